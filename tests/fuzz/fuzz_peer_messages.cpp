// libFuzzer target: the peer protocol messages a remote daemon sends on the
// control session (StreamOpen/Close, CreditGrant/Revoke/Low, Ack/Nack, Fin,
// Keepalive, and those only the handshake or rdma may carry), handed to the
// data agent's real handler through its command queue, in between what else
// a link sees (frames landing, sends completing, the transport failing, the
// link going down or being replaced) and what the local producer and consumer
// of stream "cam" (4 slots of 4 KiB each) do.  Each input gets a fresh agent,
// driven on this thread by DataAgent::runUntilIdle after every step, over
// in-memory transports that check every post (peer_fuzz_link.h).
//
// Input: records, each an op byte (low 3 bits: what, high 5: `arg`) and its
// operands; a record cut short ends the input.
//   0 message  u16 LE length, that many bytes of a serialized
//              framelink.v1.PeerMessage (records that do not parse are
//              skipped), fed 2^(arg & 7) times to link (arg >> 3) & 3:
//              0 the current one; 1 the current one, copy i naming its
//              stream id + i (many streams); 2 the previous one; 3 one that
//              never was
//   1 submit   slot u8 (mod 5: 4 is out of range), length u8 (x 32 bytes)
//   2 complete the current transport completes its sends: arg % 3 picks
//              FL_OK, FL_ERR_LINK_LOST or FL_ERR_TRANSPORT
//   3 arrive   credit u8, stream u8, sequence u8, length u8, flags u8: a
//              frame lands on the current link (credit: an index into those
//              exposed, one past them an unknown id, with flag 0x40 one that
//              was retracted; flags: 1 has a CRC32C, 2 a wrong one, 0x80
//              maybe redelivered, 0x3c attributes)
//   4 release  slot u8 (mod 5): the consumer releases it
//   5 relink   the current link goes down and a new one comes up (arg & 1:
//              from a restarted peer, a new instance)
//   6 replace  a new link comes up while the current one is still up
//   7 event    arg % 4: the current transport fails; the previous link goes
//              down; the consumer goes; the producer goes
//
// Invariants, besides no crash and no ASan/UBSan report:
//   * a message out of bounds in any state (no body, a handshake or rdma
//     message, an invalid stream name, an ACK of more than 4096 frames, an
//     offer without a frame header or with too many attribute bytes) ends
//     the session it came on, which gets exactly one Fin(PROTOCOL); no
//     message ends another link's session; every Fin the agent sends says
//     PROTOCOL, at most one per link;
//   * every post is valid and goes into a credit the peer granted on that link
//     for that stream, with that length, not revoked and not used before;
//   * the producer sees FL_OK only for a frame posted and then ACKed, once;
//   * the agent grants credits only for streams opened on that link, of the
//     consumer's slot size, each credit id once, and ACKs (and delivers) only
//     frames that landed;
//   * after each step the agent becomes idle within 100 rounds (no spinning).
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include "agent/data_agent.h"
#include "agent/peer_messages.h"
#include "agent/session_writer.h"
#include "attach/client_session.h"
#include "attach/segment.h"
#include "config/config.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "metrics/metrics.h"
#include "peer_fuzz_link.h"

using namespace framelink;
using namespace framelink::fuzz;

