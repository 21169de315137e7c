// Whether a file descriptor is the stream systemd connected to the journal.
// systemd sets JOURNAL_STREAM to "DEVICE:INODE" of the socket it gave the
// service as stdout/stderr.  The variable alone proves nothing: a child
// process or a shell started from the service inherits it with another
// stderr, so the numbers are compared with the descriptor's own (as
// sd_journal_stream_fd(3) and systemd.exec(5) recommend).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace framelink {

struct JournalStreamId {
  uint64_t device = 0;
  uint64_t inode = 0;
};

// "DEVICE:INODE", both decimal; nullopt for anything else (empty, a sign,
// trailing text, out of range).
std::optional<JournalStreamId> parseJournalStream(std::string_view value) noexcept;

// True when `fd` is the stream `journal_stream` (the value of JOURNAL_STREAM,
// null when unset) names.
bool isJournalStream(const char* journal_stream, int fd) noexcept;

}  // namespace framelink
