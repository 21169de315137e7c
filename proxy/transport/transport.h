// The data-plane transport between two daemons: one interface, several
// implementations (rdma, tcp, grpc, loopback, and the faulty decorator), one conformance suite.
//
// Model (the same for every transport, shaped after RDMA WRITE_WITH_IMM):
//   * The receiving side exposes a receive buffer under a credit id
//     (exposeCredit) and tells the peer about it over the control link
//     (CreditGrant, carrying the RemoteCredit this call returned).
//   * The sending side posts a frame (header + payload pointer) naming that
//     credit.  The payload is sent straight from the caller's memory (which
//     must stay valid until the send completes) and lands straight in the
//     credited buffer.
//   * Both sides poll events: SendComplete for posted frames (with the
//     caller's cookie), FrameArrived when a frame has fully landed in a
//     credited buffer, LinkError when the link broke (after which every
//     posted-but-uncompleted send is reported as SendComplete with an error).
//   * Pull, the other way round (RDMA READ): the sending side exposes one
//     frame's payload as a source (exposeSource) and tells the peer about it
//     in an offer (carrying the RemoteSource this call returned); the
//     receiving side, when it has room, posts a read of that source into a
//     buffer of its own (postRead) and polls ReadComplete once the bytes
//     have landed.  The sending side's transport reports nothing (an RDMA
//     READ responder is passive; tcp answers in its poll()): the peer
//     protocol tells it when the frame was taken, and it retracts the
//     source then.  A transport that cannot read says so (readable()).
//   * The per-frame protocol travels on the transport too (peer protocol 2):
//     the daemons exchange credit grants, ACKs and NACKs as control records
//     (postControl, Control events), so nothing per frame waits for the gRPC
//     Session.  A record is opaque bytes to the transport.
//
// Threading: one calling thread at a time, handed over once.
//   * Setup: the thread that makes a transport (peer_link's dialer, the gRPC
//     Session handler, the rdma or tcp listener's thread) calls only what its
//     handshake needs (rdma: cmId, cmChannel, established) and then hands it
//     to the data agent in CmdLinkUp.  The command queue orders every setup
//     call before the agent's first call.
//   * From then on the data agent is the only caller of every method below:
//     name, connected, exposeCredit, retractCredit, post, flush, poll,
//     eventFd, counters, and shutdown (on link down and when the daemon stops).
//   * The destructor runs after the last call, on the thread that drops the
//     last reference: the agent, the daemon's main thread after the agent
//     was joined, or the setup thread when the link never reached the agent.
//     It shuts the transport down if nobody did.
//   * An implementation may do its I/O on the calling thread: tcp has no
//     threads of its own (post() writes to the socket, poll() reads from it,
//     so a frame costs the agent no hand-off and no extra wake-up), and then
//     eventFd() must also wake the caller when that I/O can go on (tcp's is
//     an epoll fd over its socket).  An implementation's own threads (gRPC
//     reader and writer, the rdma device's event thread) share state with
//     the calling thread only under their own mutexes (FL_GUARDED_BY); what
//     only the calling thread touches takes no lock.  So rdma's post() takes
//     none: the payload's memory key comes in the request
//     (SendRequest::local_key).
//   Two exceptions are documented where they apply: a loopback link's two
//   ends may be driven from two threads, and the faulty decorator forwards
//   every call on the thread it was made on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "framelink/shm_layout.h"
#include "transport/frame_header.h"  // FrameHeader: the frame metadata every transport carries

