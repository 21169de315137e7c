#include "config/config_peers.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "config/config_options.h"
#include "config/config_values.h"

namespace framelink {

namespace config {
namespace {

template <typename T, typename U>
Status assign(Result<T> parsed, U& field) {
  if (!parsed) return std::move(parsed).error();
  field = std::move(*parsed);
  return {};
}

// One [[peer]] table of `file_`: its keys, and the checks that need only it.
class PeerTable {
 public:
  PeerTable(std::string file, size_t index)
      : file_(std::move(file)), base_("peer[" + std::to_string(index) + "]") {}

  Result<PeerConfig> read(const toml::table& table) {
    for (auto&& [k, value] : table) {
      if (auto st = key(std::string(k.str()), value); !st) return std::move(st).error();
    }
    if (auto st = readToken(table); !st) return std::move(st).error();
    if (auto st = check(table); !st) return std::move(st).error();
    return std::move(peer_);
  }

 private:
  // "(line 3 of /etc/framelink/framelinkd.toml)"
  std::string at(const toml::node& node) const {
    const auto line = node.source().begin.line;
    if (line == 0) return "in " + file_;
    return "(line " + std::to_string(line) + " of " + file_ + ")";
  }

  Result<std::string> str(const std::string& key, const toml::node& node) const {
    if (const auto* v = node.as_string()) return v->get();
    return invalidSetting(key + " " + at(node) + ": must be a string (in quotes)");
  }

  Status key(const std::string& name, const toml::node& value) {
    const std::string key = base_ + "." + name;
    if (name == "name") return assign(str(key, value), peer_.name);
    if (name == "address") return assign(str(key, value), peer_.address);
    if (name == "token") {
      if (auto st = assign(str(key, value), peer_.token); !st) return st;
      if (peer_.token.empty()) {
        return invalidSetting(key + " " + at(value) +
                              " is empty; write the secret this daemon and the peer share, or leave the key "
                              "out to use link.token");
      }
      has_token_ = true;
      return {};
    }
    if (name == "token_file") {
      if (auto st = assign(str(key, value), peer_.token_file); !st) return st;
      std::filesystem::path path(peer_.token_file);
      if (path.is_relative()) path = std::filesystem::path(file_).parent_path() / path;
      peer_.token_file = path.string();
      token_file_at_ = at(value);
      return {};
    }
    if (name == "cert_name") return assign(str(key, value), peer_.cert_name);
    if (name == "streams") return streams(key, value);
    std::string guess;
    for (std::string_view known : {"name", "address", "token", "token_file", "cert_name", "streams"}) {
      if (typo(name, editDistance(name, known))) {
        guess = "; did you mean '" + base_ + "." + std::string(known) + "'?";
        break;
      }
    }
    return unknownKey(key, at(value), guess);
  }

  Status streams(const std::string& key, const toml::node& value) {
    const auto* list = value.as_array();
    if (list == nullptr) {
      return invalidSetting(key + " " + at(value) + R"(: must be an array of strings, e.g. ["a", "b"])");
    }
    for (const auto& stream : *list) {
      std::string s;
      if (auto st = assign(str(key, stream), s); !st) return st;
      peer_.streams.push_back(std::move(s));
    }
    return {};
  }

  Status readToken(const toml::table& table) {
    if (peer_.token_file.empty()) return {};
    if (has_token_) {
      return invalidSetting(base_ + " " + at(table) + ": token and token_file are both set; keep one");
    }
    return assign(readTokenFile(peer_.token_file, base_ + ".token_file " + token_file_at_), peer_.token);
  }

  Status check(const toml::table& table) const {
    if (peer_.name.empty() || (peer_.address.empty() && peer_.token.empty() && peer_.cert_name.empty())) {
      return invalidSetting(base_ + " " + at(table) +
                            R"(: every [[peer]] needs name = "..." and address = "HOST:PORT" (a peer that )"
                            "only dials in: its token, token_file or cert_name instead)");
    }
    const std::string where = "[[peer]] '" + peer_.name + "' " + at(table);
    if (auto st = checkStreamName(peer_.name, where + " name", false); !st) return st;
    if (!peer_.address.empty()) {
      if (auto st = checkHostPort(peer_.address, where + " address", false); !st) return st;
    }
    for (const auto& stream : peer_.streams) {
      if (auto st = checkStreamName(stream, where + " stream name", true); !st) return st;
    }
    return {};
  }

