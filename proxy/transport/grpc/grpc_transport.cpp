// Parts of the grpc transport shared by the dialing and the serving side:
// chunking on send (payload slices that point into the slot or the source),
// reassembly on receive (into the credited buffer or the read's).
#include "transport/grpc/grpc_transport.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "transport/grpc/grpc_wire.h"

namespace framelink::transport {

namespace {

GrpcTransportOptions clampOptions(GrpcTransportOptions o) {
  o.chunk_bytes = std::clamp<size_t>(o.chunk_bytes, 4096, kMaxGrpcChunkBytes);
  return o;
}

void releaseSource(void* user_data) { delete static_cast<std::shared_ptr<void>*>(user_data); }

// A slice over `n` bytes of an exposed source at `data`, which holds the
// source's keepalive until gRPC drops its last reference: the source may be
// retracted while its answer is still in gRPC's hands.  Nothing waits for
// that release (an answer has no completion).
grpc::Slice sourceSlice(const std::shared_ptr<void>& keepalive, const uint8_t* data, size_t n) {
  auto* ref = new std::shared_ptr<void>(keepalive);
  // gRPC only reads the slice (its buffer is not const in the API).
  return grpc::Slice(const_cast<uint8_t*>(data), n, &releaseSource, ref);
}

}  // namespace

// Counts the payload slices of the frame being written that gRPC still
// references, and holds a frame's completion until the count drops to zero.
// Shared by the transport and every slice (their destroy callbacks run on
// gRPC's threads, possibly after the transport is gone).
class GrpcTransport::SliceRelease {
 public:
  explicit SliceRelease(std::shared_ptr<LockedLinkBookkeeping> core) : core_(std::move(core)) {}

  // A slice over `n` payload bytes at `data` (the producer's slot), counted
  // until gRPC drops its last reference.
  static grpc::Slice payloadSlice(const std::shared_ptr<SliceRelease>& self, const uint8_t* data, size_t n) {
    auto* ref = new std::shared_ptr<SliceRelease>(self);
    {
      MutexLock lock(self->mu_);
      ++self->outstanding_;
    }
    // gRPC only reads the slice (its buffer is not const in the API).
    return grpc::Slice(const_cast<uint8_t*>(data), n, &SliceRelease::onDestroy, ref);
  }

  // Called by the sender after the last write of a unit's frames.  True once
  // gRPC released every slice: the caller reports their completions, with
  // `status`.  False when the sender was stopped first: the last release
  // reports them then (`frames` is taken).
  bool waitReleased(std::vector<SendRequest>* frames, int status) noexcept {
    MutexLock lock(mu_);
    lock.wait(cv_, [&]() FL_REQUIRES(mu_) { return outstanding_ == 0 || stopped_; });
    if (outstanding_ == 0) {
      frames_released_ += frames->size();
      return true;
    }
    deferred_.swap(*frames);
    deferred_status_ = status;
    return false;
  }

