// Pull: when nothing reads a producer's slot any more.
//
// An offered frame's source is exposed with a pin as its keepalive.  The
// transport keeps copies of the pin for as long as it may read the slot: in
// its sources table until retractSource, then in an answer still being
// written (tcp's queue of writes, a gRPC slice) or in a window whose
// invalidation has not executed (rdma).  When the last copy goes, in
// whatever thread, the pin queues its cookie here and wakes the agent; the
// frame's slot goes back to its producer only then
// (OutboundStreams::settleSources).  So a frame that ends while a peer's read
// of it is half answered -- its ACK deadline passed -- does not let the
// producer write the next frame under bytes still going out.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "common/unique_fd.h"

namespace framelink {

class SourcePins {
 public:
  SourcePins() : event_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  SourcePins(const SourcePins&) = delete;
  SourcePins& operator=(const SourcePins&) = delete;

  // A keepalive that holds `memory` and queues `cookie` when its last copy goes.
  static std::shared_ptr<void> pin(const std::shared_ptr<SourcePins>& pins, uint64_t cookie,
                                   std::shared_ptr<void> memory) {
    {
      MutexLock lock(pins->mutex_);
      // Room for every pin not yet taken: queueing it never allocates, so
      // a pin's destructor cannot fail.
      pins->released_.reserve(++pins->untaken_);
    }
    return std::make_shared<Pin>(pins, cookie, std::move(memory));
  }

  // Readable while cookies wait to be taken.
  int eventFd() const noexcept { return event_fd_.get(); }

  // The cookies whose pins went since the last call, oldest first.
  std::vector<uint64_t> take() {
    if (!waiting_.load(std::memory_order_acquire)) return {};
    uint64_t value;
    [[maybe_unused]] auto n = ::read(event_fd_.get(), &value, sizeof(value));
    MutexLock lock(mutex_);
    waiting_.store(false, std::memory_order_relaxed);
    std::vector<uint64_t> out(released_.begin(), released_.end());
    untaken_ -= released_.size();
    released_.clear();  // keeps its capacity
    return out;
  }

 private:
  struct Pin {
    Pin(std::shared_ptr<SourcePins> p, uint64_t c, std::shared_ptr<void> m)
        : pins(std::move(p)), cookie(c), memory(std::move(m)) {}
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;
    ~Pin() { pins->released(cookie); }
    std::shared_ptr<SourcePins> pins;
    uint64_t cookie;
    std::shared_ptr<void> memory;
  };

  void released(uint64_t cookie) noexcept {
    {
      MutexLock lock(mutex_);
      released_.push_back(cookie);  // within the capacity pin() reserved
      waiting_.store(true, std::memory_order_release);
    }
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(event_fd_.get(), &one, sizeof(one));
  }

  UniqueFd event_fd_;
  std::atomic<bool> waiting_{false};
  Mutex mutex_;
  std::vector<uint64_t> released_ FL_GUARDED_BY(mutex_);
  size_t untaken_ FL_GUARDED_BY(mutex_) = 0;  // pins made and not yet taken
};

}  // namespace framelink
