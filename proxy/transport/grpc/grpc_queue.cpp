#include "transport/grpc/grpc_queue.h"

#include <utility>

namespace framelink::transport {

namespace {
thread_local int queue_thread_depth = 0;
}  // namespace

QueueThreadScope::QueueThreadScope() { ++queue_thread_depth; }
QueueThreadScope::~QueueThreadScope() { --queue_thread_depth; }
bool QueueThreadScope::current() noexcept { return queue_thread_depth > 0; }

bool DataCalls::join(const void* call, Cancel cancel) {
  MutexLock lock(mutex_);
  if (ending_) return false;
  calls_[call] = std::move(cancel);
  return true;
}

void DataCalls::leave(const void* call) {
  {
    MutexLock lock(mutex_);
    calls_.erase(call);
  }
  cv_.notify_all();
}

void DataCalls::endAll() {
  MutexLock lock(mutex_);
  ending_ = true;
  // Under the lock: a call that left may be gone.  A cancel completes nothing
  // here (completions come on the queue's thread), so it never leaves from
  // inside this loop.
  for (auto& [call, cancel] : calls_) cancel();
  lock.wait(cv_, [this]() FL_REQUIRES(mutex_) { return calls_.empty(); });
}

bool DataCalls::ending() const {
  MutexLock lock(mutex_);
  return ending_;
}

size_t DataCalls::size() const {
  MutexLock lock(mutex_);
  return calls_.size();
}

}  // namespace framelink::transport
