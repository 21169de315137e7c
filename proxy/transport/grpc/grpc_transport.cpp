// Parts of the grpc transport shared by the dialing and the serving side:
// the call's operations on the queue (reads, writes, the finish, the wakes,
// and the last completion that ends the call), and chunking on send
// (payload slices that point into the slot or the source).  Reassembly on
// receive is grpc_receive.cpp.
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
  SliceRelease(std::shared_ptr<LockedLinkBookkeeping> core, GrpcTransport* owner)
      : core_(std::move(core)), owner_(owner) {}

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

  // After the last write of a unit's frames: true when gRPC released every
  // slice already (the caller reports their completions, with `status`);
  // false when the last release reports them (`frames` is taken) and then
  // wakes the transport.
  bool releasedOrDefer(std::vector<SendRequest>* frames, int status) noexcept {
    MutexLock lock(mu_);
    if (outstanding_ == 0) {
      frames_released_ += frames->size();
      return true;
    }
    deferred_.swap(*frames);
    deferred_status_ = status;
    return false;
  }
  bool deferred() const noexcept {
    MutexLock lock(mu_);
    return !deferred_.empty();
  }
  // The transport goes: a later release wakes nobody.
  void detach() noexcept {
    MutexLock lock(mu_);
    owner_ = nullptr;
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
    if (done.empty()) return;
    for (const SendRequest& r : done) core_->completeSend(r.cookie, status, r.header.length);
    MutexLock lock(mu_);
    if (owner_ != nullptr) owner_->wake();  // the sender goes on
  }

  const std::shared_ptr<LockedLinkBookkeeping> core_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  GrpcTransport* owner_ FL_GUARDED_BY(mu_);
  size_t outstanding_ FL_GUARDED_BY(mu_) = 0;
  std::vector<SendRequest> deferred_ FL_GUARDED_BY(mu_);  // frames whose completion waits for a release
  int deferred_status_ FL_GUARDED_BY(mu_) = FL_OK;
  uint64_t frames_released_ FL_GUARDED_BY(mu_) = 0;
};

GrpcTransport::GrpcTransport(std::string peer_name, const GrpcTransportOptions& options,
                             std::unique_ptr<LockedLinkBookkeeping> core, const GrpcCallQueue& queue)
    : peer_name_(std::move(peer_name)),
      options_(clampOptions(options)),
      core_(std::move(core)),
      release_(std::make_shared<SliceRelease>(core_, this)),
      queue_(queue) {
  core_->setWake([this] { wake(); });
}

GrpcTransport::~GrpcTransport() {
  // Nothing of the call is left (the call's own reference kept the transport
  // until its last completion); a frame whose slices gRPC still holds
  // completes on their release.
  if (core_->fail(FL_ERR_SHUTDOWN, "grpc data link with " + peer_name_ + " shut down locally")) {
    warnLinkFailed(FL_ERR_SHUTDOWN, "grpc data link with " + peer_name_ + " shut down locally");
  }
  release_->detach();
}

uint64_t GrpcTransport::payloadsReleased() const noexcept { return release_->framesReleased(); }

void GrpcTransport::failLink(int status, const std::string& message) noexcept {
  if (!core_->fail(status, message)) return;
  warnLinkFailed(status, message);
  cancelCall();
}

void GrpcTransport::settleReleases() noexcept {
  // gRPC frees a finished call's stream right after the call: a second is
  // plenty, and a shutdown never hangs on it.
  release_->settle(std::chrono::seconds(1));
}

void GrpcTransport::shutdown() noexcept {
  failLink(FL_ERR_SHUTDOWN, "grpc data link with " + peer_name_ + " shut down locally");
  // The call's completions come on the queue's thread: there, it ends after this returns.
  if (QueueThreadScope::current()) return;
  {
    MutexLock lock(call_mu_);
    lock.wait(call_cv_, [this]() FL_REQUIRES(call_mu_) { return over_; });
  }
  settleReleases();
}

// ---------------------------------------------------------------- the call

void GrpcTransport::holdUntilOver(std::shared_ptr<GrpcTransport> self) noexcept {
  MutexLock lock(call_mu_);
  self_ = std::move(self);
}

std::shared_ptr<GrpcTransport> GrpcTransport::ownerHandle(std::shared_ptr<GrpcTransport> t) {
  GrpcTransport* raw = t.get();
  return std::shared_ptr<GrpcTransport>(raw, [keep = std::move(t)](GrpcTransport* p) mutable {
    p->shutdown();
    keep.reset();
  });
}

bool GrpcTransport::joinCalls() noexcept {
  return queue_.calls == nullptr || queue_.calls->join(this, [this] { cancelCall(); });
}

void GrpcTransport::neverStarted() noexcept {
  std::shared_ptr<GrpcTransport> self;
  {
    MutexLock lock(call_mu_);
    over_ = true;
    self.swap(self_);
  }
  call_cv_.notify_all();
}

