#include "common/journal_stream.h"

#include <sys/stat.h>

#include <charconv>

namespace framelink {

namespace {

// from_chars on an unsigned type takes no sign and no blanks, and says when
// the number does not fit.
bool parseDecimal(std::string_view text, uint64_t* out) noexcept {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

}  // namespace

std::optional<JournalStreamId> parseJournalStream(std::string_view value) noexcept {
  const size_t colon = value.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  JournalStreamId id;
  if (!parseDecimal(value.substr(0, colon), &id.device) ||
      !parseDecimal(value.substr(colon + 1), &id.inode)) {
    return std::nullopt;
  }
  return id;
}

bool isJournalStream(const char* journal_stream, int fd) noexcept {
  if (journal_stream == nullptr) return false;
  const auto id = parseJournalStream(journal_stream);
  if (!id) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  return uint64_t{st.st_dev} == id->device && uint64_t{st.st_ino} == id->inode;
}

}  // namespace framelink
