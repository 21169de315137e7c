// The `grpc` data transport: frames as chunked DataMessages on a Link.Data
// bidirectional stream, for networks where only the gRPC port is open.
//
// A frame is one or more DataMessages: the first carries the FrameHeader,
// each carries the next <= chunk_bytes payload bytes at `offset`, the last
// has `last` set (a zero-length frame is one message).  Frames do not
// interleave on a stream.  The messages travel as raw grpc::ByteBuffers
// (grpc_wire.h): a chunk's payload is a slice that points into the
// producer's slot, and the receiver copies it once, from gRPC's receive
// slices straight into the credited buffer.  Once retractCredit() returned,
// no more chunks of a frame land in that buffer (the rest is dropped, as tcp
// does), so the daemon may give the slot to another frame at once.  A
// frame's SendComplete comes only after gRPC dropped its last reference to
// those slices (their destroy callback ran), because the producer may reuse
// the slot after it.
//
// Chunking stays: gRPC's message size limits apply to every message, and a
// chunk bounds what one Write holds of the slot.
//
// Batches (once enableFrameBatches() said the peer reads them: both Hellos
// said frame_batches): the sender takes the small frames queued behind the one it takes
// (SendBatching: kMaxBatchedFrameBytes each, kMaxBatchFrames and
// kMaxBatchBytes in all) and writes them as one DataMessage whose `frames`
// entries are whole frames, their payload slices again pointing into the
// slots; their SendCompletes come once gRPC released every slice of the
// message.  The reader lands them one after the other as if each had come
// alone.  One Write and one Read for a batch, not for each frame: small
// frames cost a write's and a read's completion once a batch.
//
// Reads (pull) travel the same way.  postRead() sends a DataMessage with a
// ReadRequest (source id, read id, length) of its own, like a control
// record; the owner's reader looks the source up and queues the
// answer: a ReadResponse on the first of chunks exactly like a frame's,
// their payload slices pointing into the source (zero copy, the source's
// keepalive held until gRPC released them), or one "no source" message.
// The sender writes one unit at a time (an answer, or else a frame), so
// neither interleaves with the other.  The reader lands an answer straight
// in the read's buffer once it matches an outstanding read; anything else
// fails the link (FL_ERR_PROTOCOL) before a byte lands, and so does a peer
// with more than kMaxReadsOutstanding answers waiting.
//
// The call is on gRPC's asynchronous API: its reads, writes and end complete
// on one completion queue that one thread of the daemon drives (its Session
// calls' queue, link/session_call.h), so a link holds no thread of its own.
// Nothing a completion does blocks: the sender takes what is queued and is
// woken (a grpc::Alarm on the queue) when something is; the reader stops
// reading while kMaxQueuedEvents events wait for poll(), and is woken the
// same way once poll() took some.  A transport keeps itself alive until its
// call's last completion came.
//
// Dialing daemon:
//   auto t = GrpcTransport::connect(channel, {cq, &calls}, session_id, token, options);
// Listening daemon, on a service whose Data method is raw (RawDataService),
// once the server started: awaits the next Data call, and again each time one
// comes:
//   GrpcTransport::awaitDataCall(service, cq, &calls, hooks);
// hooks->first checks a call before its first message (its token),
// hooks->admit its session id, and hooks->accepted gets its transport.
// Before the queue shuts down, calls.endAll() ends every call still running.
// shutdown() cancels the call and waits until it ended (except on the
// queue's thread, which the call's completions need).
//
// The namespace is framelink::transport (not ...::grpc, which would shadow
// ::grpc inside it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "framelink/v1/link.grpc.pb.h"
#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_queue.h"
#include "transport/grpc/grpc_wire.h"
#include "transport/locked_link_bookkeeping.h"
#include "transport/transport.h"