void GrpcTransport::beginOp() noexcept {
  MutexLock lock(call_mu_);
  ++ops_;
}

void GrpcTransport::endOp() noexcept {
  {
    MutexLock lock(call_mu_);
    if (--ops_ > 0) return;
  }
  // The last completion: nothing of the call is out any more.
  callOver();
  if (queue_.calls != nullptr) queue_.calls->leave(this);
  std::shared_ptr<GrpcTransport> self;
  {
    MutexLock lock(call_mu_);
    over_ = true;
    self.swap(self_);
  }
  call_cv_.notify_all();
  // `self` may be the last reference: nothing follows.
}

void GrpcTransport::goLive(const grpc::ByteBuffer* write_first) noexcept {
  {
    MutexLock lock(call_mu_);
    live_ = true;
    ++ops_;  // a hold until the finish completes: a paused read has no operation out
  }
  if (write_first != nullptr) {
    writing_ = true;
    beginOp();
    startWrite(*write_first, grpc::WriteOptions(), &write_tag_);
  }
  read();
  pump();
}

void GrpcTransport::wake() noexcept {
  {
    MutexLock lock(call_mu_);
    if (!live_ || waking_ || finishing_ || over_) return;
    waking_ = true;
    ++ops_;
  }
  // Due at once: the completion comes on the queue's thread.
  alarm_.Set(queue_.cq, gpr_inf_past(GPR_CLOCK_MONOTONIC), &wake_tag_);
}

void GrpcTransport::wakeDone(bool /*ok*/) {
  {
    MutexLock lock(call_mu_);
    waking_ = false;
  }
  if (awaiting_release_ && !release_->deferred()) awaiting_release_ = false;
  if (read_paused_ && core_->roomForEvents()) {
    read_paused_ = false;
    read();
  }
  pump();
  maybeFinish();
  endOp();
}

void GrpcTransport::read() noexcept {
  if (want_finish_ || reading_) return;
  reading_ = true;
  beginOp();
  startRead(&read_buffer_, &read_tag_);
}

void GrpcTransport::readDone(bool ok) {
  reading_ = false;
  if (!ok) {
    // The call is over (the peer ended it, or it broke or was cancelled).
    abandonFrame();
    want_finish_ = true;
    readsEnded();
  } else if (!handleBuffer(&read_buffer_)) {
    want_finish_ = true;  // the link failed; the call is cancelled
  } else if (core_->roomForEvents()) {
    read();
  } else {
    read_paused_ = true;  // poll() wakes it
  }
  read_buffer_.Clear();
  if (want_finish_) core_->stopSending();
  maybeFinish();
  endOp();
}

void GrpcTransport::finishWhenIdle() noexcept {
  want_finish_ = true;
  core_->stopSending();
  maybeFinish();
}

void GrpcTransport::maybeFinish() noexcept {
  if (!want_finish_ || reading_ || writing_) return;
  // A unit cut short: its frames complete once gRPC let their slices go (the call's release).
  if (have_unit_) endUnit(FL_ERR_LINK_LOST);
  {
    MutexLock lock(call_mu_);
    if (finishing_) return;
    finishing_ = true;
    ++ops_;
  }
  startFinish(&finish_tag_);
}

void GrpcTransport::finishDone(bool /*ok*/) {
  {
    MutexLock lock(call_mu_);
    if (live_) --ops_;  // goLive's hold; the finish's own goes below
  }
  endOp();
}

// ---------------------------------------------------------------- sending

SendBatching GrpcTransport::batching() const noexcept {
  if (!batch_frames_.load(std::memory_order_acquire)) return {};
  return {kMaxBatchFrames, std::min<uint64_t>(kMaxBatchedFrameBytes, options_.chunk_bytes), kMaxBatchBytes};
}

void GrpcTransport::pump() noexcept {
  while (!writing_ && !awaiting_release_ && !send_over_ && !want_finish_) {
    if (!have_unit_) {
      const auto taken = core_->takeSend(&cursor_.out, batching());
      if (taken == LockedLinkBookkeeping::Take::kNothing) return;  // wake() comes once something is
      if (taken == LockedLinkBookkeeping::Take::kStopped) {
        send_over_ = true;
        return;
      }
      have_unit_ = true;
      cursor_.small = 0;
      cursor_.answer_done = false;
      cursor_.frames_done = false;
      cursor_.offset = 0;
    }
    grpc::ByteBuffer message;
    bool more = false;
    bool got = false;
    bool ok = true;
    try {
      got = nextMessage(&message, &more);
    } catch (...) {  // bad_alloc
      ok = false;
    }
    if (got && ok) {
      grpc::WriteOptions options;
      if (more) options.set_buffer_hint();
      writing_ = true;
      beginOp();
      startWrite(message, options, &write_tag_);
      return;  // `message` goes now: gRPC holds its own references
    }
    if (!ok) {
      failLink(FL_ERR_RESOURCES, "grpc data link with " + peer_name_ + ": out of memory for a message");
      send_over_ = true;
    }
    if (!endUnit(ok ? FL_OK : FL_ERR_LINK_LOST)) return;  // the release wakes the sender
  }
}

