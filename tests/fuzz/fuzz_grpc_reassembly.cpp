// libFuzzer target: the grpc data transport's reassembly of chunked frames
// and read responses (GrpcTransport::handleBuffer, the reader's step for one
// received DataMessage) with credits granted and retracted and reads posted
// between the messages.  A hostile peer sends chunks with any header, credit
// id, offset, length and `last`, read responses naming any read, source,
// length, with or without "no source", read requests for any source,
// control records between them, and raw bytes that may not parse; the
// daemon exposes, retracts and re-exposes credits and sources meanwhile
// (retraction on the same thread between two messages: the lock that orders
// it against a copy on another thread is
// test_transport_retract_mid_frame.cpp's).
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
//   * a read's buffer (a heap buffer exactly the asked length) holds only
//     the canary and tags of responses that named the read, and keeps its
//     bytes once the read completed; a read completes once, FL_OK only
//     before the LinkError and filled whole by the response that completed
//     it, FL_ERR_UNKNOWN_CREDIT with nothing landed, FL_ERR_LINK_LOST only
//     after the LinkError, and every read completes once the link failed;
//   * every read request the peer sends on a live link is answered (counted
//     served or unknown), up to the bound on answers waiting, which fails
//     the link;
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
constexpr size_t kMaxReads = 64;           // reads posted per input at most
constexpr uint64_t kSources = 4;           // source ids 1..kSources
constexpr size_t kSourceBytes = 255 * 16;  // the longest source a byte scales to

// The reader half of a grpc transport with no call under it: messages go in
// through handleBuffer, as each read's completion hands them over.
class ReaderOnly final : public GrpcTransport {
 public:
  explicit ReaderOnly(std::unique_ptr<LockedLinkBookkeeping> core)
      : GrpcTransport("fuzz-peer", GrpcTransportOptions{}, std::move(core)) {}
  bool feed(grpc::ByteBuffer* buffer) noexcept { return handleBuffer(buffer); }
  void shutdown() noexcept override { core_->fail(FL_ERR_LINK_LOST, "shutdown"); }

 private:
  void startRead(grpc::ByteBuffer*, QueueTag*) noexcept override {}
  void startWrite(const grpc::ByteBuffer&, grpc::WriteOptions, QueueTag*) noexcept override {}
  void startFinish(QueueTag*) noexcept override {}
  void cancelCall() noexcept override {}
  void callOver() noexcept override {}
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

  // ---- pull, this side the reader ----
  void postRead(uint64_t source_id, uint64_t length) {
    if (reads_.size() >= kMaxReads) return;
    auto read = std::make_unique<Read>();
    read->bytes.assign(length, kCanary);
    ReadRequest r;
    r.cookie = reads_.size();
    r.source = RemoteSource{source_id, length, 0, 0};
    r.buffer = read->bytes.data();
    r.capacity = length;
    const PostResult posted = t_->postRead(r);
    if (posted == PostResult::kNotConnected && !failed()) fail("postRead refused on a live link");
    if (posted != PostResult::kOk) return;
    // The transport names reads 1, 2, ... in the order it accepted them
    // (ReadTable); a response the peer sends names one of those, or not.
    read->tag = ++read_tags_;
    read_of_tag_[read->tag] = reads_.size();
    reads_.push_back(std::move(read));
  }

  // The tag of a recent read, `pick` % 8 reads ago (0: the newest), or of
  // none yet when `pick` is 255; 0 when there is no such read.
  uint64_t recentRead(uint8_t pick) const {
    if (pick == 255) return read_tags_ + 1;
    const uint64_t back = pick % 8;
    return back < read_tags_ ? read_tags_ - back : 0;
  }
  // The length the read `tag` asked for (0 for an unknown tag).
  uint64_t askedLength(uint64_t tag) const {
    auto it = read_of_tag_.find(tag);
    return it == read_of_tag_.end() ? 0 : reads_[it->second]->bytes.size();
  }

