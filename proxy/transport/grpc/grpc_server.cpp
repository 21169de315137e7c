// The serving side of the grpc transport: each Data call a peer opens, on
// the daemon's call queue.  A transport waits for the next call (its
// context and stream asked of the service), checks it (the token, then the
// session its first message names), and carries the link once admitted.
#include <spdlog/spdlog.h>

#include <chrono>

#include "common/log_limit.h"
#include "transport/grpc/grpc_transport.h"

namespace framelink::transport {

namespace {

using ServerDataStream = grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

LogLimiter& awaitLog() {
  static LogLimiter limiter;
  return limiter;
}

// After the next call could not be awaited (out of fds for its eventfd):
// tries again in a second, until it can or the daemon ends its calls.
class AwaitRetry final : public QueueTag {
 public:
  AwaitRetry(RawDataService& service, grpc::ServerCompletionQueue* cq, DataCalls* calls,
             std::shared_ptr<const DataCallHooks> hooks)
      : service_(service), cq_(cq), calls_(calls), hooks_(std::move(hooks)) {
    alarm_.Set(cq_, std::chrono::system_clock::now() + std::chrono::seconds(1), this);
  }
  void complete(bool ok) override {
    if (ok && (calls_ == nullptr || !calls_->ending())) {
      if (Status s = GrpcTransport::awaitDataCall(service_, cq_, calls_, hooks_); !s) {
        new AwaitRetry(service_, cq_, calls_, hooks_);
      }
    }
    delete this;
  }

 private:
  RawDataService& service_;
  grpc::ServerCompletionQueue* cq_;
  DataCalls* calls_;
  std::shared_ptr<const DataCallHooks> hooks_;
  grpc::Alarm alarm_;
};

class GrpcServerTransport final : public GrpcTransport {
 public:
  GrpcServerTransport(RawDataService& service, grpc::ServerCompletionQueue* cq, DataCalls* calls,
                      std::shared_ptr<const DataCallHooks> hooks, std::unique_ptr<LockedLinkBookkeeping> core)
      : GrpcTransport("a peer", hooks->options, std::move(core), GrpcCallQueue{cq, calls}),
        service_(service),
        server_cq_(cq),
        hooks_(std::move(hooks)),
        context_(std::make_unique<grpc::ServerContext>()),
        ctx_(context_.get()),
        stream_(std::make_unique<ServerDataStream>(ctx_)) {}

  void await(const std::shared_ptr<GrpcServerTransport>& self) {
    weak_self_ = self;
    holdUntilOver(self);
    ctx_->AsyncNotifyWhenDone(&done_tag_);
    service_.RequestData(ctx_, stream_.get(), server_cq_, server_cq_, &start_tag_);
  }

 private:
  void started(bool ok) {
    if (!ok) {  // the server shuts down: no call comes, and no done tag either
      neverStarted();
      return;
    }
    peer_name_ = ctx_->peer();
    {
      MutexLock lock(context_mu_);
      started_ = true;
    }
    beginOp();  // the done tag, now that the call started
    if (Status s = awaitDataCall(service_, server_cq_, calls(), hooks_); !s) {
      awaitLog().error("grpc data channels: cannot wait for the next one ({}); trying again in a second",
                       s.error().message);
      new AwaitRetry(service_, server_cq_, calls(), hooks_);
    }
    if (!joinCalls()) return refuse({grpc::StatusCode::UNAVAILABLE, "the daemon is stopping"});
    if (grpc::Status s = hooks_->first(*ctx_); !s.ok()) return refuse(s);
    if (hooks_->first_message_timeout.count() > 0) {
      beginOp();
      deadline_.Set(server_cq_, std::chrono::system_clock::now() + hooks_->first_message_timeout,
                    &deadline_tag_);
    }
    beginOp();
    stream_->Read(&first_, &first_tag_);
  }

  void firstRead(bool ok) {
    first_read_ = true;
    deadline_.Cancel();  // its completion comes with ok == false, unless it fired
    if (!ok) return refuseAndEnd({grpc::StatusCode::CANCELLED, "no first message"});
    ReceivedDataMessage parsed;
    if (std::string why = parseDataMessage(&first_, &parsed); !why.empty()) {
      return refuseAndEnd({grpc::StatusCode::INVALID_ARGUMENT, "malformed first DataMessage: " + why});
    }
    first_.Clear();
    session_id_ = parsed.session_id;
    if (grpc::Status s = hooks_->admit(*ctx_, session_id_); !s.ok()) return refuseAndEnd(s);
    if (Status s = core_->openEventFd(); !s) {
      return refuseAndEnd({grpc::StatusCode::RESOURCE_EXHAUSTED, s.error().message});
    }
    // The headers commit the call on the dialing side: until then a channel
    // with retries on keeps a reference to every message (payload slices
    // included), and a frame's SendComplete waits for gRPC to drop those.
    beginOp();
    stream_->SendInitialMetadata(&metadata_tag_);
    endOp();
  }

