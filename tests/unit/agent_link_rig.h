// A data agent run by the test's thread, its links over transports whose
// other ends the test plays (loopback pairs, or any pair a test brings: tcp,
// grpc, rdma); each link's Session records what the agent wrote on it.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "agent/agent_clock.h"
#include "agent/data_agent.h"
#include "agent/session_writer.h"
#include "agent_fixture.h"
#include "config/config.h"
#include "metrics/metrics.h"
#include "transport/loopback/loopback_transport.h"

namespace framelink::agent_test {

struct AgentLinkRig {
  Config config;
  Metrics metrics;
  ManualClock clock;
  std::unique_ptr<DataAgent> agent;
  std::vector<std::shared_ptr<transport::Transport>> peer_ends;
  std::vector<std::shared_ptr<std::vector<v1::PeerMessage>>> sessions;
  std::vector<std::shared_ptr<void>> kept;  // what a pair's ends need alive (a loopback link)

  explicit AgentLinkRig(uint32_t link_timeout_ms = 10000) {
    config.id = "local";
    config.idle_spin_us = 0;
    config.link_timeout_ms = link_timeout_ms;
    agent = std::make_unique<DataAgent>(config, metrics, clock);
  }
  // Link `id` (1, 2, ... in order) from peer `peer` over a loopback pair;
  // its peer end is peerEnd(id).
  void linkUp(uint64_t id, const std::string& peer) {
    auto pair = transport::loopback::makePair();
    REQUIRE(pair.ok());
    kept.push_back(pair.value().link);
    linkUpOver(id, peer, pair.value().a, pair.value().b);
  }
  // Link `id` over `agent_end`, whose other end `peer_end` the test plays.
  void linkUpOver(uint64_t id, const std::string& peer, std::shared_ptr<transport::Transport> agent_end,
                  std::shared_ptr<transport::Transport> peer_end) {
    REQUIRE(id == peer_ends.size() + 1);
    peer_ends.push_back(std::move(peer_end));
    auto said = std::make_shared<std::vector<v1::PeerMessage>>();
    sessions.push_back(said);
    CmdLinkUp up;
    up.link_id = id;
    up.identity.peer_name = peer;
    up.identity.transport_name = "test";
    up.transport = std::move(agent_end);
    auto writer = std::make_shared<SessionWriter>(
        [said](const v1::PeerMessage& m, bool) {
          said->push_back(m);
          return true;
        },
        SessionWriter::Inline{});
    up.session = PeerSession{writer, [] {}};
    agent->post(std::move(up));
    REQUIRE(agent->runUntilIdle(50));
  }
  transport::Transport& peerEnd(uint64_t id) { return *peer_ends[id - 1]; }
  // The peer of link `id` sends the record; it waits in the agent's
  // transport once this returns.
  void peerSends(uint64_t id, const v1::ControlBatch& record) {
    REQUIRE(peerEnd(id).postControl(record.SerializeAsString()) == transport::PostResult::kOk);
    for (int i = 0; i < 4; ++i) peerEnd(id).flush();
  }
  bool finSentOn(uint64_t id) const {
    for (const auto& m : *sessions[id - 1]) {
      if (m.has_fin()) return true;
    }
    return false;
  }
  uint64_t messagesHandled() const { return metrics.counters.peer_messages_received.load(); }
};

// The agent with links from two peers: link 1 from "b", which is sent
// stream "cam", and link 2 from "c" ("dish"); no credit deadline within a test.
struct TwoPeerRig : AgentLinkRig {
  explicit TwoPeerRig(const std::function<void(Config&)>& tweak = {}) {
    config.peers = {PeerConfig{"b", "127.0.0.1:1", {"cam"}}, PeerConfig{"c", "127.0.0.1:2", {"dish"}}};
    config.credit_timeout_ms = 60000;
    config.ack_delay_us = 0;
    if (tweak) tweak(config);
    agent = std::make_unique<DataAgent>(config, metrics, clock);
    linkUp(1, "b");
    linkUp(2, "c");
  }
  void settle() { REQUIRE(agent->runUntilIdle(50)); }
  TestClient attach(uint64_t id, uint32_t role, const std::string& stream, uint32_t slots = 4) {
    TestClient c = makeClient(id, role, stream, slots, 4096);
    agent->post(CmdClientAttached{c.session});
    settle();
    return c;
  }
  // Link `id`'s peer sends `messages` in one control record.
  void record(uint64_t id, const std::vector<v1::PeerMessage>& messages) {
    v1::ControlBatch batch;
    for (const auto& m : messages) *batch.add_messages() = m;
    peerSends(id, batch);
    settle();
  }
  // ... or `m` on its Session.
  void session(uint64_t id, v1::PeerMessage m) {
    agent->post(CmdPeerMessage{id, std::make_shared<v1::PeerMessage>(std::move(m)), true});
    settle();
  }
  // The id of the stream the agent opened on link `id` for `name`.
  uint64_t opened(uint64_t id, const std::string& name) const {
    for (const auto& m : *sessions[id - 1]) {
      if (m.has_stream_open() && m.stream_open().name() == name) return m.stream_open().stream_id();
    }
    FAIL("no StreamOpen for " << name << " on link " << id);
    return 0;
  }
};

inline v1::PeerMessage streamOpenMessage(uint64_t sid, const std::string& name) {
  v1::PeerMessage m;
  m.mutable_stream_open()->set_stream_id(sid);
  m.mutable_stream_open()->set_name(name);
  return m;
}

inline v1::PeerMessage ackMessage(uint64_t sid, uint64_t sequence) {
  v1::PeerMessage m;
  m.mutable_ack()->set_stream_id(sid);
  m.mutable_ack()->add_sequences(sequence);
  return m;
}

// A record of `n` CreditLows for stream 7, which the link does not have
// open: each costs the agent a lookup, and the record is within every bound.
inline v1::ControlBatch creditLows(size_t n) {
  v1::ControlBatch record;
  for (size_t i = 0; i < n; ++i) record.add_messages()->mutable_credit_low()->set_stream_id(7);
  return record;
}

}  // namespace framelink::agent_test
