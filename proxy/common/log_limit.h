// Rate-limited logging for what a hostile client or peer can cause: at most
// one line per cause and interval, and the next line that gets through says
// how many were suppressed meanwhile.  So an attack costs a bounded amount of
// log, and the log still says that (and how often) it happened.
#pragma once

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace framelink {

class LogLimiter {
 public:
  explicit LogLimiter(std::chrono::milliseconds interval = std::chrono::seconds(1)) : interval_(interval) {}

  // True when a line may be written now; `*suppressed` is how many were
  // dropped since the last one that was.
  bool allow(uint64_t* suppressed) {
    std::lock_guard<std::mutex> lock(mutex_);
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

  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    uint64_t suppressed = 0;
    if (!allow(&suppressed)) return;
    std::string text = fmt::format(format, std::forward<Args>(args)...);
    if (suppressed > 0) {
      spdlog::warn("{} ({} more like this suppressed in the last {} ms)", text, suppressed,
                   interval_.count());
    } else {
      spdlog::warn("{}", text);
    }
  }

 private:
  const std::chrono::milliseconds interval_;
  std::mutex mutex_;
  bool written_ = false;
  std::chrono::steady_clock::time_point last_{};
  uint64_t suppressed_ = 0;
};

}  // namespace framelink
