// Whether stderr is the journal: JOURNAL_STREAM is believed only for the
// descriptor whose device and inode it names.
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <string>

#include "common/journal_stream.h"

using framelink::isJournalStream;
using framelink::parseJournalStream;

namespace {

// A stream socket like the one systemd hands a service; closed with the test.
struct SocketPair {
  int fds[2] = {-1, -1};
  SocketPair() { REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  SocketPair(const SocketPair&) = delete;
  SocketPair& operator=(const SocketPair&) = delete;
};

std::string journalStreamOf(int fd) {
  struct stat st {};
  REQUIRE(::fstat(fd, &st) == 0);
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

}  // namespace

TEST_CASE("JOURNAL_STREAM parses as DEVICE:INODE in decimal", "[journal]") {
  const auto id = parseJournalStream("8:23456");
  REQUIRE(id.has_value());
  CHECK(id->device == 8);
  CHECK(id->inode == 23456);
  const auto big = parseJournalStream("18446744073709551615:0");
  REQUIRE(big.has_value());
  CHECK(big->device == 18446744073709551615ULL);
}

TEST_CASE("a JOURNAL_STREAM that is not two decimal numbers is no journal", "[journal]") {
  const char* bad = GENERATE("", ":", "8", "8:", ":23456", "8:23456x", "8:23456:1", " 8:23456", "8: 23456",
                             "-8:23456", "+8:23456", "0x8:23456", "8;23456", "18446744073709551616:1");
  INFO("JOURNAL_STREAM=\"" << bad << "\"");
  CHECK_FALSE(parseJournalStream(bad).has_value());
}

TEST_CASE("stderr is the journal only when JOURNAL_STREAM names that very descriptor", "[journal]") {
  SocketPair journal;
  SocketPair other;
  const std::string value = journalStreamOf(journal.fds[0]);
  CHECK(isJournalStream(value.c_str(), journal.fds[0]));
  // Inherited by a process whose stderr is something else (a shell started
  // from the service, a pipe): not the journal.
  CHECK_FALSE(isJournalStream(value.c_str(), other.fds[0]));
  // The other end of the same pair is another inode.
  CHECK_FALSE(isJournalStream(value.c_str(), journal.fds[1]));
  CHECK_FALSE(isJournalStream(nullptr, journal.fds[0]));
  CHECK_FALSE(isJournalStream("", journal.fds[0]));
  CHECK_FALSE(isJournalStream(value.c_str(), -1));
}

TEST_CASE("the device and the inode must both match", "[journal]") {
  SocketPair journal;
  struct stat st {};
  REQUIRE(::fstat(journal.fds[0], &st) == 0);
  const std::string other_device = std::to_string(st.st_dev + 1) + ":" + std::to_string(st.st_ino);
  const std::string other_inode = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino + 1);
  CHECK_FALSE(isJournalStream(other_device.c_str(), journal.fds[0]));
  CHECK_FALSE(isJournalStream(other_inode.c_str(), journal.fds[0]));
}