namespace {

constexpr size_t kMaxLinks = 16;  // further link ops are skipped
constexpr size_t kMaxRounds = 100;
constexpr uint64_t kNoLink = 1000;  // a link id the agent never heard of
constexpr int kMaxAckSequences = 4096;

// Out of bounds whatever the agent's state: it must close the link.
bool outOfBounds(const v1::PeerMessage& m) {
  switch (m.body_case()) {
    case v1::PeerMessage::kStreamOpen: {
      const std::string& name = m.stream_open().name();
      if (name.empty() || name.size() >= FL_STREAM_NAME_MAX) return true;
      for (char ch : name) {
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-') return true;
      }
      return false;
    }
    case v1::PeerMessage::kAck: {
      const auto& runs = m.ack().runs();
      if (runs.size() % 2 != 0) return true;
      // Counted in long double: a run's count may be any 64-bit number.
      long double frames = m.ack().sequences_size();
      for (int i = 0; i < runs.size(); i += 2) {
        const long double last =
            static_cast<long double>(runs[i]) + static_cast<long double>(runs[i + 1]) - 1;
        if (runs[i] == 0 || runs[i + 1] < 2 || last > static_cast<long double>(UINT64_MAX)) return true;
        frames += static_cast<long double>(runs[i + 1]);
      }
      return frames > kMaxAckSequences;
    }
    case v1::PeerMessage::kOffer:  // pull: a frame header within its bounds is needed
      return !m.offer().has_header() || m.offer().header().attributes().size() > FL_MAX_ATTR_BYTES;
    case v1::PeerMessage::kStreamClose:
    case v1::PeerMessage::kCreditGrant:
    case v1::PeerMessage::kCreditRevoke:
    case v1::PeerMessage::kCreditLow:
    case v1::PeerMessage::kNack:
    case v1::PeerMessage::kFin:
    case v1::PeerMessage::kKeepalive:
      return false;
    default:  // no body, Hello, HelloAck, FrameHeader: not after the handshake
      return true;
  }
}

// Copy i of a message fed many times, naming a stream of its own.
void shiftStreamId(v1::PeerMessage& m, uint64_t by) {
  switch (m.body_case()) {
    case v1::PeerMessage::kStreamOpen:
      m.mutable_stream_open()->set_stream_id(m.stream_open().stream_id() + by);
      break;
    case v1::PeerMessage::kStreamClose:
      m.mutable_stream_close()->set_stream_id(m.stream_close().stream_id() + by);
      break;
    case v1::PeerMessage::kCreditGrant:
      m.mutable_credit_grant()->set_stream_id(m.credit_grant().stream_id() + by);
      break;
    case v1::PeerMessage::kCreditRevoke:
      m.mutable_credit_revoke()->set_stream_id(m.credit_revoke().stream_id() + by);
      break;
    case v1::PeerMessage::kCreditLow:
      m.mutable_credit_low()->set_stream_id(m.credit_low().stream_id() + by);
      break;
    case v1::PeerMessage::kAck:
      m.mutable_ack()->set_stream_id(m.ack().stream_id() + by);
      break;
    case v1::PeerMessage::kNack:
      m.mutable_nack()->set_stream_id(m.nack().stream_id() + by);
      break;
    case v1::PeerMessage::kOffer:
      m.mutable_offer()->mutable_header()->set_stream_id(m.offer().header().stream_id() + by);
      break;
    default:
      break;
  }
}

const Config& config() {
  static const Config kConfig = [] {
    Config c;
    c.id = "local";
    // The only peer, named for the stream: frames of "cam" go there even though its consumer is
    // attached to this daemon too (the implicit route would deliver them here, design §4a).
    c.peers.push_back(PeerConfig{"remote", "127.0.0.1:1", {"cam"}});
    // No deadline passes during an input: the same input takes the same path.
    c.credit_timeout_ms = 3'600'000;
    c.ack_timeout_ms = 3'600'000;
    // Nor the coalescing timer: ACKs and credits go back by the quarter
    // rule (1 of the consumer's 4 slots) or on CreditLow.
    c.ack_delay_us = UINT32_MAX;
    return c;
  }();
  return kConfig;
}

// A client's segments, made once per role and for each input put back the
// way ClientSegments::create leaves them: making them costs more than an input.
std::shared_ptr<ClientSegments> segments(uint32_t role) {
  static std::shared_ptr<ClientSegments> made[2];
  std::shared_ptr<ClientSegments>& seg = made[role == FL_ROLE_CONSUMER ? 1 : 0];
  if (!seg) {
    SegmentRequest req;
    req.role = role;
    req.slot_count = kSlots;
    req.slot_size = kSlotSize;
    req.stream = "cam";
    req.hugepages = HugepageMode::kOff;
    auto created = ClientSegments::create(req);
    if (!created) fail("ClientSegments::create");
    seg = std::move(created).value();
  }
  const uint32_t capacity = seg->geometry().ring_capacity;
  fl_ring_init(seg->submitRing(), capacity, sizeof(fl_submit_desc));
  fl_ring_init(seg->completionRing(), capacity, sizeof(fl_completion_desc));
  __atomic_store_n(&seg->header()->daemon_state, uint32_t{FL_DAEMON_SERVING}, __ATOMIC_RELEASE);
  for (uint32_t s = 0; s < kSlots; ++s) std::memset(seg->slotHeader(s), 0, sizeof(fl_slot_header));
  return seg;
}

std::shared_ptr<ClientSession> makeClient(uint64_t id, uint32_t role) {
  auto c = std::make_shared<ClientSession>();
  c->id = id;
  c->role = role;
  c->stream = "cam";
  c->segments = segments(role);
  c->replied = true;            // its attach reply sent
  Doorbell submit, completion;  // the application's ends close: nobody rings them here
  if (!makeSubmitDoorbell(&submit) || !makeCompletionDoorbell(&completion)) std::abort();
  c->submit_doorbell = std::move(submit.daemon_end);
  c->completion_doorbell = std::move(completion.daemon_end);
  c->completion_reader = std::move(completion.reader);
  c->ring_capacity = c->segments->geometry().ring_capacity;
  c->slots.resize(kSlots);
  return c;
}

// One input: a fresh agent with a producer, a consumer and a first link.
class Run {
 public:
  Run() : agent_(std::make_unique<DataAgent>(config(), metrics())) {
    ledger_.producer = makeClient(1, FL_ROLE_PRODUCER);
    consumer_ = makeClient(2, FL_ROLE_CONSUMER);
    agent_->post(CmdClientAttached{ledger_.producer});
    agent_->post(CmdClientAttached{consumer_});
    linkUp(instance_);
    settle();
  }

  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  // Ends the input: the agent goes, then what it sent on each link is held
  // to the invariants.
  void finish() {
    agent_.reset();
    std::set<uint64_t> credit_ids;
    for (auto& l : links_) {
      int fins = 0;
      std::set<uint32_t> announced;  // the agent's slot regions on this link
      auto grantOnce = [&](uint64_t id) {
        if (!credit_ids.insert(id).second) fail("the agent granted one credit id twice");
      };
      for (const v1::PeerMessage& m : l->session.take()) {
        if (m.has_fin()) {
          ++fins;
          if (m.fin().code() != v1::ERROR_CODE_PROTOCOL) {
            fail("the agent sent a Fin that does not say PROTOCOL");
          }
        } else if (m.has_credit_grant()) {
          if (l->opened.count(m.credit_grant().stream_id()) == 0) {
            fail("the agent granted credits for a stream the peer never opened on that link");
          }
          for (const auto& c : m.credit_grant().credits()) {
            if (c.length() != kSlotSize) fail("the agent granted a credit of another size than the slot");
            grantOnce(c.credit_id());
          }
          for (const auto& r : m.credit_grant().regions()) {
            if (!announced.insert(r.region_id()).second) fail("the agent announced a slot region twice");
            if (r.slot_bytes() != kSlotSize || r.slot_count() != kSlots) {
              fail("the agent announced a slot region that is not its consumer's slots");
            }
          }
          for (uint64_t id : m.credit_grant().slot_credits()) {
            if (announced.count(static_cast<uint32_t>(id >> 52)) == 0) {
              fail("the agent granted a slot credit of a region it had not announced on that link");
            }
            if (((id >> 32) & 0xFFFFF) >= kSlots) fail("the agent granted a slot credit past its region");
            grantOnce(id);
          }
        } else if (m.has_credit_revoke()) {
          for (uint32_t id : m.credit_revoke().retired_regions()) {
            if (announced.erase(id) == 0) fail("the agent retired a slot region it had not announced");
          }
        } else if (m.has_ack()) {
          const auto decoded = peer::decode(m);
          const auto* ack = std::get_if<peer::Ack>(&decoded);
          if (ack == nullptr)
            fail("the agent sent an ACK its peer refuses (malformed run, or over the bound)");
          if (ack->sequences.size() > size_t{kMaxAckSequences})
            fail("the agent sent an ACK over its own bound");
          for (uint64_t seq : ack->sequences) {
            if (ledger_.landed.count({m.ack().stream_id(), seq}) == 0) {
              fail("the agent ACKed a frame that never landed");
            }
          }
        }
      }
      if (fins > 1) fail("the agent sent more than one Fin on a link");
      if (l->must_fin && fins != 1) fail("an out-of-bounds message did not get its link a Fin(PROTOCOL)");
    }
  }

