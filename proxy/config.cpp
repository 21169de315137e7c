#include "config.h"

#include <unistd.h>

#include <toml++/toml.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>

#include "framelink/framelink.h"
#include "transport/faulty/faulty_transport.h"

namespace framelink {
namespace {

constexpr std::array<std::string_view, 3> kTransports{"tcp", "grpc", "rdma"};
constexpr std::array<std::string_view, 3> kHugepages{"auto", "on", "off"};
constexpr std::array<std::string_view, 5> kLogLevels{"trace", "debug", "info", "warn", "error"};
// sockaddr_un::sun_path is 108 bytes including the terminating NUL.
constexpr size_t kMaxSocketPath = 107;
constexpr size_t kMaxStreamName = 63;

Error invalid(std::string message) { return makeError(FL_EINVAL, std::move(message)); }

template <size_t N>
std::string joinList(const std::array<std::string_view, N>& items) {
  std::string out;
  for (auto item : items) {
    if (!out.empty()) out += ", ";
    out += item;
  }
  return out;
}

std::string join(const std::vector<std::string>& items, const char* sep = ",") {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

template <size_t N>
bool oneOf(const std::array<std::string_view, N>& items, const std::string& value) {
  return std::find(items.begin(), items.end(), value) != items.end();
}

// Moves a parsed value into its field, or passes the error on.
template <typename T, typename U>
Status assign(Result<T> parsed, U& field) {
  if (!parsed) return std::move(parsed).error();
  field = std::move(*parsed);
  return {};
}

Result<uint64_t> parseUnsigned(const std::string& text, const std::string& label) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    return invalid(label + ": '" + text + "' is not a non-negative decimal integer");
  }
  errno = 0;
  const unsigned long long value = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE) return invalid(label + ": '" + text + "' is too large");
  return static_cast<uint64_t>(value);
}

Result<uint32_t> parseU32(const std::string& text, const std::string& label, bool allow_zero) {
  auto value = parseUnsigned(text, label);
  if (!value) return std::move(value).error();
  if (*value > std::numeric_limits<uint32_t>::max()) {
    return invalid(label + ": " + text + " is too large (at most 4294967295)");
  }
  if (*value == 0 && !allow_zero) return invalid(label + ": must be greater than 0");
  return static_cast<uint32_t>(*value);
}

// Byte counts: a plain number of bytes, or a number with a binary suffix
// K/KiB, M/MiB, G/GiB (case-insensitive): "4MiB", "64M", "1GiB".
Result<uint64_t> parseSize(const std::string& text, const std::string& label) {
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
    return invalid(label + ": '" + text +
                   "' is not a size; write bytes, optionally with K, KiB, M, MiB, G or GiB (e.g. 4MiB)");
  }
  if (number.empty()) {
    return invalid(label + ": '" + text + "' is not a size; write e.g. 4194304 or 4MiB");
  }
  auto value = parseUnsigned(number, label);
  if (!value) return std::move(value).error();
  if (*value > std::numeric_limits<uint64_t>::max() / unit) {
    return invalid(label + ": '" + text + "' is too large");
  }
  if (*value == 0) return invalid(label + ": must be greater than 0");
  return *value * unit;
}

Result<uint32_t> parseSize32(const std::string& text, const std::string& label) {
  auto value = parseSize(text, label);
  if (!value) return std::move(value).error();
  if (*value > std::numeric_limits<uint32_t>::max()) return invalid(label + ": '" + text + "' is too large");
  return static_cast<uint32_t>(*value);
}

Result<uint32_t> parseMode(const std::string& text, const std::string& label) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("01234567") != std::string::npos) {
    return invalid(label + ": '" + text + "' is not an octal file mode; write e.g. 0660");
  }
  const auto mode = static_cast<uint32_t>(std::strtoul(text.c_str(), nullptr, 8));
  if (mode > 0777) return invalid(label + ": '" + text + "' has bits outside 0777; write e.g. 0660");
  return mode;
}

Result<int> parseCpu(const std::string& text, const std::string& label) {
  if (text == "-1") return -1;
  auto value = parseUnsigned(text, label);
  if (!value || *value > 4095) {
    return invalid(label + ": '" + text + "' is not a CPU number; write 0, 1, ... or -1 to not pin");
  }
  return static_cast<int>(*value);
}

Status checkOneOf(const std::string& value, const std::string& label, const std::string& allowed, bool ok) {
  if (ok) return {};
  return invalid(label + ": '" + value + "' is not one of " + allowed);
}

Status checkHugepages(const std::string& value, const std::string& label) {
  return checkOneOf(value, label, joinList(kHugepages), oneOf(kHugepages, value));
}

Status checkLogLevel(const std::string& value, const std::string& label) {
  return checkOneOf(value, label, joinList(kLogLevels), oneOf(kLogLevels, value));
}

// HOST:PORT with a numeric port; IPv6 hosts in brackets ("[::1]:7700").
Status checkHostPort(const std::string& value, const std::string& label, bool allow_port0) {
  const std::string example =
      allow_port0 ? " (e.g. 0.0.0.0:7700, port 0 = any free port)" : " (e.g. 10.0.0.2:7700)";
  const size_t colon = value.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == value.size()) {
    return invalid(label + ": '" + value + "' is not HOST:PORT" + example);
  }
  const std::string host = value.substr(0, colon);
  if ((host.front() == '[') != (host.back() == ']') ||
      (host.front() != '[' && host.find(':') != std::string::npos)) {
    return invalid(label + ": '" + value + "': write IPv6 addresses in brackets, e.g. [::1]:7700");
  }
  auto port = parseUnsigned(value.substr(colon + 1), label);
  if (!port || *port > 65535) {
    return invalid(label + ": '" + value + "' has no valid port (0-65535)" + example);
  }
  if (*port == 0 && !allow_port0) {
    return invalid(label + ": '" + value + "': port 0 cannot be dialled" + example);
  }
  return {};
}

