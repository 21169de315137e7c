#include "link/session_call.h"

#include <pthread.h>

namespace framelink {

SessionQueue::SessionQueue(std::unique_ptr<::grpc::ServerCompletionQueue> cq) : cq_(std::move(cq)) {
  thread_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "fl-session-cq");
    const transport::QueueThreadScope queue_thread;
    void* tag = nullptr;
    bool ok = false;
    while (cq_->Next(&tag, &ok)) static_cast<SessionTag*>(tag)->complete(ok);
  });
}

void SessionQueue::shutdown() {
  if (!thread_.joinable()) return;
  cq_->Shutdown();
  thread_.join();
}

}  // namespace framelink
