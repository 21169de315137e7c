// What the peer-message fuzzer (fuzz_peer_messages.cpp) gives the data agent
// as one link, and what it remembers of each: the control session the agent
// writes on, and an in-memory data transport that checks every post against
// the credits the peer granted on that link.
#pragma once

#include <sys/eventfd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/session_writer.h"
#include "attach/client_session.h"
#include "framelink/framelink.h"
#include "transport/transport.h"

namespace framelink::fuzz {

using transport::FrameHeader;
using transport::LocalCredit;
using transport::PostResult;
using transport::RemoteCredit;
using transport::SendRequest;
using transport::TransportEvent;

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotSize = 4096;

// A broken invariant: say which, then crash so libFuzzer keeps the input.
[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "fuzz_peer_messages: %s\n", what);
  std::abort();
}

using StreamSeq = std::pair<uint64_t, uint64_t>;  // (stream id, sequence)

// The control session of one link: the agent's writer and what it wrote.
// The writer writes on the agent's thread as the agent sends (no writer
// thread), so what the agent sent is all here when it returns.
class Session {
 public:
  Session()
      : writer_(std::make_shared<SessionWriter>(
            [this](const v1::PeerMessage& m, bool) {
              messages_.push_back(m);
              return true;
            },
            SessionWriter::Inline{})) {}
  ~Session() { writer_->close(); }  // the agent may still hold the writer: it writes nowhere now
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::shared_ptr<SessionWriter>& writer() const { return writer_; }

  // Everything the agent sent since the last call, on the Session and in
  // control records on the transport, in the order it sent them.
  std::vector<v1::PeerMessage> take() { return std::exchange(messages_, {}); }
  void recordInBand(const v1::PeerMessage& m) { messages_.push_back(m); }

 private:
  std::vector<v1::PeerMessage> messages_;
  std::shared_ptr<SessionWriter> writer_;
};

class FakeTransport;

struct LinkState {
  uint64_t id = 0;
  bool up = false;            // the agent was told it is up, and not yet that it is down
  int cancels = 0;            // times the agent ended the session (called on this thread)
  bool must_fin = false;      // an out-of-bounds message came while the session was open
  std::set<uint64_t> opened;  // stream ids of valid StreamOpens the peer sent on it
  // Credits the peer granted on it, not revoked or used yet: how many of
  // each (stream, credit id, length).
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, uint64_t> granted;
  // Slot regions the peer announced on it, not retired: (slot bytes, slot count) by id.
  std::map<uint32_t, std::pair<uint64_t, uint32_t>> regions;
  std::shared_ptr<FakeTransport> transport;
  Session session;
};

// What every link of one input saw, for the invariants.
struct Ledger {
  std::shared_ptr<ClientSession> producer;
  std::map<StreamSeq, uint32_t> posted;  // producer frames posted: the slot of each
  std::set<StreamSeq> acked;             // ACKed by the peer after they were posted
  std::set<StreamSeq> delivered;         // completed FL_OK to the producer
  std::set<StreamSeq> landed;            // frames that landed in a consumer's credit
};

// The data transport of one link, in memory: posts complete when the input
// says so, frames land when it says so.
class FakeTransport final : public transport::Transport {
 public:
  FakeTransport(LinkState& link, Ledger& ledger)
      : link_(link), ledger_(ledger), event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  const char* name() const noexcept override { return "fuzz"; }
  bool connected() const noexcept override { return !down_; }

  Result<RemoteCredit> exposeCredit(LocalCredit credit) override {
    if (down_) return makeError(FL_ERR_LINK_LOST, "the fuzz transport is down");
    if (!exposed_.insert(credit.credit_id).second) fail("the agent exposed a credit id twice on one link");
    if (credit.buffer == nullptr || credit.capacity == 0) fail("the agent exposed an empty receive buffer");
    RemoteCredit remote;
    remote.credit_id = credit.credit_id;
    remote.length = credit.capacity;
    credits_.emplace(credit.credit_id, std::move(credit));
    return remote;
  }

  void retractCredit(uint64_t credit_id) override {
    if (credits_.erase(credit_id) != 0) retracted_.push_back(credit_id);
  }

  PostResult post(const SendRequest& r) noexcept override {
    if (down_) return PostResult::kNotConnected;
    const FrameHeader& h = r.header;
    if (h.credit_id != r.credit.credit_id || h.length > r.credit.length ||
        h.attr_length > FL_MAX_ATTR_BYTES || (r.payload == nullptr && h.length != 0)) {
      fail("the agent posted a malformed request (credit, length or attributes)");
    }
    uint32_t slot = kSlots;
    for (uint32_t s = 0; s < kSlots; ++s) {
      if (r.payload == ledger_.producer->segments->slot(s)) slot = s;
    }
    if (slot == kSlots || h.length > kSlotSize) {
      fail("the agent posted a payload that is not a producer slot");
    }
    (void)fl_crc32c(0, r.payload, h.length);  // reads it as a transport would
    auto it = link_.granted.find({h.stream_id, h.credit_id, r.credit.length});
    if (it == link_.granted.end()) {
      fail(
          "the agent posted into a credit the peer did not grant on this link (or revoked, or used already)");
    }
    if (--it->second == 0) link_.granted.erase(it);
    ledger_.posted[{h.stream_id, h.sequence}] = slot;
    in_flight_.push_back(InFlight{r.cookie, slot, h.sequence});
    return PostResult::kOk;
  }

