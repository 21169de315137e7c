// InboundStreams on its own, for the consumer side's unit tests: a manual
// clock, consumers and links (from any peer and instance) added as a test
// needs them, frames landed as a transport reports them, and what the
// streams said on each link read back off its control batch.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "agent/inbound_streams.h"
#include "agent/peer_messages.h"
#include "agent_fixture.h"
#include "forwarding_transport.h"

namespace framelink {
namespace agent_test {

// Lands sequence `seq` of stream `sid` in whichever of `consumer`'s slots is
// credited on `l` to that stream (any stream when `sid` is 0), as the
// transport reports a frame; the slot, or -1 when none is credited.
inline int landFrame(InboundStreams& inbound, const TestClient& consumer, AgentLink& l, uint64_t sid,
                     uint64_t seq) {
  for (uint32_t s = 0; s < consumer.session->slots.size(); ++s) {
    const SlotEntry& e = consumer.session->slots[s];
    if (e.state != SlotState::kCredited || e.link_id != l.id) continue;
    if (sid != 0 && e.stream_id != sid) continue;
    transport::TransportEvent ev;
    ev.kind = transport::TransportEvent::Kind::kFrameArrived;
    ev.header.stream_id = sid != 0 ? sid : 42;
    ev.header.sequence = seq;
    ev.header.credit_id = e.consumer.credit_id;
    ev.header.length = 10;
    inbound.onFrameArrived(l, ev);
    return static_cast<int>(s);
  }
  return -1;
}

// Forwards to a tcp transport; like rdma behind a send queue the peer stalls, the window of a
// credit it exposed stays open once the credit ended -- until the test shuts them all.
class WindowKeeper final : public framelink::testing::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  bool shut = false;

  const char* name() const noexcept override { return "window-keeper"; }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit credit) override {
    exposed_.insert(credit.credit_id);
    return ForwardingTransport::exposeCredit(std::move(credit));
  }
  bool windowOpen(uint64_t credit_id) const noexcept override {
    return !shut && exposed_.count(credit_id) != 0;
  }

 private:
  std::set<uint64_t> exposed_;
};

struct InboundRig {
  using WrapTransport =
      std::function<std::unique_ptr<transport::Transport>(std::unique_ptr<transport::Transport>)>;

  Metrics metrics;
  Capture capture;  // outlives the links' session writers
  NameTable names;
  PeerTable peers;
  LinkTable links;
  ClientTable clients{metrics, names};
  ManualClock clock;
  InboundStreams inbound;
  std::deque<TestClient> consumers;
  std::vector<std::unique_ptr<transport::Transport>> peer_ends;

  // `ack_delay_ns`: how long a release's ACK and credit may wait (0: the end of the round).
  explicit InboundRig(InboundStreams::Limits limits = {}, uint64_t ack_delay_ns = 0)
      : inbound(metrics, clients, links, names, clock, ack_delay_ns, limits) {}
  ~InboundRig() {
    for (auto& [id, l] : links) {
      if (l.session.writer) l.session.writer->close();
    }
  }

  AgentClient& consumer(uint64_t id, const std::string& stream, uint32_t slots = 4) {
    consumers.push_back(makeClient(id, FL_ROLE_CONSUMER, stream, slots, 4096));
    AgentClient& ac = clients.add(consumers.back().session);
    inbound.onConsumerAttached(ac);
    return ac;
  }
  // A link from `peer`, up, with no stream open yet; `wrap`, when given,
  // wraps its tcp transport.
  AgentLink& linkUp(uint64_t id, const std::string& peer = "sender", uint64_t instance = 9,
                    const WrapTransport& wrap = {}) {
    TcpPair pair = makeTcpPair();
    AgentLink& l = links.add(id);
    l.peer = peers.resolve(peer);
    l.peer_name = peer;
    l.peer_instance = instance;
    l.transport = wrap ? wrap(std::move(pair.a)) : std::move(pair.a);
    peer_ends.push_back(std::move(pair.b));
    l.session.writer =
        std::make_shared<SessionWriter>([this](const v1::PeerMessage& m, bool) { return capture.write(m); },
                                        std::chrono::milliseconds(60000));
    inbound.onLinkUp(l);
    return l;
  }
  // The link goes, as the data agent takes it down.
  void linkDown(uint64_t id) {
    AgentLink* l = links.find(id);
    REQUIRE(l != nullptr);
    inbound.onLinkDown(*l);
    l->session.writer->close();
    links.erase(id);
    inbound.retractCreditsOfLink(id);
  }
  std::string open(AgentLink& l, uint64_t sid, const std::string& name) {
    return inbound.onStreamOpen(l, peer::StreamOpen{sid, name});
  }
  // The slots of consumer `index` credited (on any link).
  size_t credited(size_t index) const {
    size_t n = 0;
    for (const SlotEntry& e : consumers[index].session->slots) n += e.state == SlotState::kCredited ? 1 : 0;
    return n;
  }
  // Sequence `seq` of stream `sid` lands in a slot credited on `l` to that
  // stream; false when none is.
  bool land(AgentLink& l, uint64_t sid, uint64_t seq) {
    for (const TestClient& c : consumers) {
      if (landFrame(inbound, c, l, sid, seq) >= 0) return true;
    }
    return false;
  }
  // Consumer `index` takes the frame delivered next and releases it; its
  // sequence, or 0 when none was delivered.
  uint64_t takeAndRelease(size_t index = 0) {
    fl_completion_desc d{};
    TestClient& c = consumers[index];
    if (fl_ring_pop(c.completion(), c.cap(), sizeof d, &d) != FL_RING_OK) return 0;
    inbound.onRelease(*clients.find(c.session->id), fl_submit_desc{d.slot, 0, 0});
    return d.sequence;
  }

  // The end of a round: what goes on each link's transport is decided.  The
  // ACKed sequences and NACKs of link `l` so far, taken off its batch.
  struct Said {
    std::vector<uint64_t> acked;
    std::vector<std::pair<uint64_t, int>> nacked;  // (sequence, code)
  };
  Said said(AgentLink& l) {
    inbound.flushControl();
    Said out;
    for (const auto& m : l.control.messages()) {
      const peer::Message decoded = peer::decode(m);
      if (const auto* ack = std::get_if<peer::Ack>(&decoded)) {
        out.acked.insert(out.acked.end(), ack->sequences.begin(), ack->sequences.end());
      }
      if (const auto* nack = std::get_if<peer::Nack>(&decoded))
        out.nacked.emplace_back(nack->sequence, nack->code);
    }
    l.control.Clear();
    return out;
  }
  // The credits revoked (recalled or withdrawn) on `l` so far, taken off its batch.
  std::vector<uint64_t> revoked(AgentLink& l) {
    inbound.flushControl();
    std::vector<uint64_t> ids;
    for (const auto& m : l.control.messages()) {
      if (m.has_credit_revoke()) {
        for (uint64_t id : m.credit_revoke().credit_ids()) ids.push_back(id);
      }
    }
    l.control.Clear();
    return ids;
  }
};

}  // namespace agent_test
}  // namespace framelink
