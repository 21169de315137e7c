// A multi-producer, single-consumer queue of commands into a thread that
// sleeps on epoll: push() from any thread, drain() from the owner.  The
// eventfd is readable while something is queued: the first push() into an
// empty queue writes it and the drain() that takes it all reads it, so a
// drain() of an empty queue -- the owner's every turn -- makes no system call.
//
// This is the one place where threads hand work to the data agent; it takes a
// mutex because its producers (attach thread, gRPC session readers, link
// dialers) are few and slow compared with the data path, which never goes
// through here.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <utility>

#include "common/thread_annotations.h"
#include "common/unique_fd.h"

namespace framelink {

template <typename T>
class CommandQueue {
 public:
  CommandQueue() : event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

  void push(T command) {
    MutexLock lock(mutex_);
    queue_.push_back(std::move(command));
    if (!signalled_.load(std::memory_order_relaxed)) {
      signalled_.store(true, std::memory_order_release);
      uint64_t one = 1;
      [[maybe_unused]] auto n = ::write(event_fd_.get(), &one, sizeof(one));
    }
  }

  // Moves everything queued into `out`; returns how many.
  size_t drain(std::deque<T>& out) {
    // A push() racing with this check writes the eventfd after it: the
    // owner's next turn sees it.
    if (!signalled_.load(std::memory_order_acquire)) return 0;
    MutexLock lock(mutex_);
    uint64_t value;
    [[maybe_unused]] auto n = ::read(event_fd_.get(), &value, sizeof(value));
    signalled_.store(false, std::memory_order_relaxed);
    size_t count = queue_.size();
    while (!queue_.empty()) {
      out.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    return count;
  }

  // Moves the queued commands for which `take(const T&)` is true into
  // `out`, in order; the others stay queued, in order (and the eventfd
  // readable).  Returns how many it moved.
  template <typename Take>
  size_t drainIf(Take&& take, std::deque<T>& out) {
    MutexLock lock(mutex_);
    size_t count = 0;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (!take(*it)) {
        ++it;
        continue;
      }
      out.push_back(std::move(*it));
      it = queue_.erase(it);
      ++count;
    }
    return count;
  }

  int eventFd() const noexcept { return event_fd_.get(); }

 private:
  UniqueFd event_fd_;
  Mutex mutex_;
  std::deque<T> queue_ FL_GUARDED_BY(mutex_);
  // The eventfd was written and not read since; changed under mutex_ only.
  // True whenever queue_ holds something.
  std::atomic<bool> signalled_{false};
};

}  // namespace framelink
