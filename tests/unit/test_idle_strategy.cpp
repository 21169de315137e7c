// The data agent's backoff: phases measured in time, only work re-arms them.
#include <catch2/catch.hpp>

#include "agent/idle_strategy.h"

using framelink::IdleStrategy;

namespace {
constexpr uint64_t kUs = 1000;
}

TEST_CASE("idle strategy spins, then yields, then sleeps, by time", "[idle]") {
  IdleStrategy idle(50 * kUs);
  const uint64_t t0 = 1'000'000'000;
  CHECK_FALSE(idle.idle(3, t0));             // work: keep going
  CHECK_FALSE(idle.idle(0, t0 + 10 * kUs));  // spinning
  CHECK_FALSE(idle.idle(0, t0 + 49 * kUs));
  CHECK_FALSE(idle.idle(0, t0 + 60 * kUs));  // yielding
  CHECK_FALSE(idle.idle(0, t0 + 99 * kUs));
  CHECK(idle.idle(0, t0 + 100 * kUs));  // sleep
  // A sleep that brought nothing: sleep again at once, however long it was.
  CHECK(idle.idle(0, t0 + 50'000 * kUs));
  // Work re-arms the spin phase.
  CHECK_FALSE(idle.idle(1, t0 + 60'000 * kUs));
  CHECK_FALSE(idle.idle(0, t0 + 60'001 * kUs));
  CHECK(idle.idle(0, t0 + 60'100 * kUs));
}

TEST_CASE("idle strategy with no spin sleeps as soon as a round finds nothing", "[idle]") {
  IdleStrategy idle(0);
  const uint64_t t0 = 5'000'000;
  CHECK_FALSE(idle.idle(1, t0));
  CHECK(idle.idle(0, t0));
  CHECK(idle.idle(0, t0 + 1));
}

TEST_CASE("idle strategy before any work sleeps at once", "[idle]") {
  IdleStrategy idle(50 * kUs);
  CHECK(idle.idle(0, 10'000'000'000ull));
}