namespace framelink::transport {

// What the sender needs to address a receive buffer (sent in CreditGrant).
struct RemoteCredit {
  uint64_t credit_id = 0;
  uint64_t length = 0;       // capacity in bytes
  uint64_t remote_addr = 0;  // rdma only
  uint32_t rkey = 0;         // rdma only
  // The receiver reads the frame for this credit from an offer (its grant
  // said pull): the sender's agent offers the frame instead of posting it,
  // and no transport writes into this credit.
  bool pull = false;
};

// A receive buffer on this side.  `keepalive` keeps the memory mapped for as
// long as the transport may still write into it.
//
// rdma: the 256-byte fl_slot_header of the slot lies immediately before
// `buffer` (the daemon's segment layout guarantees it), and the frame's
// header lands there together with the payload in one RDMA write.
struct LocalCredit {
  uint64_t credit_id = 0;
  uint8_t* buffer = nullptr;
  uint64_t capacity = 0;
  std::shared_ptr<void> keepalive;
};

struct SendRequest {
  uint64_t cookie = 0;               // returned in the SendComplete event
  FrameHeader header;                // header.credit_id and header.length must be set
  const uint8_t* payload = nullptr;  // header.length bytes, valid until SendComplete
  RemoteCredit credit;               // the credit named by header.credit_id
  // The key of the memory registration that holds the payload: rdma's lkey
  // of the producer's data segment, registered with the device when the
  // producer attached (ClientSegments::localKey).  rdma refuses a non-empty
  // frame without one (kInvalid); the other transports ignore it.
  std::optional<uint32_t> local_key;
};

// Pull.  One frame's payload on the sending side, exposed for the peer to
// read (exposeSource).  `keepalive` keeps the memory mapped for as long as
// the transport may still read it: past retractSource, for a response
// already being written.
struct LocalSource {
  uint64_t source_id = 0;
  const uint8_t* payload = nullptr;  // `length` bytes
  uint64_t length = 0;
  std::shared_ptr<void> keepalive;
};

// What the reader needs to address a source (sent in the offer).
struct RemoteSource {
  uint64_t source_id = 0;
  uint64_t length = 0;       // bytes the source holds
  uint64_t remote_addr = 0;  // rdma only
  uint32_t rkey = 0;         // rdma only
};

struct ReadRequest {
  uint64_t cookie = 0;  // returned in the ReadComplete event
  RemoteSource source;  // as the offer carried it
  // Where the bytes land: source.length bytes of a buffer this side owns,
  // valid until the ReadComplete (a consumer's slot, its header before it).
  uint8_t* buffer = nullptr;
  uint64_t capacity = 0;  // of `buffer`; a larger source is refused (kInvalid)
  // rdma: the lkey of the registration that holds `buffer`; unset: the
  // receive registration that holds it (a consumer's slots are registered
  // one by one, each with its own key).  The other transports ignore it.
  std::optional<uint32_t> local_key;
};

enum class PostResult {
  kOk,
  kBackpressure,  // transport queue full: retry after polling
  kNotConnected,  // link is down: nothing was queued
  kInvalid,       // request is malformed (length > credit, null payload): nothing queued
};

// The largest control record (postControl); a receiver fails the link with
// FL_ERR_PROTOCOL on a larger one.  The daemon keeps its records well below:
// it splits grants and ACKs (peer_messages.h bounds).
inline constexpr size_t kMaxControlBytes = size_t{256} * 1024;
// Control bytes a transport holds unsent before postControl reports
// kBackpressure: a peer that stops reading cannot make this side queue
// without bound.
inline constexpr size_t kMaxControlBacklogBytes = size_t{8} * 1024 * 1024;

// What a link's transport did, for stats and the metrics endpoint
// (framelink_transport_*_total).  Every transport keeps them the same way
// (link_bookkeeping.h); they only grow.
struct TransportCounters {
  uint64_t frames_sent = 0;  // sends completed FL_OK
  uint64_t bytes_sent = 0;   // payload bytes of those
  uint64_t frames_received = 0;
  uint64_t bytes_received = 0;         // payload bytes of frames received
  uint64_t unknown_credit_frames = 0;  // frames for an unknown or retracted credit
  uint64_t backpressure = 0;           // post() and postControl() calls refused with kBackpressure
  uint64_t control_sent = 0;           // records
  uint64_t control_received = 0;       // records
  uint64_t reads_completed = 0;        // postRead()s completed FL_OK (reader side)
  uint64_t bytes_read = 0;             // payload bytes of those
  uint64_t reads_served = 0;           // reads of an exposed source answered (tcp, grpc, loopback)
  uint64_t unknown_source_reads = 0;   // reads of an unknown or retracted source (answered with an error)
  uint64_t zerocopy_sends = 0;         // tcp: payload sendmsg calls with MSG_ZEROCOPY
  uint64_t zerocopy_copied = 0;        // tcp: of those notified, the calls the kernel copied all the same
  uint64_t batched_sends = 0;          // grpc: messages that carried several frames
  uint64_t batched_frames = 0;         // grpc: the frames those carried

