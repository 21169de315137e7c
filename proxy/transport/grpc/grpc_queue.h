// What the grpc transport's calls share with the daemon's other calls on
// gRPC's asynchronous API: one completion queue that one thread drives
// (link/session_call.h: SessionQueue), its tags, and the set of Data calls
// still running, which the daemon ends before it shuts the queue down.
//
// Every tag given to gRPC on that queue is a QueueTag: the thread calls
// complete(ok) for each completion, one at a time.  A reaction must not block.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>

#include "common/thread_annotations.h"

namespace framelink::transport {

class QueueTag {
 public:
  virtual ~QueueTag() = default;
  virtual void complete(bool ok) = 0;
};

// A completion handled by a member function of its call.
template <typename Owner>
class MemberTag final : public QueueTag {
 public:
  MemberTag(Owner* owner, void (Owner::*fn)(bool)) : owner_(owner), fn_(fn) {}
  void complete(bool ok) override { (owner_->*fn_)(ok); }

 private:
  Owner* owner_;
  void (Owner::*fn_)(bool);
};

// Marks the calling thread as the one that drives a call queue, for as long
// as the object lives.  A transport's shutdown() on that thread does not
// wait for its call to end: the call's completions need that very thread.
class QueueThreadScope {
 public:
  QueueThreadScope();
  ~QueueThreadScope();
  QueueThreadScope(const QueueThreadScope&) = delete;
  QueueThreadScope& operator=(const QueueThreadScope&) = delete;

  static bool current() noexcept;
};

// The Data calls of one queue that have not ended yet.  A call joins when
// it starts and leaves once its last completion came; endAll() cancels
// every one and waits until they all left, so that the queue can shut down.
class DataCalls {
 public:
  using Cancel = std::function<void()>;

  // False once endAll() began: the call must not start.
  bool join(const void* call, Cancel cancel);
  void leave(const void* call);
  void endAll();
  bool ending() const;
  size_t size() const;

 private:
  mutable Mutex mutex_;
  std::condition_variable cv_;
  bool ending_ FL_GUARDED_BY(mutex_) = false;
  std::map<const void*, Cancel> calls_ FL_GUARDED_BY(mutex_);
};

}  // namespace framelink::transport
