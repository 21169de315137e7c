// Rate-limited logging for what a hostile client or peer can cause: at most
// one line per cause and interval, and the next line that gets through says
// how many were suppressed meanwhile.  So an attack costs a bounded amount of
// log, and the log still says that (and how often) it happened.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <utility>

#include "common/thread_annotations.h"

namespace framelink {

class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(1)) : interval_(interval) {}

  // True when a line may be written now; `*suppressed` is how many were
  // dropped since the last one that was.
  bool allow(uint64_t* suppressed) {
    MutexLock lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (written_ && now - last_ < interval_) {
      ++suppressed_;
      return false;
    }
    written_ = true;
    last_ = now;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

  // Formats through spdlog alone (one formatting path for every log line);
  // after a quiet spell, a line first says how many were suppressed.
  template <typename... Args>
  void warn(spdlog::format_string_t<Args...> format, Args&&... args) {
    uint64_t suppressed = 0;
    if (!allow(&suppressed)) return;
    if (suppressed > 0) {
      spdlog::warn("{} more lines like the next were suppressed in the last {} ms", suppressed,
                   interval_.count());
    }
    spdlog::warn(format, std::forward<Args>(args)...);
  }

 private:
  const std::chrono::milliseconds interval_;
  Mutex mutex_;
  bool written_ FL_GUARDED_BY(mutex_) = false;
  std::chrono::steady_clock::time_point last_ FL_GUARDED_BY(mutex_){};
  uint64_t suppressed_ FL_GUARDED_BY(mutex_) = 0;
};

}  // namespace framelink
