// A holder of the token that opens many links under one daemon id (each
// Hello claiming an instance of its choice) against a real framelinkd: the
// links past the bound are refused and counted, and the links it keeps share
// a consumer's slots as one sender, so an honest peer's frames still land.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "harness.h"
#include "hostile_peer.h"
#include "hostile_script.h"
#include "hostile_util.h"

using namespace framelink::integ;
namespace v1 = framelink::v1;

namespace {

constexpr size_t kLinks = 8;
constexpr uint32_t kConsumerSlots = 4;

// Gives back every credit the daemon recalls from `peer`, as a sender that
// has nothing to send does, from the `done`-th recall on; returns how many
// recalls it has answered.
size_t giveBackRecalled(HostilePeer& peer, size_t done) {
  const PeerInbox in = peer.inbox();
  size_t seen = 0;
  for (const auto* list : {&in.session, &in.control}) {
    for (const auto& m : *list) {
      if (!m.has_credit_revoke() || m.credit_revoke().returned()) continue;
      if (seen++ < done) continue;
      v1::PeerMessage back;
      *back.mutable_credit_revoke() = m.credit_revoke();
      back.mutable_credit_revoke()->set_returned(true);
      peer.sendControl(back);
    }
  }
  return seen;
}

bool granted(const PeerInbox& in) {
  for (const auto* list : {&in.session, &in.control}) {
    for (const auto& m : *list) {
      if (m.has_credit_grant()) return true;
    }
  }
  return false;
}

// Sends `frames` frames from A's producer to `consumer` on B one at a time;
// each must arrive whole and complete FL_OK.
void requireEveryFrame(DaemonPair& pair, Client& consumer, const std::string& stream, int frames) {
  Client producer = attachProducer(pair.a(), stream, 4, 64 * 1024);
  for (int i = 0; i < frames; ++i) {
    const uint64_t id = 1 + uint64_t(i);
    submitFrame(producer.get(), id, 1000 + 17 * uint64_t(i));
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    checkSyntheticFrame(f, id, 1000 + 17 * uint64_t(i));
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
  }
}

}  // namespace

TEST_CASE(
    "hostile links: a peer opening 8 links under one id keeps at most 4, and they share the slots as one "
    "sender",
    "[integration][hostile_peer][identity]") {
  // One instance: the links beyond the bound are refused.  Distinct
  // instances under the shared token: the second instance is refused while
  // the first one's link is up.
  const bool distinct = GENERATE(false, true);
  INFO((distinct ? "distinct instances" : "one instance"));
  DaemonPair pair(pairOptions());
  // The consumer is there first: the hostile links take its slots before A's producer comes.
  Client consumer = attachConsumer(pair.b(), "cam", kConsumerSlots, 64 * 1024);
  std::vector<std::unique_ptr<HostilePeer>> peers;
  size_t refused = 0;
  for (size_t i = 0; i < kLinks; ++i) {
    HostilePeer::Options o;
    o.address = pair.b().grpcAddress();
    o.daemon_id = "many";
    o.transport = "tcp";  // the pair's
    o.session_id = 0x6d616e79 + i;
    o.instance = distinct ? 1 + i : 1;
    o.may_be_refused = true;
    auto peer = std::make_unique<HostilePeer>(o);
    if (!peer->admitted()) {
      INFO("refusal: " << peer->refusal().error_message());
      CHECK_THAT(peer->refusal().error_message(),
                 Catch::Contains(distinct ? "linked from another daemon" : "links up already"));
      ++refused;
      continue;
    }
    peer->readSession();
    peer->readData();
    peers.push_back(std::move(peer));
  }
  REQUIRE(peers.size() == (distinct ? 1 : 4));
  CHECK(refused == kLinks - peers.size());
  const char* counter =
      distinct ? "framelink_peer_instance_refused_total" : "framelink_peer_links_over_limit_total";
  CHECK(pair.b().metric(counter) == static_cast<int64_t>(refused));

  // The hostile peer opens the stream on each link, sends nothing, and
  // gives back only what is recalled (it is polled for recalls: a peer's
  // own pace, not a wait for the daemon).
  std::atomic<bool> stop{false};
  std::thread giver([&] {
    std::vector<size_t> done(peers.size(), 0);
    while (!stop.load()) {
      for (size_t i = 0; i < peers.size(); ++i) done[i] = giveBackRecalled(*peers[i], done[i]);
      std::this_thread::sleep_for(Millis(5));
    }
  });
  // Joined however the test ends (a failed REQUIRE throws).
  struct Join {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~Join() {
      stop = true;
      thread.join();
    }
  } join{stop, giver};
  for (auto& peer : peers) CHECK(peer->sendSession(streamOpen(1, "cam")));
  // The first of the links whose StreamOpen the daemon takes is granted the slots.
  REQUIRE(waitUntil(
      [&] {
        return std::any_of(peers.begin(), peers.end(),
                           [](const auto& peer) { return granted(peer->inbox()); });
      },
      Millis(5000)));
  requireEveryFrame(pair, consumer, "cam", 20);
  CHECK(pair.b().alive());
}
