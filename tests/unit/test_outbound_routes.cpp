// A stream routed to several peers: each route runs the frame protocol on its
// own (its stream id and sequence there, its credits, its ACK, its replay
// when its link breaks) from the same producer slot, and the producer hears
// one completion once every route is done -- the first failure, and every
// route's readers counted.  OutboundStreams on its own, on simulated time.
#include <array>
#include <cstring>
#include <memory>
#include <utility>

#include "agent/outbound_streams.h"
#include "agent_fixture.h"
#include "outbound_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

namespace {

// A producer of "cam" routed to peers "b" and "c", each over a link of its own.
struct TwoRoutes {
  Config config;
  Metrics metrics;
  ManualClock clock;
  Capture capture;  // outlives the links' session writers
  NameTable names;
  PeerTable peers;
  LinkTable links;
  ClientTable clients{metrics, names};
  OutboundStreams out{config, metrics, clock, clients, peers, links};
  std::array<TcpPair, 2> pairs{makeTcpPair(), makeTcpPair()};
  TestClient producer;
  AgentClient* client = nullptr;
  std::array<AgentLink*, 2> link{};
  std::array<uint64_t, 2> stream_id{};

  TwoRoutes() : producer(makeClient(1, FL_ROLE_PRODUCER, "cam", 4, 4096)) {
    config.id = "local";
    config.peers.push_back(PeerConfig{"b", "127.0.0.1:1", {"cam"}});
    config.peers.push_back(PeerConfig{"c", "127.0.0.1:2", {"cam"}});
    config.credit_timeout_ms = 200;
    config.ack_timeout_ms = 1000;
    client = &clients.add(producer.session);
    out.onProducerAttached(*client);
    REQUIRE(client->more_routes.size() == 1);
    for (int r = 0; r < 2; ++r) link[r] = &addLink(static_cast<uint64_t>(r + 1), r == 0 ? "b" : "c", r);
    stream_id = {client->out_stream, client->more_routes[0].out_stream};
  }
  ~TwoRoutes() {
    for (auto& [id, l] : links) l.session.writer->close();
  }

  AgentLink& addLink(uint64_t id, const std::string& peer, int pair) {
    AgentLink& l = links.add(id);
    l.peer = peers.resolve(peer);
    l.peer_name = peer;
    l.peer_instance = 1;
    l.transport = std::move(pairs[pair].a);
    l.session.writer = std::make_shared<SessionWriter>(
        [this](const v1::PeerMessage& m, bool) { return capture.write(m); }, 60000ms);
    out.onLinkUp(l);
    return l;
  }
  void submit(uint32_t slot, uint64_t length) {
    std::memset(producer.session->segments->slotHeader(slot), 0, sizeof(fl_slot_header));
    producer.session->segments->slotHeader(slot)->frame_id = 100 + slot;
    out.onSubmit(*client, fl_submit_desc{slot, 0, length});
  }
  // Route r's peer grants credit `id`; the frame waiting goes into it.
  void grant(int r, uint64_t id) {
    peer::CreditGrant g;
    g.stream_id = stream_id[r];
    g.credits.push_back(transport::RemoteCredit{id, 4096, 0, 0});
    REQUIRE(out.onCreditGrant(*link[r], g).empty());
    out.pumpAll();
  }
  void sendCompletes(int r) {
    out.onSendComplete(waitEvent(*link[r]->transport, transport::TransportEvent::Kind::kSendComplete));
  }
  // A frame goes out on both routes: submitted in `slot`, each route's peer
  // grants a credit (b `credit_b`, c `credit_c`), and both sends complete.
  void sendOnBoth(uint32_t slot = 0, uint64_t credit_b = 7, uint64_t credit_c = 9) {
    submit(slot, 100);
    grant(0, credit_b);
    grant(1, credit_c);
    sendCompletes(0);
    sendCompletes(1);
  }
  void ack(int r, uint64_t sequence, int status = FL_OK, uint32_t readers = 1) {
    out.onAck(link[r]->peer, stream_id[r], sequence, status, status == FL_OK ? "" : "refused", readers,
              status == FL_OK ? readers : 0);
  }
  bool completed(fl_completion_desc* d) {
    return fl_ring_pop(producer.completion(), producer.cap(), sizeof(*d), d) == FL_RING_OK;
  }
};

}  // namespace