  TransportCounters& operator+=(const TransportCounters& o) noexcept {
    frames_sent += o.frames_sent;
    bytes_sent += o.bytes_sent;
    frames_received += o.frames_received;
    bytes_received += o.bytes_received;
    unknown_credit_frames += o.unknown_credit_frames;
    backpressure += o.backpressure;
    control_sent += o.control_sent;
    control_received += o.control_received;
    reads_completed += o.reads_completed;
    bytes_read += o.bytes_read;
    reads_served += o.reads_served;
    unknown_source_reads += o.unknown_source_reads;
    zerocopy_sends += o.zerocopy_sends;
    zerocopy_copied += o.zerocopy_copied;
    batched_sends += o.batched_sends;
    batched_frames += o.batched_frames;
    return *this;
  }
};

struct TransportEvent {
  enum class Kind { kSendComplete, kFrameArrived, kLinkError, kControl, kReadComplete };
  Kind kind = Kind::kSendComplete;
  uint64_t cookie = 0;  // kSendComplete, kReadComplete
  int status = FL_OK;   // fl_status: FL_OK, or why the send / link failed
  FrameHeader header;   // kFrameArrived: payload is in the buffer of header.credit_id
  std::string message;  // human-readable detail for errors
  std::string control;  // kControl: the record, exactly as the peer posted it