  // Runs the records of one input; returns at the first one cut short.
  void feed(const uint8_t* data, size_t size) {
    size_t pos = 0;
    auto take = [&](size_t n) -> const uint8_t* {
      if (size - pos < n) return nullptr;
      const uint8_t* p = data + pos;
      pos += n;
      return p;
    };
    while (pos < size) {
      const uint8_t op = data[pos++];
      const unsigned arg = op >> 3;
      switch (op & 7) {
        case 0: {
          const uint8_t* len = take(2);
          if (len == nullptr) return;
          const size_t n = std::min<size_t>(len[0] | (size_t{len[1]} << 8), size - pos);
          const uint8_t* bytes = take(n);
          auto message = std::make_shared<v1::PeerMessage>();
          if (!message->ParseFromArray(bytes, static_cast<int>(n))) break;
          const unsigned target = (arg >> 3) & 3;
          LinkState* l = target <= 1 ? current() : target == 2 ? previous() : nullptr;
          peerSays(l, std::move(message), 1u << (arg & 7), target == 1);
          break;
        }
        case 1: {
          const uint8_t* b = take(2);
          if (b == nullptr) return;
          submit(b[0] % (kSlots + 1), uint64_t{b[1]} * 32);
          break;
        }
        case 2: {
          static constexpr int kStatus[3] = {FL_OK, FL_ERR_LINK_LOST, FL_ERR_TRANSPORT};
          current()->transport->completeSends(kStatus[arg % 3]);
          settle();
          break;
        }
        case 3: {
          const uint8_t* b = take(5);
          if (b == nullptr) return;
          current()->transport->arrive(b);
          settle();
          break;
        }
        case 4: {
          const uint8_t* b = take(1);
          if (b == nullptr) return;
          release(b[0] % (kSlots + 1));
          break;
        }
        case 5:
          if (links_.size() >= kMaxLinks) break;
          linkDown(current());
          linkUp((arg & 1) ? ++instance_ : instance_);
          settle();
          break;
        case 6:
          if (links_.size() >= kMaxLinks) break;
          linkUp(instance_);
          settle();
          break;
        case 7:
          switch (arg % 4) {
            case 0:
              current()->transport->failLink();
              break;
            case 1:
              if (LinkState* l = previous()) linkDown(l);
              break;
            case 2:
              agent_->post(CmdClientGone{consumer_->id});
              break;
            case 3:
              agent_->post(CmdClientGone{ledger_.producer->id});
              break;
          }
          settle();
          break;
      }
    }
  }