TEST_CASE("routes: a frame goes to each peer from the same slot and completes once both acknowledged",
          "[agent][outbound][routes]") {
  TwoRoutes rig;
  CHECK(rig.stream_id[0] != rig.stream_id[1]);
  rig.sendOnBoth();
  CHECK(rig.metrics.counters.frames_submitted.load() == 1);
  rig.ack(0, 1, FL_OK, 2);
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));  // peer c has not answered
  // The slot is still the frame's: submitting it again is refused.
  rig.submit(0, 100);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_SLOT_NOT_OWNED);
  rig.ack(1, 1, FL_OK, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
  CHECK(d.slot == 0);
  CHECK(d.readers == 3);
  CHECK(d.released == 3);
  CHECK(rig.metrics.counters.frames_delivered.load() == 1);
  CHECK_FALSE(rig.completed(&d));
  // Each route numbers its own frames.
  rig.submit(1, 100);
  rig.grant(0, 8);
  rig.grant(1, 10);
  CHECK(rig.client->headers[1].sequence == 2);
  CHECK(rig.client->more_routes[0].headers[1].sequence == 2);
}

TEST_CASE("routes: one route's link breaks; only that route sends the frame again, on its next link",
          "[agent][outbound][routes]") {
  TwoRoutes rig;
  rig.sendOnBoth();
  rig.ack(0, 1);
  rig.out.onLinkDown(*rig.link[1], "cable pulled");
  CHECK(rig.metrics.counters.frames_replayed.load() == 1);
  rig.out.forgetPostsOf(2);
  TcpPair again = makeTcpPair();
  rig.pairs[1] = std::move(again);
  rig.link[1] = &rig.addLink(3, "c", 1);
  rig.grant(1, 11);
  rig.sendCompletes(1);
  CHECK(rig.link[0]->frames_out == 1);  // peer b had it already
  CHECK(rig.link[1]->frames_out == 1);
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  rig.ack(1, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
  CHECK(d.readers == 2);
}

TEST_CASE("routes: a route with no consumer fails the frame with its reason, counting the other's readers",
          "[agent][outbound][routes]") {
  TwoRoutes rig;
  rig.submit(0, 100);
  rig.grant(0, 7);  // peer c never grants
  rig.sendCompletes(0);
  rig.ack(0, 1, FL_OK, 2);
  rig.clock.advanceMs(199);
  rig.out.checkDeadlines();
  fl_completion_desc d{};
  CHECK_FALSE(rig.completed(&d));
  rig.clock.advanceMs(2);
  rig.out.checkDeadlines();
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_NO_CONSUMER);
  CHECK(d.readers == 2);
  CHECK(d.released == 2);
  CHECK(rig.metrics.counters.frames_failed.load() == 1);
  CHECK(rig.metrics.counters.frames_delivered.load() == 0);
  // Nothing of it is left on either route: the slot takes a new frame.
  rig.submit(0, 100);
  rig.grant(1, 9);
  CHECK(rig.link[1]->frames_out == 1);
}

TEST_CASE("routes: one route's reader count cannot wrap the frame's, nor hide another route's",
          "[agent][outbound][routes]") {
  TwoRoutes rig;
  rig.sendOnBoth();
  rig.ack(0, 1, FL_OK, UINT32_MAX);  // a route's peer may claim any count of readers
  rig.ack(1, 1, FL_OK, 1);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
  CHECK(d.readers == UINT32_MAX);  // saturated, not 0
  CHECK(d.released == UINT32_MAX);
  CHECK(d.released <= d.readers);
}

TEST_CASE("routes: a NACKed frame is sent again on its route only", "[agent][outbound][routes]") {
  TwoRoutes rig;
  rig.sendOnBoth();
  rig.ack(1, 1, FL_ERR_CRC_MISMATCH);
  CHECK(rig.metrics.counters.frames_resent_crc.load() == 1);
  rig.grant(1, 10);
  rig.sendCompletes(1);
  CHECK(rig.link[0]->frames_out == 1);
  CHECK(rig.link[1]->frames_out == 2);
  rig.ack(1, 1);
  rig.ack(0, 1);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_OK);
}

TEST_CASE("routes: the daemon stopping ends a half-done frame once, with SHUTDOWN",
          "[agent][outbound][routes]") {
  TwoRoutes rig;
  rig.submit(0, 100);
  rig.grant(0, 7);
  rig.sendCompletes(0);
  rig.ack(0, 1);  // route b done; route c still waits for a credit
  rig.out.startShutdown();
  rig.out.failAllInProgress(*rig.producer.session, FL_ERR_SHUTDOWN, "stopping");
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_SHUTDOWN);
  CHECK(d.readers == 1);
  CHECK_FALSE(rig.completed(&d));
  CHECK(rig.producer.session->slots[0].state == SlotState::kFree);
  CHECK(rig.client->more_routes[0].slots[0].state == SlotState::kFree);
  CHECK(rig.producer.session->in_progress == 0);
}