  static TransportEvent sendComplete(uint64_t cookie, int status, std::string message = {}) {
    TransportEvent ev;
    ev.kind = Kind::kSendComplete;
    ev.cookie = cookie;
    ev.status = status;
    ev.message = std::move(message);
    return ev;
  }
  // A frame that landed in the buffer of header.credit_id.
  static TransportEvent frameArrived(const FrameHeader& header, int status = FL_OK,
                                     std::string message = {}) {
    TransportEvent ev;
    ev.kind = Kind::kFrameArrived;
    ev.status = status;
    ev.header = header;
    ev.message = std::move(message);
    return ev;
  }
  // A read posted with `cookie` ended: FL_OK when the source's bytes have
  // landed, FL_ERR_UNKNOWN_CREDIT when the peer had no such source (never
  // exposed, retracted, or shorter than asked), FL_ERR_LINK_LOST when the link
  // went first.
  static TransportEvent readComplete(uint64_t cookie, int status, std::string message = {}) {
    TransportEvent ev;
    ev.kind = Kind::kReadComplete;
    ev.cookie = cookie;
    ev.status = status;
    ev.message = std::move(message);
    return ev;
  }
  // Takes the record; `record` is left empty, ready for the next one.
  static TransportEvent controlRecord(std::string& record) {
    TransportEvent ev;
    ev.kind = Kind::kControl;
    ev.control = std::move(record);
    record.clear();
    return ev;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual const char* name() const noexcept = 0;
  virtual bool connected() const noexcept = 0;
  // Both daemons of the link read several frames in one message (their
  // Hello and HelloAck said frame_batches): called before the link carries
  // frames; a transport that can batch (grpc) does so from then on.
  virtual void enableFrameBatches() noexcept {}

  // Receive side.  After exposeCredit the peer may write one frame into the
  // buffer; the credit is consumed by that frame's FrameArrived event.
  virtual Result<RemoteCredit> exposeCredit(LocalCredit credit) = 0;
  // The buffer is going away (consumer detached): a frame that still
  // arrives for this credit is reported as FrameArrived with status
  // FL_ERR_UNKNOWN_CREDIT (the link stays up).  Of a frame already landing
  // when the credit is retracted, nothing more is written into the buffer
  // once retractCredit returned (the rest is read and dropped), except on
  // rdma, whose writes cannot be stopped: there the buffer may still be
  // written, and the credit's keepalive keeps it mapped until then.
  // Credit ids are unique per link; exposeCredit after the link went down
  // fails with FL_ERR_LINK_LOST.
  virtual void retractCredit(uint64_t credit_id) = 0;
  // Whether the peer may still write into the buffer of a credit that was
  // retracted or consumed (its FrameArrived polled): true on rdma until the
  // invalidation of the credit's memory window has executed, which waits
  // behind everything queued before it on this link's send queue -- a peer
  // that stops taking our sends keeps it waiting.  The slot must not be
  // granted on another link until this is false.  False once the link
  // failed (no write reaches a queue pair in error) and on every transport
  // whose writes end with retractCredit.
  virtual bool windowOpen(uint64_t credit_id) const noexcept {
    (void)credit_id;
    return false;
  }
  // Whether every credit exposed so far takes the peer's writes now.  A
  // grant sent on this link follows what made its credit writable (rdma: the
  // bind of its window goes ahead of it on the same send queue, which
  // executes in order), so the protocol never asks; a peer told of a credit
  // some other way (a test handing RemoteCredits across in-process) waits
  // until this is true.  Always true where exposing is immediate.
  virtual bool creditsWritable() const noexcept { return true; }

  // Send side.  Non-blocking.  kInvalid when header.credit_id differs from
  // credit.credit_id, the length exceeds the credit, attr_length exceeds
  // FL_MAX_ATTR_BYTES or the payload is null with a non-zero length (rdma
  // also: a non-empty payload without local_key).  Every accepted post gets
  // exactly one SendComplete, after the transport stopped reading the
  // payload; none is FL_OK after the link's (single) LinkError.
  virtual PostResult post(const SendRequest& request) noexcept = 0;
  // Why the last post() returned kInvalid, for the frame's completion;
  // valid until the next post().
  virtual std::string_view lastRefusal() const noexcept { return "the request is malformed"; }

  // Queues one control record for the peer, which receives it as one
  // kControl event with exactly these bytes.  Records arrive in the order
  // they were posted, exactly once, unless the link fails first (then any of
  // them may be lost, like a frame in flight).  A record may overtake
  // frames posted before it: what it says never refers to frames sent the
  // same way.  Non-blocking.  kInvalid: empty or larger than
  // kMaxControlBytes; kBackpressure: more than kMaxControlBacklogBytes wait
  // unsent (retry after polling); kNotConnected: the link is down.
  virtual PostResult postControl(std::string record) noexcept = 0;

  // ---- Pull ----
  // Whether this link can read (postRead) and be read (exposeSource).  The
  // daemon offers pull on a link only where both ends' transports can.
  virtual bool readable() const noexcept { return false; }

  // Sending side.  After exposeSource the peer may read the source's bytes,
  // any number of times, until retractSource.  Source ids are unique per
  // link.  FL_EINVAL: the id is exposed already, or a non-empty source has
  // no payload; FL_ERR_LINK_LOST after the link went down;
  // FL_ERR_TRANSPORT where !readable().
  // By value: an implementation keeps the source (and its keepalive).
  virtual Result<RemoteSource> exposeSource(
      LocalSource /*source*/) {  // NOLINT(performance-unnecessary-value-param)
    return makeError(FL_ERR_TRANSPORT, std::string(name()) + " links cannot be read (no pull)");
  }
  // The source is going away (its frame was released, or its offer ended).
  // A read of it that arrives later fails (ReadComplete FL_ERR_UNKNOWN_CREDIT
  // on the reader; rdma: the read breaks the link, as a write into a retracted
  // credit does): the peer protocol retracts a source only when the reader
  // said it is done with it.  A response already being written goes on from
  // the source's keepalive.
  virtual void retractSource(uint64_t source_id) { (void)source_id; }

  // Receiving side.  Non-blocking.  Every accepted read gets exactly one
  // ReadComplete; none is FL_OK after the link's LinkError.  kInvalid: null
  // buffer with a non-empty source, source.length above capacity, or
  // !readable() (rdma also: no local_key for a non-empty source).
  virtual PostResult postRead(const ReadRequest& request) noexcept {
    (void)request;
    return PostResult::kInvalid;
  }

  // Hands everything accepted by post() and postControl() since the last flush to the
  // hardware (rdma: one chained ibv_post_send; tcp: one sendmsg for the
  // round's frames).  The agent calls it after each round of posts; a
  // transport may also flush on its own when its batch is full, and poll()
  // hands over what a caller posted without a flush().
  virtual void flush() noexcept {}

  // Fills up to `max` events; returns how many.  A transport that does its
  // I/O on the calling thread does it here (tcp: continues a write the
  // socket did not take whole, reads what arrived), bounded per call so that
  // one busy link cannot hold up the caller's others.
  virtual size_t poll(TransportEvent* out, size_t max) noexcept = 0;

  // Readable when poll() may return something (level: drain poll() until 0,
  // then read/clear is done by the transport).  For a transport that does
  // its I/O in poll(), also while that I/O can make progress (tcp: data
  // waits in its socket, or its socket has room for a waiting write), even
  // if poll() then has no event yet.
  virtual int eventFd() const noexcept = 0;

  // Closes the link; pending sends complete with FL_ERR_LINK_LOST.
  virtual void shutdown() noexcept = 0;

  // What the link did so far.  Read by the data agent when it publishes
  // its stats, never per frame.
  virtual TransportCounters counters() const noexcept = 0;
};

}  // namespace framelink::transport