  const std::string file_;
  const std::string base_;  // "peer[2]"
  PeerConfig peer_;
  bool has_token_ = false;
  std::string token_file_at_;
};

}  // namespace

Status readPeers(const toml::node& node, const std::string& file, Config& config) {
  const auto* array = node.as_array();
  if (array == nullptr || !array->is_array_of_tables()) {
    const auto line = node.source().begin.line;
    return invalidSetting("'peer' (line " + std::to_string(line) + " of " + file +
                          ") must be written as [[peer]] tables");
  }
  size_t index = 0;
  for (const auto& element : *array) {
    auto peer = PeerTable(file, index++).read(*element.as_table());
    if (!peer) return std::move(peer).error();
    config.peers.push_back(std::move(peer.value()));
  }
  return {};
}

Status applyPeerFlags(const std::vector<std::string>& peer_flags, const std::vector<std::string>& route_flags,
                      Config& c) {
  for (const auto& spec : peer_flags) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return invalidSetting("--peer '" + spec + "': write NAME=HOST:PORT, e.g. --peer hostb=10.0.0.2:7700");
    }
    PeerConfig peer{spec.substr(0, eq), spec.substr(eq + 1), {}, {}, {}, {}};
    if (auto st = checkStreamName(peer.name, "--peer '" + spec + "': the name", false); !st) return st;
    if (auto st = checkHostPort(peer.address, "--peer " + peer.name, false); !st) return st;
    auto existing = std::find_if(c.peers.begin(), c.peers.end(),
                                 [&](const PeerConfig& p) { return p.name == peer.name; });
    if (existing != c.peers.end()) {
      existing->address = peer.address;
    } else {
      c.peers.push_back(std::move(peer));
    }
  }
  for (const auto& spec : route_flags) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos) {
      return invalidSetting("--route '" + spec +
                            "': write STREAM=PEER[,PEER...], e.g. --route cam0=hostb or --route "
                            "cam0=hostb,hostc (STREAM may be '*')");
    }
    const std::string stream = spec.substr(0, eq);
    if (auto st = checkStreamName(stream, "--route " + spec + ": stream name", true); !st) return st;
    const std::string names = spec.substr(eq + 1);
    for (size_t from = 0; from <= names.size();) {
      const size_t comma = std::min(names.find(',', from), names.size());
      const std::string name = names.substr(from, comma - from);
      from = comma + 1;
      auto peer =
          std::find_if(c.peers.begin(), c.peers.end(), [&](const PeerConfig& p) { return p.name == name; });
      if (peer == c.peers.end()) {
        std::vector<std::string> known;
        for (const auto& p : c.peers) known.push_back(p.name);
        return invalidSetting("--route " + spec + ": no peer named '" + name +
                              "' (configured: " + (known.empty() ? std::string("none") : join(known, ", ")) +
                              "); add --peer " + name + "=HOST:PORT or a [[peer]] table");
      }
      if (std::find(peer->streams.begin(), peer->streams.end(), stream) == peer->streams.end()) {
        peer->streams.push_back(stream);
      }
    }
  }
  return {};
}

Status checkPeers(const Config& c) {
  for (size_t i = 0; i < c.peers.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (c.peers[i].name == c.peers[j].name) {
        return invalidSetting("peer '" + c.peers[i].name +
                              "' is configured twice; give each peer a unique name");
      }
    }
  }
  // Each route is a side the producer's completion waits for (a bit of its
  // record in OutboundStreams): a bound the configuration can break loudly.
  for (const auto& peer : c.peers) {
    for (const auto& stream : peer.streams) {
      const size_t routes = c.routesFor(stream).size();
      if (routes > kMaxRoutesPerStream) {
        return invalidSetting("stream '" + stream + "' is routed to " + std::to_string(routes) +
                              " peers; at most " + std::to_string(kMaxRoutesPerStream) +
                              " are supported (route it to fewer, or relay through a host that routes on)");
      }
    }
  }
  // Only a dialer that must show a certificate has names to check.
  if (c.tls_client_auth) return {};
  if (c.tls_require_cert_name) {
    return invalidSetting(
        "link.tls_require_cert_name (--tls-require-cert-name) needs link.tls_client_auth: without mutual "
        "TLS a dialing peer shows no certificate whose name could be checked");
  }
  for (const auto& peer : c.peers) {
    if (!peer.cert_name.empty()) {
      return invalidSetting("[[peer]] '" + peer.name +
                            "' cert_name needs link.tls_client_auth (mutual TLS): without it a dialing "
                            "peer shows no certificate whose name could be checked");
    }
  }
  return {};
}

}  // namespace config

