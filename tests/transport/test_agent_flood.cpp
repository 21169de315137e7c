// A peer that floods the data agent with control records over a real
// transport -- tcp and grpc here, rdma over Soft-RoCE in the lane (built with
// FL_AGENT_FLOOD_RDMA) -- as a hostile peer daemon would: the transport hands
// the agent a bounded number of events however fast the peer sends, a record
// too big for one round is taken over several while another link's goes at
// once, and a peer whose records keep the agent busy for link_timeout_ms is
// cut with a reason while the other link is left alone.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent_link_rig.h"
#include "transport/transport.h"
#include "transport_pair.h"

using namespace framelink;
using namespace framelink::agent_test;
using framelink::transport::testing::kindName;
using framelink::transport::testing::TransportKind;
using framelink::transport::testing::TransportPair;

namespace {

using Clock = std::chrono::steady_clock;

TransportKind floodKind() {
#ifdef FL_AGENT_FLOOD_RDMA
  return TransportKind::kRdma;
#else
  return GENERATE(TransportKind::kTcp, TransportKind::kGrpc);
#endif
}

std::unique_ptr<TransportPair> makePair(TransportKind kind) {
  auto made = TransportPair::make(kind);
  if (!made.ok()) FAIL(kindName(kind) << ": " << made.error().message);
  REQUIRE(made.ok());
  return std::move(made).value();
}

// 4,000 CreditLows: about 12 KiB, well within a control record's bound.
constexpr size_t kRecordMessages = 4000;

// Posts `record` on `peer` as a flooder does, as soon as the transport takes
// it, polling the peer's end meanwhile (rdma completes its sends there);
// false when the link is down or 10 s pass.
bool flood(transport::Transport& peer, const std::string& record) {
  std::vector<transport::TransportEvent> scratch(64);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    const transport::PostResult r = peer.postControl(record);
    peer.flush();
    peer.poll(scratch.data(), scratch.size());
    if (r == transport::PostResult::kOk) return true;
    if (r != transport::PostResult::kBackpressure) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

}  // namespace

TEST_CASE("agent flood: a peer sending faster than the agent reads is held back, and loses nothing",
          "[transport][agent][security]") {
  const TransportKind kind = floodKind();
  INFO(kindName(kind));
  auto pair = makePair(kind);
  const std::string record = creditLows(kRecordMessages).SerializeAsString();
  // The agent's end is not polled while the peer sends as fast as it may:
  // what waits for it is bounded (tcp's socket buffers, grpc's reader and
  // rdma's receives stop at kMaxQueuedEvents), and the peer is told to wait.
  size_t posted = 0;
  size_t held_back = 0;
  std::vector<transport::TransportEvent> scratch(64);
  const auto until = Clock::now() + std::chrono::seconds(3);
  while (Clock::now() < until && held_back < 100) {
    const transport::PostResult r = pair->b->postControl(record);
    pair->b->flush();
    pair->b->poll(scratch.data(), scratch.size());
    REQUIRE((r == transport::PostResult::kOk || r == transport::PostResult::kBackpressure));
    if (r == transport::PostResult::kOk) {
      ++posted;
    } else {
      ++held_back;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  INFO("records posted: " << posted << " of " << record.size()
                          << " bytes; refused for backpressure: " << held_back);
  CHECK(held_back > 0);
  // Read now: every record arrives, none lost.
  size_t records = 0;
  std::vector<transport::TransportEvent> events(256);
  const auto drained = Clock::now() + std::chrono::seconds(30);
  while (records < posted && Clock::now() < drained) {
    pair->b->flush();
    pair->b->poll(scratch.data(), scratch.size());
    const size_t n = pair->a->poll(events.data(), events.size());
    for (size_t i = 0; i < n; ++i) {
      records += events[i].kind == transport::TransportEvent::Kind::kControl ? 1 : 0;
    }
  }
  CHECK(records == posted);
}

TEST_CASE("agent flood: a huge record waits for later rounds while another link's goes now",
          "[transport][agent][security]") {
  const TransportKind kind = floodKind();
  INFO(kindName(kind));
  auto pair = makePair(kind);
  AgentLinkRig rig;
  rig.linkUpOver(1, "flooder", pair->a, pair->b);
  rig.linkUp(2, "honest");
  REQUIRE(flood(*pair->b, creditLows(kRecordMessages).SerializeAsString()));
  // The record has reached the agent once the agent has begun it.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (rig.messagesHandled() == 0 && Clock::now() < deadline) {
    pair->b->flush();
    rig.agent->runUntilIdle(1);
  }
  REQUIRE(rig.messagesHandled() > 0);
  CHECK(rig.messagesHandled() < kRecordMessages);
  // Link 2's record holds a Session message, which a control record must not
  // carry: the Fin that answers it shows when it was handled.
  v1::ControlBatch misplaced;
  misplaced.add_messages()->mutable_keepalive()->set_timestamp_ns(1);
  rig.peerSends(2, misplaced);
  rig.agent->runUntilIdle(1);
  CHECK(rig.finSentOn(2));
  CHECK(rig.messagesHandled() < kRecordMessages);
  CHECK(rig.agent->runUntilIdle(1000));
  CHECK(rig.messagesHandled() == kRecordMessages);
  CHECK_FALSE(rig.finSentOn(1));
}

TEST_CASE("agent flood: a peer whose records keep the agent busy for link_timeout_ms is cut with a reason",
          "[transport][agent][security]") {
  const TransportKind kind = floodKind();
  INFO(kindName(kind));
  auto pair = makePair(kind);
  AgentLinkRig rig(1000);
  rig.linkUpOver(1, "flooder", pair->a, pair->b);
  rig.linkUp(2, "honest");
  const std::string record = creditLows(kRecordMessages).SerializeAsString();
  // Records back to back while the agent's clock runs past link_timeout_ms
  // (50 ms a step): every round leaves some for the next.  The peer posts
  // without waiting, as the agent reads less than a record a step.
  std::vector<transport::TransportEvent> scratch(64);
  // grpc and rdma deliver on threads and completions of their own: the
  // first record is in before the clock runs.
  REQUIRE(flood(*pair->b, record));
  const auto first = Clock::now() + std::chrono::seconds(10);
  while (rig.messagesHandled() == 0 && Clock::now() < first) {
    pair->b->flush();
    rig.agent->runUntilIdle(1);
  }
  REQUIRE(rig.messagesHandled() > 0);
  int step = 0;
  for (; step < 100 && !rig.finSentOn(1); ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (pair->b->postControl(record) == transport::PostResult::kNotConnected) break;
    pair->b->flush();
    pair->b->poll(scratch.data(), scratch.size());
    rig.agent->runUntilIdle(4);
    rig.clock.advanceMs(50);
    rig.agent->runUntilIdle(1);
  }
  INFO("steps: " << step << "; messages handled: " << rig.messagesHandled());
  REQUIRE(rig.finSentOn(1));
  CHECK(rig.metrics.counters.links_cut_busy.load() == 1);
  bool said_why = false;
  for (const auto& m : *rig.sessions[0]) {
    if (m.has_fin()) said_why = m.fin().reason().find("kept the data agent busy") != std::string::npos;
  }
  CHECK(said_why);
  CHECK_FALSE(rig.finSentOn(2));
}
