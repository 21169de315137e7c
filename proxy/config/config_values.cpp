#include "config/config_values.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "config/transport_names.h"
#include "framelink/shm_layout.h"

namespace framelink {

Error invalidSetting(std::string message) { return makeError(FL_EINVAL, std::move(message)); }

Error unknownKey(const std::string& key, const std::string& where, const std::string& guess) {
  return invalidSetting(
      "unknown key '" + key + "' " + where + guess + (guess.empty() ? "; the" : " The") +
      " configuration reference (man 5 framelinkd.toml, docs/reference/configuration.md) lists every key");
}

namespace {

std::string quoted(const std::string& text) { return "'" + text + "'"; }

std::string joinChoices(const std::vector<std::string_view>& items) {
  std::string out;
  for (auto item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

Result<uint64_t> parseDigits(const std::string& text, const std::string& label) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    return invalidSetting(label + ": " + quoted(text) + " is not a non-negative decimal integer");
  }
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return invalidSetting(label + ": " + quoted(text) + " is too large");
  return static_cast<uint64_t>(value);
}

}  // namespace

Result<uint64_t> parseNumber(const std::string& text, const std::string& label, uint64_t min, uint64_t max) {
  auto value = parseDigits(text, label);
  if (!value) return std::move(value).error();
  if (*value < min) {
    return invalidSetting(label + ": " + quoted(text) +
                          (min == 1 ? " is too small: must be greater than 0"
                                    : " is too small: must be at least " + std::to_string(min)));
  }
  if (*value > max) {
    return invalidSetting(label + ": " + quoted(text) + " is too large (at most " + std::to_string(max) +
                          ")");
  }
  return *value;
}

Result<uint64_t> parseSize(const std::string& text, const std::string& label, uint64_t max) {
  const size_t digits = text.find_first_not_of("0123456789");
  const std::string number = text.substr(0, digits);
  std::string suffix = digits == std::string::npos ? "" : text.substr(digits);
  std::transform(suffix.begin(), suffix.end(), suffix.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  uint64_t unit = 1;
  if (suffix == "k" || suffix == "kib") {
    unit = uint64_t{1} << 10;
  } else if (suffix == "m" || suffix == "mib") {
    unit = uint64_t{1} << 20;
  } else if (suffix == "g" || suffix == "gib") {
    unit = uint64_t{1} << 30;
  } else if (!suffix.empty() && suffix != "b") {
    return invalidSetting(
        label + ": " + quoted(text) +
        " is not a size; write bytes, optionally with K, KiB, M, MiB, G or GiB (e.g. 4MiB)");
  }
  if (number.empty()) {
    return invalidSetting(label + ": " + quoted(text) + " is not a size; write e.g. 4194304 or 4MiB");
  }
  auto value = parseDigits(number, label);
  if (!value) return std::move(value).error();
  if (*value > max / unit) {
    return invalidSetting(label + ": " + quoted(text) + " is too large (at most " + std::to_string(max) +
                          ")");
  }
  if (*value == 0) {
    return invalidSetting(label + ": " + quoted(text) + " is too small: must be greater than 0");
  }
  return *value * unit;
}

std::string formatSize(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {uint64_t{1} << 30, "GiB"}, {uint64_t{1} << 20, "MiB"}, {uint64_t{1} << 10, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (bytes != 0 && bytes % unit == 0) return std::to_string(bytes / unit) + name;
  }
  return std::to_string(bytes);
}

Result<uint32_t> parseMode(const std::string& text, const std::string& label) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos) {
    return invalidSetting(label + ": " + quoted(text) + " is not an octal file mode; write e.g. 0660");
  }
  const auto mode = static_cast<uint32_t>(std::strtoul(text.c_str(), nullptr, 8));
  if (mode > 0777) {
    return invalidSetting(label + ": " + quoted(text) + " has bits outside 0777; write e.g. 0660");
  }
  return mode;
}

std::string formatMode(uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
}

Result<int> parseCpu(const std::string& text, const std::string& label) {
  if (text == "-1") return -1;
  auto value = parseDigits(text, label);
  if (!value || *value > 4095) {
    return invalidSetting(label + ": " + quoted(text) +
                          " is not a CPU number; write 0, 1, ... or -1 to not pin");
  }
  return static_cast<int>(*value);
}

