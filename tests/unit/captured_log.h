// The daemon's log lines (the default logger's), as written, from a
// CapturedLog's construction to its end.
#pragma once

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace framelink::test {

class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    sink_->set_pattern("%v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("framelinkd", sink_));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  // How many of the lines hold `text`.
  int count(const std::string& text) const {
    int n = 0;
    for (const std::string& line : sink_->last_formatted()) n += line.find(text) != std::string::npos ? 1 : 0;
    return n;
  }
  bool has(const std::string& text) const { return count(text) > 0; }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_ =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
};

}  // namespace framelink::test
