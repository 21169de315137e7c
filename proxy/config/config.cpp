#include "config/config.h"

#include <unistd.h>

#include <toml++/toml.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "config/config_options.h"
#include "config/config_peers.h"
#include "config/config_reload.h"
#include "config/config_values.h"
#include "config/tls_crl.h"
#include "framelink/framelink.h"
#include "framelink/shm_layout.h"

namespace framelink {
namespace {

using config::Option;
using config::options;

// sockaddr_un::sun_path is 108 bytes including the terminating NUL.
constexpr size_t kMaxSocketPath = 107;

Error invalid(std::string message) { return invalidSetting(std::move(message)); }

// Moves a parsed value into its field, or passes the error on.
template <typename T, typename U>
Status assign(Result<T> parsed, U& field) {
  if (!parsed) return std::move(parsed).error();
  field = std::move(*parsed);
  return {};
}

// "[daemon], [link], [limits], [metrics], [[peer]]"
std::string sectionList() {
  std::string out;
  std::string_view last;
  for (const auto& option : options()) {
    if (option.section == last) continue;
    last = option.section;
    if (!out.empty()) out += ", ";
    out += std::holds_alternative<config::Peers>(option.value) ? "[[" + std::string(last) + "]]"
                                                               : "[" + std::string(last) + "]";
  }
  return out;
}

bool isSection(const std::string& name) {
  return std::any_of(options().begin(), options().end(), [&](const Option& o) { return o.section == name; });
}

// "; did you mean 'link.token_file'?" for an unknown key of [section]: the
// same key in another table, else the file key a typo away; "" for neither.
std::string didYouMean(std::string_view section, std::string_view key) {
  const Option* best = nullptr;
  size_t best_distance = 0;
  for (const auto& option : options()) {
    if (!option.in_file || option.key.empty()) continue;
    const size_t d = config::editDistance(key, option.key) * 2 + (option.section == section ? 0 : 1);
    if (best == nullptr || d < best_distance) {
      best = &option;
      best_distance = d;
    }
  }
  if (best == nullptr || !config::typo(key, best_distance / 2)) return {};
  return "; did you mean '" + config::keyName(*best) + "'?";
}

// The same for an unknown top-level name: a table a typo away.
std::string didYouMeanTable(std::string_view name) {
  for (const auto& option : options()) {
    if (config::typo(name, config::editDistance(name, option.section))) {
      return std::holds_alternative<config::Peers>(option.value)
                 ? "; did you mean [[" + std::string(option.section) + "]]?"
                 : "; did you mean [" + std::string(option.section) + "]?";
    }
  }
  return {};
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
      if (name == "peer") {
        status = config::readPeers(node, file_, config);
      } else if (isSection(name)) {
        status = section(node, name, config);
      } else {
        std::string guess = didYouMeanTable(name);
        if (guess.empty()) guess = didYouMean("", name);  // a key outside its table
        status = invalid("unknown table or key '" + name + "' " + at(node) + guess +
                         (guess.empty() ? "; known tables: " : " Known tables: ") + sectionList());
      }
      if (!status) return status;
    }
    if (config.token_file.empty()) return {};
    if (!config.token.empty()) {
      return invalid("link.token and link.token_file are both set in " + file_ + "; keep one");
    }
    return assign(readTokenFile(config.token_file, "link.token_file in " + file_), config.token);
  }

 private:
  // "(line 3 of /etc/framelink/framelinkd.toml)"
  std::string at(const toml::node& node) const {
    const auto line = node.source().begin.line;
    if (line == 0) return "in " + file_;
    return "(line " + std::to_string(line) + " of " + file_ + ")";
  }
  config::Origin origin(const std::string& key, const toml::node& node) const {
    return {key + " " + at(node), true, std::filesystem::path(file_).parent_path().string()};
  }

  Status section(const toml::node& node, const std::string& name, Config& config) {
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      return invalid("'" + name + "' " + at(node) + " must be a table: write [" + name + "]");
    }
    for (auto&& [key, value] : *table) {
      const std::string full = name + "." + std::string(key.str());
      const Option* option = config::findOption(name, key.str());
      if (option == nullptr) return unknownKey(full, at(value), didYouMean(name, key.str()));
      if (auto st = config::setFromToml(*option, value, origin(full, value), config); !st) return st;
    }
    return {};
  }

  std::string file_;
};

// ---- command line ----

std::string versionText() {
  return "framelinkd " + std::to_string(FL_VERSION_MAJOR) + "." + std::to_string(FL_VERSION_MINOR) + "." +
         std::to_string(FL_VERSION_PATCH);
}

// What CLI11 collected for one option of the table.  Values stay text until
// setFromText, so that flags and the file go through the same checks.
struct FlagValue {
  CLI::Option* cli = nullptr;
  std::string text;
  std::vector<std::string> list;
  bool on = false;
};

