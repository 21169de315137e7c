// libFuzzer target: the grpc data transport's reassembly of chunked frames
// (GrpcTransport::handleBuffer, the reader's step for one received
// DataMessage) with credits granted and retracted between the messages.  A
// hostile peer sends chunks with any header, credit id, offset, length and
// `last`, control records between them, and raw bytes that may not parse;
// the daemon exposes, retracts and re-exposes credits meanwhile (retraction
// on the same thread between two messages: the lock that orders it against a
// copy on another thread is test_transport_retract_mid_frame.cpp's).
//
// Four slots, each a separate heap buffer exactly its credit's capacity
// (ASan reports a write past one), filled with a canary on every grant.
// Every grant is a fresh credit id (ids are unique per link), at most one
// live credit per slot; a header names a recent id: live, retracted,
// consumed, or never granted.  Each frame's payload bytes are one tag byte,
// unique per frame header sent.
// Invariants, after every message:
//   * a retracted slot keeps every byte it had when retractCredit returned,
//     until the slot is granted again;
//   * a slot holds only the canary and tags of frames whose header named its
//     live credit while it was live;
//   * a FrameArrived with FL_OK names the credit of the frame the last header
//     began, live from that header to now, with a length within its slot;
//   * a message the reader refuses fails the link with exactly one LinkError,
//     and every refusal is one (no crash, no silent stop).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "transport/grpc/grpc_transport.h"
#include "transport/grpc/grpc_wire.h"

using namespace framelink;
using namespace framelink::transport;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_grpc_reassembly: %s\n", what);
  std::abort();
}

constexpr uint8_t kCanary = 0xA5;
constexpr size_t kSlots = 4;
constexpr size_t kCapacity[kSlots] = {1, 64, 1000, 5000};

// The reader half of a grpc transport with no call under it: messages go in
// through handleBuffer, as the reader thread hands them over.
class ReaderOnly final : public GrpcTransport {
 public:
  explicit ReaderOnly(std::unique_ptr<LockedLinkBookkeeping> core)
      : GrpcTransport("fuzz-peer", GrpcTransportOptions{}, std::move(core)) {}
  bool feed(grpc::ByteBuffer* buffer) noexcept { return handleBuffer(buffer); }
  void shutdown() noexcept override { core_->fail(FL_ERR_LINK_LOST, "shutdown"); }

 private:
  bool writeMessage(const grpc::ByteBuffer&, bool) noexcept override { return false; }
  void cancelStream() noexcept override {}
};

class Harness {
 public:
  Harness() {
    auto core = LockedLinkBookkeeping::create();
    if (!core) fail("LockedLinkBookkeeping::create failed");
    t_ = std::make_unique<ReaderOnly>(std::move(*core));
    for (size_t s = 0; s < kSlots; ++s) slots_[s].bytes.assign(kCapacity[s], kCanary);
  }

  bool failed() const { return link_errors_ != 0; }

  void grant(size_t slot) {
    Slot& s = slots_[slot];
    if (s.live != 0) return;  // one live credit per slot
    const uint64_t id = ++last_id_;
    s.bytes.assign(s.bytes.size(), kCanary);
    s.allowed.clear();
    s.snapshot.clear();
    auto granted = t_->exposeCredit(LocalCredit{id, s.bytes.data(), s.bytes.size(), nullptr});
    if (!granted) fail("exposeCredit refused a fresh credit on a live link");
    s.live = id;
    slot_of_[id] = slot;
  }

  void retract(size_t slot) {
    Slot& s = slots_[slot];
    if (s.live == 0) return;
    t_->retractCredit(s.live);
    if (frame_credit_ == s.live) frame_live_ = false;
    s.live = 0;
    s.snapshot = s.bytes;
  }

  // A recent credit id: `back` grants ago (0: the newest); 0 when none.
  uint64_t recentId(uint64_t back) const { return back < last_id_ ? last_id_ - back : 0; }

  // A chunk: the header (when `header`) names `credit_id` and `length`.
  void chunk(bool header, uint64_t credit_id, uint64_t length, uint64_t offset, bool last, size_t payload) {
    uint8_t tag = frame_tag_;
    if (header) {
      tag = nextTag();
      frame_tag_ = tag;
      frame_credit_ = credit_id;
      frame_live_ = liveSlot(credit_id) != nullptr;
      if (frame_live_) liveSlot(credit_id)->allowed.insert(tag);
      frame_offset_ = 0;
    }
    FrameHeader h;
    h.credit_id = credit_id;
    h.length = length;
    h.sequence = ++sequence_;
    std::string prefix;
    encodeChunkPrefix(header ? &h : nullptr, offset, last, payload, &prefix);
    const std::string bytes(payload, static_cast<char>(tag));
    grpc::Slice slices[2] = {grpc::Slice(prefix), grpc::Slice(bytes)};
    grpc::ByteBuffer buffer(slices, payload > 0 ? 2 : 1);
    frame_offset_ += payload;
    feed(&buffer);
  }

