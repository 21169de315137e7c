// One thread that runs the timed work of every live session: keepalives
// due, a peer silent for too long, a data channel that did not come in time.
// A Session call has no thread of its own (link/session_call.h); what it
// must do at a time it asks of these timers.  A callback runs on the timers' thread
// and must not block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "common/thread_annotations.h"

namespace framelink {

class SessionTimers {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  SessionTimers();
  ~SessionTimers();
  SessionTimers(const SessionTimers&) = delete;
  SessionTimers& operator=(const SessionTimers&) = delete;

  // Runs `fn` once at `when` (at once when it has passed), unless cancel()ed first.
  Id at(Clock::time_point when, std::function<void()> fn);
  // After it returns, the callback of `id` does not run and is not running --
  // except when called from that callback itself.  A fired id is ignored.
  void cancel(Id id);
  // How many callbacks wait (for tests and metrics).
  size_t waiting() const;

 private:
  void run();

  mutable Mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;  // a callback returned (cancel waits for the one running)
  // By time, then id: the earliest first.
  std::map<std::pair<Clock::time_point, Id>, std::function<void()>> due_ FL_GUARDED_BY(mutex_);
  std::map<Id, Clock::time_point> when_ FL_GUARDED_BY(mutex_);
  Id next_id_ FL_GUARDED_BY(mutex_) = 1;
  Id running_ FL_GUARDED_BY(mutex_) = 0;
  bool stopping_ FL_GUARDED_BY(mutex_) = false;
  std::thread::id thread_id_;
  std::thread thread_;
};

}  // namespace framelink