namespace framelink::transport {

// A Link service whose Data method is raw (DataMessages as grpc::ByteBuffers)
// and asynchronous: GrpcTransport::awaitDataCall asks for its calls.
using RawDataService = framelink::v1::Link::WithRawMethod_Data<framelink::v1::Link::Service>;

struct GrpcTransportOptions {
  size_t chunk_bytes = kDefaultGrpcChunkBytes;  // clamped to [4 KiB, kMaxGrpcChunkBytes]
  size_t send_queue_depth = kDefaultSendQueueDepth;
  // Largest frame read (and discarded) for an unknown credit; see TcpTransportOptions.
  uint64_t max_frame_bytes = uint64_t{1} << 30;
};

// Where the calls run: the queue their completions come on (one thread
// drives it, in a QueueThreadScope) and the calls the daemon ends before
// it shuts the queue down.
struct GrpcCallQueue {
  grpc::CompletionQueue* cq = nullptr;
  DataCalls* calls = nullptr;
};

class GrpcTransport;

// What the listening daemon decides of each Data call.  Run on the queue's
// thread: they must not block.
struct DataCallHooks {
  // Before the first message (its metadata: the token): OK, or the status that ends the call.
  std::function<grpc::Status(grpc::ServerContext& ctx)> first;
  // The session the first message names: OK, or the status that ends the call.
  std::function<grpc::Status(grpc::ServerContext& ctx, uint64_t session_id)> admit;
  // The call is a link now: its transport, for the session waiting for it.
  std::function<void(uint64_t session_id, std::shared_ptr<GrpcTransport> t)> accepted;
  GrpcTransportOptions options;
  // How long a call may take to send its first message (0: no limit).
  std::chrono::milliseconds first_message_timeout{0};
};

class GrpcTransport : public Transport {
 public:
  // Opens Link.Data on `channel` (create it with channelArguments()), with
  // the token in the call metadata and session_id in the first message.
  // Does not wait for the server: a rejected call shows up as a LinkError
  // (FL_ERR_AUTH for UNAUTHENTICATED / PERMISSION_DENIED).
  static Result<std::shared_ptr<Transport>> connect(std::shared_ptr<grpc::Channel> channel,
                                                    const GrpcCallQueue& queue, uint64_t session_id,
                                                    const std::string& token,
                                                    const GrpcTransportOptions& options = {});
  // Asks `service` for the next Data call; each one that comes asks for the
  // next.  Once the server shuts down, the one asked for never comes.
  // Fails only when out of resources (an eventfd).
  static Status awaitDataCall(RawDataService& service, grpc::ServerCompletionQueue* cq, DataCalls* calls,
                              std::shared_ptr<const DataCallHooks> hooks);

  ~GrpcTransport() override;

  const char* name() const noexcept override { return "grpc"; }
  bool connected() const noexcept override { return core_->connected(); }
  // Small frames queued together share a message from now on.
  void enableFrameBatches() noexcept override { batch_frames_.store(true, std::memory_order_release); }
  Result<RemoteCredit> exposeCredit(LocalCredit credit) override {
    return core_->exposeCredit(std::move(credit));
  }
  void retractCredit(uint64_t credit_id) override { core_->retractCredit(credit_id); }
  PostResult post(const SendRequest& request) noexcept override { return core_->post(request); }
  std::string_view lastRefusal() const noexcept override { return core_->lastRefusal(); }
  PostResult postControl(std::string record) noexcept override {
    return core_->postControl(std::move(record));
  }
  bool readable() const noexcept override { return true; }
  Result<RemoteSource> exposeSource(LocalSource source) override {
    return core_->exposeSource(std::move(source));
  }
  void retractSource(uint64_t source_id) override { core_->retractSource(source_id); }
  PostResult postRead(const ReadRequest& request) noexcept override { return core_->postRead(request); }
  size_t poll(TransportEvent* out, size_t max) noexcept override { return core_->poll(out, max); }
  int eventFd() const noexcept override { return core_->eventFd(); }
  // Fails the link, cancels the call and waits until it ended (not on the queue's thread).
  void shutdown() noexcept override;

  TransportCounters counters() const noexcept override { return core_->counters(); }
  size_t chunkBytes() const noexcept { return options_.chunk_bytes; }
  // Frames whose payload slices gRPC has released (all of them): a frame's
  // SendComplete is reported only after this count covers it.
  uint64_t payloadsReleased() const noexcept;

 protected:
  GrpcTransport(std::string peer_name, const GrpcTransportOptions& options,
                std::unique_ptr<LockedLinkBookkeeping> core, const GrpcCallQueue& queue = {});

