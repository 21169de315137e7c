// What a log line is about -- a client, a peer, a stream, a frame -- for the
// journal's fields FL_CLIENT, FL_PEER, FL_STREAM and FL_SEQUENCE.  spdlog has
// no mapped diagnostic context, so the code that handles one client's, one
// peer's or one stream's event opens a LogScope around it, and the journal
// sink (journal_sink.h) reads the fields of the thread that logs.
//
// A scope is a few stores into a thread-local struct and as many to restore
// it: it neither allocates nor copies names, so the data path may open one
// per frame.  The names it is given must outlive it; code that erases the
// client or link its scope names takes a copy of the name first.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace framelink {

struct LogFields {
  uint64_t client = 0;               // 0: none (client ids start at 1)
  std::string_view peer;             // empty: none
  std::string_view stream;           // empty: none
  std::optional<uint64_t> sequence;  // a frame's sequence on its stream
};

namespace detail {
// Constant-initialised and trivially destructible: no guard on access.
inline thread_local LogFields current_log_fields;
}  // namespace detail

// The fields of the scopes open on this thread.
inline const LogFields& currentLogFields() noexcept { return detail::current_log_fields; }

// Adds the fields set in `fields` to those of the scopes around it, for its
// lifetime; the ones it leaves unset are inherited (a client's frame inside
// a peer's event carries both).
class LogScope {
 public:
  explicit LogScope(const LogFields& fields) noexcept : saved_(detail::current_log_fields) {
    LogFields& now = detail::current_log_fields;
    if (fields.client != 0) now.client = fields.client;
    if (!fields.peer.empty()) now.peer = fields.peer;
    if (!fields.stream.empty()) now.stream = fields.stream;
    if (fields.sequence) now.sequence = fields.sequence;
  }
  ~LogScope() { detail::current_log_fields = saved_; }

  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

 private:
  const LogFields saved_;
};

}  // namespace framelink
