// What the tests of hostile_peer.h have the peer say, and read back from
// what it received: a daemon pair for it to dial, StreamOpen, frame headers,
// offers, and the credits and NACKs it was sent.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "harness.h"
#include "hostile_peer.h"
#include "hostile_util.h"

namespace framelink::integ {

namespace v1 = framelink::v1;

inline DaemonPair::Options pairOf(const std::string& transport, std::vector<std::string> extra_b = {}) {
  DaemonPair::Options o = pairOptions();
  o.transport = transport;
  o.extra_args_b = std::move(extra_b);
  return o;
}

inline v1::PeerMessage streamOpen(uint64_t stream_id, const std::string& name) {
  v1::PeerMessage m;
  m.mutable_stream_open()->set_stream_id(stream_id);
  m.mutable_stream_open()->set_name(name);
  return m;
}

// The credit ids the daemon granted the peer on `stream_id` so far.
inline std::vector<uint64_t> grantedCredits(const PeerInbox& inbox, uint64_t stream_id) {
  std::vector<uint64_t> ids;
  auto collect = [&](const v1::PeerMessage& m) {
    if (!m.has_credit_grant() || m.credit_grant().stream_id() != stream_id) return;
    for (const auto& c : m.credit_grant().credits()) ids.push_back(c.credit_id());
    for (uint64_t id : m.credit_grant().slot_credits()) ids.push_back(id);
  };
  for (const auto& m : inbox.session) collect(m);
  for (const auto& m : inbox.control) collect(m);
  return ids;
}

// Opens `name` as stream `stream_id` from the peer and waits for credits.
inline std::vector<uint64_t> openAndAwaitCredits(HostilePeer& peer, uint64_t stream_id,
                                                 const std::string& name) {
  REQUIRE(peer.sendSession(streamOpen(stream_id, name)));
  std::vector<uint64_t> ids;
  REQUIRE(peer.waitFor(
      [&](const PeerInbox& in) {
        ids = grantedCredits(in, stream_id);
        return !ids.empty();
      },
      Millis(5000)));
  return ids;
}

inline v1::FrameHeader frameHeader(uint64_t stream_id, uint64_t sequence, uint64_t credit_id,
                                   uint64_t length) {
  v1::FrameHeader h;
  h.set_stream_id(stream_id);
  h.set_sequence(sequence);
  h.set_credit_id(credit_id);
  h.set_frame_id(1000 + sequence);
  h.set_length(length);
  return h;
}

inline size_t nacksOf(const PeerInbox& in, uint64_t stream_id, uint64_t sequence, v1::ErrorCode code) {
  return countMessages(in, [&](const v1::PeerMessage& m) {
    return m.has_nack() && m.nack().stream_id() == stream_id && m.nack().sequence() == sequence &&
           m.nack().code() == code;
  });
}

inline uint64_t helloSession(int n) { return 0x40571130 + n; }

// A peer that dials B of `pair` over `transport`.
inline HostilePeer::Options peerOf(DaemonPair& pair, const std::string& id, int n,
                                   const std::string& transport) {
  HostilePeer::Options o;
  o.address = pair.b().grpcAddress();
  o.daemon_id = id;
  o.session_id = helloSession(n);
  o.transport = transport;
  return o;
}

inline v1::PeerMessage offer(const v1::FrameHeader& header, uint64_t source_id) {
  v1::PeerMessage m;
  *m.mutable_offer()->mutable_header() = header;
  m.mutable_offer()->set_source_id(source_id);
  return m;
}

inline bool grantsSay(const PeerInbox& in, uint64_t stream_id, bool pull) {
  return countMessages(in, [&](const v1::PeerMessage& m) {
           return m.has_credit_grant() && m.credit_grant().stream_id() == stream_id &&
                  m.credit_grant().pull() == pull;
         }) > 0;
}

// B with the hostile peer as its only configured peer: every stream a
// producer on B opens goes to it.  The address is never dialed successfully;
// the peer dials in under that id.
inline DaemonPair::Options pairRoutingTo(const std::string& transport, const std::string& peer_id) {
  return pairOf(transport, {"--peer", peer_id + "=127.0.0.1:1"});
}

// Waits for the daemon to open `name` to the peer; its stream id.
inline uint64_t awaitStreamOpen(HostilePeer& peer, const std::string& name) {
  uint64_t id = 0;
  REQUIRE(peer.waitFor(
      [&](const PeerInbox& in) {
        for (const auto& m : in.session) {
          if (m.has_stream_open() && m.stream_open().name() == name) id = m.stream_open().stream_id();
        }
        return id != 0;
      },
      Millis(5000)));
  return id;
}

// Grants `count` whole credits of `bytes` each, ids first..first+count-1.
inline v1::PeerMessage grant(uint64_t stream_id, uint64_t first, size_t count, uint64_t bytes) {
  v1::PeerMessage m;
  auto* g = m.mutable_credit_grant();
  g->set_stream_id(stream_id);
  g->set_largest_slot(bytes);
  for (size_t i = 0; i < count; ++i) {
    auto* c = g->add_credits();
    c->set_credit_id(first + i);
    c->set_length(bytes);
  }
  return m;
}

inline v1::PeerMessage ackRun(uint64_t stream_id, uint64_t first, uint64_t count) {
  v1::PeerMessage m;
  m.mutable_ack()->set_stream_id(stream_id);
  m.mutable_ack()->add_runs(first);
  m.mutable_ack()->add_runs(count);
  return m;
}

}  // namespace framelink::integ
