// A flood aimed at a daemon, and what it did to the daemon's memory: the
// hostile peer tests run a scripted peer's sends in rounds until the daemon
// cuts it, sampling the daemon's VmRSS as they go.
#pragma once

#include <sys/types.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>

#include "harness.h"
#include "hostile_peer.h"

namespace framelink::integ {

// Under a sanitizer the daemon keeps freed memory in quarantine and runs
// several times slower: its VmRSS says nothing of what it holds for a peer,
// and a flood takes longer to reach the bound.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// What a flood did to the daemon it was aimed at.
struct Flood {
  uint64_t rounds = 0;
  bool cut = false;  // a send failed: the daemon cut the peer
  Millis took{0};
  int64_t rss_before = 0;  // the daemon's VmRSS, KiB
  int64_t rss_peak = 0;
};

// Runs `round(1)`, `round(2)`, ... until one returns false (the daemon cut
// the peer) or `limit` passes, sampling `pid`'s VmRSS every `sample_every`
// rounds.
inline Flood floodUntilCut(pid_t pid, Millis limit, uint64_t sample_every,
                           const std::function<bool(uint64_t)>& round) {
  Flood flood;
  flood.rss_before = residentKiB(pid);
  REQUIRE(flood.rss_before > 0);
  flood.rss_peak = flood.rss_before;
  const auto start = Clock::now();
  while (!flood.cut && Clock::now() - start < limit) {
    ++flood.rounds;
    flood.cut = !round(flood.rounds);
    if (flood.rounds % sample_every == 0) flood.rss_peak = std::max(flood.rss_peak, residentKiB(pid));
  }
  flood.took = std::chrono::duration_cast<Millis>(Clock::now() - start);
  return flood;
}

}  // namespace framelink::integ