  // A chunk of a read response; the first (`first`) names the read.
  void responseChunk(bool first, uint64_t read_id, uint64_t source_id, uint64_t length, bool no_source,
                     uint64_t offset, bool last, size_t payload) {
    uint8_t tag = unit_tag_;
    if (first) {
      tag = nextTag();
      unit_tag_ = tag;
      response_read_ = read_id;
      auto it = read_of_tag_.find(read_id);
      if (it != read_of_tag_.end()) reads_[it->second]->allowed.insert(tag);
      unit_offset_ = 0;
    }
    framelink::v1::ReadResponse response;
    response.set_source_id(source_id);
    response.set_read_id(read_id);
    response.set_length(length);
    response.set_no_source(no_source);
    std::string prefix;
    encodeReadResponsePrefix(first ? &response : nullptr, offset, last, payload, &prefix);
    const std::string bytes(payload, static_cast<char>(tag));
    grpc::Slice slices[2] = {grpc::Slice(prefix), grpc::Slice(bytes)};
    grpc::ByteBuffer buffer(slices, payload > 0 ? 2 : 1);
    unit_offset_ += payload;
    feed(&buffer);
  }

  // ---- pull, this side the owner ----
  void toggleSource(uint64_t id, uint64_t length) {
    if (exposed_.count(id) != 0) {
      t_->retractSource(id);
      exposed_.erase(id);
      return;
    }
    auto r = t_->exposeSource(LocalSource{id, source_bytes_.data(), length, nullptr});
    if (!r) fail("exposeSource refused a source not exposed on a live link");
    exposed_.insert(id);
  }

  void peerRead(uint64_t source_id, uint64_t length) {
    framelink::v1::ReadRequest q;
    q.set_source_id(source_id);
    q.set_read_id(++peer_reads_);
    q.set_length(length);
    grpc::ByteBuffer buffer = encodeReadRequest(q);
    feed(&buffer);
  }

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
    uint8_t tag = unit_tag_;
    if (header) {
      tag = nextTag();
      unit_tag_ = tag;
      frame_credit_ = credit_id;
      frame_live_ = liveSlot(credit_id) != nullptr;
      if (frame_live_) liveSlot(credit_id)->allowed.insert(tag);
      unit_offset_ = 0;
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
    unit_offset_ += payload;
    feed(&buffer);
  }

  void control(size_t bytes) {
    grpc::ByteBuffer buffer = encodeControl(std::string(std::max<size_t>(bytes, 1), 'c'));
    feed(&buffer);
  }

  void raw(const uint8_t* data, size_t n) {
    // Bytes that parse into frame or read data are the structured ops'
    // business, which know where such bytes may land and what a read
    // request asks; raw ones would carry bytes no invariant can place.
    grpc::Slice probe_slice(data, n);
    grpc::ByteBuffer probe(&probe_slice, 1);
    ReceivedDataMessage parsed;
    if (parseDataMessage(&probe, &parsed).empty() && (parsed.has_header || parsed.has_read_request ||
                                                      parsed.has_read_response || parsed.payload_bytes > 0)) {
      return;
    }
    grpc::Slice slice(data, n);
    grpc::ByteBuffer buffer(&slice, 1);
    feed(&buffer);
  }

