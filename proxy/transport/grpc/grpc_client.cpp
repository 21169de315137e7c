// The dialing side of the grpc transport: owns the ClientContext and the
// Link.Data call; a reader thread and a sender thread.
#include <spdlog/spdlog.h>

#include <system_error>

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
  GrpcClientTransport(std::shared_ptr<grpc::Channel> channel, const GrpcTransportOptions& options,
                      std::unique_ptr<LockedLinkBookkeeping> core)
      : GrpcTransport("the dialed peer", options, std::move(core)),
        channel_(std::move(channel)),
        context_(std::make_unique<grpc::ClientContext>()) {}

  ~GrpcClientTransport() override { shutdown(); }

  Status start(uint64_t session_id, const std::string& token) {
    grpc::ClientContext* context = nullptr;
    {
      MutexLock lock(context_mu_);
      context = context_.get();
    }
    context->AddMetadata(kTokenMetadataKey, token);
    stream_ = openRawDataCall(channel_, context);
    if (!stream_) return makeError(FL_ERR_TRANSPORT, "grpc data link: cannot open the Data call");
    // A failed first write means the call is already over; the reader then
    // reports why (e.g. UNAUTHENTICATED) as the LinkError.
    stream_->Write(encodeSessionId(session_id));
    try {
      // Sender first: the reader joins it, so it must exist before the reader runs.
      sender_ = std::thread([this] { senderLoop(); });
      MutexLock lock(join_mu_);
      reader_ = std::thread([this] { readerLoop(); });
    } catch (const std::system_error& e) {
      shutdown();
      return makeError(FL_ERR_RESOURCES, std::string("grpc data link: cannot start threads: ") + e.what());
    }
    return {};
  }

  void shutdown() noexcept override {
    failLink(FL_ERR_SHUTDOWN, "grpc data link shut down locally");
    MutexLock lock(join_mu_);
    if (reader_.joinable()) {
      reader_.join();  // joins the sender and finishes the call
    } else if (stream_ && !finished_) {
      // start() failed before the reader ran.
      stopSender();
      if (sender_.joinable()) sender_.join();
      stream_->Finish();
      finished_ = true;
      releaseCall();
    }
    settleReleases();
  }

 private:
  bool writeMessage(const grpc::ByteBuffer& message, bool more) noexcept override {
    grpc::WriteOptions options;
    if (more) options.set_buffer_hint();
    return stream_->Write(message, options);
  }
  void cancelStream() noexcept override {
    MutexLock lock(context_mu_);
    if (context_) context_->TryCancel();
  }

  // Frees the finished call.  gRPC may hold payload slices of a frame whose
  // write failed until then (in the call's stream), and that frame's
  // SendComplete waits for them.
  void releaseCall() noexcept {
    stream_.reset();
    MutexLock lock(context_mu_);
    context_.reset();  // the context holds the call's last reference
  }

  void readerLoop() noexcept {
    grpc::ByteBuffer msg;
    bool protocol_ok = true;
    while (protocol_ok && stream_->Read(&msg)) protocol_ok = handleBuffer(&msg);
    abandonFrame();
    // Finish() may not overlap a Write(): stop the sender first.  Once Read
    // returned false the call is over, so a Write in progress returns soon;
    // after a protocol violation failLink() cancelled the call.
    stopSender();
    if (sender_.joinable()) sender_.join();
    grpc::Status status = stream_->Finish();
    finished_ = true;
    std::string text =
        "grpc data link: stream ended: " + std::to_string(status.error_code()) + " " + status.error_message();
    failLink(status.ok() ? FL_ERR_LINK_LOST : statusToFl(status), text);
    releaseCall();
  }

  std::shared_ptr<grpc::Channel> channel_;
  Mutex context_mu_;  // cancelStream() may run on any thread while the reader frees the call
  std::unique_ptr<grpc::ClientContext> context_ FL_GUARDED_BY(context_mu_);
  std::unique_ptr<RawClientDataStream> stream_;  // freed before context_
  Mutex join_mu_;          // one shutdown() joins the reader, a concurrent one waits for that
  bool finished_ = false;  // reader thread, then shutdown() after joining it
  std::thread reader_ FL_GUARDED_BY(join_mu_);
  std::thread sender_;  // joined by the reader thread
};

}  // namespace

Result<std::unique_ptr<Transport>> GrpcTransport::connect(std::shared_ptr<grpc::Channel> channel,
                                                          uint64_t session_id, const std::string& token,
                                                          size_t chunk_bytes) {
  GrpcTransportOptions options;
  options.chunk_bytes = chunk_bytes;
  return connect(std::move(channel), session_id, token, options);
}

Result<std::unique_ptr<Transport>> GrpcTransport::connect(std::shared_ptr<grpc::Channel> channel,
                                                          uint64_t session_id, const std::string& token,
                                                          const GrpcTransportOptions& options) {
  if (!channel) return makeError(FL_EINVAL, "GrpcTransport::connect: null channel");
  auto core = LockedLinkBookkeeping::create(options.send_queue_depth);
  if (!core) return std::move(core).error().context("grpc data link");
  auto t = std::make_unique<GrpcClientTransport>(std::move(channel), options, std::move(core).value());
  if (Status s = t->start(session_id, token); !s) return std::move(s).error();
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace framelink::transport