struct Flags {
  std::string config;
  bool print_reference = false;
  bool check_only = false;
  std::vector<FlagValue> values;  // parallel to options()
  std::vector<std::string> peer, route;
};

// The flag of a setting, by its key ("link.token").
const FlagValue& flagOf(const Flags& f, std::string_view key) {
  for (size_t i = 0; i < options().size(); ++i) {
    if (config::keyName(options()[i]) == key) return f.values[i];
  }
  static const FlagValue kNone;
  return kNone;
}

bool given(const Flags& f, std::string_view key) {
  const FlagValue& flag = flagOf(f, key);
  return flag.cli != nullptr && flag.cli->count() > 0;
}

void addFlags(CLI::App& app, Flags& f) {
  app.add_option("--config", f.config, "TOML file, loaded first; flags override it")->type_name("FILE");
  app.add_flag("--print-config-reference", f.print_reference,
               "Print the table of settings (markdown, as in the configuration reference) and exit");
  app.add_flag(
      "--check-config", f.check_only,
      "Check the configuration (the file and the flags) as a start would, print what it sets and its "
      "warnings, and exit without starting: 0 valid, 2 invalid (the error says what and where)");
  f.values.resize(options().size());
  for (size_t i = 0; i < options().size(); ++i) {
    const Option& option = options()[i];
    FlagValue& v = f.values[i];
    const std::string group = "[" + std::string(option.section) + "]";
    if (std::holds_alternative<config::Peers>(option.value)) {
      app.add_option("--peer", f.peer, "A peer daemon this daemon dials (repeatable)")
          ->allow_extra_args(false)
          ->type_name("NAME=HOST:PORT")
          ->group("[[peer]]");
      app.add_option("--route", f.route,
                     "Route a stream (or '*') to a peer, or to several: STREAM=PEER1,PEER2 (repeatable)")
          ->allow_extra_args(false)
          ->type_name("STREAM=PEER")
          ->group("[[peer]]");
      continue;
    }
    std::string names = config::flagName(option);
    for (auto alias : option.aliases) names += "," + std::string(alias);
    std::string help(option.help);
    if (const auto text = config::defaultText(option);
        !text.empty() && text != "-" && !config::isSwitch(option)) {
      help += " (default " + text + ")";
    }
    if (config::isSwitch(option)) {
      v.cli = app.add_flag(names, v.on, help);
    } else if (config::isList(option)) {
      v.cli =
          app.add_option(names, v.list, help + "; repeatable or comma-separated")->allow_extra_args(false);
    } else {
      v.cli = app.add_option(names, v.text, help);
    }
    v.cli->type_name(config::placeholder(option))->group(option.in_file ? group : "command line only");
  }
  flagOf(f, "link.token_file").cli->excludes(flagOf(f, "link.token").cli);
}

Status applyFlags(const Flags& f, Config& c) {
  for (size_t i = 0; i < options().size(); ++i) {
    const FlagValue& v = f.values[i];
    if (v.cli == nullptr || v.cli->count() == 0) continue;
    const Option& option = options()[i];
    std::vector<std::string> values;
    if (config::isSwitch(option)) {
      values = {v.on ? "true" : "false"};
    } else if (config::isList(option)) {
      values = v.list;
    } else {
      values = {v.text};
    }
    if (auto st = config::setFromText(option, values, {config::flagName(option), false, {}}, c); !st) {
      return st;
    }
  }
  // A token given here replaces the file's token_file.
  if (given(f, "link.token")) c.token_file.clear();
  // Lowering a limit on the command line lowers the default with it.
  if (given(f, "limits.max_slot_size") && !given(f, "limits.default_slot_size") &&
      c.default_slot_size > c.max_slot_size) {
    c.default_slot_size = c.max_slot_size;
  }
  if (given(f, "limits.max_slots") && !given(f, "limits.default_slot_count") &&
      c.default_slot_count > c.max_slots) {
    c.default_slot_count = c.max_slots;
  }
  return config::applyPeerFlags(f.peer, f.route, c);
}

// ---- checks that involve more than one setting, after file and flags are merged ----

// A trust file that does not exist yet, or holds only blanks and comments.
bool noCertificates(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno == ENOENT;
  std::string line;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first != std::string::npos && line[first] != '#') return false;
  }
  return true;
}