  void stop() noexcept {
    {
      MutexLock lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }

  void settle(std::chrono::milliseconds limit) noexcept {
    MutexLock lock(mu_);
    lock.waitFor(cv_, limit, [&]() FL_REQUIRES(mu_) { return outstanding_ == 0; });
  }

  uint64_t framesReleased() const noexcept {
    MutexLock lock(mu_);
    return frames_released_;
  }

 private:
  static void onDestroy(void* user_data) {
    auto* ref = static_cast<std::shared_ptr<SliceRelease>*>(user_data);
    (*ref)->released();
    delete ref;
  }

  void released() noexcept {
    std::vector<SendRequest> done;
    int status = FL_OK;
    {
      MutexLock lock(mu_);
      if (--outstanding_ == 0 && !deferred_.empty()) {
        done.swap(deferred_);
        status = deferred_status_;
        frames_released_ += done.size();
      }
    }
    cv_.notify_all();
    for (const SendRequest& r : done) core_->completeSend(r.cookie, status, r.header.length);
  }

  const std::shared_ptr<LockedLinkBookkeeping> core_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  size_t outstanding_ FL_GUARDED_BY(mu_) = 0;
  bool stopped_ FL_GUARDED_BY(mu_) = false;
  std::vector<SendRequest> deferred_ FL_GUARDED_BY(mu_);  // frames whose completion waits for a release
  int deferred_status_ FL_GUARDED_BY(mu_) = FL_OK;
  uint64_t frames_released_ FL_GUARDED_BY(mu_) = 0;
};

GrpcTransport::GrpcTransport(std::string peer_name, const GrpcTransportOptions& options,
                             std::unique_ptr<LockedLinkBookkeeping> core)
    : peer_name_(std::move(peer_name)),
      options_(clampOptions(options)),
      core_(std::move(core)),
      release_(std::make_shared<SliceRelease>(core_)) {}

GrpcTransport::~GrpcTransport() = default;

uint64_t GrpcTransport::payloadsReleased() const noexcept { return release_->framesReleased(); }

void GrpcTransport::failLink(int status, const std::string& message) noexcept {
  release_->stop();
  if (!core_->fail(status, message)) return;
  warnLinkFailed(status, message);
  cancelStream();
}

void GrpcTransport::stopSender() noexcept {
  core_->stopSending();
  release_->stop();
}

void GrpcTransport::settleReleases() noexcept {
  // gRPC frees a finished call's stream on its own threads, right after the
  // call: a second is plenty, and a shutdown never hangs on it.
  release_->settle(std::chrono::seconds(1));
}

// ---------------------------------------------------------------- sending

SendBatching GrpcTransport::batching() const noexcept {
  if (!batch_frames_.load(std::memory_order_acquire)) return {};
  return {kMaxBatchFrames, std::min<uint64_t>(kMaxBatchedFrameBytes, options_.chunk_bytes), kMaxBatchBytes};
}

void GrpcTransport::senderLoop() noexcept {
  LockedLinkBookkeeping::Outgoing out;
  std::string prefix;  // reused: keeps its capacity
  while (core_->nextSend(&out, batching())) {
    bool ok = true;
    try {
      // Control records, then read requests: small, each held back while
      // more follows at once, so that they share a write.
      const size_t records = out.control.size();
      const size_t small = records + out.asks.size();
      const bool unit = out.has_answer || !out.frames.empty();
      for (size_t i = 0; ok && i < small; ++i) {
        const bool more = unit || i + 1 < small;
        if (i < records) {
          ok = writeMessage(encodeControl(out.control[i]), more);
        } else {
          const ReadAsk& ask = out.asks[i - records];
          framelink::v1::ReadRequest request;
          request.set_source_id(ask.source_id);
          request.set_read_id(ask.read_id);
          request.set_length(ask.length);
          ok = writeMessage(encodeReadRequest(request), more);
        }
      }
    } catch (...) {  // bad_alloc
      ok = false;
    }
    if (out.has_answer) ok = ok && writeAnswer(out.answer, &prefix);
    if (out.frames.empty()) {
      if (!ok) return;
      continue;
    }
    if (ok) {
      ok = out.frames.size() == 1 ? writeFrame(out.frames[0], &prefix) : writeBatch(out.frames, &prefix);
    }
    const int status = ok ? FL_OK : FL_ERR_LINK_LOST;
    if (!release_->waitReleased(&out.frames, status)) return;  // completed by the last release
    for (const SendRequest& r : out.frames) core_->completeSend(r.cookie, status, r.header.length);
    // A failed write means the call is over; the reader sees that too and
    // fails the link with the call's status.
    if (!ok) return;
  }
}

template <typename EncodePrefix, typename PayloadSlice>
bool GrpcTransport::writeChunked(uint64_t length, std::string* prefix, EncodePrefix&& encode,
                                 PayloadSlice&& payload) noexcept {
  uint64_t offset = 0;
  bool ok = true;
  try {
    while (ok) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(options_.chunk_bytes, length - offset));
      prefix->clear();
      encode(offset, offset + n == length, n, prefix);
      {
        // This scope's references go before the caller waits for gRPC's to go (waitReleased).
        grpc::Slice slices[2] = {grpc::Slice(*prefix), grpc::Slice()};
        if (n > 0) slices[1] = payload(offset, n);
        grpc::ByteBuffer message(slices, n > 0 ? 2 : 1);
        ok = writeMessage(message, false);
      }
      offset += n;
      if (offset >= length) break;
    }
  } catch (...) {  // bad_alloc
    ok = false;
  }
  return ok;
}