bool validName(const std::string& name) {
  return !name.empty() && name.size() <= kMaxStreamName &&
         name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
             std::string::npos;
}

Status checkStream(const std::string& stream, const std::string& label) {
  if (stream == "*" || validName(stream)) return {};
  return invalid(label + ": '" + stream + "' is not a stream name ([A-Za-z0-9._-], 1-63 characters) or '*'");
}

Status checkTransports(const std::vector<std::string>& transports, const std::string& label) {
  if (transports.empty()) {
    return invalid(label + ": name at least one transport (" + joinList(kTransports) + ")");
  }
  for (size_t i = 0; i < transports.size(); ++i) {
    if (!oneOf(kTransports, transports[i])) {
      return invalid(label + ": unknown transport '" + transports[i] + "'; use " + joinList(kTransports));
    }
    if (std::find(transports.begin(), transports.begin() + static_cast<long>(i), transports[i]) !=
        transports.begin() + static_cast<long>(i)) {
      return invalid(label + ": transport '" + transports[i] + "' is listed twice");
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

Result<std::string> readTokenFile(const std::string& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid(label + ": cannot read '" + path + "': " + std::strerror(errno));
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) return invalid(label + ": '" + path + "' is empty; put the shared secret in it");
  return token;
}

// ---- TOML ----

class TomlReader {
 public:
  explicit TomlReader(std::string file) : file_(std::move(file)) {}

  Status load(Config& config) {
    if (std::ifstream probe(file_); !probe) {
      return invalid("cannot read config file '" + file_ + "': " + std::strerror(errno));
    }
    toml::table root;
    try {
      root = toml::parse_file(file_);
    } catch (const toml::parse_error& e) {
      const auto& where = e.source().begin;
      return invalid("config file " + file_ + ":" + std::to_string(where.line) + ":" +
                     std::to_string(where.column) + ": " + std::string(e.description()));
    }
    for (auto&& [key, node] : root) {
      const std::string name{key.str()};
      Status status;
      if (name == "daemon") {
        status = section(node, name,
                         [&](const std::string& k, const toml::node& n) { return daemonKey(k, n, config); });
      } else if (name == "link") {
        status = section(node, name,
                         [&](const std::string& k, const toml::node& n) { return linkKey(k, n, config); });
      } else if (name == "limits") {
        status = section(node, name,
                         [&](const std::string& k, const toml::node& n) { return limitsKey(k, n, config); });
      } else if (name == "metrics") {
        status = section(node, name,
                         [&](const std::string& k, const toml::node& n) { return metricsKey(k, n, config); });
      } else if (name == "peer") {
        status = peers(node, config);
      } else {
        status = invalid("unknown table or key '" + name + "' " + at(node) +
                         "; known: [daemon], [link], [limits], [metrics], [[peer]]");
      }
      if (!status) return status;
    }
    if (!config.token.empty() && !token_file_.empty()) {
      return invalid("link.token and link.token_file are both set in " + file_ + "; keep one");
    }
    if (!token_file_.empty()) {
      // Relative to the file that names it, so a config directory can be moved as a whole.
      std::filesystem::path path(token_file_);
      if (path.is_relative()) path = std::filesystem::path(file_).parent_path() / path;
      return assign(readTokenFile(path.string(), "link.token_file in " + file_), config.token);
    }
    return {};
  }

 private:
  // "(line 3 of /etc/framelink/framelinkd.toml)"
  std::string at(const toml::node& node) const {
    const auto line = node.source().begin.line;
    if (line == 0) return "in " + file_;
    return "(line " + std::to_string(line) + " of " + file_ + ")";
  }
  std::string label(const std::string& key, const toml::node& node) const { return key + " " + at(node); }

  template <typename Fn>
  Status section(const toml::node& node, const std::string& name, Fn&& fn) {
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      return invalid("'" + name + "' " + at(node) + " must be a table: write [" + name + "]");
    }
    for (auto&& [key, value] : *table) {
      Status status = fn(name + "." + std::string(key.str()), value);
      if (!status) return status;
    }
    return {};
  }

  Status unknown(const std::string& key, const toml::node& node) const {
    return invalid("unknown key '" + key + "' " + at(node) +
                   "; the README section \"Configuration\" lists every key");
  }

  Result<std::string> str(const std::string& key, const toml::node& node) const {
    if (const auto* v = node.as_string()) return v->get();
    return invalid(label(key, node) + ": must be a string (in quotes)");
  }
  // A file name, relative to the directory of the config file that names it.
  Result<std::string> path(const std::string& key, const toml::node& node) const {
    auto s = str(key, node);
    if (!s || s->empty()) return s;
    std::filesystem::path p(*s);
    if (p.is_relative()) p = std::filesystem::path(file_).parent_path() / p;
    return p.string();
  }
  Result<int64_t> integer(const std::string& key, const toml::node& node) const {
    if (const auto* v = node.as_integer()) return v->get();
    return invalid(label(key, node) + ": must be an integer");
  }
  Result<uint32_t> u32(const std::string& key, const toml::node& node, bool allow_zero = false) const {
    auto v = integer(key, node);
    if (!v) return std::move(v).error();
    if (*v < 0) return invalid(label(key, node) + ": must not be negative");
    return parseU32(std::to_string(*v), label(key, node), allow_zero);
  }
  // An integer number of bytes or a string with a suffix ("4MiB").
  Result<uint64_t> size(const std::string& key, const toml::node& node) const {
    if (const auto* v = node.as_integer()) {
      if (v->get() < 0) return invalid(label(key, node) + ": must not be negative");
      return parseSize(std::to_string(v->get()), label(key, node));
    }
    if (const auto* v = node.as_string()) return parseSize(v->get(), label(key, node));
    return invalid(label(key, node) + ": must be a number of bytes or a string such as \"4MiB\"");
  }
  Result<uint32_t> count(const std::string& key, const toml::node& node) const {
    auto v = size(key, node);
    if (!v) return std::move(v).error();
    return parseSize32(std::to_string(*v), label(key, node));
  }
  Result<std::vector<std::string>> strings(const std::string& key, const toml::node& node) const {
    const auto* array = node.as_array();
    if (array == nullptr) {
      return invalid(label(key, node) + R"(: must be an array of strings, e.g. ["a", "b"])");
    }
    std::vector<std::string> out;
    for (const auto& element : *array) {
      auto s = str(key, element);
      if (!s) return std::move(s).error();
      out.push_back(std::move(*s));
    }
    return out;
  }
  Result<std::vector<uint32_t>> ids(const std::string& key, const toml::node& node) const {
    const auto* array = node.as_array();
    if (array == nullptr) {
      return invalid(label(key, node) + ": must be an array of integers, e.g. [1000, 1001]");
    }
    std::vector<uint32_t> out;
    for (const auto& element : *array) {
      auto v = u32(key, element, /*allow_zero=*/true);
      if (!v) return std::move(v).error();
      out.push_back(*v);
    }
    return out;
  }

  Status daemonKey(const std::string& key, const toml::node& node, Config& c) {
    const std::string k = key.substr(key.find('.') + 1);
    if (k == "id") return assign(str(key, node), c.id);
    if (k == "socket") return assign(str(key, node), c.socket_path);
    if (k == "socket_mode") {
      if (const auto* v = node.as_integer()) {  // a TOML octal literal, 0o660
        if (v->get() < 0 || v->get() > 0777) {
          return invalid(label(key, node) + ": must be within 0o000..0o777");
        }
        c.socket_mode = static_cast<uint32_t>(v->get());
        return {};
      }
      auto s = str(key, node);
      if (!s) return invalid(label(key, node) + ": must be an octal string such as \"0660\"");
      return assign(parseMode(*s, label(key, node)), c.socket_mode);
    }
    if (k == "socket_group") return assign(str(key, node), c.socket_group);
    if (k == "allowed_uids") return assign(ids(key, node), c.allowed_uids);
    if (k == "allowed_gids") return assign(ids(key, node), c.allowed_gids);
    if (k == "log_level") {
      auto s = str(key, node);
      if (!s) return std::move(s).error();
      if (auto st = checkLogLevel(*s, label(key, node)); !st) return st;
      c.log_level = *s;
      return {};
    }
    if (k == "ready_file") return assign(str(key, node), c.ready_file);
    if (k == "cpu") {
      auto v = integer(key, node);
      if (!v) return std::move(v).error();
      return assign(parseCpu(std::to_string(*v), label(key, node)), c.cpu);
    }
    if (k == "idle_spin_us") return assign(u32(key, node, true), c.idle_spin_us);
    if (k == "hugepages") {
      auto s = str(key, node);
      if (!s) return std::move(s).error();
      if (auto st = checkHugepages(*s, label(key, node)); !st) return st;
      c.hugepages = *s;
      return {};
    }
    return unknown(key, node);
  }

  Status linkKey(const std::string& key, const toml::node& node, Config& c) {
    const std::string k = key.substr(key.find('.') + 1);
    if (k == "listen" || k == "data_listen") {
      auto s = str(key, node);
      if (!s) return std::move(s).error();
      if (auto st = checkHostPort(*s, label(key, node), true); !st) return st;
      (k == "listen" ? c.listen : c.data_listen) = *s;
      return {};
    }
    if (k == "token") return assign(str(key, node), c.token);
    if (k == "token_file") return assign(str(key, node), token_file_);
    if (k == "transports") {
      auto list = strings(key, node);
      if (!list) return std::move(list).error();
      if (auto st = checkTransports(*list, label(key, node)); !st) return st;
      c.transports = std::move(*list);
      return {};
    }
    if (k == "ack_timeout_ms") return assign(u32(key, node), c.ack_timeout_ms);
    if (k == "credit_timeout_ms") return assign(u32(key, node), c.credit_timeout_ms);
    if (k == "connect_timeout_ms") return assign(u32(key, node), c.connect_timeout_ms);
    if (k == "keepalive_ms") return assign(u32(key, node), c.keepalive_ms);
    if (k == "reconnect_min_ms") return assign(u32(key, node), c.reconnect_min_ms);
    if (k == "reconnect_max_ms") return assign(u32(key, node), c.reconnect_max_ms);
    if (k == "grpc_chunk_bytes") return assign(size(key, node), c.grpc_chunk_bytes);
    if (k == "rdma_device") return assign(str(key, node), c.rdma_device);
    if (k == "rdma_port") {
      uint32_t port = 0;
      if (auto st = assign(u32(key, node, true), port); !st) return st;
      if (port > 65535) return invalid(label(key, node) + ": a port is 0-65535 (0 = any free port)");
      c.rdma_port = port;
      return {};
    }
    if (k == "rdma_retry_ms") return assign(u32(key, node), c.rdma_retry_ms);
    if (k == "tls_cert_file") return assign(path(key, node), c.tls_cert_file);
    if (k == "tls_key_file") return assign(path(key, node), c.tls_key_file);
    if (k == "tls_ca_file") return assign(path(key, node), c.tls_ca_file);
    if (k == "tls_server_name") return assign(str(key, node), c.tls_server_name);
    if (k == "tls_client_auth") {
      if (const auto* v = node.as_boolean()) {
        c.tls_client_auth = v->get();
        return {};
      }
      return invalid(label(key, node) + ": must be true or false");
    }
    if (k == "allow_unauthenticated") {
      if (const auto* v = node.as_boolean()) {
        c.allow_unauthenticated = v->get();
        return {};
      }
      return invalid(label(key, node) + ": must be true or false");
    }
    return unknown(key, node);
  }

  Status limitsKey(const std::string& key, const toml::node& node, Config& c) {
    const std::string k = key.substr(key.find('.') + 1);
    if (k == "max_slot_size") return assign(size(key, node), c.max_slot_size);
    if (k == "max_slots") return assign(count(key, node), c.max_slots);
    if (k == "max_client_bytes") return assign(size(key, node), c.max_client_bytes);
    if (k == "default_slot_count") return assign(count(key, node), c.default_slot_count);
    if (k == "default_slot_size") return assign(size(key, node), c.default_slot_size);
    return unknown(key, node);
  }

  Status metricsKey(const std::string& key, const toml::node& node, Config& c) {
    const std::string k = key.substr(key.find('.') + 1);
    if (k == "listen") {
      auto s = str(key, node);
      if (!s) return std::move(s).error();
      if (!s->empty()) {
        if (auto st = checkHostPort(*s, label(key, node), true); !st) return st;
      }
      c.metrics_listen = *s;
      return {};
    }
    return unknown(key, node);
  }

  Status peers(const toml::node& node, Config& c) {
    const auto* array = node.as_array();
    if (array == nullptr || !array->is_array_of_tables()) {
      return invalid("'peer' " + at(node) + " must be written as [[peer]] tables");
    }
    size_t index = 0;
    for (const auto& element : *array) {
      const std::string base = "peer[" + std::to_string(index++) + "]";
      PeerConfig peer;
      bool has_address = false;
      for (auto&& [k, value] : *element.as_table()) {
        const std::string name{k.str()};
        const std::string key = base + "." + name;
        Status status;
        if (name == "name") {
          status = assign(str(key, value), peer.name);
        } else if (name == "address") {
          status = assign(str(key, value), peer.address);
          has_address = true;
        } else if (name == "streams") {
          status = assign(strings(key, value), peer.streams);
        } else {
          status = unknown(key, value);
        }
        if (!status) return status;
      }
      if (peer.name.empty() || !has_address) {
        return invalid(base + " " + at(element) +
                       R"(: every [[peer]] needs name = "..." and address = "HOST:PORT")");
      }
      const std::string where = "[[peer]] '" + peer.name + "' " + at(element);
      if (!validName(peer.name)) {
        return invalid(where + ": name must be [A-Za-z0-9._-], 1-63 characters");
      }
      if (auto st = checkHostPort(peer.address, where + " address", false); !st) return st;
      for (const auto& stream : peer.streams) {
        if (auto st = checkStream(stream, where + " streams"); !st) return st;
      }
      c.peers.push_back(std::move(peer));
    }
    return {};
  }

  std::string file_;
  std::string token_file_;
};

// ---- command line ----

// Flags are parsed into strings first so that every value goes through the
// same checks (and messages) as the TOML file, and so that only the flags
// actually given override the file.
struct Flags {
  std::string config, id, socket, socket_mode, socket_group, listen, data_listen, token, token_file,
      transports, hugepages, log_level, metrics, ready_file, ack_timeout, credit_timeout, connect_timeout,
      max_slot_size, max_slots, max_client_bytes, default_slot_size, default_slots, cpu, idle_spin,
      rdma_device, rdma_port, rdma_retry, fault_inject, tls_cert, tls_key, tls_ca, tls_server_name;
  bool tls_client_auth = false;
  bool allow_unauthenticated = false;
  std::vector<std::string> allow_uid, allow_gid, peer, route;
};

std::string versionText() {
  return "framelinkd " + std::to_string(FL_VERSION_MAJOR) + "." + std::to_string(FL_VERSION_MINOR) + "." +
         std::to_string(FL_VERSION_PATCH);
}

Status applyFlags(const CLI::App& app, const Flags& f, Config& c) {
  auto given = [&](const char* name) { return app.count(name) > 0; };
  if (given("--id")) c.id = f.id;
  if (given("--socket")) c.socket_path = f.socket;
  if (given("--socket-mode")) {
    if (auto st = assign(parseMode(f.socket_mode, "--socket-mode"), c.socket_mode); !st) return st;
  }
  if (given("--socket-group")) c.socket_group = f.socket_group;
  if (given("--allow-uid")) {
    c.allowed_uids.clear();
    for (const auto& v : f.allow_uid) {
      auto id = parseU32(v, "--allow-uid", true);
      if (!id) return std::move(id).error();
      c.allowed_uids.push_back(*id);
    }
  }
  if (given("--allow-gid")) {
    c.allowed_gids.clear();
    for (const auto& v : f.allow_gid) {
      auto id = parseU32(v, "--allow-gid", true);
      if (!id) return std::move(id).error();
      c.allowed_gids.push_back(*id);
    }
  }
  if (given("--listen")) {
    if (auto st = checkHostPort(f.listen, "--listen", true); !st) return st;
    c.listen = f.listen;
  }
  if (given("--data-listen")) {
    if (auto st = checkHostPort(f.data_listen, "--data-listen", true); !st) return st;
    c.data_listen = f.data_listen;
  }
  if (given("--token")) c.token = f.token;
  if (given("--token-file")) {
    if (auto st = assign(readTokenFile(f.token_file, "--token-file"), c.token); !st) return st;
  }
  if (given("--tls-cert")) c.tls_cert_file = f.tls_cert;
  if (given("--tls-key")) c.tls_key_file = f.tls_key;
  if (given("--tls-ca")) c.tls_ca_file = f.tls_ca;
  if (given("--tls-server-name")) c.tls_server_name = f.tls_server_name;
  if (given("--tls-client-auth")) c.tls_client_auth = f.tls_client_auth;
  if (given("--allow-unauthenticated")) c.allow_unauthenticated = f.allow_unauthenticated;
  if (given("--transports")) {
    auto list = splitComma(f.transports);
    if (auto st = checkTransports(list, "--transports"); !st) return st;
    c.transports = std::move(list);
  }
  for (const auto& spec : f.peer) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return invalid("--peer '" + spec + "': write NAME=HOST:PORT, e.g. --peer hostb=10.0.0.2:7700");
    }
    PeerConfig peer{spec.substr(0, eq), spec.substr(eq + 1), {}};
    if (!validName(peer.name)) {
      return invalid("--peer '" + spec + "': the name must be [A-Za-z0-9._-], 1-63 characters");
    }
    if (auto st = checkHostPort(peer.address, "--peer " + peer.name, false); !st) return st;
    auto existing = std::find_if(c.peers.begin(), c.peers.end(),
                                 [&](const PeerConfig& p) { return p.name == peer.name; });
    if (existing != c.peers.end()) {
      existing->address = peer.address;
    } else {
      c.peers.push_back(std::move(peer));
    }
  }
  for (const auto& spec : f.route) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return invalid("--route '" + spec +
                     "': write STREAM=PEER, e.g. --route cam0=hostb (STREAM may be '*')");
    }
    const std::string stream = spec.substr(0, eq);
    const std::string name = spec.substr(eq + 1);
    if (auto st = checkStream(stream, "--route " + spec); !st) return st;
    auto peer =
        std::find_if(c.peers.begin(), c.peers.end(), [&](const PeerConfig& p) { return p.name == name; });
    if (peer == c.peers.end()) {
      std::vector<std::string> names;
      for (const auto& p : c.peers) names.push_back(p.name);
      return invalid("--route " + spec + ": no peer named '" + name +
                     "' (configured: " + (names.empty() ? std::string("none") : join(names, ", ")) +
                     "); add --peer " + name + "=HOST:PORT or a [[peer]] table");
    }
    if (std::find(peer->streams.begin(), peer->streams.end(), stream) == peer->streams.end()) {
      peer->streams.push_back(stream);
    }
  }
  if (given("--hugepages")) {
    if (auto st = checkHugepages(f.hugepages, "--hugepages"); !st) return st;
    c.hugepages = f.hugepages;
  }
  if (given("--log-level")) {
    if (auto st = checkLogLevel(f.log_level, "--log-level"); !st) return st;
    c.log_level = f.log_level;
  }
  if (given("--metrics")) {
    if (auto st = checkHostPort(f.metrics, "--metrics", true); !st) return st;
    c.metrics_listen = f.metrics;
  }
  if (given("--ready-file")) c.ready_file = f.ready_file;
  if (given("--rdma-device")) c.rdma_device = f.rdma_device;
  if (given("--fault-inject")) {
    auto spec = transport::parseFaultSpec(f.fault_inject);
    if (!spec) return invalid("--fault-inject: " + spec.error().message);
    c.fault_inject = f.fault_inject;
  }
  if (given("--rdma-port")) {
    if (auto st = assign(parseU32(f.rdma_port, "--rdma-port", true), c.rdma_port); !st) return st;
    if (c.rdma_port > 65535) {
      return invalid("--rdma-port " + f.rdma_port + ": a port is 0-65535 (0 = any free port)");
    }
  }
  if (given("--rdma-retry-ms")) {
    if (auto st = assign(parseU32(f.rdma_retry, "--rdma-retry-ms", false), c.rdma_retry_ms); !st) return st;
  }
  if (given("--ack-timeout-ms")) {
    if (auto st = assign(parseU32(f.ack_timeout, "--ack-timeout-ms", false), c.ack_timeout_ms); !st) {
      return st;
    }
  }
  if (given("--credit-timeout-ms")) {
    if (auto st = assign(parseU32(f.credit_timeout, "--credit-timeout-ms", false), c.credit_timeout_ms);
        !st) {
      return st;
    }
  }
  if (given("--connect-timeout-ms")) {
    if (auto st = assign(parseU32(f.connect_timeout, "--connect-timeout-ms", false), c.connect_timeout_ms);
        !st) {
      return st;
    }
  }
  if (given("--max-slot-size")) {
    if (auto st = assign(parseSize(f.max_slot_size, "--max-slot-size"), c.max_slot_size); !st) return st;
  }
  if (given("--max-slots")) {
    if (auto st = assign(parseSize32(f.max_slots, "--max-slots"), c.max_slots); !st) return st;
  }
  if (given("--default-slot-size")) {
    if (auto st = assign(parseSize(f.default_slot_size, "--default-slot-size"), c.default_slot_size); !st) {
      return st;
    }
  } else if (given("--max-slot-size") && c.default_slot_size > c.max_slot_size) {
    c.default_slot_size = c.max_slot_size;  // lowering the limit lowers the default with it
  }
  if (given("--default-slots")) {
    if (auto st = assign(parseSize32(f.default_slots, "--default-slots"), c.default_slot_count); !st) {
      return st;
    }
  } else if (given("--max-slots") && c.default_slot_count > c.max_slots) {
    c.default_slot_count = c.max_slots;
  }
  if (given("--max-client-bytes")) {
    if (auto st = assign(parseSize(f.max_client_bytes, "--max-client-bytes"), c.max_client_bytes); !st) {
      return st;
    }
  }
  if (given("--cpu")) {
    if (auto st = assign(parseCpu(f.cpu, "--cpu"), c.cpu); !st) return st;
  }
  if (given("--idle-spin-us")) {
    if (auto st = assign(parseU32(f.idle_spin, "--idle-spin-us", true), c.idle_spin_us); !st) return st;
  }
  return {};
}