 private:
  static Metrics& metrics() {
    static Metrics m;  // counters only: nothing reads them back into the agent
    return m;
  }

  LinkState* current() { return links_.back().get(); }
  LinkState* previous() { return links_.size() >= 2 ? links_[links_.size() - 2].get() : nullptr; }

  void linkUp(uint64_t instance) {
    auto l = std::make_unique<LinkState>();
    l->id = links_.size() + 1;
    l->up = true;
    l->transport = std::make_shared<FakeTransport>(*l, ledger_);
    CmdLinkUp up;
    up.link_id = l->id;
    up.identity.peer_name = "remote";
    up.identity.peer_instance = instance;
    up.identity.transport_name = "fuzz";
    up.transport = l->transport;
    up.session = PeerSession{l->session.writer(), [state = l.get()] { ++state->cancels; }};
    agent_->post(std::move(up));
    links_.push_back(std::move(l));
  }

  void linkDown(LinkState* l) {
    if (!l->up) return;
    l->up = false;
    agent_->post(CmdLinkDown{l->id, "the fuzz input took it down"});
  }

  void peerSays(LinkState* l, std::shared_ptr<v1::PeerMessage> m, unsigned copies, bool spread) {
    std::vector<int> before;
    for (auto& other : links_) before.push_back(other->cancels);
    for (unsigned i = 0; i < copies; ++i) {
      std::shared_ptr<v1::PeerMessage> copy = m;
      if (spread && i > 0) {
        copy = std::make_shared<v1::PeerMessage>(*m);
        shiftStreamId(*copy, i);
      }
      if (l != nullptr && (spread || i == 0)) note(*l, *copy, spread ? 1 : copies);
      if (l != nullptr && isPerFrameMessage(*copy)) {
        // Protocol 2: per-frame messages come in control records on the transport.
        l->transport->controlArrives(*copy);
      } else {
        agent_->post(CmdPeerMessage{l != nullptr ? l->id : kNoLink, std::move(copy), /*from_session=*/true});
      }
    }
    settle();
    for (size_t i = 0; i < links_.size(); ++i) {
      if (links_[i].get() != l && links_[i]->cancels != before[i]) {
        fail("a message on one link ended another link's session");
      }
    }
    if (l == nullptr || !l->up || !outOfBounds(*m)) return;
    const size_t index = static_cast<size_t>(l->id - 1);
    if (before[index] == 0) {
      if (l->cancels == 0) fail("an out-of-bounds message did not end its session");
      l->must_fin = true;
    }
  }

