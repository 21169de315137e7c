#include "agent/session_writer.h"

#include <time.h>

namespace framelink {

SessionWriter::SessionWriter(WriteFn write, std::chrono::milliseconds keepalive)
    : write_(std::move(write)), keepalive_(keepalive) {
  thread_ = std::thread([this] { run(); });
}

SessionWriter::SessionWriter(WriteFn write, Inline)
    : write_(std::move(write)), keepalive_(0), inline_(true) {}

SessionWriter::~SessionWriter() { close(); }

void SessionWriter::send(v1::PeerMessage message) {
  if (inline_) {
    {
      MutexLock lock(mutex_);
      if (closing_ || failed_) return;
    }
    if (!write_(message, false)) {
      MutexLock lock(mutex_);
      failed_ = true;
    }
    return;
  }
  {
    MutexLock lock(mutex_);
    if (closing_ || failed_) return;
    queue_.push_back(std::move(message));
  }
  cv_.notify_one();
}

void SessionWriter::close() {
  {
    MutexLock lock(mutex_);
    closing_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

bool SessionWriter::failed() const {
  MutexLock lock(mutex_);
  return failed_;
}

void SessionWriter::run() {
  MutexLock lock(mutex_);
  for (;;) {
    bool woke =
        lock.waitFor(cv_, keepalive_, [this]() FL_REQUIRES(mutex_) { return closing_ || !queue_.empty(); });
    if (!woke) {
      v1::PeerMessage keepalive;
      timespec ts{};
      ::clock_gettime(CLOCK_REALTIME, &ts);
      keepalive.mutable_keepalive()->set_timestamp_ns(uint64_t(ts.tv_sec) * 1000000000ULL +
                                                      uint64_t(ts.tv_nsec));
      queue_.push_back(std::move(keepalive));
    }
    while (!queue_.empty()) {
      v1::PeerMessage message = std::move(queue_.front());
      queue_.pop_front();
      bool more = !queue_.empty();
      lock.unlock();
      bool ok = write_(message, more);
      lock.lock();
      if (!ok) {
        failed_ = true;
        queue_.clear();
        return;
      }
    }
    if (closing_) return;
  }
}

}  // namespace framelink
