// The parsers of what `framelink doctor` reads from /proc (meminfo, a
// process's limits): plain text in, numbers out, tested on sample text.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>

#include "doctor.h"

namespace framelink::cli {

std::optional<Hugepages> parseMeminfo(const std::string& text) {
  Hugepages h;
  bool total = false, free = false, size = false;
  std::istringstream in(text);
  std::string key;
  uint64_t value = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    if (!(fields >> key >> value)) continue;
    if (key == "HugePages_Total:") total = true, h.total = value;
    if (key == "HugePages_Free:") free = true, h.free = value;
    if (key == "Hugepagesize:") size = true, h.size_kib = value;
  }
  if (!total || !free || !size) return std::nullopt;
  return h;
}

std::optional<uint64_t> parseMemlock(const std::string& limits_text) {
  std::istringstream in(limits_text);
  std::string line;
  const std::string key = "Max locked memory";
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream fields(line.substr(key.size()));
    std::string soft;
    if (!(fields >> soft)) return std::nullopt;
    if (soft == "unlimited") return UINT64_MAX;
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(soft.c_str(), &end, 10);
    if (errno != 0 || end == soft.c_str() || *end != '\0') return std::nullopt;
    return v;
  }
  return std::nullopt;
}

}  // namespace framelink::cli