  // What the peer said (`copies` times) that later posts, completions and
  // ACKs are held to.
  void note(LinkState& l, const v1::PeerMessage& m, unsigned copies) {
    switch (m.body_case()) {
      case v1::PeerMessage::kStreamOpen:
        if (!outOfBounds(m)) l.opened.insert(m.stream_open().stream_id());
        break;
      case v1::PeerMessage::kCreditGrant: {
        const auto& g = m.credit_grant();
        for (const auto& c : g.credits()) l.granted[{g.stream_id(), c.credit_id(), c.length()}] += copies;
        // A region's slot credits are the slots it holds; one announced
        // again or out of bounds closes the link instead.
        for (const auto& r : g.regions()) {
          if (r.region_id() >= 1 && r.region_id() < 4096 && r.slot_bytes() > 0 && r.slot_count() >= 1 &&
              r.slot_count() <= (1u << 20)) {
            l.regions.emplace(r.region_id(), std::make_pair(r.slot_bytes(), r.slot_count()));
          }
        }
        for (uint64_t id : g.slot_credits()) {
          auto r = l.regions.find(static_cast<uint32_t>(id >> 52));
          if (r != l.regions.end() && ((id >> 32) & 0xFFFFF) < r->second.second) {
            l.granted[{g.stream_id(), id, r->second.first}] += copies;
          }
        }
        break;
      }
      case v1::PeerMessage::kCreditRevoke:
        for (uint32_t id : m.credit_revoke().retired_regions()) l.regions.erase(id);
        for (uint64_t id : m.credit_revoke().credit_ids()) {
          const uint64_t stream = m.credit_revoke().stream_id();
          auto it = l.granted.lower_bound({stream, id, 0});
          while (it != l.granted.end() && std::get<0>(it->first) == stream && std::get<1>(it->first) == id) {
            it = l.granted.erase(it);
          }
        }
        break;
      case v1::PeerMessage::kAck: {
        // What the agent takes of it: a malformed one closes the link instead.
        const auto decoded = peer::decode(m);
        if (const auto* ack = std::get_if<peer::Ack>(&decoded)) {
          for (uint64_t seq : ack->sequences) {
            const StreamSeq key{m.ack().stream_id(), seq};
            if (ledger_.posted.count(key) != 0) ledger_.acked.insert(key);
          }
        }
        break;
      }
      default:
        break;
    }
  }

