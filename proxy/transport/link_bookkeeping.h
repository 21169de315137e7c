// The bookkeeping every transport keeps around the bytes it moves, in one
// place: the credit table, the bounded send ring, the control-record queue,
// the event queue, the admission rules of post() and postControl(), the
// "link fails exactly once" rule and the TransportCounters.
//
// LinkBookkeeping takes no lock: tcp, rdma and loopback call it on the
// calling thread only (loopback under its link's mutex).  grpc, whose reader
// and writer run on threads of their own, holds one under a mutex
// (LockedLinkBookkeeping, locked_link_bookkeeping.h).
//
// The rules it keeps for every transport (transport.h):
//   * post() refuses a malformed request with kInvalid and says why
//     (lastRefusal), refuses everything with kNotConnected once the link
//     failed, and reports kBackpressure (counted) when the send queue is full.
//   * postControl() refuses an empty or oversized record with kInvalid (and
//     says why), kNotConnected once failed, kBackpressure (counted) beyond
//     kMaxControlBacklogBytes or when out of memory.
//   * fail() reports LinkError once; every frame still queued completes
//     with FL_ERR_LINK_LOST, after which none completes FL_OK; queued
//     control records are lost with the link.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "transport/transport.h"

namespace framelink::transport {

// How many lines a second all links of this process together may log about
// their transport failing (and the agent about links going up and down): a
// holder of the peer token can open and close links as fast as handshakes
// finish.  The line after a quiet spell says how many were left out.
inline constexpr uint32_t kLoggedLinkEventsPerSecond = 20;

// Logs, as a warning, why a transport's link failed (not when it was shut
// down), within kLoggedLinkEventsPerSecond over every link.
void warnLinkFailed(int status, const std::string& message);

// Default depth of the send queue: post() reports kBackpressure beyond it.
inline constexpr size_t kDefaultSendQueueDepth = 256;

// Checks a SendRequest the way every transport must before queueing it.
// Returns an empty string when the request is well formed, else why not.
const char* validateSendRequest(const SendRequest& request) noexcept;
// The same for a ReadRequest.
const char* validateReadRequest(const ReadRequest& request) noexcept;

// Reads one link has outstanding at most, on either side: postRead()
// reports kBackpressure beyond it, and a responder (tcp, grpc) that finds
// its peer asking for more fails the link (FL_ERR_PROTOCOL), so a reader
// cannot make it queue answers without bound.
inline constexpr size_t kMaxReadsOutstanding = 256;

// Events not yet polled: a ring that grows by doubling (a deque would
// allocate for every event: one TransportEvent fills a deque block).
class EventQueue {
 public:
  // Drops the event when out of memory: the ACK timeout of the peer
  // protocol recovers the frame.
  void push(TransportEvent event) noexcept;
  // Moves up to `max` events to `out`; returns how many.
  size_t take(TransportEvent* out, size_t max) noexcept;
  size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }

 private:
  std::vector<TransportEvent> events_;
  size_t head_ = 0;
  size_t count_ = 0;
};

// Frames accepted by post() and not yet taken for writing: a fixed ring, so
// post() never allocates.
class SendRing {
 public:
  explicit SendRing(size_t depth) : ring_(depth) {}  // throws std::bad_alloc
  size_t depth() const noexcept { return ring_.size(); }
  size_t size() const noexcept { return count_; }
  bool empty() const noexcept { return count_ == 0; }
  bool full() const noexcept { return count_ == ring_.size(); }
  void push(const SendRequest& request) noexcept {
    ring_[(head_ + count_) % ring_.size()] = request;
    ++count_;
  }
  // The oldest frame; valid until the next push().
  const SendRequest& front() const noexcept { return ring_[head_]; }
  void pop() noexcept {
    head_ = (head_ + 1) % ring_.size();
    --count_;
  }

 private:
  std::vector<SendRequest> ring_;
  size_t head_ = 0;
  size_t count_ = 0;
};

// Control records accepted by postControl() and not yet written, with the
// bytes still unsent (bounded by kMaxControlBacklogBytes).
class ControlQueue {
 public:
  bool empty() const noexcept { return records_.empty(); }
  size_t size() const noexcept { return records_.size(); }
  size_t bytes() const noexcept { return bytes_; }
  // Queues the record (its admission is LinkBookkeeping::admitControl);
  // false when out of memory, then the record stays with the caller.
  bool push(std::string& record) noexcept;
  const std::string& front() const noexcept { return records_.front(); }
  // Takes the oldest record whole.
  std::string pop() noexcept;
  // Takes every record.
  void takeAll(std::deque<std::string>* out) noexcept;
  // For a record sent in fragments: `n` more bytes of the front one left,
  // and the front one is done (after its last fragment was counted).
  void consumed(size_t n) noexcept { bytes_ -= n; }
  void dropFront() noexcept { records_.pop_front(); }
  void clear() noexcept;