// The TLS settings go together; reads their files.
Status loadTls(Config& c) {
  const bool cert = !c.tls_cert_file.empty();
  if (cert != !c.tls_key_file.empty()) {
    return invalid(
        "link.tls_cert_file (--tls-cert-file) and link.tls_key_file (--tls-key-file) go together: "
        "give this daemon's certificate chain and its private key, or neither");
  }
  if (!cert) {
    if (!c.tls_ca_file.empty() || !c.tls_crl_file.empty() || !c.tls_server_name.empty() ||
        c.tls_client_auth) {
      return invalid(
          "TLS settings without a certificate: tls_ca_file, tls_crl_file, tls_server_name and "
          "tls_client_auth "
          "apply only when link.tls_cert_file and link.tls_key_file (--tls-cert-file, --tls-key-file) are "
          "set");
    }
    return {};
  }
  if (c.tls_client_auth && c.tls_ca_file.empty()) {
    return invalid(
        "link.tls_client_auth (--tls-client-auth) needs link.tls_ca_file (--tls-ca-file): the CA "
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
    if (noCertificates(c.tls_ca_file)) {
      c.tls_ca_pem = c.tls_cert_pem;
      c.tls_no_peer_certs = true;
    } else if (auto st = assign(readPem(c.tls_ca_file, "link.tls_ca_file", "CA certificates"), c.tls_ca_pem);
               !st) {
      return st;
    }
  }
  if (!c.tls_crl_file.empty()) {
    if (c.tls_ca_file.empty() || c.tls_no_peer_certs) {
      return invalid("link.tls_crl_file (--tls-crl) needs link.tls_ca_file with the CA that signed the CRLs");
    }
    if (auto st = assign(readPem(c.tls_crl_file, "link.tls_crl_file", "certificate revocation lists"),
                         c.tls_crl_pem);
        !st) {
      return st;
    }
    if (auto st = checkCrls(c.tls_crl_pem, c.tls_ca_pem, c.tls_crl_revoked); !st) return st;
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
  return token.empty() && !peerTokens() && !tlsEnabled() &&
         (!loopbackHost(listen) || !loopbackHost(data_listen));
}

std::string Config::tokenInClearAt() const {
  if (tlsEnabled()) return {};
  const bool tokens = !token.empty() || peerTokens();
  if (!tokens) return {};
  if (!loopbackHost(listen)) return "link.listen " + listen;
  for (const PeerConfig& p : peers) {
    if (!p.address.empty() && !loopbackHost(p.address) && !peerToken(p.name).empty()) {
      return "peer " + p.name + " at " + p.address;
    }
  }
  return {};
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
  // Peers name this daemon by its id in [[peer]] tables and routes: the same rule.
  if (auto st = checkStreamName(c.id, "daemon.id (--id)", false); !st) return st;
  if (c.socket_path.empty()) return invalid("socket path is empty; pass --socket PATH");
  if (c.socket_path.size() > kMaxSocketPath) {
    return invalid("socket path '" + c.socket_path + "' is " + std::to_string(c.socket_path.size()) +
                   " bytes; a Unix socket path must be at most " + std::to_string(kMaxSocketPath));
  }
  if (auto st = config::checkPeers(c); !st) return st;
  if (auto st = config::checkDiscovery(c); !st) return st;
  if (c.data_listen.empty()) {
    // A fixed port by default, the one after the gRPC port, so that a
    // firewall rule can be written before the daemon first runs.
    const size_t colon = c.listen.rfind(':');
    uint32_t port = 0;
    if (colon == std::string::npos ||
        std::from_chars(c.listen.data() + colon + 1, c.listen.data() + c.listen.size(), port).ec !=
            std::errc{}) {
      return invalid("link.listen '" + c.listen + "' has no port; write HOST:PORT");
    }
    if (port >= 65535) {
      return invalid(
          "link.listen's port is " + std::to_string(port) +
          ": the tcp data port, by default the one after it, would not exist; set link.data_listen "
          "(--data-listen HOST:PORT)");
    }
    c.data_listen = c.listen.substr(0, colon + 1) + std::to_string(port == 0 ? 0 : port + 1);
  }
  if (c.unauthenticatedFromNetwork() && !c.allow_unauthenticated) {
    return invalid(
        "link.listen " + c.listen + " / data_listen " + c.data_listen +
        " accept peers from the network, but neither a token nor TLS is configured: any host that reaches "
        "the port could link and push frames to local consumers.  Generate a token the daemon alone can "
        "read (umask 077; head -c 32 /dev/urandom | base64 > /etc/framelink/peer.token; chown framelink "
        "/etc/framelink/peer.token) and set link.token_file (--token-file) to it on both daemons, or give "
        "each [[peer]] a token_file of its own; or turn "
        "on mutual TLS (tls_cert_file, tls_key_file, tls_ca_file, tls_client_auth); or listen on "
        "127.0.0.1; or set link.allow_unauthenticated = true (--allow-unauthenticated) to accept the risk");
  }
  if (c.reconnect_min_ms > c.reconnect_max_ms) {
    return invalid("reconnect_min_ms (" + std::to_string(c.reconnect_min_ms) +
                   ") is larger than reconnect_max_ms (" + std::to_string(c.reconnect_max_ms) + ")");
  }
  // The peer's keepalives (every keepalive_ms, its own setting, usually
  // the same) are what is heard on an idle link.
  if (c.link_timeout_ms != 0 && c.link_timeout_ms < 2 * uint64_t{c.keepalive_ms}) {
    return invalid("link_timeout_ms (" + std::to_string(c.link_timeout_ms) +
                   ") must be at least twice keepalive_ms (" + std::to_string(c.keepalive_ms) +
                   "): an idle link hears only the peer's keepalives; raise link_timeout_ms, lower "
                   "keepalive_ms, or set link_timeout_ms = 0 to never give a silent link up");
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

// A markdown table cell: '|' would end it.
std::string cell(const std::string& text) {
  std::string out;
  for (char ch : text) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
  return out;
}

}  // namespace

Result<Config> parseConfig(int argc, const char* const* argv) {
  CLI::App app{"framelinkd: moves frames between hosts, zero-copy, over shared memory and RDMA/TCP/gRPC",
               "framelinkd"};
  app.set_version_flag("--version", versionText(), "Print the version and exit");
  app.get_formatter()->column_width(40);
  Flags f;
  addFlags(app, f);
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
  if (f.print_reference) {
    Config config;
    config.exit_now = true;
    config.exit_message = configReference();
    return config;
  }

  Config config;
  if (!f.config.empty()) {
    config.config_file = f.config;
    if (auto st = TomlReader(f.config).load(config); !st) return std::move(st).error();
  }
  if (auto st = applyFlags(f, config); !st) return std::move(st).error();
  if (auto st = validate(config); !st) return std::move(st).error();
  if (f.check_only) {
    config.exit_now = true;
    config.exit_message = "framelinkd: the configuration is valid: " + describe(config) + "\n";
    for (const auto& warning : config.routeWarnings()) config.exit_message += "warning: " + warning + "\n";
    config.exit_message +=
        "configuration " + configHash(config) + " (framelink doctor shows the running one's)\n";
  }
  return config;
}

std::string describe(const Config& c) {
  std::string out = "config=" + (c.config_file.empty() ? std::string("-") : c.config_file);
  std::string_view section;
  for (const auto& option : options()) {
    if (std::holds_alternative<config::Peers>(option.value)) {
      out += " [[" + std::string(option.section) + "]] " + config::show(option, c);
      continue;
    }
    if (option.section != section) {
      section = option.section;
      out += " [" + std::string(section) + "]";
    }
    out += " " + std::string(option.key) + "=" + config::show(option, c);
  }
  return out;
}

std::vector<std::string> changedOptions(const Config& running, const Config& next) {
  std::vector<std::string> changed;
  for (const auto& option : options()) {
    if (config::show(option, running) == config::show(option, next)) continue;
    if (std::holds_alternative<config::Peers>(option.value)) {
      changed.push_back("[[" + std::string(option.section) + "]]");
    } else {
      changed.push_back("[" + std::string(option.section) + "] " + std::string(option.key));
    }
  }
  return changed;
}

std::string configReference() {
  std::string out =
      "| key | flag | default | |\n"
      "|---|---|---|---|\n"
      "| | `--config FILE` | | TOML file, loaded first; flags override it |\n";
  for (const auto& option : options()) {
    if (std::holds_alternative<config::Peers>(option.value)) {
      out +=
          "| `[[peer]]` `name`, `address`, `streams`, `token`, `token_file`, `cert_name` | `--peer "
          "NAME=HOST:PORT`, "
          "`--route STREAM=PEER[,PEER...]` | | " +
          cell(std::string(option.help)) + " (both flags repeatable) |\n";
      continue;
    }
    std::string flag = "`" + config::flagName(option);
    if (const auto ph = config::placeholder(option); !ph.empty()) flag += " " + ph;
    flag += "`";
    for (size_t i = 0; i < option.aliases.size(); ++i) {
      flag += (i == 0 ? " (also `" : ", `") + std::string(option.aliases[i]) + "`";
      if (i + 1 == option.aliases.size()) flag += ")";
    }
    std::string key = option.in_file
                          ? "`[" + std::string(option.section) + "] " + std::string(option.key) + "`"
                          : "(flag only)";
    std::string fallback = config::defaultText(option);
    const bool literal = !config::tomlValue(option, Config{}).empty();
    out += "| " + key + " | " + cell(flag) + " | " + (literal ? "`" + cell(fallback) + "`" : cell(fallback)) +
           " | " + cell(std::string(option.help)) + " |\n";
  }
  return out;
}

}  // namespace framelink