// Checks that involve more than one setting, after file and flags are merged.
// A PEM file for TLS: readable, not empty, and PEM ("-----BEGIN ").
Result<std::string> readPem(const std::string& path, const std::string& label, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid(label + ": cannot read '" + path + "': " + std::strerror(errno));
  std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return invalid(label + ": '" + path + "' is not PEM; it should hold " + what +
                   " (-----BEGIN ...----- blocks)");
  }
  return pem;
}

// The TLS settings go together; reads their files.
Status loadTls(Config& c) {
  const bool cert = !c.tls_cert_file.empty();
  if (cert != !c.tls_key_file.empty()) {
    return invalid(
        "link.tls_cert_file (--tls-cert) and link.tls_key_file (--tls-key) go together: "
        "give this daemon's certificate chain and its private key, or neither");
  }
  if (!cert) {
    if (!c.tls_ca_file.empty() || !c.tls_server_name.empty() || c.tls_client_auth) {
      return invalid(
          "TLS settings without a certificate: tls_ca_file, tls_server_name and tls_client_auth "
          "apply only when link.tls_cert_file and link.tls_key_file (--tls-cert, --tls-key) are set");
    }
    return {};
  }
  if (c.tls_client_auth && c.tls_ca_file.empty()) {
    return invalid(
        "link.tls_client_auth (--tls-client-auth) needs link.tls_ca_file (--tls-ca): the CA "
        "that signs the certificates of the peers allowed to dial in");
  }
  if (auto st = assign(readPem(c.tls_cert_file, "link.tls_cert_file", "a certificate chain"), c.tls_cert_pem);
      !st) {
    return st;
  }
  if (auto st = assign(readPem(c.tls_key_file, "link.tls_key_file", "a private key"), c.tls_key_pem); !st) {
    return st;
  }
  if (!c.tls_ca_file.empty()) {
    if (auto st = assign(readPem(c.tls_ca_file, "link.tls_ca_file", "CA certificates"), c.tls_ca_pem); !st) {
      return st;
    }
  }
  return {};
}