Result<bool> parseBool(const std::string& text, const std::string& label) {
  if (text == "true") return true;
  if (text == "false") return false;
  return invalidSetting(label + ": " + quoted(text) + " must be true or false");
}

Status checkChoice(const std::string& value, const std::string& label,
                   const std::vector<std::string_view>& choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return {};
  return invalidSetting(label + ": " + quoted(value) + " is not one of " + joinChoices(choices));
}

Status checkHostPort(const std::string& value, const std::string& label, bool allow_port0) {
  const std::string example =
      allow_port0 ? " (e.g. 0.0.0.0:7700, port 0 = any free port)" : " (e.g. 10.0.0.2:7700)";
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == value.size()) {
    return invalidSetting(label + ": " + quoted(value) + " is not HOST:PORT" + example);
  }
  const std::string host = value.substr(0, colon);
  if ((host.front() == '[') != (host.back() == ']') ||
      (host.front() != '[' && host.find(':') != std::string::npos)) {
    return invalidSetting(label + ": " + quoted(value) +
                          ": write IPv6 addresses in brackets, e.g. [::1]:7700");
  }
  auto port = parseDigits(value.substr(colon + 1), label);
  if (!port || *port > 65535) {
    return invalidSetting(label + ": " + quoted(value) + " has no valid port (0-65535)" + example);
  }
  if (*port == 0 && !allow_port0) {
    return invalidSetting(label + ": " + quoted(value) + ": port 0 cannot be dialled" + example);
  }
  return {};
}

Status checkStreamName(const std::string& name, const std::string& label, bool allow_star) {
  if ((allow_star && name == "*") || fl_stream_name_valid(name.data(), name.size())) return {};
  return invalidSetting(label + ": " + quoted(name) + " is not valid: use 1-" +
                        std::to_string(FL_STREAM_NAME_LEN_MAX) + " characters of [A-Za-z0-9._-]" +
                        (allow_star ? ", or '*'" : ""));
}

const std::vector<std::string_view>& knownTransports() {
  static const std::vector<std::string_view> kTransports(kTransportNames.begin(), kTransportNames.end());
  return kTransports;
}

Status checkTransports(const std::vector<std::string>& transports, const std::string& label) {
  if (transports.empty()) {
    return invalidSetting(label + ": name at least one transport (" + joinChoices(knownTransports()) + ")");
  }
  for (size_t i = 0; i < transports.size(); ++i) {
    const auto& known = knownTransports();
    if (std::find(known.begin(), known.end(), transports[i]) == known.end()) {
      return invalidSetting(label + ": unknown transport " + quoted(transports[i]) + "; use " +
                            joinChoices(known));
    }
    if (std::find(transports.begin(), transports.begin() + static_cast<long>(i), transports[i]) !=
        transports.begin() + static_cast<long>(i)) {
      return invalidSetting(label + ": transport " + quoted(transports[i]) + " is listed twice");
    }
  }
  return {};
}

std::vector<std::string> splitComma(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    out.push_back(item);
  }
  return out;
}

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

Result<std::string> readTokenFile(const std::string& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalidSetting(label + ": cannot read " + quoted(path) + ": " + std::strerror(errno));
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) {
    return invalidSetting(label + ": " + quoted(path) + " is empty; put the shared secret in it");
  }
  return token;
}

Result<std::string> readPem(const std::string& path, const std::string& label, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalidSetting(label + ": cannot read " + quoted(path) + ": " + std::strerror(errno));
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return invalidSetting(label + ": " + quoted(path) + " is not PEM; it should hold " + what +
                          " (-----BEGIN ...----- blocks)");
  }
  return pem;
}

}  // namespace framelink

namespace framelink {

Result<sockaddr_in> ipv4WithPort(const std::string& text, uint16_t default_port) {
  const size_t colon = text.rfind(':');
  const std::string host = colon == std::string::npos ? text : text.substr(0, colon);
  const long port =
      colon == std::string::npos ? default_port : std::strtol(text.c_str() + colon + 1, nullptr, 10);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1 || port <= 0 || port > 65535) {
    return makeError(FL_EINVAL, "'" + text + "' is not IPv4[:PORT]");
  }
  sa.sin_port = htons(static_cast<uint16_t>(port));
  return sa;
}

}  // namespace framelink