bool GrpcTransport::writeFrame(const SendRequest& r, std::string* prefix) noexcept {
  return writeChunked(
      r.header.length, prefix,
      [&r](uint64_t offset, bool last, size_t n, std::string* out) {
        encodeChunkPrefix(offset == 0 ? &r.header : nullptr, offset, last, n, out);
      },
      [this, &r](uint64_t offset, size_t n) {
        return SliceRelease::payloadSlice(release_, r.payload + offset, n);
      });
}

bool GrpcTransport::writeBatch(const std::vector<SendRequest>& frames, std::string* prefix) noexcept {
  bool ok = false;
  try {
    // A prefix slice (copied) and a payload slice (the producer's slot) a frame.
    batch_slices_.clear();
    for (const SendRequest& r : frames) {
      prefix->clear();
      encodeBatchedFramePrefix(r.header, r.header.length, prefix);
      batch_slices_.emplace_back(*prefix);
      if (r.header.length > 0) {
        batch_slices_.push_back(SliceRelease::payloadSlice(release_, r.payload, r.header.length));
      }
    }
    grpc::ByteBuffer message(batch_slices_.data(), batch_slices_.size());
    ok = writeMessage(message, false);
  } catch (...) {  // bad_alloc
    ok = false;
  }
  batch_slices_.clear();  // before waitReleased: gRPC's references are what it waits for
  return ok;
}

bool GrpcTransport::writeAnswer(const ReadAnswer& a, std::string* prefix) noexcept {
  framelink::v1::ReadResponse response;
  response.set_source_id(a.asked.source_id);
  response.set_read_id(a.asked.read_id);
  const uint64_t length = a.known ? a.asked.length : 0;
  response.set_length(length);
  response.set_no_source(!a.known);
  // Chunked as a frame's payload is; the first chunk names the read.
  return writeChunked(
      length, prefix,
      [&response](uint64_t offset, bool last, size_t n, std::string* out) {
        encodeReadResponsePrefix(offset == 0 ? &response : nullptr, offset, last, n, out);
      },
      [&a](uint64_t offset, size_t n) { return sourceSlice(a.keepalive, a.payload + offset, n); });
}

// ---------------------------------------------------------------- receiving

void GrpcTransport::abandonFrame() noexcept {
  if (credit_) {
    core_->endReceive();
    credit_.reset();
  }
  in_frame_ = false;
  in_response_ = false;
  response_buffer_ = nullptr;
}

bool GrpcTransport::violation(const std::string& what) noexcept {
  abandonFrame();
  failLink(FL_ERR_PROTOCOL, "grpc data link with " + peer_name_ + ": " + what);
  return false;
}

bool GrpcTransport::handleBuffer(grpc::ByteBuffer* buffer) noexcept {
  std::string malformed;
  try {
    malformed = parseDataMessage(buffer, &received_);
  } catch (...) {  // bad_alloc
    malformed = "out of memory while parsing a message";
  }
  if (malformed.empty()) {
    const bool ok = handleMessage(received_);
    received_.slices.clear();  // gRPC's receive buffers go back now, not with the next message
    return ok;
  }
  abandonFrame();
  failLink(FL_ERR_PROTOCOL, "grpc data link with " + peer_name_ + ": malformed DataMessage: " + malformed);
  return false;
}

