// Rate-limited logging for what a hostile client or peer can cause: at most
// `burst` lines per cause and interval, and the next line that gets through
// says how many were suppressed meanwhile.  So an attack costs a bounded
// amount of log, and the log still says that (and how often) it happened.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <utility>

#include "common/thread_annotations.h"

namespace framelink {

class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(1), uint32_t burst = 1)
      : interval_(interval), burst_(burst == 0 ? 1 : burst) {}

  // True when a line may be written now; `*suppressed` is how many were
  // dropped since the last one that was.
  bool allow(uint64_t* suppressed) {
    MutexLock lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (!started_ || now - window_start_ >= interval_) {
      started_ = true;
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= burst_) {
      ++suppressed_;
      return false;
    }
    ++in_window_;
    *suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

  // Formats through spdlog alone (one formatting path for every log line);
  // after a quiet spell, a line first says how many were suppressed.
  template <typename... Args>
  void warn(spdlog::format_string_t<Args...> format, Args&&... args) {
    log(spdlog::level::warn, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void info(spdlog::format_string_t<Args...> format, Args&&... args) {
    log(spdlog::level::info, format, std::forward<Args>(args)...);
  }
  template <typename... Args>
  void error(spdlog::format_string_t<Args...> format, Args&&... args) {
    log(spdlog::level::err, format, std::forward<Args>(args)...);
  }

 private:
  template <typename... Args>
  void log(spdlog::level::level_enum level, spdlog::format_string_t<Args...> format, Args&&... args) {
    if (!spdlog::should_log(level)) return;
    uint64_t suppressed = 0;
    if (!allow(&suppressed)) return;
    if (suppressed > 0) {
      spdlog::log(level, "{} more lines like the next were suppressed in the last {} ms", suppressed,
                  interval_.count());
    }
    spdlog::log(level, format, std::forward<Args>(args)...);
  }

  const std::chrono::milliseconds interval_;
  const uint32_t burst_;
  Mutex mutex_;
  bool started_ FL_GUARDED_BY(mutex_) = false;
  std::chrono::steady_clock::time_point window_start_ FL_GUARDED_BY(mutex_){};
  uint32_t in_window_ FL_GUARDED_BY(mutex_) = 0;
  uint64_t suppressed_ FL_GUARDED_BY(mutex_) = 0;
};

}  // namespace framelink
