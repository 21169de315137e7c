#include "agent/session_timers.h"

#include <pthread.h>

namespace framelink {

SessionTimers::SessionTimers() {
  thread_ = std::thread([this] { run(); });
  thread_id_ = thread_.get_id();
}

SessionTimers::~SessionTimers() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

SessionTimers::Id SessionTimers::at(Clock::time_point when, std::function<void()> fn) {
  Id id = 0;
  bool earliest = false;
  {
    MutexLock lock(mutex_);
    id = next_id_++;
    due_.emplace(std::make_pair(when, id), std::move(fn));
    when_.emplace(id, when);
    earliest = due_.begin()->first.second == id;
  }
  if (earliest) cv_.notify_all();
  return id;
}

void SessionTimers::cancel(Id id) {
  MutexLock lock(mutex_);
  auto it = when_.find(id);
  if (it != when_.end()) {
    due_.erase({it->second, id});
    when_.erase(it);
    return;
  }
  if (std::this_thread::get_id() == thread_id_) return;  // from its own callback
  lock.wait(done_cv_, [this, id]() FL_REQUIRES(mutex_) { return running_ != id; });
}

size_t SessionTimers::waiting() const {
  MutexLock lock(mutex_);
  return due_.size();
}

void SessionTimers::run() {
  ::pthread_setname_np(::pthread_self(), "fl-sessions");
  MutexLock lock(mutex_);
  for (;;) {
    if (stopping_) return;
    if (due_.empty()) {
      lock.wait(cv_);
      continue;
    }
    const auto first = due_.begin();
    const Clock::time_point when = first->first.first;
    if (Clock::now() < when) {
      // A new earlier timer, a cancel or the stop wakes it: it looks again.
      lock.waitUntil(cv_, when, [this, when]() FL_REQUIRES(mutex_) {
        return stopping_ || due_.empty() || due_.begin()->first.first < when;
      });
      continue;
    }
    const Id id = first->first.second;
    std::function<void()> fn = std::move(first->second);
    due_.erase(first);
    when_.erase(id);
    running_ = id;
    lock.unlock();
    fn();
    fn = nullptr;  // what it captured goes before cancel() may return
    lock.lock();
    running_ = 0;
    done_cv_.notify_all();
  }
}

}  // namespace framelink