// "127.0.0.1:7700", "[::1]:0", "localhost:7700": only this host can connect.
bool loopbackHost(const std::string& host_port) {
  std::string host = host_port.substr(0, host_port.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

bool Config::unauthenticatedFromNetwork() const {
  return token.empty() && !tlsEnabled() && (!loopbackHost(listen) || !loopbackHost(data_listen));
}

namespace {

Status validate(Config& c) {
  if (c.id.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') {
      return invalid("cannot determine the host name for the daemon id; pass --id NAME");
    }
    c.id = host;
  }
  if (c.socket_path.empty()) return invalid("socket path is empty; pass --socket PATH");
  if (c.socket_path.size() > kMaxSocketPath) {
    return invalid("socket path '" + c.socket_path + "' is " + std::to_string(c.socket_path.size()) +
                   " bytes; a Unix socket path must be at most " + std::to_string(kMaxSocketPath));
  }
  for (size_t i = 0; i < c.peers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (c.peers[i].name == c.peers[j].name) {
        return invalid("peer '" + c.peers[i].name + "' is configured twice; give each peer a unique name");
      }
      for (const auto& stream : c.peers[i].streams) {
        const auto& other = c.peers[j].streams;
        if (std::find(other.begin(), other.end(), stream) != other.end()) {
          return invalid("stream '" + stream + "' is routed to both peer '" + c.peers[j].name +
                         "' and peer '" + c.peers[i].name + "'; route it to one");
        }
      }
    }
  }
  if (c.unauthenticatedFromNetwork() && !c.allow_unauthenticated) {
    return invalid(
        "link.listen " + c.listen + " / data_listen " + c.data_listen +
        " accept peers from the network, but neither a token nor TLS is configured: any host that reaches "
        "the port could link and push frames to local consumers.  Generate a token the daemon alone can "
        "read (umask 077; head -c 32 /dev/urandom | base64 > /etc/framelink/peer.token; chown framelink "
        "/etc/framelink/peer.token) and set link.token_file (--token-file) to it on both daemons; or turn "
        "on mutual TLS (tls_cert_file, tls_key_file, tls_ca_file, tls_client_auth); or listen on "
        "127.0.0.1; or set link.allow_unauthenticated = true (--allow-unauthenticated) to accept the risk");
  }
  if (c.reconnect_min_ms > c.reconnect_max_ms) {
    return invalid("reconnect_min_ms (" + std::to_string(c.reconnect_min_ms) +
                   ") is larger than reconnect_max_ms (" + std::to_string(c.reconnect_max_ms) + ")");
  }
  if (c.default_slot_size > c.max_slot_size) {
    return invalid("limits.default_slot_size (" + std::to_string(c.default_slot_size) +
                   ") is larger than max_slot_size (" + std::to_string(c.max_slot_size) +
                   "); lower one or raise the other");
  }
  if (c.default_slot_count > c.max_slots) {
    return invalid("limits.default_slot_count (" + std::to_string(c.default_slot_count) +
                   ") is larger than max_slots (" + std::to_string(c.max_slots) + ")");
  }
  if (c.default_slot_size * c.default_slot_count > c.max_client_bytes) {
    return invalid("a client with the default slots (" + std::to_string(c.default_slot_count) + " x " +
                   std::to_string(c.default_slot_size) + " bytes) would exceed max_client_bytes (" +
                   std::to_string(c.max_client_bytes) + "); raise max_client_bytes or lower the defaults");
  }
  return loadTls(c);
}

}  // namespace