  PostResult postControl(std::string record) noexcept override {
    if (down_) return PostResult::kNotConnected;
    if (record.empty() || record.size() > transport::kMaxControlBytes) {
      fail("the agent posted a control record out of bounds");
    }
    v1::ControlBatch batch;
    if (!batch.ParseFromString(record)) fail("the agent posted a control record that is not a ControlBatch");
    for (const v1::PeerMessage& m : batch.messages()) {
      if (!isPerFrameMessage(m)) fail("the agent put a Session message in a control record");
      link_.session.recordInBand(m);
    }
    return PostResult::kOk;
  }

  // The peer's control record lands.
  void controlArrives(const v1::PeerMessage& m) {
    if (down_) return;
    v1::ControlBatch batch;
    *batch.add_messages() = m;
    TransportEvent ev;
    ev.kind = TransportEvent::Kind::kControl;
    ev.control = batch.SerializeAsString();
    events_.push_back(std::move(ev));
  }

  size_t poll(TransportEvent* out, size_t max) noexcept override {
    size_t n = 0;
    while (n < max && !events_.empty()) {
      out[n++] = std::move(events_.front());
      events_.pop_front();
    }
    return n;
  }

  int eventFd() const noexcept override { return event_fd_.get(); }
  transport::TransportCounters counters() const noexcept override { return {}; }

  void shutdown() noexcept override {
    // The daemon stopping fails every frame first (FL_ERR_SHUTDOWN), while
    // it still owns every producer's segment: no ownership check here.
    down_ = true;
    completeSends(FL_ERR_LINK_LOST, /*check_owner=*/false);
  }

  // ---- the input's side ----
  void completeSends(int status, bool check_owner = true) {
    for (const InFlight& p : in_flight_) {
      // Until this completion the transport may read the slot: the agent
      // must not have ended the frame and handed the slot back.
      const SlotEntry& e = ledger_.producer->slots[p.slot];
      if (check_owner && (e.state == SlotState::kFree || e.sequence != p.sequence)) {
        fail("the agent ended a frame while a transport still held a post of its payload");
      }
      TransportEvent ev;
      ev.kind = TransportEvent::Kind::kSendComplete;
      ev.cookie = p.cookie;
      ev.status = down_ && status == FL_OK ? FL_ERR_LINK_LOST : status;
      events_.push_back(std::move(ev));
    }
    in_flight_.clear();
  }

  // The link broke: one LinkError, then every send still in flight fails.
  void failLink() {
    if (down_) return;
    TransportEvent ev;
    ev.kind = TransportEvent::Kind::kLinkError;
    ev.status = FL_ERR_LINK_LOST;
    ev.message = "the fuzz input broke the link";
    events_.push_back(std::move(ev));
    down_ = true;
    completeSends(FL_ERR_LINK_LOST);
  }

  void arrive(const uint8_t* b) {
    if (down_) return;
    const uint8_t which = b[0], flags = b[4];
    TransportEvent ev;
    ev.kind = TransportEvent::Kind::kFrameArrived;
    ev.header.stream_id = b[1];
    ev.header.sequence = b[2];
    ev.header.frame_id = b[2];
    ev.header.maybe_redelivered = (flags & 0x80) ? 1 : 0;
    const size_t index = which % (credits_.size() + 1);
    if (index == credits_.size()) {
      // What a byte-stream transport reports for a credit it does not have.
      ev.status = FL_ERR_UNKNOWN_CREDIT;
      ev.message = "frame for an unknown credit";
      ev.header.credit_id =
          (!retracted_.empty() && (flags & 0x40)) ? retracted_[which % retracted_.size()] : 1'000'000 + which;
      events_.push_back(std::move(ev));
      return;
    }
    auto it = std::next(credits_.begin(), static_cast<std::ptrdiff_t>(index));
    const LocalCredit& credit = it->second;
    FrameHeader& h = ev.header;
    h.credit_id = credit.credit_id;
    h.length = (uint64_t{b[3]} * 17) % (credit.capacity + 1);
    std::memset(credit.buffer, b[2], h.length);
    h.attr_length = (((flags >> 2) & 0x0f) * 13u) % (FL_MAX_ATTR_BYTES + 1);
    std::memset(h.attrs, 'a', h.attr_length);
    if (flags & 1) {
      h.has_crc32c = 1;
      h.crc32c = fl_crc32c(0, credit.buffer, h.length) ^ ((flags >> 1) & 1);
    }
    credits_.erase(it);  // consumed by this frame
    ledger_.landed.insert({h.stream_id, h.sequence});
    events_.push_back(std::move(ev));
  }

 private:
  LinkState& link_;
  Ledger& ledger_;
  UniqueFd event_fd_;
  bool down_ = false;
  std::map<uint64_t, LocalCredit> credits_;  // exposed, not consumed or retracted
  std::set<uint64_t> exposed_;               // every credit id ever exposed
  std::vector<uint64_t> retracted_;
  struct InFlight {
    uint64_t cookie;
    uint32_t slot;
    uint64_t sequence;
  };
  std::vector<InFlight> in_flight_;  // posts not completed yet
  std::deque<TransportEvent> events_;
};

}  // namespace framelink::fuzz