  // ---- the concrete side's call; each operation completes through its tag on the queue
  virtual void startRead(grpc::ByteBuffer* into, QueueTag* tag) noexcept = 0;
  virtual void startWrite(const grpc::ByteBuffer& message, grpc::WriteOptions options,
                          QueueTag* tag) noexcept = 0;
  // Once no read or write is out: the client asks for the call's status, the server sends its own.
  virtual void startFinish(QueueTag* tag) noexcept = 0;
  // Any thread: cancels the call unless it is released.
  virtual void cancelCall() noexcept = 0;
  // The peer's messages ended (a read failed), on the queue's thread.
  virtual void readsEnded() noexcept {}
  // After the last completion: the call's status is known (client), or the
  // call is over (server).  Fails the link with why, and frees the call.
  virtual void callOver() noexcept = 0;

  // ---- for the concrete side, on the queue's thread
  // The call carries the link from now: reads and writes start.  `write_first`:
  // a message that goes before anything queued (the dialer's session id).
  void goLive(const grpc::ByteBuffer* write_first) noexcept;
  // An operation the concrete side started (the call's start, its done tag)
  // and its completion; the last completion ends the call (callOver).
  void beginOp() noexcept;
  void endOp() noexcept;
  // The call is to end: its finish starts once no read or write is out.
  void finishWhenIdle() noexcept;
  // Keeps the transport until the call's last completion (the call's own reference).
  void holdUntilOver(std::shared_ptr<GrpcTransport> self) noexcept;
  // What the owner of `t` gets: once its last copy goes, the transport shuts
  // down (its call ends) -- the call's own reference does not keep a link
  // nobody holds.
  static std::shared_ptr<GrpcTransport> ownerHandle(std::shared_ptr<GrpcTransport> t);
  // The call did not start at all: nothing waits for it.
  void neverStarted() noexcept;
  // Joins the queue's calls; false when the daemon is ending them (the call must end).
  bool joinCalls() noexcept;
  DataCalls* calls() const noexcept { return queue_.calls; }
  grpc::CompletionQueue* cq() const noexcept { return queue_.cq; }

  // Parses and reassembles one received message; false after a protocol
  // violation (the link is failed then).
  bool handleBuffer(grpc::ByteBuffer* buffer) noexcept;
  // Releases a credit held by a frame that will never complete, and forgets
  // a read response that will not either (fail() completes its read).
  void abandonFrame() noexcept;
  void failLink(int status, const std::string& message) noexcept;
  // Waits (briefly) until gRPC released the slices of a frame whose
  // completion the sender left to the last release, so that its
  // SendComplete is there when shutdown() returns.
  void settleReleases() noexcept;

  class SliceRelease;

  std::string peer_name_;  // set before the transport is handed to anyone
  const GrpcTransportOptions options_;
  // Shared with the payload slices' destroy callbacks, which may run on a
  // gRPC thread after this transport is gone.
  std::shared_ptr<LockedLinkBookkeeping> core_;
  std::shared_ptr<SliceRelease> release_;

 private:
  // One unit the sender took (LockedLinkBookkeeping::takeSend) and how far it is written.
  struct SendCursor {
    LockedLinkBookkeeping::Outgoing out;
    size_t small = 0;  // control records and read requests written
    bool answer_done = false;
    bool frames_done = false;
    uint64_t offset = 0;  // of the answer or the frame being chunked
  };

  // ---- sending, on the queue's thread
  // Writes the next message of what is queued, unless a write is out, a
  // unit waits for gRPC to release its slices, or nothing is queued.
  void pump() noexcept;
  // The next message of the unit taken; false once the unit is written.
  bool nextMessage(grpc::ByteBuffer* message, bool* more);
  // The next chunk of `length` bytes at cursor_.offset: encode(offset, last,
  // n, prefix) writes its fields, payload(offset, n) makes the slice of its bytes.
  template <typename EncodePrefix, typename PayloadSlice>
  bool nextChunk(uint64_t length, grpc::ByteBuffer* message, EncodePrefix&& encode, PayloadSlice&& payload);
  // Several whole frames as one message (`frames`).
  void batchMessage(const std::vector<SendRequest>& frames, grpc::ByteBuffer* message);
  // The unit is written (`status` FL_OK) or failed: its frames complete once
  // gRPC released their slices; false while that waits.
  bool endUnit(int status) noexcept;
  // What takeSend() may take at once: one frame until enableFrameBatches().
  SendBatching batching() const noexcept;
  // Any thread: the queue's thread runs pump() and resumes a paused read soon.
  void wake() noexcept;

