// Lock rules the compiler checks: clang's thread-safety analysis
// (-Wthread-safety, on in the clang build of scripts/fuzz.sh) proves that every
// member marked FL_GUARDED_BY(mu) is touched only with `mu` held and that a
// function marked FL_REQUIRES(mu) is only called with it held.  Under GCC the
// macros are empty and Mutex is a plain std::mutex.
//
// libstdc++'s std::mutex carries no capability attributes, so the daemon locks
// through the Mutex and MutexLock below.  The macros carry an FL_ prefix
// because abseil (pulled in by gRPC's headers) defines the unprefixed names.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define FL_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define FL_THREAD_ANNOTATION(x)
#endif

#define FL_CAPABILITY(x) FL_THREAD_ANNOTATION(capability(x))
#define FL_SCOPED_CAPABILITY FL_THREAD_ANNOTATION(scoped_lockable)
#define FL_GUARDED_BY(x) FL_THREAD_ANNOTATION(guarded_by(x))
#define FL_PT_GUARDED_BY(x) FL_THREAD_ANNOTATION(pt_guarded_by(x))
#define FL_ACQUIRED_BEFORE(...) FL_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define FL_ACQUIRED_AFTER(...) FL_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define FL_REQUIRES(...) FL_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define FL_ACQUIRE(...) FL_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define FL_RELEASE(...) FL_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define FL_TRY_ACQUIRE(...) FL_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define FL_EXCLUDES(...) FL_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define FL_ASSERT_CAPABILITY(x) FL_THREAD_ANNOTATION(assert_capability(x))
#define FL_RETURN_CAPABILITY(x) FL_THREAD_ANNOTATION(lock_returned(x))
#define FL_NO_THREAD_SAFETY_ANALYSIS FL_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace framelink {

// std::mutex with the capability attribute the analysis needs.
class FL_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() FL_ACQUIRE() { mu_.lock(); }
  void unlock() FL_RELEASE() { mu_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope (std::unique_lock underneath, so a
// std::condition_variable can wait on it: the wait releases and re-acquires
// the mutex, and the caller holds it again when wait returns, as the analysis
// assumes).  unlock()/lock() open a window in the middle of the scope.
class FL_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) FL_ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() FL_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() FL_RELEASE() { lock_.unlock(); }
  void lock() FL_ACQUIRE() { lock_.lock(); }

  // Condition-variable waits; `pred` runs with the mutex held, so a lambda
  // reading guarded members says so with FL_REQUIRES.
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  template <typename Pred>
  void wait(std::condition_variable& cv, Pred pred) {
    cv.wait(lock_, std::move(pred));
  }
  template <typename Rep, typename Period, typename Pred>
  bool waitFor(std::condition_variable& cv, std::chrono::duration<Rep, Period> timeout, Pred pred) {
    return cv.wait_for(lock_, timeout, std::move(pred));
  }
  template <typename Clock, typename Duration, typename Pred>
  bool waitUntil(std::condition_variable& cv, std::chrono::time_point<Clock, Duration> deadline, Pred pred) {
    return cv.wait_until(lock_, deadline, std::move(pred));
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace framelink
