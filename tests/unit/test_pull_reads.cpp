// PullReads on its own: offers wait in line per link and are read in the
// order they came, no more than the bound at once; a completion counts only
// for a posted read of the link it names; a link's reads go with it; a link
// whose reads stop moving is found, and only then.
#include <catch2/catch.hpp>

#include <memory>

#include "agent/pull_reads.h"

using namespace framelink;

namespace {

transport::FrameHeader offered(uint64_t sequence) {
  transport::FrameHeader h;
  h.stream_id = 42;
  h.sequence = sequence;
  h.credit_id = 100 + sequence;
  return h;
}

// Posts what the link's line lets out under `bound`; returns how many.
size_t postAll(PullReads& pull, uint64_t link_id, size_t bound, uint64_t now_ns) {
  size_t n = 0;
  for (auto it = pull.next(link_id, bound); it != pull.end(); it = pull.next(link_id, bound)) {
    pull.leaveLine(link_id);
    pull.posted(it, std::make_shared<int>(0), now_ns);
    ++n;
  }
  return n;
}

}  // namespace

TEST_CASE("pull reads: a link's offers are read in the order they came, at most the bound at once",
          "[pull_reads]") {
  PullReads pull;
  const uint64_t c1 = pull.queue(1, offered(1), {});
  const uint64_t c2 = pull.queue(1, offered(2), {});
  const uint64_t c3 = pull.queue(1, offered(3), {});
  pull.queue(2, offered(9), {});
  REQUIRE(pull.next(1, 2)->first == c1);
  CHECK(postAll(pull, 1, 2, 10) == 2);
  CHECK(pull.inFlight() == 2);
  CHECK(pull.next(1, 2) == pull.end());  // two out: the third waits
  CHECK_FALSE(pull.reads().at(c3).posted);

  // One completes: the third goes; the read comes back whole.
  auto done = pull.complete(1, c1, 20);
  REQUIRE(done.has_value());
  CHECK(done->header.sequence == 1);
  CHECK(done->keepalive != nullptr);  // the consumer's segments lived until now
  REQUIRE(pull.next(1, 2)->first == c3);
  CHECK(postAll(pull, 1, 2, 20) == 1);
  CHECK(pull.inFlight() == 3 - 1);
  CHECK(pull.peakPerLink() == 2);
  // Link 2's line is its own.
  CHECK(postAll(pull, 2, 2, 20) == 1);
  CHECK(pull.inFlight() == 3);
  CHECK(pull.reads().count(c2) == 1);
}

TEST_CASE("pull reads: an offer dropped before its read is skipped in the line", "[pull_reads]") {
  PullReads pull;
  const uint64_t c1 = pull.queue(1, offered(1), {});
  const uint64_t c2 = pull.queue(1, offered(2), {});
  pull.erase(pull.reads().find(c1));  // its stream closed, its consumer went
  auto next = pull.next(1, 4);
  REQUIRE(next != pull.end());
  CHECK(next->first == c2);
}

TEST_CASE("pull reads: a completion counts only for a posted read of the link it names", "[pull_reads]") {
  PullReads pull;
  const uint64_t c1 = pull.queue(1, offered(1), {});
  const uint64_t c2 = pull.queue(1, offered(2), {});
  CHECK(postAll(pull, 1, 1, 10) == 1);
  CHECK_FALSE(pull.complete(2, c1, 11).has_value());  // another link's completion: forged or late
  CHECK_FALSE(pull.complete(1, c2, 11).has_value());  // not posted yet
  CHECK_FALSE(pull.complete(1, 999, 11).has_value());
  CHECK(pull.inFlight() == 1);
  CHECK(pull.complete(1, c1, 11).has_value());
  CHECK_FALSE(pull.complete(1, c1, 12).has_value());  // once
  CHECK(pull.inFlight() == 0);
}

TEST_CASE("pull reads: a link whose reads stop moving is stalled, one that moves or is idle is not",
          "[pull_reads]") {
  constexpr uint64_t kStall = 1000;
  PullReads pull;
  const uint64_t a = pull.queue(1, offered(1), {});
  pull.queue(1, offered(2), {});
  pull.queue(2, offered(3), {});
  postAll(pull, 1, 4, 100);
  pull.queue(3, offered(4), {});  // waits, never posted: nothing to stall on
  CHECK(pull.stalled(100 + kStall - 1, kStall).empty());
  auto stalled = pull.stalled(100 + kStall, kStall);
  REQUIRE(stalled.size() == 1);
  CHECK(stalled[0].first == 1);
  CHECK(stalled[0].second == 2);
  CHECK(pull.stalled(100 + kStall, 0).empty());  // 0: never

  // One read completes: the link moved, its clock starts again.
  REQUIRE(pull.complete(1, a, 100 + kStall).has_value());
  CHECK(pull.stalled(100 + 2 * kStall - 1, kStall).empty());
  CHECK(pull.stalled(100 + 2 * kStall, kStall).size() == 1);
}

TEST_CASE("pull reads: a link that goes takes its reads and its line, no other's", "[pull_reads]") {
  PullReads pull;
  pull.queue(1, offered(1), {});
  pull.queue(1, offered(2), {});
  const uint64_t other = pull.queue(2, offered(3), {});
  postAll(pull, 1, 1, 10);
  postAll(pull, 2, 1, 10);
  REQUIRE(pull.inFlight() == 2);
  pull.dropLink(1);
  CHECK(pull.inFlight() == 1);
  CHECK(pull.reads().size() == 1);
  CHECK(pull.next(1, 4) == pull.end());
  CHECK(pull.stalled(1'000'000, 10).size() == 1);  // link 2's read only
  CHECK(pull.complete(2, other, 20).has_value());
  CHECK(pull.reads().empty());
}