std::string Config::routeFor(const std::string& stream) const {
  for (const auto& peer : peers) {
    if (std::find(peer.streams.begin(), peer.streams.end(), stream) != peer.streams.end()) return peer.name;
  }
  for (const auto& peer : peers) {
    if (std::find(peer.streams.begin(), peer.streams.end(), "*") != peer.streams.end()) return peer.name;
  }
  const PeerConfig* fallback = nullptr;
  for (const auto& peer : peers) {
    if (!peer.streams.empty()) continue;
    if (fallback != nullptr) return "";  // two peers without routes: ambiguous
    fallback = &peer;
  }
  return fallback != nullptr ? fallback->name : "";
}

Result<Config> parseConfig(int argc, const char* const* argv) {
  CLI::App app{"framelinkd: moves frames between hosts, zero-copy, over shared memory and RDMA/TCP/gRPC",
               "framelinkd"};
  app.set_version_flag("--version", versionText(), "Print the version and exit");
  app.get_formatter()->column_width(34);
  Flags f;
  auto one = [](CLI::Option* o) { return o->allow_extra_args(false); };
  app.add_option("--config", f.config, "TOML file (flags override it)")->type_name("FILE");
  app.add_option("--id", f.id, "Daemon id (default: host name)")->type_name("NAME");
  app.add_option("--socket", f.socket, "Unix attach socket (default /run/framelink/framelinkd.sock)")
      ->type_name("PATH");
  app.add_option("--socket-mode", f.socket_mode, "Socket mode (default 0660)")->type_name("OCTAL");
  app.add_option("--socket-group", f.socket_group, "Socket group (default: as created)")->type_name("NAME");
  one(app.add_option("--allow-uid", f.allow_uid, "Allow this uid to attach (repeatable; default: anyone)"))
      ->type_name("N");
  one(app.add_option("--allow-gid", f.allow_gid, "Allow this gid to attach (repeatable)"))->type_name("N");
  app.add_option("--listen", f.listen, "gRPC listener for peers (default 0.0.0.0:7700)")
      ->type_name("HOST:PORT");
  app.add_option("--data-listen", f.data_listen, "tcp data listener (default 0.0.0.0:0)")
      ->type_name("HOST:PORT");
  auto* token = app.add_option("--token", f.token, "Shared secret for peer links")->type_name("TOKEN");
  app.add_option("--token-file", f.token_file, "Read the shared secret from FILE")
      ->type_name("FILE")
      ->excludes(token);
  app.add_option("--tls-cert", f.tls_cert, "TLS on the gRPC link: this daemon's certificate chain (PEM)")
      ->type_name("FILE");
  app.add_option("--tls-key", f.tls_key, "The private key of --tls-cert (PEM)")->type_name("FILE");
  app.add_option("--tls-ca", f.tls_ca, "CA certificates that sign the peers' certificates (PEM)")
      ->type_name("FILE");
  app.add_option("--tls-server-name", f.tls_server_name,
                 "Name to verify in the peer's certificate (default: the host of its address)")
      ->type_name("NAME");
  app.add_flag("--tls-client-auth", f.tls_client_auth,
               "Mutual TLS: peers that dial in must present a certificate signed by --tls-ca");
  app.add_flag("--allow-unauthenticated", f.allow_unauthenticated,
               "Listen for peers on a non-loopback address without --token or TLS (refused otherwise)");
  app.add_option("--transports", f.transports, "Comma list in preference order (default tcp,grpc)")
      ->type_name("LIST");
  app.add_option("--rdma-device", f.rdma_device,
                 "RDMA device (default: the one that owns the --listen address)")
      ->type_name("NAME");
  app.add_option("--rdma-port", f.rdma_port, "rdma_cm listen port, announced to peers (default 0 = any)")
      ->type_name("PORT");
  app.add_option("--fault-inject", f.fault_inject,
                 "Tests only: inject link faults, e.g. seed=7,drop=0.01,delay=0.05 (see README)")
      ->type_name("SPEC");
  app.add_option("--rdma-retry-ms", f.rdma_retry,
                 "How often a link that fell back from rdma tries it again (default 30000)")
      ->type_name("MS");
  one(app.add_option("--peer", f.peer, "A peer daemon's gRPC address (repeatable)"))
      ->type_name("NAME=HOST:PORT");
  one(app.add_option("--route", f.route, "Route a stream (or '*') to a peer (repeatable)"))
      ->type_name("STREAM=PEER");
  app.add_option("--hugepages", f.hugepages, "auto|on|off (default auto)")->type_name("MODE");
  app.add_option("--log-level", f.log_level, "trace|debug|info|warn|error (default info)")
      ->type_name("LEVEL");
  app.add_option("--metrics", f.metrics, "Serve /metrics and /stats (default off)")->type_name("HOST:PORT");
  app.add_option("--ready-file", f.ready_file, "Write pid/ports here once serving")->type_name("PATH");
  app.add_option("--ack-timeout-ms", f.ack_timeout, "Default 30000")->type_name("N");
  app.add_option("--credit-timeout-ms", f.credit_timeout, "Default 30000")->type_name("N");
  app.add_option("--connect-timeout-ms", f.connect_timeout, "Default 5000")->type_name("N");
  app.add_option("--max-slot-size", f.max_slot_size, "Default 64MiB")->type_name("BYTES");
  app.add_option("--max-slots", f.max_slots, "Per client, default 1024")->type_name("N");
  app.add_option("--max-client-bytes", f.max_client_bytes, "Per client, default 1GiB")->type_name("BYTES");
  app.add_option("--default-slot-size", f.default_slot_size, "For clients that ask for 0, default 4MiB")
      ->type_name("BYTES");
  app.add_option("--default-slots", f.default_slots, "For clients that ask for 0, default 8")->type_name("N");
  app.add_option("--cpu", f.cpu, "Pin the data agent to this CPU (-1 = no)")->type_name("N");
  app.add_option(
         "--idle-spin-us", f.idle_spin,
         "The data agent spins this long after its last work, yields as long, then sleeps (0 = sleep at "
         "once; default 50)")
      ->type_name("US");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    Config config;
    config.exit_now = true;
    config.exit_message = app.help();
    return config;
  } catch (const CLI::CallForVersion& e) {
    Config config;
    config.exit_now = true;
    config.exit_message = std::string(e.what()) + "\n";
    return config;
  } catch (const CLI::ParseError& e) {
    return invalid(std::string(e.what()) + "; run framelinkd --help");
  }

  Config config;
  if (!f.config.empty()) {
    config.config_file = f.config;
    if (auto st = TomlReader(f.config).load(config); !st) return std::move(st).error();
  }
  if (auto st = applyFlags(app, f, config); !st) return std::move(st).error();
  if (auto st = validate(config); !st) return std::move(st).error();
  return config;
}

