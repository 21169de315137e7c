#include "cli_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace framelink::cli {

std::atomic<bool> g_interrupted{false};

Journal::~Journal() {
  if (fd_ >= 0) ::close(fd_);
}

bool Journal::open(const std::string& path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  return fd_ >= 0;
}

void Journal::record(const char* event, uint64_t frame_id, int status) noexcept {
  if (fd_ < 0) return;
  char line[96];
  const int n = std::snprintf(line, sizeof line, "%llu %s %llu %d\n", (unsigned long long)monotonicNs(),
                              event, (unsigned long long)frame_id, status);
  if (n > 0) (void)!::write(fd_, line, static_cast<size_t>(n));
}

std::optional<uint64_t> parseSize(std::string_view text) {
  std::string s(text);
  while (!s.empty() && (s.back() == ' ')) s.pop_back();
  if (s.empty()) return std::nullopt;
  uint64_t mult = 1;
  // Accept K, KB, KiB (all binary: frames are sized in pages, not in SI units).
  auto stripSuffix = [&](std::string_view suf) {
    if (s.size() > suf.size()) {
      std::string tail = s.substr(s.size() - suf.size());
      bool eq = true;
      for (size_t i = 0; i < suf.size(); ++i) {
        if (std::tolower(static_cast<unsigned char>(tail[i])) != suf[i]) eq = false;
      }
      if (eq) {
        s.resize(s.size() - suf.size());
        return true;
      }
    }
    return false;
  };
  if (!stripSuffix("ib")) stripSuffix("b");
  if (!s.empty()) {
    switch (std::tolower(static_cast<unsigned char>(s.back()))) {
      case 'k':
        mult = 1ull << 10;
        s.pop_back();
        break;
      case 'm':
        mult = 1ull << 20;
        s.pop_back();
        break;
      case 'g':
        mult = 1ull << 30;
        s.pop_back();
        break;
      case 't':
        mult = 1ull << 40;
        s.pop_back();
        break;
      default:
        break;
    }
  }
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  if (s.find_first_of(".eE") != std::string::npos) {
    const double v = std::strtod(s.c_str(), &end);
    if (errno != 0 || *end != '\0' || !(v >= 0) || v * static_cast<double>(mult) > 1.8e19) {
      return std::nullopt;
    }
    return static_cast<uint64_t>(std::llround(v * static_cast<double>(mult)));
  }
  if (s[0] == '-') return std::nullopt;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  if (mult != 1 && v > UINT64_MAX / mult) return std::nullopt;
  return static_cast<uint64_t>(v) * mult;
}

std::optional<std::pair<uint64_t, uint64_t>> parseSizeRange(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto lo = parseSize(text.substr(0, colon));
  auto hi = parseSize(text.substr(colon + 1));
  if (!lo || !hi || *lo > *hi) return std::nullopt;
  return std::make_pair(*lo, *hi);
}

std::vector<std::string> splitList(std::string_view text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t pos = text.find(sep, start);
    if (pos == std::string_view::npos) pos = text.size();
    std::string item(text.substr(start, pos - start));
    if (!item.empty()) out.push_back(item);
    start = pos + 1;
  }
  return out;
}

std::optional<std::vector<uint64_t>> parseSizeList(std::string_view text) {
  std::vector<uint64_t> out;
  for (const auto& item : splitList(text, ',')) {
    auto v = parseSize(item);
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

uint64_t pageRound(uint64_t v) { return (v + 4095) / 4096 * 4096; }

std::string formatBytes(uint64_t bytes) {
  char buf[64];
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  const bool exact = unit == 0 || bytes % (1ull << (10 * unit)) == 0;
  if (exact) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[unit]);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[unit]);
  }
  return buf;
}

std::string jsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

uint64_t monotonicNs() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t realtimeNs() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void sleepNs(uint64_t ns) noexcept {
  timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !g_interrupted.load()) {
  }
}

double percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  size_t idx = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  if (idx >= v.size()) idx = v.size() - 1;
  return v[idx];
}

static void onInterrupt(int) { g_interrupted.store(true); }

void installInterruptHandler() {
  struct sigaction sa {};
  sa.sa_handler = onInterrupt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: blocking calls return EINTR so loops notice quickly
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

std::string selfExe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

std::string selfDir() {
  std::string exe = selfExe();
  const size_t slash = exe.rfind('/');
  if (slash == std::string::npos) return "./";
  return exe.substr(0, slash + 1);
}

std::string findInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return {};
  for (const auto& dir : splitList(path, ':')) {
    std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

bool RecentFrameIds::seenBefore(uint64_t id) {
  if (!ids_.insert(id).second) return true;
  order_.push_back(id);
  if (order_.size() > kRemembered) {
    ids_.erase(order_.front());
    order_.pop_front();
  }
  return false;
}

}  // namespace framelink::cli