  void control(size_t bytes) {
    grpc::ByteBuffer buffer = encodeControl(std::string(std::max<size_t>(bytes, 1), 'c'));
    feed(&buffer);
  }

  void raw(const uint8_t* data, size_t n) {
    grpc::Slice slice(data, n);
    grpc::ByteBuffer buffer(&slice, 1);
    feed(&buffer);
  }

  uint64_t frameOffset() const { return frame_offset_; }

  // Takes the events so far and checks them and the slots.
  void check() {
    TransportEvent events[16];
    for (;;) {
      const size_t n = t_->poll(events, 16);
      for (size_t i = 0; i < n; ++i) checkEvent(events[i]);
      if (n < 16) break;
    }
    for (const Slot& s : slots_) {
      if (s.live == 0 && !s.snapshot.empty() && s.bytes != s.snapshot) {
        fail("bytes landed in a slot after its credit was retracted");
      }
      for (uint8_t b : s.bytes) {
        if (b != kCanary && s.allowed.count(b) == 0) {
          fail("a slot holds bytes of a frame not for its live credit");
        }
      }
    }
    if (link_errors_ > 1) fail("more than one LinkError");
  }

 private:
  struct Slot {
    std::vector<uint8_t> bytes;
    uint64_t live = 0;  // the live credit's id; 0: none
    std::set<uint8_t> allowed;
    std::vector<uint8_t> snapshot;  // as retractCredit left it
  };

  // The slot whose live credit `id` is; null when `id` is not live.
  Slot* liveSlot(uint64_t id) {
    auto it = slot_of_.find(id);
    if (it == slot_of_.end() || slots_[it->second].live != id) return nullptr;
    return &slots_[it->second];
  }

  uint8_t nextTag() {
    if (++tag_counter_ == kCanary) ++tag_counter_;
    return tag_counter_;
  }

  void feed(grpc::ByteBuffer* buffer) {
    const bool accepted = t_->feed(buffer);
    check();
    if (accepted != (link_errors_ == 0)) fail("a refused message without a LinkError, or the reverse");
  }

  void checkEvent(const TransportEvent& e) {
    switch (e.kind) {
      case TransportEvent::Kind::kLinkError:
        ++link_errors_;
        break;
      case TransportEvent::Kind::kFrameArrived: {
        if (e.status != FL_OK) break;
        const uint64_t id = e.header.credit_id;
        Slot* s = liveSlot(id);
        if (id != frame_credit_ || !frame_live_ || s == nullptr) {
          fail("FL_OK for a frame whose credit was not live throughout");
        }
        if (e.header.length > s->bytes.size()) fail("FL_OK for a frame longer than its slot");
        // The credit is consumed by its frame: the daemon grants the slot
        // again (a new id) once the consumer is done with it.
        s->live = 0;
        s->snapshot.clear();
        frame_live_ = false;
        break;
      }
      case TransportEvent::Kind::kControl:
      case TransportEvent::Kind::kSendComplete:
        break;
    }
  }

  std::unique_ptr<ReaderOnly> t_;
  Slot slots_[kSlots];
  std::map<uint64_t, size_t> slot_of_;  // every id granted
  uint64_t last_id_ = 0;
  uint8_t tag_counter_ = 0;
  uint8_t frame_tag_ = 0;
  uint64_t frame_credit_ = 0;
  bool frame_live_ = false;  // the last header named a live credit, not retracted since
  uint64_t frame_offset_ = 0;
  uint64_t sequence_ = 0;
  int link_errors_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness h;
  size_t i = 0;
  auto next = [&] { return i < size ? data[i++] : uint8_t{0}; };
  while (i < size && !h.failed()) {
    const uint8_t op = next();
    switch (op % 6) {
      case 0:
        h.grant((op >> 3) % kSlots);
        break;
      case 1:
        h.retract((op >> 3) % kSlots);
        break;
      case 2:
      case 3: {  // a chunk; bit 3: header, bit 4: last, bit 5: an offset of its own
        const bool header = (op & 0x08) != 0;
        const uint8_t pick = next();  // 255: an id never granted yet
        const uint64_t credit_id = pick == 255 ? h.recentId(0) + 1 : h.recentId(pick % 8);
        const uint64_t length = uint64_t{next()} << 5 | next() >> 3;
        const size_t payload = size_t{next()} * ((op & 0x80) != 0 ? 16 : 1);
        const uint64_t offset = (op & 0x20) != 0 ? next() : (header ? 0 : h.frameOffset());
        h.chunk(header, credit_id, length, offset, (op & 0x10) != 0, payload);
        break;
      }
      case 4:
        h.control(op >> 3);
        break;
      case 5: {
        const size_t n = std::min<size_t>(next(), size - i);
        h.raw(data + i, n);
        i += n;
        break;
      }
    }
  }
  h.check();
  return 0;
}
