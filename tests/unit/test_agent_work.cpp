// What one peer may cost the data agent, and the bounds that keep it from
// stalling the other links: what a transport queues for the agent, a
// CreditLow that starts no grant round when nothing could be granted, a
// huge control record handled over several rounds while the other links
// get theirs, a peer whose records keep the agent busy cut, and the answers
// repeated on a new link sent a bounded part per round.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "inbound_fixture.h"
#include "transport/locked_link_bookkeeping.h"
#include "transport/loopback/loopback_transport.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

TEST_CASE("agent work: a transport reading on a thread of its own stops reading while the agent is behind",
          "[agent][security]") {
  auto made = transport::LockedLinkBookkeeping::create();
  REQUIRE(made.ok());
  transport::LockedLinkBookkeeping& book = *made.value();
  constexpr size_t kMore = 8;
  std::atomic<size_t> arrived{0};
  std::thread reader([&] {
    for (size_t i = 0; i < transport::kMaxQueuedEvents + kMore; ++i) {
      book.controlArrived("record");
      ++arrived;
    }
  });
  waitUntil([&] { return arrived.load() >= transport::kMaxQueuedEvents; }, "the reader queued to the bound");
  // It reads no more until events are taken (a wait for something that must
  // not happen: a sleep, not an event).
  std::this_thread::sleep_for(50ms);
  CHECK(arrived.load() == transport::kMaxQueuedEvents);
  std::vector<transport::TransportEvent> out(kMore);
  CHECK(book.poll(out.data(), kMore) == kMore);
  waitUntil([&] { return arrived.load() == transport::kMaxQueuedEvents + kMore; }, "the reader read on");
  reader.join();
  // A link that fails lets a waiting reader go.
  std::thread late([&] { book.controlArrived("record"); });
  CHECK(book.fail(FL_ERR_LINK_LOST, "gone"));
  late.join();
}