 private:
  std::deque<std::string> records_;
  size_t bytes_ = 0;
};

// The receive buffers this side exposed, by credit id, and the one a frame
// is landing in now (taken out of the table: a frame consumes its credit).
// rdma addresses a credit by the low 32 bits of its id (the immediate data)
// and keeps retracted buffers mapped for a while, because nothing stops an
// RDMA write the peer already posted; the other transports forget a
// retracted credit at once.
struct CreditTableOptions {
  uint64_t key_mask = ~uint64_t{0};  // what of the credit id the peer addresses it by
  size_t keep_retracted = 0;         // retracted credits kept (the oldest beyond are forgotten)
};

class CreditTable {
 public:
  explicit CreditTable(CreditTableOptions options = {}) : options_(options) {}

  // FL_EINVAL when the id (or another id with the same key) is exposed already.
  Status add(LocalCredit credit);
  void retract(uint64_t credit_id) noexcept;
  // The exposed (or kept retracted) credit a peer's frame names by `key`, or null.
  const LocalCredit* lookup(uint64_t key) const noexcept;
  // Forgets retracted credit `credit_id` before its turn (no frame can land
  // in its buffer any more), letting its buffer go.
  void forgetRetracted(uint64_t credit_id) noexcept;

  // A frame for the credit with `key` starts landing: the credit leaves the
  // table and is held (keepalive) until endLanding().  Null when no credit
  // has that key; then the frame is one for an unknown credit.
  const LocalCredit* beginLanding(uint64_t key) noexcept;
  // True while the landing frame's credit is not retracted.
  bool landingValid() const noexcept { return landing_.has_value() && !landing_retracted_; }
  // The frame landed (or was abandoned); true if its credit was not
  // retracted meanwhile (nor before, when it was a kept retracted one).
  bool endLanding() noexcept;

  // Forgets every credit (the link is gone: no frame lands any more).
  void clear() noexcept;

 private:
  struct Entry {
    LocalCredit credit;
    bool retracted = false;
  };
  const CreditTableOptions options_;
  std::unordered_map<uint64_t, Entry> credits_;  // by key
  std::deque<uint64_t> retracted_;               // keys, oldest first
  std::optional<LocalCredit> landing_;
  bool landing_retracted_ = false;
};

// Pull, the sending side: the sources this side exposed, by id.  A
// retracted source is forgotten at once; a response being written keeps
// its memory through the source's keepalive, which the transport copies.
class SourceTable {
 public:
  // FL_EINVAL when the id is exposed already (or out of memory: FL_ERR_RESOURCES).
  Status add(LocalSource source);
  void retract(uint64_t source_id) noexcept { sources_.erase(source_id); }
  const LocalSource* lookup(uint64_t source_id) const noexcept;
  size_t size() const noexcept { return sources_.size(); }
  void clear() noexcept { sources_.clear(); }
  // Empties the table; the memory each source kept (its keepalive).
  std::vector<std::shared_ptr<void>> takeMemory();

 private:
  std::unordered_map<uint64_t, LocalSource> sources_;
};

// Pull, the receiving side: the reads this side posted and that have not
// completed, by a tag the transport gives each (what its wire names the
// read by: tcp's read id, rdma's work request id).
class ReadTable {
 public:
  // The new read's tag; 0 when out of memory (nothing added).
  uint64_t add(const ReadRequest& request) noexcept;
  const ReadRequest* lookup(uint64_t tag) const noexcept;
  // Removes the read and returns it; nullopt for an unknown tag.
  std::optional<ReadRequest> take(uint64_t tag) noexcept;
  size_t size() const noexcept { return reads_.size(); }
  bool empty() const noexcept { return reads_.empty(); }
  // Takes every read, oldest first.
  std::vector<ReadRequest> takeAll() noexcept;

 private:
  uint64_t next_tag_ = 1;
  std::unordered_map<uint64_t, ReadRequest> reads_;
};

class LinkBookkeeping {
 public:
  // `send_queue_depth`: frames the ring holds (0: the transport queues
  // frames its own way, see admitFrame).  Throws std::bad_alloc.
  explicit LinkBookkeeping(size_t send_queue_depth, CreditTableOptions credits = {});

  bool failed() const noexcept { return failed_; }
  std::string_view lastRefusal() const noexcept { return refusal_; }
  const TransportCounters& counters() const noexcept { return counters_; }

