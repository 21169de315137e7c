// Small helpers shared by the `framelink` subcommands: size parsing, clocks, formatting.
#ifndef FRAMELINK_CLI_CLI_UTIL_H
#define FRAMELINK_CLI_CLI_UTIL_H

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace framelink::cli {

// "4096", "64K", "1M", "2G", "1.5M", "64KiB" -> bytes (binary multiples).
std::optional<uint64_t> parseSize(std::string_view text);
// "MIN:MAX" with sizes as above.
std::optional<std::pair<uint64_t, uint64_t>> parseSizeRange(std::string_view text);
// "64K,1M,4M" -> sizes; nullopt if any element is bad.
std::optional<std::vector<uint64_t>> parseSizeList(std::string_view text);
std::vector<std::string> splitList(std::string_view text, char sep);

// `v` rounded up to a whole number of 4 KiB pages: the slot size for frames of `v` bytes.
uint64_t pageRound(uint64_t v);

// "1.00 MiB", "64 KiB", "17 B".
std::string formatBytes(uint64_t bytes);
std::string jsonEscape(std::string_view s);

uint64_t monotonicNs() noexcept;
uint64_t realtimeNs() noexcept;
void sleepNs(uint64_t ns) noexcept;

// Percentile (0..100) of unsorted samples by nearest rank; sorts `v`.  0 when empty.
double percentile(std::vector<double>& v, double p);

// Set by SIGINT / SIGTERM once installInterruptHandler() ran.
extern std::atomic<bool> g_interrupted;
void installInterruptHandler();

// An append-only record of what happened to each frame, one line per event
// ("<CLOCK_MONOTONIC ns> <event> <frame id> [<status>]"), written with one
// write(2) each so that it survives the process being killed at any point.
// A closed journal (no path given) ignores everything.
class Journal {
 public:
  Journal() = default;
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  // Opens (creates, appends to) `path`; false with errno set on failure.
  bool open(const std::string& path);
  void record(const char* event, uint64_t frame_id, int status = 0) noexcept;

 private:
  int fd_ = -1;
};

// Directory holding the running executable (from /proc/self/exe), with a trailing '/'.
std::string selfDir();
std::string selfExe();
// First executable `name` in $PATH, or "".
std::string findInPath(const std::string& name);

// The ids of the last frames received, to tell a flagged redelivery from a first delivery.
class RecentFrameIds {
 public:
  static constexpr size_t kRemembered = 4096;
  // true when id is one of the last kRemembered ids; remembers it either way.
  bool seenBefore(uint64_t id);

 private:
  std::deque<uint64_t> order_;
  std::unordered_set<uint64_t> ids_;
};

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_CLI_UTIL_H
