// A multi-producer, single-consumer queue of commands into a thread that
// sleeps on epoll: push() from any thread, drain() from the owner.  The
// eventfd becomes readable when something was pushed.
//
// This is the one place where threads hand work to the data agent; it takes a
// mutex because its producers (attach thread, gRPC session readers, link
// dialers) are few and slow compared with the data path, which never goes
// through here.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

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
    {
      MutexLock lock(mutex_);
      queue_.push_back(std::move(command));
    }
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(event_fd_.get(), &one, sizeof(one));
  }

  // Moves everything queued into `out`; returns how many.
  size_t drain(std::deque<T>& out) {
    uint64_t value;
    [[maybe_unused]] auto n = ::read(event_fd_.get(), &value, sizeof(value));
    MutexLock lock(mutex_);
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
};

}  // namespace framelink