Status config::checkDiscovery(const Config& config) {
  if (!config.discovery_dns_srv.empty()) {
    if (!config.discovery_etcd.empty()) {
      return invalidSetting(
          "discovery.etcd and discovery.dns_srv are both set: a fleet has one registry; "
          "keep the one its daemons use");
    }
    const std::string& name = config.discovery_dns_srv;
    if (name.size() > 253 ||
        name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") !=
            std::string::npos) {
      return invalidSetting(
          "discovery.dns_srv '" + name +
          "' is not a DNS name; write the SRV records' name, e.g. _framelink._tcp.line1.example");
    }
  }
  if (!config.discovery_dns_server.empty()) {
    const std::string& s = config.discovery_dns_server;
    if (!ipv4WithPort(s, 53)) {
      return invalidSetting("discovery.dns_server '" + s +
                            "' is not IPv4[:PORT] (e.g. 10.0.0.2 or 127.0.0.1:5353)");
    }
  }
  if (config.discovery_etcd.empty()) return {};
  size_t start = 0;
  while (start <= config.discovery_etcd.size()) {
    const size_t comma = std::min(config.discovery_etcd.find(',', start), config.discovery_etcd.size());
    const std::string url = config.discovery_etcd.substr(start, comma - start);
    if (url.rfind("http://", 0) != 0 || url.size() <= 7 || url.find(':', 7) == std::string::npos) {
      return invalidSetting("discovery.etcd: '" + url +
                            "' is not an etcd endpoint; write http://HOST:PORT (several: comma-separated)");
    }
    start = comma + 1;
  }
  if (config.discovery_prefix.empty() || config.discovery_prefix.front() != '/') {
    return invalidSetting("discovery.etcd_prefix '" + config.discovery_prefix +
                          "' must start with '/' (the default is /framelink/)");
  }
  return {};
}

namespace {

// Rules 1-3 of Config::routesFor (the written peers' routes, then the
// readers the registry announced); `implicit` is rule 4, apart.
std::vector<std::string> explicitRoutes(const std::vector<PeerConfig>& peers, const std::string& stream) {
  std::vector<std::string> named, starred, readers;
  for (const auto& peer : peers) {
    const bool names = std::find(peer.streams.begin(), peer.streams.end(), stream) != peer.streams.end();
    if (peer.discovered) {
      if (names && readers.size() < kMaxRoutesPerStream) readers.push_back(peer.name);
    } else if (names) {
      named.push_back(peer.name);
    } else if (std::find(peer.streams.begin(), peer.streams.end(), "*") != peer.streams.end()) {
      starred.push_back(peer.name);
    }
  }
  if (!named.empty()) return named;
  if (!starred.empty()) return starred;
  return readers;
}

const PeerConfig* implicitRoute(const std::vector<PeerConfig>& peers) {
  const PeerConfig* fallback = nullptr;
  for (const auto& peer : peers) {
    if (peer.discovered || !peer.streams.empty()) continue;
    if (fallback != nullptr) return nullptr;  // two peers without routes: ambiguous
    fallback = &peer;
  }
  return fallback;
}

}  // namespace

std::vector<std::string> Config::routesFor(const std::string& stream) const {
  std::vector<std::string> routes = explicitRoutes(peers, stream);
  if (!routes.empty()) return routes;
  if (const PeerConfig* fallback = implicitRoute(peers)) return {fallback->name};
  return {};
}