void GrpcTransport::writeDone(bool ok) {
  writing_ = false;
  if (!ok) {
    // The call is over; the reader sees that too and fails the link with the call's status.
    send_over_ = true;
    if (have_unit_) endUnit(FL_ERR_LINK_LOST);
  }
  pump();
  maybeFinish();
  endOp();
}

bool GrpcTransport::endUnit(int status) noexcept {
  have_unit_ = false;
  std::vector<SendRequest>& frames = cursor_.out.frames;
  if (frames.empty()) return true;
  if (!release_->releasedOrDefer(&frames, status)) {
    awaiting_release_ = true;
    return false;
  }
  for (const SendRequest& r : frames) core_->completeSend(r.cookie, status, r.header.length);
  frames.clear();
  return true;
}

bool GrpcTransport::nextMessage(grpc::ByteBuffer* message, bool* more) {
  LockedLinkBookkeeping::Outgoing& out = cursor_.out;
  // Control records, then read requests: small, each held back while more
  // follows at once, so that they share a write.
  const size_t records = out.control.size();
  const size_t small = records + out.asks.size();
  const bool unit = out.has_answer || !out.frames.empty();
  if (cursor_.small < small) {
    const size_t i = cursor_.small++;
    *more = unit || i + 1 < small;
    if (i < records) {
      *message = encodeControl(out.control[i]);
    } else {
      const ReadAsk& ask = out.asks[i - records];
      framelink::v1::ReadRequest request;
      request.set_source_id(ask.source_id);
      request.set_read_id(ask.read_id);
      request.set_length(ask.length);
      *message = encodeReadRequest(request);
    }
    return true;
  }
  if (out.has_answer && !cursor_.answer_done) {
    const ReadAnswer& a = out.answer;
    framelink::v1::ReadResponse response;
    response.set_source_id(a.asked.source_id);
    response.set_read_id(a.asked.read_id);
    const uint64_t length = a.known ? a.asked.length : 0;
    response.set_length(length);
    response.set_no_source(!a.known);
    // Chunked as a frame's payload is; the first chunk names the read.
    cursor_.answer_done = nextChunk(
        length, message,
        [&response](uint64_t offset, bool last, size_t n, std::string* prefix) {
          encodeReadResponsePrefix(offset == 0 ? &response : nullptr, offset, last, n, prefix);
        },
        [&a](uint64_t offset, size_t n) { return sourceSlice(a.keepalive, a.payload + offset, n); });
    return true;
  }
  if (out.frames.empty() || cursor_.frames_done) return false;
  if (out.frames.size() > 1) {
    batchMessage(out.frames, message);
    cursor_.frames_done = true;
    return true;
  }
  const SendRequest& r = out.frames[0];
  cursor_.frames_done = nextChunk(
      r.header.length, message,
      [&r](uint64_t offset, bool last, size_t n, std::string* prefix) {
        encodeChunkPrefix(offset == 0 ? &r.header : nullptr, offset, last, n, prefix);
      },
      [this, &r](uint64_t offset, size_t n) {
        return SliceRelease::payloadSlice(release_, r.payload + offset, n);
      });
  return true;
}

template <typename EncodePrefix, typename PayloadSlice>
bool GrpcTransport::nextChunk(uint64_t length, grpc::ByteBuffer* message, EncodePrefix&& encode,
                              PayloadSlice&& payload) {
  const uint64_t offset = cursor_.offset;
  const size_t n = static_cast<size_t>(std::min<uint64_t>(options_.chunk_bytes, length - offset));
  const bool last = offset + n == length;
  prefix_.clear();
  encode(offset, last, n, &prefix_);
  grpc::Slice slices[2] = {grpc::Slice(prefix_), grpc::Slice()};
  if (n > 0) slices[1] = payload(offset, n);
  *message = grpc::ByteBuffer(slices, n > 0 ? 2 : 1);
  cursor_.offset = last ? 0 : offset + n;
  return last;
}

void GrpcTransport::batchMessage(const std::vector<SendRequest>& frames, grpc::ByteBuffer* message) {
  // A prefix slice (copied) and a payload slice (the producer's slot) a frame.
  batch_slices_.clear();
  for (const SendRequest& r : frames) {
    prefix_.clear();
    encodeBatchedFramePrefix(r.header, r.header.length, &prefix_);
    batch_slices_.emplace_back(prefix_);
    if (r.header.length > 0) {
      batch_slices_.push_back(SliceRelease::payloadSlice(release_, r.payload, r.header.length));
    }
  }
  *message = grpc::ByteBuffer(batch_slices_.data(), batch_slices_.size());
  batch_slices_.clear();  // the message holds its own references
}

}  // namespace framelink::transport