bool GrpcTransport::handleMessage(const ReceivedDataMessage& m) noexcept {
  if (m.frame_count > 0) return handleBatch(m);
  const bool chunk_data =
      m.has_header || m.has_read_response || m.payload_bytes != 0 || m.offset != 0 || m.last;
  if (!m.control.empty()) {
    if (chunk_data || m.has_read_request) {
      return violation("a control record shares its message with frame data");
    }
    if (m.control.size() > kMaxControlBytes) {
      return violation("control record of " + std::to_string(m.control.size()) + " bytes exceeds " +
                       std::to_string(kMaxControlBytes));
    }
    core_->controlArrived(m.control);
    return true;
  }
  if (m.has_read_request) {
    if (chunk_data) return violation("a read request shares its message with frame data");
    return handleReadRequest(m.read_request);
  }
  if (in_response_ || (!in_frame_ && m.has_read_response)) return handleResponseChunk(m);
  if (!in_frame_) {
    if (!m.has_header) return violation("chunk without a frame header");
    if (!beginFrame(m.header)) return false;
  } else if (m.has_header) {
    return violation("frame header in the middle of frame " + std::to_string(frame_.sequence));
  } else if (m.has_read_response) {
    return violation("read response in the middle of frame " + std::to_string(frame_.sequence));
  }
  return landChunk(m, SIZE_MAX, m.offset, m.payload_bytes, m.last);
}

bool GrpcTransport::handleBatch(const ReceivedDataMessage& m) noexcept {
  if (m.has_header || m.has_read_response || m.payload_bytes != 0 || m.offset != 0 || m.last ||
      !m.control.empty() || m.has_read_request) {
    return violation("batched frames share their message with other fields");
  }
  if (in_frame_ || in_response_) {
    return violation("batched frames in the middle of " +
                     (in_frame_ ? "frame " + std::to_string(frame_.sequence)
                                : "the response to read " + std::to_string(response_read_)));
  }
  for (size_t i = 0; i < m.frame_count; ++i) {
    if (!beginFrame(m.frames[i].header)) return false;
    if (!landChunk(m, i, 0, m.frames[i].payload_bytes, true)) return false;
  }
  return true;
}

bool GrpcTransport::landChunk(const ReceivedDataMessage& m, size_t frame, uint64_t offset, uint64_t bytes,
                              bool last) noexcept {
  if (offset != offset_) {
    return violation("chunk at offset " + std::to_string(offset) + ", expected " + std::to_string(offset_));
  }
  if (bytes > frame_.length - offset_) {
    return violation("chunk runs past the frame length " + std::to_string(frame_.length));
  }
  // The one copy on this side: from gRPC's receive slices into the slot.
  // A credit retracted in the middle of the frame may already stand for
  // another frame in that slot: the rest of this one is read and dropped,
  // and endReceive reports it as for a retracted credit.
  if (credit_ && bytes > 0) {
    uint8_t* dst = credit_->buffer + offset_;
    if (frame == SIZE_MAX) {
      core_->copyIntoLanding([&m, dst] { m.copyPayload(dst); });
    } else {
      core_->copyIntoLanding([&m, frame, dst] { m.copyFramePayload(frame, dst); });
    }
  }
  offset_ += bytes;
  if (!last) return true;
  if (offset_ != frame_.length) {
    return violation("last chunk at " + std::to_string(offset_) + " of " + std::to_string(frame_.length) +
                     " bytes");
  }
  in_frame_ = false;
  if (!credit_) {
    core_->frameArrived(frame_, FL_ERR_UNKNOWN_CREDIT,
                        "frame for unknown or retracted credit " + std::to_string(frame_.credit_id));
    return true;
  }
  credit_.reset();
  if (core_->endReceive()) {
    core_->frameArrived(frame_, FL_OK);
  } else {
    core_->frameArrived(
        frame_, FL_ERR_UNKNOWN_CREDIT,
        "credit " + std::to_string(frame_.credit_id) + " was retracted while the frame landed");
  }
  return true;
}