  // Where the next chunk of the unit (frame or read response) the last
  // first chunk began goes on.
  uint64_t unitOffset() const { return unit_offset_; }

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
    for (const auto& r : reads_) {
      if (r->done && r->bytes != r->snapshot) fail("bytes landed in a read's buffer after it completed");
      for (uint8_t b : r->bytes) {
        if (b != kCanary && r->allowed.count(b) == 0) fail("a read's buffer holds bytes not for it");
      }
      if (link_errors_ != 0 && !r->done) fail("a read outstanding after the LinkError");
    }
    const TransportCounters c = t_->counters();
    if (link_errors_ == 0 && c.reads_served + c.unknown_source_reads != peer_reads_) {
      fail("a read request of the peer went unanswered on a live link");
    }
    if (link_errors_ > 1) fail("more than one LinkError");
  }

 private:
  struct Read {
    std::vector<uint8_t> bytes;  // exactly the asked length
    uint64_t tag = 0;
    std::set<uint8_t> allowed;  // tags of responses that named the read
    bool done = false;
    std::vector<uint8_t> snapshot;  // as its completion left it
  };

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
      case TransportEvent::Kind::kReadComplete: {
        if (e.cookie >= reads_.size()) fail("ReadComplete for a read never posted");
        Read& r = *reads_[e.cookie];
        if (r.done) fail("a read completed twice");
        r.done = true;
        r.snapshot = r.bytes;
        const bool untouched =
            std::all_of(r.bytes.begin(), r.bytes.end(), [](uint8_t b) { return b == kCanary; });
        if (e.status == FL_OK) {
          if (link_errors_ != 0) fail("FL_OK for a read after the LinkError");
          if (response_read_ != r.tag) fail("FL_OK for a read the last response did not name");
          const uint8_t tag = unit_tag_;
          if (!std::all_of(r.bytes.begin(), r.bytes.end(), [tag](uint8_t b) { return b == tag; })) {
            fail("FL_OK for a read its response did not fill");
          }
        } else if (e.status == FL_ERR_UNKNOWN_CREDIT) {
          if (!untouched) fail("bytes landed for a read the peer had no source for");
        } else if (e.status == FL_ERR_LINK_LOST) {
          if (link_errors_ == 0) fail("FL_ERR_LINK_LOST for a read before the LinkError");
        } else {
          fail("a read completed with an unexpected status");
        }
        break;
      }
      case TransportEvent::Kind::kControl:
      case TransportEvent::Kind::kSendComplete:
        break;
    }
  }

  std::unique_ptr<ReaderOnly> t_;
  Slot slots_[kSlots];
  std::vector<std::unique_ptr<Read>> reads_;  // by cookie
  std::map<uint64_t, size_t> read_of_tag_;    // read tag -> cookie
  uint64_t read_tags_ = 0;
  uint64_t response_read_ = 0;  // the read the last response's first chunk named
  std::set<uint64_t> exposed_;  // source ids
  std::vector<uint8_t> source_bytes_ = std::vector<uint8_t>(kSourceBytes, 0x5A);
  uint64_t peer_reads_ = 0;
  std::map<uint64_t, size_t> slot_of_;  // every id granted
  uint64_t last_id_ = 0;
  uint8_t tag_counter_ = 0;
  uint8_t unit_tag_ = 0;  // of the frame or read response the last first chunk began
  uint64_t frame_credit_ = 0;
  bool frame_live_ = false;  // the last header named a live credit, not retracted since
  uint64_t unit_offset_ = 0;
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
        const uint64_t offset = (op & 0x20) != 0 ? next() : (header ? 0 : h.unitOffset());
        h.chunk(header, credit_id, length, offset, (op & 0x10) != 0, payload);
        break;
      }
      case 4:
        if ((op & 0x80) == 0) {
          h.control(op >> 3);
          break;
        }
        // Bit 7: a pull step, bits 3-4 say which.
        switch ((op >> 3) & 3) {
          case 0: {  // this side reads a source of the peer's
            const uint64_t source_id = next() % kSources + 1;
            h.postRead(source_id, uint64_t{next()} * ((op & 0x20) != 0 ? 16 : 1));
            break;
          }
          case 1: {  // a chunk of the peer's response
            // Bit 0: the first chunk, 1: last, 2: no source, 3: an offset of
            // its own, 4: a length of its own, 5: 16 times the payload.
            const uint8_t bits = next();
            const uint64_t read_id = h.recentRead(next());
            const bool first = (bits & 0x01) != 0;
            const uint64_t length = (bits & 0x10) != 0 ? uint64_t{next()} * 16 : h.askedLength(read_id);
            const size_t payload = size_t{next()} * ((bits & 0x20) != 0 ? 16 : 1);
            const uint64_t offset = (bits & 0x08) != 0 ? next() : (first ? 0 : h.unitOffset());
            const uint64_t source_id = next() % kSources + 1;
            h.responseChunk(first, read_id, source_id, length, (bits & 0x04) != 0, offset, (bits & 0x02) != 0,
                            payload);
            break;
          }
          case 2: {  // the peer reads a source of this side's
            const uint64_t source_id = next() % kSources + 1;
            h.peerRead(source_id, uint64_t{next()} * 16);
            break;
          }
          default: {  // this side exposes or retracts a source
            const uint64_t source_id = next() % kSources + 1;
            h.toggleSource(source_id, uint64_t{next()} * 16);
            break;
          }
        }
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
