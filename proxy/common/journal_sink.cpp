#include "common/journal_sink.h"

#include <spdlog/common.h>
#include <syslog.h>

#include <cstring>

namespace framelink {

int journalPriority(spdlog::level::level_enum level) noexcept {
  switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug:
      return LOG_DEBUG;
    case spdlog::level::info:
      return LOG_INFO;
    case spdlog::level::warn:
      return LOG_WARNING;
    case spdlog::level::err:
      return LOG_ERR;
    case spdlog::level::critical:
      return LOG_CRIT;
    default:
      return LOG_INFO;
  }
}

namespace {

std::string field(std::string_view name, std::string_view value) {
  std::string f;
  f.reserve(name.size() + 1 + value.size());
  f.append(name).append("=").append(value);
  return f;
}

}  // namespace

std::vector<std::string> journalFields(std::string_view identifier, const spdlog::details::log_msg& msg,
                                       const LogFields& fields) {
  std::vector<std::string> out;
  out.reserve(10);
  out.push_back(field("MESSAGE", std::string_view(msg.payload.data(), msg.payload.size())));
  out.push_back(field("PRIORITY", std::to_string(journalPriority(msg.level))));
  out.push_back(field("SYSLOG_IDENTIFIER", identifier));
  if (!msg.source.empty()) {
    out.push_back(field("CODE_FILE", msg.source.filename));
    out.push_back(field("CODE_LINE", std::to_string(msg.source.line)));
    if (msg.source.funcname != nullptr) out.push_back(field("CODE_FUNC", msg.source.funcname));
  }
  if (fields.client != 0) out.push_back(field("FL_CLIENT", std::to_string(fields.client)));
  if (!fields.peer.empty()) out.push_back(field("FL_PEER", fields.peer));
  if (!fields.stream.empty()) out.push_back(field("FL_STREAM", fields.stream));
  if (fields.sequence) out.push_back(field("FL_SEQUENCE", std::to_string(*fields.sequence)));
  return out;
}

void JournalSink::sink_it_(const spdlog::details::log_msg& msg) {
  const std::vector<std::string> fields = journalFields(identifier_, msg, currentLogFields());
  std::vector<iovec> iov(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    // iovec's base is not const; sd_journal_sendv only reads it.
    iov[i].iov_base = const_cast<char*>(fields[i].data());  // NOLINT(cppcoreguidelines-pro-type-const-cast)
    iov[i].iov_len = fields[i].size();
  }
  // Returns a negative errno; spdlog's error handler says it on stderr.
  if (const int r = send_(iov.data(), static_cast<int>(iov.size())); r < 0) {
    spdlog::throw_spdlog_ex("cannot write to the journal: " + std::string(std::strerror(-r)));
  }
}

}  // namespace framelink
