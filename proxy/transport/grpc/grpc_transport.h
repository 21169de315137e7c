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
// frames cost gRPC's hand-offs between threads once a batch.
//
// Reads (pull) travel the same way.  postRead() sends a DataMessage with a
// ReadRequest (source id, read id, length) of its own, like a control
// record; the owner's reader thread looks the source up and queues the
// answer: a ReadResponse on the first of chunks exactly like a frame's,
// their payload slices pointing into the source (zero copy, the source's
// keepalive held until gRPC released them), or one "no source" message.
// The sender writes one unit at a time (an answer, or else a frame), so
// neither interleaves with the other.  The reader lands an answer straight
// in the read's buffer once it matches an outstanding read; anything else
// fails the link (FL_ERR_PROTOCOL) before a byte lands, and so does a peer
// with more than kMaxReadsOutstanding answers waiting.
//
// Dialing daemon:
//   auto t = GrpcTransport::connect(channel, session_id, token, chunk_bytes);
// Listening daemon, in a RawDataLinkService (its Data method streams raw
// ByteBuffers):
//   grpc::Status serveRawData(grpc::ServerContext* ctx, DataStream* stream) override {
//     grpc::ByteBuffer first;
//     if (!stream->Read(&first)) return {grpc::StatusCode::CANCELLED, "no first message"};
//     // parseDataMessage(&first, ...); check ctx metadata kTokenMetadataKey
//     // and the session_id against the Session
//     auto t = GrpcTransport::adoptServerStream(ctx, stream, chunk_bytes);
//     if (!t) return {grpc::StatusCode::RESOURCE_EXHAUSTED, t.error().message};
//     handOver(*t);                  // the daemon keeps a shared_ptr<Transport>
//     return (*t)->runUntilClosed();  // blocks: the reader runs on this thread
//   }
// runUntilClosed() returns once the stream ended (peer closed, error,
// protocol violation) or the daemon called shutdown(); after that the
// transport never touches the stream again and reports kNotConnected.
// shutdown() on a server transport waits for runUntilClosed() to return
// (it cancels the call first, so that is prompt).
//
// The namespace is framelink::transport (not ...::grpc, which would shadow
// ::grpc inside it).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "framelink/v1/link.grpc.pb.h"
#include "transport/grpc/grpc_limits.h"
#include "transport/grpc/grpc_wire.h"
#include "transport/locked_link_bookkeeping.h"
#include "transport/transport.h"

namespace framelink::transport {

// The server side of a Link.Data call: DataMessages as raw ByteBuffers.
using DataStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

// A Link service whose Data method hands its handler raw ByteBuffers
// (gRPC 1.51 generates that only for the async and callback APIs): derive
// from it and implement serveRawData instead of Data.
class RawDataLinkService : public framelink::v1::Link::Service {
 public:
  RawDataLinkService();
  virtual grpc::Status serveRawData(grpc::ServerContext* context, DataStream* stream) = 0;
};

struct GrpcTransportOptions {
  size_t chunk_bytes = kDefaultGrpcChunkBytes;  // clamped to [4 KiB, kMaxGrpcChunkBytes]
  size_t send_queue_depth = kDefaultSendQueueDepth;
  // Largest frame read (and discarded) for an unknown credit; see TcpTransportOptions.
  uint64_t max_frame_bytes = uint64_t{1} << 30;
};

class GrpcServerTransport;

class GrpcTransport : public Transport {
 public:
  // Opens Link.Data on `channel` (create it with channelArguments()), with
  // the token in the call metadata and session_id in the first message.
  // Does not wait for the server: a rejected call shows up as a LinkError
  // (FL_ERR_AUTH for UNAUTHENTICATED / PERMISSION_DENIED).
  static Result<std::unique_ptr<Transport>> connect(std::shared_ptr<grpc::Channel> channel,
                                                    uint64_t session_id, const std::string& token,
                                                    size_t chunk_bytes = kDefaultGrpcChunkBytes);
  static Result<std::unique_ptr<Transport>> connect(std::shared_ptr<grpc::Channel> channel,
                                                    uint64_t session_id, const std::string& token,
                                                    const GrpcTransportOptions& options);

  // Wraps the stream of a running Data handler whose first message the
  // handler has already read.  `context` and `stream` must stay valid until
  // runUntilClosed() returns, i.e. the handler calls it before returning.
  // Fails only when out of resources (eventfd): return RESOURCE_EXHAUSTED then.
  static Result<std::shared_ptr<GrpcServerTransport>> adoptServerStream(
      grpc::ServerContext* context, DataStream* stream, size_t chunk_bytes = kDefaultGrpcChunkBytes);
  static Result<std::shared_ptr<GrpcServerTransport>> adoptServerStream(grpc::ServerContext* context,
                                                                        DataStream* stream,
                                                                        const GrpcTransportOptions& options);

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

