#include "metrics/peer_problems.h"

#include <time.h>

#include <algorithm>

namespace framelink {

const char* PeerProblems::causeName(Cause cause) noexcept {
  switch (cause) {
    case Cause::kBadAddress:
      return "bad_address";
    case Cause::kUnreachable:
      return "unreachable";
    case Cause::kUnreachableOrTls:
      return "unreachable_or_tls";
    case Cause::kToken:
      return "token";
    case Cause::kCredentials:
      return "credentials";
    case Cause::kRefused:
      return "refused";
    case Cause::kVersion:
      return "version";
    case Cause::kProtocol:
      return "protocol";
    case Cause::kDataChannel:
      return "data_channel";
    case Cause::kLinkDown:
      return "link_down";
  }
  return "link_down";
}

void PeerProblems::record(const std::string& peer, Cause cause, std::string what) noexcept {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const uint64_t at = uint64_t(now.tv_sec) * 1'000'000'000ULL + uint64_t(now.tv_nsec);
  if (what.size() > kMaxMessageBytes) what.resize(kMaxMessageBytes);
  try {
    MutexLock lock(mu_);
    auto it = problems_.find(peer);
    if (it == problems_.end()) {
      if (problems_.size() >= kMaxPeers) {
        problems_.erase(
            std::min_element(problems_.begin(), problems_.end(),
                             [](const auto& a, const auto& b) { return a.second.at_ns < b.second.at_ns; }));
        forgotten_.fetch_add(1, std::memory_order_relaxed);
      }
      it = problems_.emplace(peer, Problem{}).first;
    }
    it->second.cause = cause;
    it->second.what = std::move(what);
    it->second.at_ns = at;
    ++it->second.count;
  } catch (...) {
    // Out of memory: the problem is in the log still.
  }
}

std::map<std::string, PeerProblems::Problem> PeerProblems::snapshot() const {
  MutexLock lock(mu_);
  return problems_;
}

}  // namespace framelink