  // ---- credits ----
  // exposeCredit() as transport.h has it; `remote_addr`/`rkey` go into the
  // RemoteCredit (rdma).
  Result<RemoteCredit> exposeCredit(LocalCredit credit, uint64_t remote_addr = 0, uint32_t rkey = 0);
  void retractCredit(uint64_t credit_id) noexcept { credits_.retract(credit_id); }
  CreditTable& credits() noexcept { return credits_; }
  const CreditTable& credits() const noexcept { return credits_; }

  // ---- pull ----
  // exposeSource() as transport.h has it; `remote_addr`/`rkey` go into the
  // RemoteSource (rdma).
  Result<RemoteSource> exposeSource(LocalSource source, uint64_t remote_addr = 0, uint32_t rkey = 0);
  void retractSource(uint64_t source_id) noexcept { sources_.retract(source_id); }
  SourceTable& sources() noexcept { return sources_; }
  // postRead()'s admission (`also_invalid` as in admitFrame; `queue_full`:
  // the transport has no room for it now, kBackpressure, counted); on kOk
  // the read is in reads() under the returned tag (*tag).
  PostResult postRead(const ReadRequest& request, uint64_t* tag, const char* also_invalid = nullptr,
                      bool queue_full = false) noexcept;
  ReadTable& reads() noexcept { return reads_; }
  const ReadTable& reads() const noexcept { return reads_; }
  // A read of `tag` ended: reports its ReadComplete (FL_OK counted, with
  // `bytes`; FL_OK after the link failed becomes FL_ERR_LINK_LOST).  False
  // for a tag that is not outstanding (nothing reported).
  bool readDone(uint64_t tag, int status, uint64_t bytes, std::string message = {}) noexcept;
  // This side answered a peer's read: of a source it has (true) or not.
  void countReadServed(bool known) noexcept {
    ++(known ? counters_.reads_served : counters_.unknown_source_reads);
  }

  // ---- sending ----
  // post()'s admission for `queued` frames waiting of `depth`;
  // `also_invalid` is a transport's own reason to refuse the request (null:
  // none).  Does not queue.
  PostResult admitFrame(const SendRequest& request, size_t queued, size_t depth,
                        const char* also_invalid = nullptr) noexcept {
    if (const char* why = validateSendRequest(request); *why != '\0') return refuse(why);
    if (also_invalid != nullptr) return refuse(also_invalid);
    if (failed_) return PostResult::kNotConnected;
    if (queued >= depth) {
      ++counters_.backpressure;
      return PostResult::kBackpressure;
    }
    return PostResult::kOk;
  }
  // post() into the send ring.
  PostResult post(const SendRequest& request) noexcept {
    const PostResult admitted = admitFrame(request, ring_.size(), ring_.depth());
    if (admitted == PostResult::kOk) ring_.push(request);
    return admitted;
  }
  SendRing& ring() noexcept { return ring_; }

  // postControl()'s admission for `backlog` unsent bytes.  Does not queue.
  PostResult admitControl(const std::string& record, size_t backlog) noexcept;
  // postControl() into the control queue.
  PostResult postControl(std::string record) noexcept;
  ControlQueue& control() noexcept { return control_; }

  // ---- events ----
  EventQueue& events() noexcept { return events_; }
  const EventQueue& events() const noexcept { return events_; }
  // A frame landed (FL_OK: counted as received, header.length bytes) or
  // was for an unknown or retracted credit (FL_ERR_UNKNOWN_CREDIT, counted).
  void frameArrived(const FrameHeader& header, int status, std::string message = {}) noexcept;
  // Takes the record; `record` is left empty.
  void controlArrived(std::string& record) noexcept;
  // A frame was written: FL_OK (counted) unless the link failed meanwhile.
  void sendDone(uint64_t cookie, int status, uint64_t bytes) noexcept;
  void countControlSent(uint64_t records) noexcept { counters_.control_sent += records; }
  // One message carries `frames` frames (grpc batches).
  void countBatch(uint64_t frames) noexcept {
    ++counters_.batched_sends;
    counters_.batched_frames += frames;
  }

  // The first call reports LinkError(status, message), completes `writing`
  // (frames taken off the ring whose payloads are no longer read), every
  // queued frame and every outstanding read with FL_ERR_LINK_LOST, drops the
  // queued control records and the exposed sources and returns true.  Later
  // calls do nothing and return false.
  bool fail(int status, std::string message, std::span<const uint64_t> writing = {}) noexcept;

 private:
  PostResult refuse(const char* why) noexcept {
    refusal_ = why;
    return PostResult::kInvalid;
  }

  bool failed_ = false;
  const char* refusal_ = "the request is malformed";
  TransportCounters counters_;
  CreditTable credits_;
  SourceTable sources_;
  ReadTable reads_;
  SendRing ring_;
  ControlQueue control_;
  EventQueue events_;
};

}  // namespace framelink::transport
