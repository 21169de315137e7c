// An spdlog sink that writes each line to the journal as one entry with
// fields: MESSAGE, PRIORITY (the line's level), SYSLOG_IDENTIFIER,
// CODE_FILE/CODE_LINE/CODE_FUNC when the call site gave them, and FL_CLIENT,
// FL_PEER, FL_STREAM and FL_SEQUENCE from the logging thread's LogScope
// (log_fields.h).  So `journalctl -u framelinkd FL_PEER=hostB` selects the
// lines about one peer.  spdlog's own systemd_sink knows only the first three.
//
// The sink calls the journal through a function pointer (sd_journal_sendv in
// framelinkd): the daemon's library does not link libsystemd, and a test can
// catch the entry.  The fields are read where the line is logged, so the
// sink belongs to a synchronous logger, never an async one.
#pragma once

#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <sys/uio.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/log_fields.h"

namespace framelink {

// sd_journal_sendv(3).
using JournalSend = int (*)(const struct iovec* fields, int count);

// The journal's priority (syslog(3)'s LOG_*) for an spdlog level.
int journalPriority(spdlog::level::level_enum level) noexcept;

// One entry's fields, each "NAME=value" and sent as it is: a value may hold
// newlines or any bytes (sd_journal_sendv frames such a field with its size).
std::vector<std::string> journalFields(std::string_view identifier, const spdlog::details::log_msg& msg,
                                       const LogFields& fields);

// Without a mutex: it keeps no state but what it is built with, and
// sd_journal_sendv may be called from any thread.
class JournalSink final : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 public:
  JournalSink(std::string identifier, JournalSend send) : identifier_(std::move(identifier)), send_(send) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  const std::string identifier_;
  const JournalSend send_;
};

}  // namespace framelink
