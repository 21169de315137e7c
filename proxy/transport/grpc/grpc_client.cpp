// The dialing side of the grpc transport: owns the ClientContext and the
// Link.Data call, whose operations complete on the daemon's call queue.
#include <spdlog/spdlog.h>

#include "transport/grpc/grpc_transport.h"

namespace framelink::transport {

namespace {

int statusToFl(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return FL_ERR_AUTH;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return FL_ERR_PROTOCOL;
    default:
      return FL_ERR_LINK_LOST;
  }
}

class GrpcClientTransport final : public GrpcTransport {
 public:
  GrpcClientTransport(const GrpcTransportOptions& options, std::unique_ptr<LockedLinkBookkeeping> core,
                      const GrpcCallQueue& queue)
      : GrpcTransport("the dialed peer", options, std::move(core), queue) {}

  // Starts the call; its first message names the session.
  Status start(std::shared_ptr<GrpcClientTransport> self, const std::shared_ptr<grpc::Channel>& channel,
               uint64_t session_id, const std::string& token) {
    if (!joinCalls()) {
      neverStarted();
      return makeError(FL_ERR_SHUTDOWN, "grpc data link: the daemon is stopping");
    }
    holdUntilOver(std::move(self));
    {
      MutexLock lock(context_mu_);
      context_ = std::make_unique<grpc::ClientContext>();
      context_->AddMetadata(kTokenMetadataKey, token);
      stream_ = prepareRawDataCall(channel, context_.get(), cq());
      if (cancelled_) context_->TryCancel();  // the daemon ends its calls, or shutdown() came first
    }
    first_ = encodeSessionId(session_id);
    beginOp();
    stream_->StartCall(&start_tag_);
    return {};
  }

 private:
  void startRead(grpc::ByteBuffer* into, QueueTag* tag) noexcept override { stream_->Read(into, tag); }
  void startWrite(const grpc::ByteBuffer& message, grpc::WriteOptions options,
                  QueueTag* tag) noexcept override {
    stream_->Write(message, options, tag);
  }
  void startFinish(QueueTag* tag) noexcept override { stream_->Finish(&status_, tag); }
  void cancelCall() noexcept override {
    MutexLock lock(context_mu_);
    cancelled_ = true;
    if (context_) context_->TryCancel();
  }
  void callOver() noexcept override {
    failLink(status_.ok() ? FL_ERR_LINK_LOST : statusToFl(status_),
             "grpc data link: stream ended: " + std::to_string(status_.error_code()) + " " +
                 status_.error_message());
    // Frees the call.  gRPC may hold payload slices of a frame whose write
    // failed until then, and that frame's SendComplete waits for them.  The
    // stream lives in the call's memory: it goes first.
    std::unique_ptr<grpc::ClientContext> context;
    {
      MutexLock lock(context_mu_);
      stream_.reset();
      context.swap(context_);
    }
  }
  // On the queue's thread, as every reaction.  A call that did not start
  // fails its read, and its status is the LinkError.
  void started(bool /*ok*/) {
    goLive(&first_);
    endOp();
  }

  Mutex context_mu_;  // cancelCall() may come from any thread while the call is freed
  std::unique_ptr<grpc::ClientContext> context_ FL_GUARDED_BY(context_mu_);
  bool cancelled_ FL_GUARDED_BY(context_mu_) = false;
  std::unique_ptr<RawAsyncClientDataStream> stream_;  // freed before context_
  grpc::Status status_;                               // set by the finish
  grpc::ByteBuffer first_;                            // the session id, written first
  MemberTag<GrpcClientTransport> start_tag_{this, &GrpcClientTransport::started};
};

}  // namespace

Result<std::shared_ptr<Transport>> GrpcTransport::connect(std::shared_ptr<grpc::Channel> channel,
                                                          const GrpcCallQueue& queue, uint64_t session_id,
                                                          const std::string& token,
                                                          const GrpcTransportOptions& options) {
  if (!channel || queue.cq == nullptr) {
    return makeError(FL_EINVAL, "GrpcTransport::connect: no channel or queue");
  }
  auto core = LockedLinkBookkeeping::create(options.send_queue_depth);
  if (!core) return std::move(core).error().context("grpc data link");
  auto t = std::make_shared<GrpcClientTransport>(options, std::move(core).value(), queue);
  if (Status s = t->start(t, channel, session_id, token); !s) return std::move(s).error();
  return std::shared_ptr<Transport>(ownerHandle(std::move(t)));
}

}  // namespace framelink::transport