std::string describe(const Config& c) {
  auto mode = [](uint32_t m) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "%04o", m);
    return std::string(buf);
  };
  auto ids = [](const std::vector<uint32_t>& v) {
    std::vector<std::string> s;
    s.reserve(v.size());
    for (auto id : v) s.push_back(std::to_string(id));
    return v.empty() ? std::string("any") : join(s);
  };
  std::string peers;
  for (const auto& p : c.peers) {
    if (!peers.empty()) peers += ' ';
    peers += p.name + "=" + p.address;
    if (!p.streams.empty()) peers += "[" + join(p.streams) + "]";
  }
  std::ostringstream out;
  out << "id=" << c.id << " config=" << (c.config_file.empty() ? "-" : c.config_file)
      << " socket=" << c.socket_path << " mode=" << mode(c.socket_mode)
      << " group=" << (c.socket_group.empty() ? "-" : c.socket_group) << " uids=" << ids(c.allowed_uids)
      << " gids=" << ids(c.allowed_gids) << " listen=" << c.listen << " data_listen=" << c.data_listen
      << " token=" << (c.token.empty() ? "none" : "<redacted>") << " tls="
      << (!c.tlsEnabled()     ? std::string("off")
          : c.tls_client_auth ? "mutual(cert=" + c.tls_cert_file + ",ca=" + c.tls_ca_file + ")"
                              : "on(cert=" + c.tls_cert_file +
                                    ",ca=" + (c.tls_ca_file.empty() ? "system" : c.tls_ca_file) + ")")
      << (c.tls_server_name.empty() ? "" : " tls_server_name=" + c.tls_server_name)
      << (c.allow_unauthenticated ? " allow_unauthenticated=true" : "")
      << " transports=" << join(c.transports) << " peers={" << peers << "}"
      << " hugepages=" << c.hugepages << " log_level=" << c.log_level
      << " metrics=" << (c.metrics_listen.empty() ? "off" : c.metrics_listen)
      << " ready_file=" << (c.ready_file.empty() ? "-" : c.ready_file) << " cpu=" << c.cpu
      << " idle_spin_us=" << c.idle_spin_us << " ack_timeout_ms=" << c.ack_timeout_ms
      << " credit_timeout_ms=" << c.credit_timeout_ms << " connect_timeout_ms=" << c.connect_timeout_ms
      << " keepalive_ms=" << c.keepalive_ms << " reconnect_ms=" << c.reconnect_min_ms << ".."
      << c.reconnect_max_ms << " grpc_chunk_bytes=" << c.grpc_chunk_bytes
      << " rdma_device=" << (c.rdma_device.empty() ? "auto" : c.rdma_device) << " rdma_port=" << c.rdma_port
      << " rdma_retry_ms=" << c.rdma_retry_ms
      << (c.fault_inject.empty() ? "" : " fault_inject=" + c.fault_inject)
      << " max_slot_size=" << c.max_slot_size << " max_slots=" << c.max_slots
      << " max_client_bytes=" << c.max_client_bytes << " default_slots=" << c.default_slot_count << "x"
      << c.default_slot_size;
  return out.str();
}

}  // namespace framelink