  void readDone(bool ok);
  void writeDone(bool ok);
  void finishDone(bool ok);
  void wakeDone(bool ok);
  void read() noexcept;
  void maybeFinish() noexcept;

  // ---- receiving
  bool handleMessage(const ReceivedDataMessage& message) noexcept;
  // The frames of a batch, one after the other; false after a protocol violation.
  bool handleBatch(const ReceivedDataMessage& message) noexcept;
  // Lands the next `bytes` of the frame begun, at `offset` (the whole frame
  // when `last`): the message's payload, or frames[frame] of its batch.
  bool landChunk(const ReceivedDataMessage& message, size_t frame, uint64_t offset, uint64_t bytes,
                 bool last) noexcept;
  // Answers a peer's read request; false when the link failed over it.
  bool handleReadRequest(const framelink::v1::ReadRequest& request) noexcept;
  // Starts reassembling the frame this header opens; false after a protocol violation.
  bool beginFrame(const framelink::v1::FrameHeader& header) noexcept;
  // A chunk of a read response (the first one names the read).
  bool handleResponseChunk(const ReceivedDataMessage& message) noexcept;
  // Fails the link for a protocol violation; returns false.
  bool violation(const std::string& what) noexcept;

  const GrpcCallQueue queue_;
  std::atomic<bool> batch_frames_{false};  // enableFrameBatches() was called

  // The call's operations.  ops_ counts the completions to come; the last
  // one ends the call.  Read by shutdown() and wake() on other threads.
  Mutex call_mu_;
  std::condition_variable call_cv_;  // over_
  int ops_ FL_GUARDED_BY(call_mu_) = 0;
  bool live_ FL_GUARDED_BY(call_mu_) = false;       // goLive() ran: wakes start operations
  bool waking_ FL_GUARDED_BY(call_mu_) = false;     // the alarm is set
  bool finishing_ FL_GUARDED_BY(call_mu_) = false;  // the finish started: no more operations
  bool over_ FL_GUARDED_BY(call_mu_) = false;       // the last completion came (or none ever will)
  std::shared_ptr<GrpcTransport> self_ FL_GUARDED_BY(call_mu_);  // until over_
  grpc::Alarm alarm_;                                            // wake(): set while waking_

  // The queue's thread only.
  bool reading_ = false;           // a read is out
  bool read_paused_ = false;       // no room for events: the read waits for poll()
  bool writing_ = false;           // a write is out
  bool send_over_ = false;         // takeSend() said stopped, or a write failed
  bool awaiting_release_ = false;  // the unit written waits for gRPC to release its slices
  bool want_finish_ = false;
  bool have_unit_ = false;
  SendCursor cursor_;
  std::string prefix_;                     // reused: keeps its capacity
  std::vector<grpc::Slice> batch_slices_;  // reused
  grpc::ByteBuffer read_buffer_;
  MemberTag<GrpcTransport> read_tag_{this, &GrpcTransport::readDone};
  MemberTag<GrpcTransport> write_tag_{this, &GrpcTransport::writeDone};
  MemberTag<GrpcTransport> finish_tag_{this, &GrpcTransport::finishDone};
  MemberTag<GrpcTransport> wake_tag_{this, &GrpcTransport::wakeDone};

  ReceivedDataMessage received_;
  // Reassembly state: a frame or a read response (they do not interleave)
  // and the offset the next chunk of it must have.
  bool in_frame_ = false;
  FrameHeader frame_;
  std::optional<LocalCredit> credit_;
  bool in_response_ = false;
  uint64_t response_read_ = 0;  // the read's tag
  uint64_t response_length_ = 0;
  uint8_t* response_buffer_ = nullptr;  // the read's
  uint64_t offset_ = 0;
};

}  // namespace framelink::transport