namespace {

// Peers b and c as a registry announced them: which of the stream's readers each has.
void announce(TwoRoutes& rig, RouteReaders b, RouteReaders c) {
  for (PeerConfig& p : rig.config.peers) {
    const RouteReaders r = p.name == "b" ? b : c;
    p.discovered = true;
    p.subscribed.clear();
    p.grouped.clear();
    if (r == RouteReaders::kSubscribers || r == RouteReaders::kBoth) p.subscribed = {"cam"};
    if (r == RouteReaders::kGroup || r == RouteReaders::kBoth) p.grouped = {"cam"};
  }
  rig.out.refreshRouteReaders(*rig.client);
}

// Whether route r's stream has a frame waiting for a credit, and its
// header's subscribers-only flag.
bool waits(TwoRoutes& rig, int r, uint32_t slot) {
  const SlotEntry& e = r == 0 ? rig.producer.session->slots[slot] : rig.client->more_routes[0].slots[slot];
  return e.state == SlotState::kPending;
}
bool forSubscribersOnly(TwoRoutes& rig, int r, uint32_t slot) {
  return (r == 0 ? rig.client->headers[slot] : rig.client->more_routes[0].headers[slot]).subscribers_only !=
         0;
}

}  // namespace

TEST_CASE("routes: a queue group on two hosts gets each frame on one of them, in turn",
          "[agent][outbound][routes][groups]") {
  TwoRoutes rig;
  announce(rig, RouteReaders::kGroup, RouteReaders::kGroup);
  rig.submit(0, 100);
  CHECK(waits(rig, 0, 0));
  CHECK_FALSE(waits(rig, 1, 0));
  CHECK_FALSE(forSubscribersOnly(rig, 0, 0));
  rig.submit(1, 100);
  // b's frame still waits for a credit: c, which has none waiting, takes the next.
  CHECK(rig.client->more_routes[0].slots[1].state == SlotState::kPending);
  CHECK(rig.producer.session->slots[1].state == SlotState::kLent);  // the frame's, on route c alone
  fl_completion_desc d{};
  rig.submit(1, 100);  // the slot is taken until c is done
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_SLOT_NOT_OWNED);
  rig.grant(0, 7);
  rig.grant(1, 9);
  rig.sendCompletes(0);
  rig.sendCompletes(1);
  CHECK(rig.link[0]->frames_out == 1);
  CHECK(rig.link[1]->frames_out == 1);
  rig.ack(1, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 1);
  CHECK(d.status == FL_OK);
  CHECK(d.readers == 1);
  rig.ack(0, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 0);
  CHECK(d.readers == 1);
  // Both idle again: they take turns.
  rig.submit(2, 100);
  rig.submit(3, 100);
  CHECK(waits(rig, 0, 2) != waits(rig, 1, 2));
  CHECK(waits(rig, 0, 3) != waits(rig, 1, 3));
  CHECK(waits(rig, 0, 2) != waits(rig, 0, 3));
  CHECK(rig.metrics.counters.frames_subscribers_only.load() == 0);
}