bool GrpcTransport::handleReadRequest(const framelink::v1::ReadRequest& q) noexcept {
  const int status = core_->answerRead(ReadAsk{q.source_id(), q.read_id(), q.length()});
  if (status == FL_ERR_PROTOCOL) {
    return violation("peer has more than " + std::to_string(kMaxReadsOutstanding) + " reads unanswered");
  }
  if (status != FL_OK) {
    abandonFrame();
    failLink(status, "grpc data link with " + peer_name_ + ": out of memory for a read response");
    return false;
  }
  return true;
}

bool GrpcTransport::beginFrame(const framelink::v1::FrameHeader& p) noexcept {
  if (!fromProto(p, &frame_)) {
    return violation("attributes of " + std::to_string(p.attributes().size()) + " bytes exceed " +
                     std::to_string(FL_MAX_ATTR_BYTES));
  }
  offset_ = 0;
  in_frame_ = true;
  credit_ = core_->beginReceive(frame_.credit_id);
  if (credit_ && frame_.length > credit_->capacity) {
    return violation("frame of " + std::to_string(frame_.length) + " bytes exceeds credit " +
                     std::to_string(frame_.credit_id) + " of " + std::to_string(credit_->capacity) +
                     " bytes");
  }
  if (!credit_ && frame_.length > options_.max_frame_bytes) {
    return violation("frame of " + std::to_string(frame_.length) + " bytes for unknown credit " +
                     std::to_string(frame_.credit_id) + " exceeds max_frame_bytes");
  }
  return true;
}

bool GrpcTransport::handleResponseChunk(const ReceivedDataMessage& m) noexcept {
  if (!in_response_) {
    const framelink::v1::ReadResponse& r = m.read_response;
    if (m.has_header) return violation("a read response shares its message with a frame header");
    const std::optional<ReadRequest> read = core_->findRead(r.read_id());
    if (!read) {
      return violation("read response for read " + std::to_string(r.read_id()) +
                       ", which is not outstanding");
    }
    if (r.no_source() && r.length() == 0 && m.payload_bytes == 0 && m.offset == 0 && m.last) {
      core_->readDone(r.read_id(), FL_ERR_UNKNOWN_CREDIT, 0,
                      "the peer has no source " + std::to_string(read->source.source_id) + " of " +
                          std::to_string(read->source.length) +
                          " bytes (retracted, never offered, or offered with another length)");
      return true;
    }
    // Checked before a byte lands: the buffer holds exactly the asked length.
    if (r.no_source() || r.length() != read->source.length || r.source_id() != read->source.source_id) {
      return violation("read response for read " + std::to_string(r.read_id()) +
                       " does not match its request (source " + std::to_string(r.source_id()) + ", " +
                       std::to_string(r.length()) + " bytes" + (r.no_source() ? ", no source" : "") + ")");
    }
    in_response_ = true;
    response_read_ = r.read_id();
    response_length_ = r.length();
    response_buffer_ = read->buffer;
    offset_ = 0;
  } else if (m.has_header || m.has_read_response) {
    return violation(std::string(m.has_header ? "frame header" : "read response") +
                     " in the middle of the response to read " + std::to_string(response_read_));
  }
  if (m.offset != offset_) {
    return violation("read response chunk at offset " + std::to_string(m.offset) + ", expected " +
                     std::to_string(offset_));
  }
  if (m.payload_bytes > response_length_ - offset_) {
    return violation("read response chunk runs past the length " + std::to_string(response_length_));
  }
  // The one copy on this side, as for a frame: gRPC's receive slices into
  // the read's buffer, unless the link failed meanwhile and gave it back.
  if (m.payload_bytes > 0) {
    uint8_t* dst = response_buffer_ + offset_;
    core_->copyIntoRead(response_read_, [&m, dst] { m.copyPayload(dst); });
  }
  offset_ += m.payload_bytes;
  if (!m.last) return true;
  if (offset_ != response_length_) {
    return violation("last read response chunk at " + std::to_string(offset_) + " of " +
                     std::to_string(response_length_) + " bytes");
  }
  in_response_ = false;
  response_buffer_ = nullptr;
  core_->readDone(response_read_, FL_OK, response_length_);
  return true;
}

}  // namespace framelink::transport
