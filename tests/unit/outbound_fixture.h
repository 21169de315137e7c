// What the producer side's tests share: the peer's messages and set-ups that
// bring a producer's stream up and send a frame through the data agent
// (AgentFixture), and OutboundRig, which drives OutboundStreams on its own.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <utility>

#include "agent/outbound_streams.h"
#include "agent_fixture.h"

namespace framelink {
namespace agent_test {

// A CreditGrant from the peer for `stream_id`: one credit per (id, length),
// in that order.
inline v1::PeerMessage creditGrant(uint64_t stream_id,
                                   std::initializer_list<std::pair<uint64_t, uint64_t>> credits) {
  v1::PeerMessage g;
  g.mutable_credit_grant()->set_stream_id(stream_id);
  for (const auto& [credit_id, length] : credits) {
    auto* c = g.mutable_credit_grant()->add_credits();
    c->set_credit_id(credit_id);
    c->set_length(length);
  }
  return g;
}

// Attaches `producer`, brings link `link_id` up (on `t`, or on the fixture's
// own pair) and waits until the agent announces the producer's stream there.
inline v1::StreamOpen attachAndOpen(AgentFixture& f, TestClient& producer, uint64_t link_id = 1,
                                    std::unique_ptr<transport::Transport> t = nullptr) {
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp(link_id, std::move(t));
  return f.capture.next([](auto& m) { return m.has_stream_open(); }).stream_open();
}

// Attaches `producer` on link 1 and sends one frame of `length` bytes from
// its slot 0: the peer's end exposes a 4 KiB buffer under credit 7 and grants
// it, and this returns the stream's id once the frame arrived there.
inline uint64_t sendOneFrame(AgentFixture& f, TestClient& producer, uint64_t length) {
  const uint64_t stream_id = attachAndOpen(f, producer).stream_id();
  exposeLanding(*f.pair.b, 7, 4096);
  f.peerSays(creditGrant(stream_id, {{7, 4096}}));
  producer.push(0, length);
  waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
  return stream_id;
}

// The producer side on its own, on simulated time and without the agent's
// thread: the test hands it submits, grants and send completions, and moves
// the clock; each deadline fires exactly when it is due.
struct OutboundRig {
  Config config;
  Metrics metrics;
  ManualClock clock;
  Capture capture;  // outlives the link's session writer
  NameTable names;
  PeerTable peers;
  LinkTable links;
  ClientTable clients{metrics, names};
  OutboundStreams out{config, metrics, clock, clients, peers, links};
  TcpPair pair = makeTcpPair();
  TestClient producer;
  AgentClient* client = nullptr;
  AgentLink* link = nullptr;
  uint64_t stream_id = 0;

  explicit OutboundRig(uint32_t slots = 4) : producer(makeClient(1, FL_ROLE_PRODUCER, "cam", slots, 4096)) {
    config.id = "local";
    config.peers.push_back(PeerConfig{"remote", "127.0.0.1:1", {}});
    config.credit_timeout_ms = 200;
    config.ack_timeout_ms = 1000;
    client = &clients.add(producer.session);
    out.onProducerAttached(*client);
    REQUIRE(client->route != kNoPeer);
    link = &links.add(1);
    link->peer = peers.resolve("remote");
    link->peer_name = "remote";
    link->peer_instance = 1;
    link->transport = std::move(pair.a);
    link->session.writer = std::make_shared<SessionWriter>(
        [this](const v1::PeerMessage& m, bool) { return capture.write(m); }, 60000ms);
    out.onLinkUp(*link);
    stream_id = capture.next([](auto& m) { return m.has_stream_open(); }).stream_open().stream_id();
    CHECK(stream_id == client->out_stream);
  }
  ~OutboundRig() { link->session.writer->close(); }

  // A second link `id` to the same peer over `transport` (replacing link 1,
  // as after a reconnect), announced to the streams.
  AgentLink& addLink(uint64_t id, std::shared_ptr<transport::Transport> transport) {
    AgentLink& l = links.add(id);
    l.peer = link->peer;
    l.peer_name = "remote";
    l.peer_instance = 1;
    l.transport = std::move(transport);
    l.session.writer = link->session.writer;
    out.onLinkUp(l);
    return l;
  }
  // A grant of credit `id` (4 KiB) on `l` for the rig's stream, and the post it starts.
  void grantAndPump(AgentLink& l, uint64_t id) {
    peer::CreditGrant grant;
    grant.stream_id = stream_id;
    grant.credits.push_back(transport::RemoteCredit{id, 4096, 0, 0});
    REQUIRE(out.onCreditGrant(l, grant).empty());
    REQUIRE(out.pumpAll() > 0);
  }

  void submit(uint32_t slot, uint64_t length) {
    std::memset(producer.session->segments->slotHeader(slot), 0, sizeof(fl_slot_header));
    producer.session->segments->slotHeader(slot)->frame_id = 100 + slot;
    out.onSubmit(*client, fl_submit_desc{slot, 0, length});
  }
  // Hands the agent the next `n` send completions of `l`'s transport.
  void completeSends(AgentLink& l, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      out.onSendComplete(waitEvent(*l.transport, transport::TransportEvent::Kind::kSendComplete));
    }
  }
  bool completed(fl_completion_desc* d) {
    return fl_ring_pop(producer.completion(), producer.cap(), sizeof(*d), d) == FL_RING_OK;
  }
};

}  // namespace agent_test
}  // namespace framelink
