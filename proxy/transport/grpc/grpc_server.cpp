// The serving side of the grpc transport: lives in the daemon's Data handler.
// The reader runs on the handler thread (runUntilClosed), the sender on a
// thread runUntilClosed starts and joins, so the stream is never touched
// after the handler returns.
#include <spdlog/spdlog.h>

#include <grpcpp/support/method_handler.h>

#include <system_error>

#include "transport/grpc/grpc_transport.h"

namespace framelink::transport {

RawDataLinkService::RawDataLinkService() {
  // Data is method 1 of Link (link.proto declares Session, then Data).  The
  // handler is the one the generated code uses, typed for ByteBuffers.
  constexpr int kDataMethodIndex = 1;
  MarkMethodStreamed(
      kDataMethodIndex,
      new grpc::internal::BidiStreamingHandler<RawDataLinkService, grpc::ByteBuffer, grpc::ByteBuffer>(
          [](RawDataLinkService* service, grpc::ServerContext* context, DataStream* stream) {
            return service->serveRawData(context, stream);
          },
          this));
}

Result<std::shared_ptr<GrpcServerTransport>> GrpcTransport::adoptServerStream(grpc::ServerContext* context,
                                                                              DataStream* stream,
                                                                              size_t chunk_bytes) {
  GrpcTransportOptions options;
  options.chunk_bytes = chunk_bytes;
  return adoptServerStream(context, stream, options);
}

Result<std::shared_ptr<GrpcServerTransport>> GrpcTransport::adoptServerStream(
    grpc::ServerContext* context, DataStream* stream, const GrpcTransportOptions& options) {
  if (context == nullptr || stream == nullptr) {
    return makeError(FL_EINVAL, "GrpcTransport::adoptServerStream: null context or stream");
  }
  auto core = LockedLinkBookkeeping::create(options.send_queue_depth);
  if (!core) return std::move(core).error().context("grpc data link from " + context->peer());
  return std::make_shared<GrpcServerTransport>(context, stream, options, std::move(core).value());
}

GrpcServerTransport::GrpcServerTransport(grpc::ServerContext* context, DataStream* stream,
                                         const GrpcTransportOptions& options,
                                         std::unique_ptr<LockedLinkBookkeeping> core)
    : GrpcTransport(context->peer(), options, std::move(core)), context_(context), stream_(stream) {}

// Not shutdown(): the last reference may go on the handler thread, before
// the call (and any payload slice it holds) is freed.
GrpcServerTransport::~GrpcServerTransport() { close(); }

bool GrpcServerTransport::writeMessage(const grpc::ByteBuffer& message, bool more) noexcept {
  grpc::WriteOptions options;
  if (more) options.set_buffer_hint();
  return stream_->Write(message, options);
}

void GrpcServerTransport::cancelStream() noexcept {
  MutexLock lock(mu_);
  if (state_ == State::kRunning && context_ != nullptr) context_->TryCancel();
}

grpc::Status GrpcServerTransport::runUntilClosed() {
  {
    MutexLock lock(mu_);
    if (state_ != State::kAdopted) {
      return {grpc::StatusCode::FAILED_PRECONDITION, "data transport already closed"};
    }
    state_ = State::kRunning;
  }
  grpc::Status result = grpc::Status::OK;
  // The headers commit the call on the dialing side: until then a channel
  // with retries on keeps a reference to every message (payload slices
  // included), and a frame's SendComplete waits for gRPC to drop those.
  stream_->SendInitialMetadata();
  try {
    sender_ = std::thread([this] { senderLoop(); });
  } catch (const std::system_error& e) {
    failLink(FL_ERR_RESOURCES, std::string("grpc data link: cannot start the sender thread: ") + e.what());
    result = {grpc::StatusCode::RESOURCE_EXHAUSTED, "cannot start the sender thread"};
  }
  // shutdown() may have run before this call was marked running, in which
  // case it could not cancel the call: do not start reading then.
  if (sender_.joinable() && !core_->failed()) {
    grpc::ByteBuffer msg;
    bool protocol_ok = true;
    while (protocol_ok && stream_->Read(&msg)) protocol_ok = handleBuffer(&msg);
    abandonFrame();
    if (!protocol_ok) result = {grpc::StatusCode::INVALID_ARGUMENT, "framelink data protocol violation"};
    // The peer stopped sending; make sure a Write blocked on flow control
    // returns, then stop the sender before the stream goes away.
    stopSender();
    cancelStream();
    sender_.join();
    failLink(FL_ERR_LINK_LOST, "grpc data link with " + peer_name_ + ": peer closed the stream");
  } else if (sender_.joinable()) {
    stopSender();
    sender_.join();
    result = {grpc::StatusCode::CANCELLED, "data transport shut down"};
  }
  {
    MutexLock lock(mu_);
    state_ = State::kClosed;
    context_ = nullptr;
    stream_ = nullptr;
  }
  cv_.notify_all();
  return result;
}

void GrpcServerTransport::shutdown() noexcept {
  close();
  settleReleases();
}

void GrpcServerTransport::close() noexcept {
  failLink(FL_ERR_SHUTDOWN, "grpc data link with " + peer_name_ + " shut down locally");
  MutexLock lock(mu_);
  if (state_ == State::kAdopted) {
    state_ = State::kClosed;  // runUntilClosed() will return at once
    context_ = nullptr;
    return;
  }
  lock.wait(cv_, [&]() FL_REQUIRES(mu_) { return state_ == State::kClosed; });
}

}  // namespace framelink::transport