TEST_CASE(
    "routes: a host with subscribers gets every frame, for its subscribers only when the group's share went "
    "elsewhere; none left there is no failure",
    "[agent][outbound][routes][groups]") {
  TwoRoutes rig;
  announce(rig, RouteReaders::kBoth, RouteReaders::kGroup);
  rig.submit(0, 100);  // the group's share to b (first in turn): c gets nothing
  CHECK(waits(rig, 0, 0));
  CHECK_FALSE(forSubscribersOnly(rig, 0, 0));
  CHECK_FALSE(waits(rig, 1, 0));
  rig.submit(1, 100);  // to c: b gets it for its subscribers
  CHECK(waits(rig, 0, 1));
  CHECK(forSubscribersOnly(rig, 0, 1));
  CHECK(waits(rig, 1, 1));
  CHECK_FALSE(forSubscribersOnly(rig, 1, 1));
  CHECK(rig.metrics.counters.frames_subscribers_only.load() == 1);
  rig.grant(0, 7);
  rig.grant(0, 8);
  rig.grant(1, 9);
  for (int i = 0; i < 2; ++i) rig.sendCompletes(0);
  rig.sendCompletes(1);
  rig.ack(0, 1, FL_OK, 2);
  fl_completion_desc d{};
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 0);
  CHECK(d.readers == 2);
  // b's subscribers left before frame 2 came: refused there for want of one, delivered to c's member.
  rig.ack(0, 2, FL_ERR_NO_CONSUMER, 0);
  rig.ack(1, 1, FL_OK, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.slot == 1);
  CHECK(d.status == FL_OK);
  CHECK(d.readers == 1);
  CHECK(rig.metrics.counters.frames_no_subscriber.load() == 1);
  CHECK(rig.metrics.counters.frames_failed.load() == 0);

  // A route for subscribers only carries every frame, each for its subscribers.
  announce(rig, RouteReaders::kSubscribers, RouteReaders::kGroup);
  rig.submit(2, 100);
  rig.submit(3, 100);
  for (uint32_t slot : {2u, 3u}) {
    CHECK(waits(rig, 0, slot));
    CHECK(forSubscribersOnly(rig, 0, slot));
    CHECK(waits(rig, 1, slot));
  }
  // A NO_CONSUMER for a frame meant for every reader there is the failure it says.
  announce(rig, RouteReaders::kEvery, RouteReaders::kEvery);
  rig.grant(0, 10);
  rig.grant(0, 11);
  rig.grant(1, 12);
  rig.grant(1, 13);
  for (int i = 0; i < 2; ++i) {
    rig.sendCompletes(0);
    rig.sendCompletes(1);
  }
  rig.ack(0, 3, FL_OK, 1);
  rig.ack(1, 2, FL_OK, 1);
  rig.ack(0, 4, FL_OK, 1);
  rig.ack(1, 3, FL_OK, 1);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(rig.completed(&d));
    CHECK(d.status == FL_OK);
    CHECK(d.readers == 2);
  }
  rig.submit(0, 100);
  CHECK_FALSE(forSubscribersOnly(rig, 0, 0));
  rig.grant(0, 14);
  rig.sendCompletes(0);
  rig.ack(0, 5, FL_ERR_NO_CONSUMER);
  rig.grant(1, 15);
  rig.sendCompletes(1);
  rig.ack(1, 4, FL_OK, 1);
  REQUIRE(rig.completed(&d));
  CHECK(d.status == FL_ERR_NO_CONSUMER);
  CHECK(rig.metrics.counters.frames_no_subscriber.load() == 1);
}

TEST_CASE(
    "routes: a found host whose readers left gets no new frame while others are in flight; a host added "
    "takes its place once its frames are done",
    "[agent][outbound][routes][groups]") {
  TwoRoutes rig;
  announce(rig, RouteReaders::kSubscribers, RouteReaders::kSubscribers);
  rig.submit(0, 100);  // to b and c, each waiting for a credit: in flight
  // c's readers leave: it is no route of "cam" any more, but frame 0 is still on it.
  rig.config.peers[1].streams.clear();
  rig.config.peers[1].subscribed.clear();
  rig.out.refreshRouteReaders(*rig.client);
  CHECK(rig.client->more_routes[0].readers == RouteReaders::kNone);
  rig.submit(1, 100);
  CHECK(waits(rig, 0, 1));
  CHECK_FALSE(waits(rig, 1, 1));
  CHECK(waits(rig, 1, 0));  // frame 0 keeps the side it has

  auto found = [&](const std::string& name) {
    PeerConfig p{name, "127.0.0.1:9", {"cam"}};
    p.discovered = true;
    p.subscribed = {"cam"};
    rig.config.peers.push_back(p);
  };
  // d comes with a reader: its route is added at once, after c's, which still has frame 0.
  found("d");
  CHECK(rig.out.addRoutes(*rig.client, {"b", "d"}));
  REQUIRE(rig.client->more_routes.size() == 2);
  CHECK(rig.client->more_routes[1].peer == rig.peers.resolve("d"));
  CHECK_FALSE(rig.out.addRoutes(*rig.client, {"b", "d"}));  // nothing to add
  // c answers frame 0; then e comes, and takes c's place: the routes do not grow.
  rig.grant(1, 9);
  rig.sendCompletes(1);
  rig.ack(1, 1);
  found("e");
  CHECK(rig.out.addRoutes(*rig.client, {"b", "d", "e"}));
  REQUIRE(rig.client->more_routes.size() == 2);
  CHECK(rig.client->more_routes[0].peer == rig.peers.resolve("e"));
  CHECK(rig.client->more_routes[0].readers == RouteReaders::kSubscribers);
  rig.submit(2, 100);
  CHECK(waits(rig, 0, 2));
  CHECK(waits(rig, 1, 2));  // on e's route now

  // A written peer's route that left keeps the frames until none is in flight: nothing is added.
  TwoRoutes written;
  written.submit(0, 100);
  written.config.peers[1].streams.clear();
  written.config.peers.push_back(PeerConfig{"d", "127.0.0.1:9", {"cam"}});
  CHECK_FALSE(written.out.addRoutes(*written.client, {"b", "d"}));
  written.out.refreshRouteReaders(*written.client);
  CHECK(written.client->more_routes[0].readers == RouteReaders::kEvery);
}