  void metadataSent(bool ok) {
    if (!ok) return refuseAndEnd({grpc::StatusCode::CANCELLED, "the call ended before its headers went out"});
    accepted_ = true;
    goLive(nullptr);
    if (auto self = weak_self_.lock()) hooks_->accepted(session_id_, ownerHandle(std::move(self)));
    endOp();
  }

  // No first message in time: the call is cancelled, and its read fails.
  void deadlinePassed(bool ok) {
    if (ok && !first_read_) cancelCall();
    endOp();
  }

  void done(bool /*ok*/) { endOp(); }

  void refuse(const grpc::Status& status) {
    finish_status_ = status;
    finishWhenIdle();
  }
  void refuseAndEnd(const grpc::Status& status) {
    refuse(status);
    endOp();  // the operation that refused
  }

  void startRead(grpc::ByteBuffer* into, QueueTag* tag) noexcept override { stream_->Read(into, tag); }
  void startWrite(const grpc::ByteBuffer& message, grpc::WriteOptions options,
                  QueueTag* tag) noexcept override {
    stream_->Write(message, options, tag);
  }
  void startFinish(QueueTag* tag) noexcept override { stream_->Finish(finish_status_, tag); }
  // The peer stopped sending: a write waiting on flow control must end too.
  void readsEnded() noexcept override { cancelCall(); }
  void cancelCall() noexcept override {
    MutexLock lock(context_mu_);
    if (started_ && context_) context_->TryCancel();
  }
  void callOver() noexcept override {
    if (accepted_) {
      failLink(FL_ERR_LINK_LOST, "grpc data link with " + peer_name_ + ": peer closed the stream");
    } else {
      core_->fail(FL_ERR_LINK_LOST, "the data call was refused");  // nobody has the transport
    }
    // Frees the call; gRPC lets the payload slices it held go.
    std::unique_ptr<ServerDataStream> stream;
    std::unique_ptr<grpc::ServerContext> context;
    {
      MutexLock lock(context_mu_);
      stream.swap(stream_);
      context.swap(context_);
    }
  }

  RawDataService& service_;
  grpc::ServerCompletionQueue* const server_cq_;
  const std::shared_ptr<const DataCallHooks> hooks_;
  std::weak_ptr<GrpcServerTransport> weak_self_;
  Mutex context_mu_;  // cancelCall() may come from any thread while the call is freed
  bool started_ FL_GUARDED_BY(context_mu_) = false;
  std::unique_ptr<grpc::ServerContext> context_ FL_GUARDED_BY(context_mu_);
  grpc::ServerContext* const ctx_;            // context_, for the queue's thread: valid until callOver()
  std::unique_ptr<ServerDataStream> stream_;  // freed before context_
  // The queue's thread only.
  grpc::ByteBuffer first_;
  bool first_read_ = false;
  bool accepted_ = false;
  uint64_t session_id_ = 0;
  grpc::Status finish_status_;
  grpc::Alarm deadline_;
  MemberTag<GrpcServerTransport> start_tag_{this, &GrpcServerTransport::started};
  MemberTag<GrpcServerTransport> first_tag_{this, &GrpcServerTransport::firstRead};
  MemberTag<GrpcServerTransport> metadata_tag_{this, &GrpcServerTransport::metadataSent};
  MemberTag<GrpcServerTransport> deadline_tag_{this, &GrpcServerTransport::deadlinePassed};
  MemberTag<GrpcServerTransport> done_tag_{this, &GrpcServerTransport::done};
};

}  // namespace

Status GrpcTransport::awaitDataCall(RawDataService& service, grpc::ServerCompletionQueue* cq,
                                    DataCalls* calls, std::shared_ptr<const DataCallHooks> hooks) {
  if (cq == nullptr || !hooks) return makeError(FL_EINVAL, "GrpcTransport::awaitDataCall: no queue or hooks");
  // Its eventfd once the call is admitted: the call waited for holds none.
  auto core = LockedLinkBookkeeping::createWithoutEventFd(hooks->options.send_queue_depth);
  if (!core) return std::move(core).error().context("grpc data link");
  auto t =
      std::make_shared<GrpcServerTransport>(service, cq, calls, std::move(hooks), std::move(core).value());
  t->await(t);
  return {};
}

}  // namespace framelink::transport