  TransportCounters counters() const noexcept override { return core_->counters(); }
  size_t chunkBytes() const noexcept { return options_.chunk_bytes; }
  // Frames whose payload slices gRPC has released (all of them): a frame's
  // SendComplete is reported only after this count covers it.
  uint64_t payloadsReleased() const noexcept;

 protected:
  GrpcTransport(std::string peer_name, const GrpcTransportOptions& options,
                std::unique_ptr<LockedLinkBookkeeping> core);

  // The stream, as the concrete side has it.
  // `more`: another message follows at once (grpc::WriteOptions::set_buffer_hint).
  virtual bool writeMessage(const grpc::ByteBuffer& message, bool more) noexcept = 0;
  virtual void cancelStream() noexcept = 0;

  void senderLoop() noexcept;
  // Stops the sender (LockedLinkBookkeeping::stopSending) and wakes it if it waits
  // for gRPC to release a frame's slices.
  void stopSender() noexcept;
  // After the call ended: waits (briefly) until gRPC released the slices of
  // a frame whose completion the sender left to the last release, so that
  // its SendComplete is there when shutdown() returns.
  void settleReleases() noexcept;
  // Parses and reassembles one received message; false after a protocol
  // violation (the link is failed then).
  bool handleBuffer(grpc::ByteBuffer* buffer) noexcept;
  // Releases a credit held by a frame that will never complete, and forgets
  // a read response that will not either (fail() completes its read).
  void abandonFrame() noexcept;
  void failLink(int status, const std::string& message) noexcept;

  class SliceRelease;

  const std::string peer_name_;
  const GrpcTransportOptions options_;
  // Shared with the payload slices' destroy callbacks, which may run on a
  // gRPC thread after this transport is gone.
  std::shared_ptr<LockedLinkBookkeeping> core_;
  std::shared_ptr<SliceRelease> release_;

 private:
  // Writes the answer to a peer's read, all its chunks; false when a write failed.
  bool writeAnswer(const ReadAnswer& answer, std::string* prefix) noexcept;
  // Writes a frame in chunks; false when a write failed.
  bool writeFrame(const SendRequest& frame, std::string* prefix) noexcept;
  // Writes `length` bytes as chunks of at most chunk_bytes, a message each:
  // encode(offset, last, n, prefix) writes a chunk's fields, payload(offset,
  // n) makes the slice of its bytes.  False when a write failed.
  template <typename EncodePrefix, typename PayloadSlice>
  bool writeChunked(uint64_t length, std::string* prefix, EncodePrefix&& encode,
                    PayloadSlice&& payload) noexcept;
  // Writes several whole frames as one message (`frames`); false when the write failed.
  bool writeBatch(const std::vector<SendRequest>& frames, std::string* prefix) noexcept;
  // What nextSend() may take at once: one frame until enableFrameBatches().
  SendBatching batching() const noexcept;
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
  std::atomic<bool> batch_frames_{false};  // enableFrameBatches() was called
  std::vector<grpc::Slice> batch_slices_;  // sender thread only: keeps its capacity
  ReceivedDataMessage received_;           // reader thread only
  // Reassembly state, reader thread only: a frame or a read response (they
  // do not interleave) and the offset the next chunk of it must have.
  bool in_frame_ = false;
  FrameHeader frame_;
  std::optional<LocalCredit> credit_;
  bool in_response_ = false;
  uint64_t response_read_ = 0;  // the read's tag
  uint64_t response_length_ = 0;
  uint8_t* response_buffer_ = nullptr;  // the read's
  uint64_t offset_ = 0;
};

class GrpcServerTransport final : public GrpcTransport {
 public:
  GrpcServerTransport(grpc::ServerContext* context, DataStream* stream, const GrpcTransportOptions& options,
                      std::unique_ptr<LockedLinkBookkeeping> core);
  ~GrpcServerTransport() override;

  // Runs the reader on the calling (handler) thread until the stream ends or
  // shutdown() is called; returns the status for the handler to return.
  // Call at most once; a second call returns FAILED_PRECONDITION.
  grpc::Status runUntilClosed();

  void shutdown() noexcept override;

 private:
  bool writeMessage(const grpc::ByteBuffer& message, bool more) noexcept override;
  void cancelStream() noexcept override;
  // shutdown() without settleReleases().
  void close() noexcept;

  enum class State { kAdopted, kRunning, kClosed };
  Mutex mu_;
  std::condition_variable cv_;
  State state_ FL_GUARDED_BY(mu_) = State::kAdopted;
  grpc::ServerContext* context_ FL_GUARDED_BY(mu_);  // null once closed
  DataStream* stream_;  // valid while kRunning; used by the reader and sender threads
  std::thread sender_;  // started and joined by runUntilClosed()
};

}  // namespace framelink::transport