  void submit(uint32_t slot, uint64_t length) {
    ClientSession& p = *ledger_.producer;
    if (slot < kSlots) p.segments->slotHeader(slot)->frame_id = ++frame_id_;
    fl_submit_desc d{slot, 0, length};
    if (fl_ring_push(p.segments->submitRing(), p.ring_capacity, sizeof d, &d) != FL_RING_OK) return;
    settle();
  }

  void release(uint32_t slot) {
    fl_submit_desc d{slot, 0, 0};
    if (fl_ring_push(consumer_->segments->submitRing(), consumer_->ring_capacity, sizeof d, &d) !=
        FL_RING_OK) {
      return;
    }
    settle();
  }

  // Lets the agent handle everything posted so far, then checks what it
  // completed to the applications.
  void settle() {
    if (!agent_->runUntilIdle(kMaxRounds)) fail("the agent still finds work after 100 rounds: it would spin");
    fl_completion_desc d;
    ClientSession& p = *ledger_.producer;
    while (fl_ring_pop(p.segments->completionRing(), p.ring_capacity, sizeof d, &d) == FL_RING_OK) {
      if (d.status != FL_OK) continue;
      if (d.slot >= kSlots) fail("the producer got FL_OK for a slot it does not have");
      bool acked = false;
      for (const auto& [key, slot] : ledger_.posted) {
        if (key.second == d.sequence && slot == d.slot && ledger_.acked.count(key) != 0) {
          acked = true;
          if (!ledger_.delivered.insert(key).second) fail("the producer got FL_OK twice for one frame");
        }
      }
      if (!acked) fail("the producer got FL_OK for a frame the peer did not ACK after it was posted");
    }
    while (fl_ring_pop(consumer_->segments->completionRing(), consumer_->ring_capacity, sizeof d, &d) ==
           FL_RING_OK) {
      if (d.status != FL_OK) continue;
      if (d.slot >= kSlots) fail("the consumer got a frame in a slot it does not have");
      // The producer's own frames reach it too, from the producer's slot
      // beside the peer (the stream is routed there by name): not the peer's.
      if (consumer_->slots[d.slot].consumer.local_from != 0) continue;
      bool landed = false;
      for (const auto& key : ledger_.landed) landed = landed || key.second == d.sequence;
      if (!landed) fail("the consumer got a frame that never landed");
    }
  }

  Ledger ledger_;
  std::shared_ptr<ClientSession> consumer_;
  std::vector<std::unique_ptr<LinkState>> links_;  // by id - 1
  uint64_t instance_ = 1;
  uint64_t frame_id_ = 0;
  // Last, so it goes first: it calls back into the links (cancel) and its
  // transports into the ledger.
  std::unique_ptr<DataAgent> agent_;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // FRAMELINK_FUZZ_LOG=debug shows what the agent made of an input (to reproduce one).
  const char* level = std::getenv("FRAMELINK_FUZZ_LOG");
  spdlog::set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::off);
  // Not a line per string field that is not UTF-8 (such a message does not parse: skipped).
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Run run;
  run.feed(data, size);
  run.finish();
  return 0;
}