RouteReaders Config::routeReaders(const std::string& peer, const std::string& stream) const {
  auto named = [&](const std::vector<std::string>& streams) {
    return std::binary_search(streams.begin(), streams.end(), stream);  // sorted (checkEntry)
  };
  for (const auto& p : peers) {
    if (p.name != peer) continue;
    if (!p.discovered) return RouteReaders::kEvery;
    const bool subscribed = named(p.subscribed);
    const bool grouped = named(p.grouped);
    if (subscribed && grouped) return RouteReaders::kBoth;
    if (grouped) return RouteReaders::kGroup;
    return subscribed ? RouteReaders::kSubscribers : RouteReaders::kEvery;
  }
  return RouteReaders::kEvery;
}

std::vector<std::string> Config::routeWarnings() const {
  std::vector<std::string> unrouted, starred;
  for (const auto& peer : peers) {
    if (peer.discovered) continue;
    if (peer.streams.empty()) unrouted.push_back(peer.name);
    if (std::find(peer.streams.begin(), peer.streams.end(), "*") != peer.streams.end()) {
      starred.push_back(peer.name);
    }
  }
  if (unrouted.size() < 2 || !starred.empty()) return {};
  return {"peers " + join(unrouted, ", ") +
          " have no streams list: a stream that no peer's streams list names goes to none of them (only a "
          "single peer without a list takes every other stream), and fails FL_ERR_NO_ROUTE unless a consumer "
          "of it is attached here.  Give each peer its streams (streams = [\"cam0\"], or --route cam0=" +
          unrouted.front() + "), or \"*\" to the one that takes the rest"};
}

std::string Config::whyNoRoute(const std::string& stream) const {
  const auto found =
      std::count_if(peers.begin(), peers.end(), [](const PeerConfig& p) { return p.discovered; });
  const std::string registry =
      !discoveryEnabled()
          ? std::string()
          : "; of the " + std::to_string(found) + " daemons found in the registry, none has a reader of it";
  const auto written = static_cast<long>(peers.size()) - found;
  if (written == 0) return "no peer is configured for stream '" + stream + "'" + registry;
  const auto unlisted = std::count_if(peers.begin(), peers.end(),
                                      [](const PeerConfig& p) { return !p.discovered && p.streams.empty(); });
  return "none of the " + std::to_string(written) + " configured peers takes stream '" + stream +
         "' (no peer's streams list names it or \"*\"" +
         (unlisted > 1 ? ", and " + std::to_string(unlisted) + " peers have no list, so none takes the rest"
                       : std::string()) +
         ")" + registry;
}

bool Config::routeIsImplicit(const std::string& stream) const {
  return explicitRoutes(peers, stream).empty() && implicitRoute(peers) != nullptr;
}

const PeerConfig* Config::peer(std::string_view name) const {
  auto it = std::find_if(peers.begin(), peers.end(), [&](const PeerConfig& p) { return p.name == name; });
  return it != peers.end() ? &*it : nullptr;
}

const std::string& Config::peerToken(std::string_view id) const {
  const PeerConfig* p = peer(id);
  return p != nullptr && !p->token.empty() ? p->token : token;
}

bool Config::peerTokens() const {
  return std::any_of(peers.begin(), peers.end(), [](const PeerConfig& p) { return !p.token.empty(); });
}

std::string Config::certNameFor(std::string_view id) const {
  if (const PeerConfig* p = peer(id); p != nullptr && !p->cert_name.empty()) return p->cert_name;
  return tls_require_cert_name ? std::string(id) : std::string();
}

std::vector<std::string> exposedTokenFiles(const Config& config) {
  std::vector<std::string> files;
  if (!config.token_file.empty()) files.push_back(config.token_file);
  for (const auto& peer : config.peers) {
    if (!peer.token_file.empty()) files.push_back(peer.token_file);
  }
  std::vector<std::string> warnings;
  for (const auto& file : files) {
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0 || (st.st_mode & 077) == 0) continue;
    const passwd* owner = ::getpwuid(st.st_uid);
    const group* group = ::getgrgid(st.st_gid);
    warnings.push_back("token file " + file + " (mode " + formatMode(st.st_mode & 0777) + ", owner " +
                       (owner != nullptr ? owner->pw_name : std::to_string(st.st_uid)) + ", group " +
                       (group != nullptr ? group->gr_name : std::to_string(st.st_gid)) +
                       ") is open to other users than the daemon's: whoever reads it can link as a peer; "
                       "chown it to the daemon's user and chmod 0600 " +
                       file);
  }
  return warnings;
}

}  // namespace framelink
