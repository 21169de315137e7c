#include "config/config_options.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "config/config_values.h"
#include "framelink/shm_layout.h"
#include "transport/faulty/faulty_transport.h"

namespace framelink::config {

// One row per setting.  Defaults live in Config's member initialisers; the
// help, describe() and the configuration reference read them from there.
const std::vector<Option>& options() {
  static const std::vector<Option> kOptions{
      // clang-format off
      // section  key                  value                                                   help
      {"daemon", "id",                 Text{&Config::id, "NAME", "hostname"},                 "Daemon id, shown to peers and in logs"},
      {"daemon", "socket",             Text{&Config::socket_path, "PATH"},                     "Unix socket applications attach to"},
      {"daemon", "socket_mode",        Mode{&Config::socket_mode},                             "Permissions of the attach socket"},
      {"daemon", "socket_group",       Text{&Config::socket_group, "NAME", "unchanged"},       "Group of the attach socket (unchanged: the group it was created with)"},
      {"daemon", "admin_group",        Text{&Config::admin_group, "NAME", "socket-group"},      "Group whose members may query the daemon (framelink stats, clients, links); socket-group: the attach socket's group"},
      {"daemon", "allowed_uids",       Ids{&Config::allowed_uids},                             "SO_PEERCRED allow-list of uids that may attach (both lists empty: anyone who can open the socket)", {"--allow-uid"}},
      {"daemon", "allowed_gids",       Ids{&Config::allowed_gids},                             "SO_PEERCRED allow-list of gids that may attach", {"--allow-gid"}},
      {"daemon", "log_level",          Choice{&Config::log_level, {"trace", "debug", "info", "warn", "error"}}, "Log level"},
      {"daemon", "ready_file",         Text{&Config::ready_file, "PATH"},                      "Written once serving: pid=, grpc_port=, data_port=, rdma_port=, metrics_port=, socket="},
      {"daemon", "cpu",                Cpu{&Config::cpu},                                      "Pin the data agent to this CPU (-1 = do not pin)"},
      {"daemon", "idle_spin_us",       Number{&Config::idle_spin_us, 0, UINT32_MAX, "US"},     "The data agent spins this long after its last work, yields as long again, then sleeps in epoll (0 = sleep at once)"},
      {"daemon", "client_wait_spin_us", Number{&Config::client_wait_spin_us, 0, FL_WAIT_SPIN_MAX_US, "US"}, "The wait spin of the clients attached here that set none of their own (wait_spin_us, FRAMELINK_WAIT_SPIN_US): a blocking or async wait that finds nothing looks again this long before it sleeps on its doorbell (0 = sleep at once)"},
      {"daemon", "drain_timeout_ms",   Number{&Config::drain_timeout_ms, 0, 600'000, "MS"},    "On SIGTERM (systemctl stop, restart) the frames in progress get this long to end as they end (delivered, or failed for their own reason) before the daemon stops; the rest end FL_ERR_SHUTDOWN (0 = stop at once). New frames are refused meanwhile, or, under systemd, wait in their rings for the next daemon (a hot restart)"},
      {"daemon", "hugepages",          Choice{&Config::hugepages, {"auto", "on", "off"}},      "Data segments on 2 MiB pages: auto (when reserved), on (required), off"},
      {"daemon", "copy_streams",       Streams{&Config::copy_streams},                          "Streams whose frames consumers on this host get as a copy in their own slot, not lent (they see only their frames, and nothing the producer writes after submitting)", {"--copy-stream"}},
      {"daemon", "drop_streams",       Streams{&Config::drop_streams},                          "Streams whose subscribers on this host are skipped for a frame, not waited for, while more than drop_lag frames of the stream wait for them (they get a gap notice); the others block the producer", {"--drop-stream"}},
      {"daemon", "pull_streams",       Streams{&Config::pull_streams},                          "Streams whose frames from peers this daemon pulls: the sender offers each frame and this end reads it (RDMA READ on rdma) into a consumer's slot when one is free; the others are pushed", {"--pull-stream"}},
      {"daemon", "pull_reads_per_link", Number{&Config::pull_reads_per_link, 1, 256, "READS"},  "pull_streams: reads this daemon has in flight on one link at most (the rest of the offers wait)"},
      {"daemon", "drop_lag",           Number{&Config::drop_lag, 1, 1'000'000, "FRAMES"},       "drop_streams: how many frames may wait for a subscriber without a free slot before it is skipped"},
      {"link",   "listen",             Address{&Config::listen},                               "gRPC listener for peer daemons (port 0 = any free port)"},
      {"link",   "data_listen",        Address{&Config::data_listen, false, "listen+1"}, "tcp data listener, advertised to peers in Hello; by default listen's host and the port after its (7701 next to 7700; any free port when listen's is 0), so that a firewall rule can be written in advance"},
      {"link",   "token",              Text{&Config::token, "TOKEN", "none", false, true},     "Shared secret a peer presents, unless its [[peer]] has a token of its own"},
      {"link",   "token_file",         TokenFile{&Config::token_file},                         "Read the shared secret from this file (excludes token); keep it readable by the daemon's user only"},
      {"link",   "allow_unauthenticated", Switch{&Config::allow_unauthenticated},              "Accept peers from the network with neither a token nor TLS (refused otherwise; warns at start)"},
      {"link",   "transports",         Transports{&Config::transports},                        "Data transports in preference order, from rdma, tcp, grpc (loopback: two daemons of one process)"},
      {"link",   "tls_cert_file",      Text{&Config::tls_cert_file, "FILE", "off", true},      "TLS on the gRPC link: this daemon's certificate chain (PEM)", {"--tls-cert"}},
      {"link",   "tls_key_file",       Text{&Config::tls_key_file, "FILE", "-", true},         "The private key of tls_cert_file (PEM)", {"--tls-key"}},
      {"link",   "tls_ca_file",        Text{&Config::tls_ca_file, "FILE", "system", true},     "CA certificates that sign the peers' certificates (PEM); system: the system's CA store; a file that holds none (yet): no peer is trusted", {"--tls-ca"}},
      {"link",   "tls_client_auth",    Switch{&Config::tls_client_auth},                       "Mutual TLS: a dialing peer must present a certificate signed by tls_ca_file"},
      {"link",   "tls_crl_file",       Text{&Config::tls_crl_file, "FILE", "-", true},         "Certificate revocation lists (PEM) of the CAs in tls_ca_file: a peer whose certificate they list is refused when it links; read at start and at each reload", {"--tls-crl"}},
      {"link",   "tls_server_name",    Text{&Config::tls_server_name, "NAME", "peer-host"},    "Name to verify in the peer's certificate; peer-host: the host of its address"},
      {"link",   "tls_require_cert_name", Switch{&Config::tls_require_cert_name},              "Mutual TLS: a dialing peer's certificate (common name or a DNS name) must name the daemon id it claims, or its [[peer]]'s cert_name"},
      {"link",   "ack_timeout_ms",     Number{&Config::ack_timeout_ms, 1, UINT32_MAX, "MS"},   "A frame not acknowledged by the remote consumer, or not released by a local one, in time fails with FL_ERR_TIMEOUT"},
      {"link",   "ack_delay_us",       Number{&Config::ack_delay_us, 0, 1'000'000, "US"},      "A released frame's ACK and its slot's credit wait at most this long to go back to the sender with others (sooner once a quarter of the sender's window waits or the sender is low on credits; 0 = at once)"},
      {"link",   "credit_timeout_ms",  Number{&Config::credit_timeout_ms, 1, UINT32_MAX, "MS"}, "A frame that gets no receive credit (or no link) in time fails"},
      {"link",   "connect_timeout_ms", Number{&Config::connect_timeout_ms, 1, UINT32_MAX, "MS"}, "Dialling a peer gives up after this long"},
      {"link",   "keepalive_ms",       Number{&Config::keepalive_ms, 1, UINT32_MAX, "MS"},     "Keepalive interval of peer links"},
      {"link",   "link_timeout_ms",    Number{&Config::link_timeout_ms, 0, UINT32_MAX, "MS"},  "A link on which nothing (not even a keepalive, nor a pull read's bytes while reads are in flight) arrives from the peer for this long is given up and dialled again; more than the peer's keepalive_ms (0 = never)"},
      {"link",   "reconnect_min_ms",   Number{&Config::reconnect_min_ms, 1, UINT32_MAX, "MS"}, "Reconnect back-off, doubling from this"},
      {"link",   "reconnect_max_ms",   Number{&Config::reconnect_max_ms, 1, UINT32_MAX, "MS"}, "... up to this"},
      {"link",   "grpc_chunk_bytes",   Bytes{&Config::grpc_chunk_bytes},                       "Chunk size of the grpc data transport"},
      {"link",   "tcp_zerocopy_bytes", Bytes{&Config::tcp_zerocopy_bytes, "never"},            "tcp: a frame of at least this many bytes is sent from its slot with MSG_ZEROCOPY (no copy into the socket; the slot is finished when the kernel lets its pages go); a link on which the kernel copies anyway (loopback, veth) stops after its first 64; never: every frame is copied into the socket"},
      {"link",   "rdma_device",        Text{&Config::rdma_device, "NAME", "auto"},             "RDMA device (ibv_devices lists them); auto: the one that owns the listen address"},
      {"link",   "rdma_port",          Number{&Config::rdma_port, 0, 65535, "PORT"},           "rdma_cm listen port, announced to peers (0 = any)"},
      {"link",   "rdma_retry_ms",      Number{&Config::rdma_retry_ms, 1, UINT32_MAX, "MS"},    "How often a link that fell back from rdma tries it again"},
      {"link",   "fault_inject",       FaultSpec{&Config::fault_inject},                       "Tests only: inject link faults, e.g. seed=7,drop=0.01,delay=0.05", {}, false},
      {"limits", "max_slot_size",      Bytes{&Config::max_slot_size},                          "Per client: the largest slot"},
      {"limits", "max_slots",          Count{&Config::max_slots},                              "Per client: the most slots"},
      {"limits", "max_client_bytes",   Bytes{&Config::max_client_bytes},                       "Per client: the most segment bytes"},
      {"limits", "max_uid_bytes",      Bytes{&Config::max_uid_bytes, "auto"},                  "One uid's clients together: the most segment bytes (then FL_ERR_QUOTA); auto: half of max_total_bytes"},
      {"limits", "max_total_bytes",    Bytes{&Config::max_total_bytes, "auto"},                "All clients together: the most segment bytes (then FL_ERR_QUOTA); auto: half of the host's RAM"},
      {"limits", "max_clients_per_uid", Number{&Config::max_clients_per_uid, 1, UINT32_MAX, "N"}, "Clients one uid may have attached at once, and connections it may have waiting to attach (then FL_ERR_QUOTA)"},
      {"limits", "default_slot_count", Count{&Config::default_slot_count},                     "Slots of a client that asks for 0", {"--default-slots"}},
      {"limits", "default_slot_size",  Bytes{&Config::default_slot_size},                      "Slot size of a client that asks for 0"},
      {"metrics", "listen",            Address{&Config::metrics_listen, true},                 "Prometheus text at /metrics, JSON at /stats, a health probe at /healthz", {"--metrics"}},
      {"discovery", "etcd",            Text{&Config::discovery_etcd, "URLS", "off"},          "etcd endpoints (http://HOST:PORT, comma-separated) where the daemons of a fleet find each other: each publishes its id, address and the streams it has readers for under a lease it keeps alive, and links to the others it finds (docs/guide/fleet.md)"},
      {"discovery", "etcd_prefix",     Text{&Config::discovery_prefix, "KEY"},                 "The fleet's keys in etcd: PREFIXdaemons/ID"},
      {"discovery", "advertise",       Text{&Config::discovery_advertise, "HOST:PORT", "link.listen"}, "The address other daemons dial this one at, as published; link.listen: its host (this host's name when it is a wildcard) and the port the listener took"},
      {"discovery", "lease_ttl_s",     Number{&Config::discovery_lease_ttl_s, 2, 3600, "S"},   "This daemon's entry lives this long after its last keep-alive (a crashed host is forgotten within it)"},
      {"discovery", "link_idle_s",     Number{&Config::discovery_link_idle_s, 1, 86'400, "S"},  "A link to a daemon found in the registry is made when a producer here writes a stream it reads, and ended this long after none does"},
      {"discovery", "poll_ms",         Number{&Config::discovery_poll_ms, 100, 600'000, "MS"}, "How often, at the latest, this daemon looks at its own readers and producers and publishes its entry again when they changed (a change is published at once; the other daemons' entries are watched, not read on a timer)"},
      {"discovery", "dns_srv",         Text{&Config::discovery_dns_srv, "NAME", "off"},       "Instead of etcd: the fleet is the SRV records of NAME (_framelink._tcp.DOMAIN: a Kubernetes headless service's, dnsmasq's --srv-host, any DNS server's), each the host and gRPC port of a daemon; this daemon asks each what it is (its id and streams, the token or its certificate proving it) and links where a stream needs it (docs/guide/fleet.md)"},
      {"discovery", "dns_server",      Text{&Config::discovery_dns_server, "IP[:PORT]", "resolv.conf"}, "The DNS server asked for dns_srv's records (port 53 unless given); resolv.conf: the host's resolver"},
      {"discovery", "dns_refresh_s",   Number{&Config::discovery_dns_refresh_s, 1, 3600, "S"},  "How often dns_srv's records are read again (a new host is found within it); while this daemon has producers, each daemon named is asked again then for its readers"},
      {"peer",   "",                   Peers{},                                                "A peer daemon: where this daemon dials it (no address: it only dials in), the streams routed to it (a stream listed on several peers goes to each), and how it proves its id when it dials in: its own token or token_file instead of link.token, the cert_name its certificate must carry"},
      // clang-format on
  };
  return kOptions;
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

bool typo(std::string_view typed, size_t distance) {
  return distance <= std::max<size_t>(2, typed.size() / 3);
}

const Option* findOption(std::string_view section, std::string_view key) {
  for (const auto& option : options()) {
    if (option.section == section && option.key == key && option.in_file) return &option;
  }
  return nullptr;
}

namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// A TOML basic string, "like this".
std::string tomlString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string tomlList(const std::vector<std::string>& items, bool quote) {
  std::string out = "[";
  for (const auto& item : items) {
    if (out.size() > 1) out += ", ";
    out += quote ? tomlString(item) : item;
  }
  return out + "]";
}

template <typename T>
std::vector<std::string> texts(const std::vector<T>& values) {
  std::vector<std::string> out;
  out.reserve(values.size());
  for (const auto& v : values) out.push_back(std::to_string(v));
  return out;
}

std::string printed(const toml::node& node) {
  std::ostringstream out;
  node.visit([&](const auto& n) { out << n; });
  return out.str();
}

Error wrongType(const toml::node& node, const Origin& origin, const char* expected) {
  return invalidSetting(origin.label + ": must be " + expected + ", not " + printed(node));
}

// The TOML value as the text a flag would carry (arrays: one text each).
Result<std::vector<std::string>> tomlTexts(const Value& value, const toml::node& node, const Origin& origin) {
  auto one = [](std::string text) { return std::vector<std::string>{std::move(text)}; };
  auto string = [&](const char* expected) -> Result<std::vector<std::string>> {
    if (const auto* s = node.as_string()) return one(s->get());
    return wrongType(node, origin, expected);
  };
  auto integer = [&](const char* expected) -> Result<std::vector<std::string>> {
    if (const auto* i = node.as_integer()) return one(std::to_string(i->get()));
    return wrongType(node, origin, expected);
  };
  auto array = [&](bool strings, const char* expected) -> Result<std::vector<std::string>> {
    const auto* list = node.as_array();
    if (list == nullptr) return wrongType(node, origin, expected);
    std::vector<std::string> out;
    for (const auto& element : *list) {
      if (strings && element.is_string()) {
        out.push_back(element.as_string()->get());
      } else if (!strings && element.is_integer()) {
        out.push_back(std::to_string(element.as_integer()->get()));
      } else {
        return wrongType(node, origin, expected);
      }
    }
    return out;
  };
  return std::visit(
      Overloaded{
          [&](const Number&) { return integer("an integer"); },
          [&](const Cpu&) { return integer("an integer"); },
          [&](const Bytes&) {
            return node.is_integer() ? integer("") : string("a number of bytes or a string such as \"4MiB\"");
          },
          [&](const Count&) { return node.is_integer() ? integer("") : string("an integer"); },
          [&](const Mode&) -> Result<std::vector<std::string>> {
            if (const auto* i = node.as_integer()) {  // a TOML octal literal, 0o660
              if (i->get() < 0) return wrongType(node, origin, "an octal mode such as 0o660 or \"0660\"");
              std::ostringstream octal;
              octal << std::oct << i->get();
              return one(octal.str());
            }
            return string("an octal string such as \"0660\"");
          },
          [&](const Switch&) -> Result<std::vector<std::string>> {
            if (const auto* b = node.as_boolean()) return one(b->get() ? "true" : "false");
            return wrongType(node, origin, "true or false");
          },
          [&](const Ids&) { return array(false, "an array of integers, e.g. [1000, 1001]"); },
          [&](const Transports&) { return array(true, "an array of strings, e.g. [\"tcp\", \"grpc\"]"); },
          [&](const Streams&) { return array(true, "an array of stream names, e.g. [\"cam0\"]"); },
          [&](const auto&) { return string("a string (in quotes)"); },
      },
      value);
}

}  // namespace

std::string keyName(const Option& option) {
  if (std::holds_alternative<Peers>(option.value)) return "[[peer]]";
  return std::string(option.section) + "." + std::string(option.key);
}

std::string flagName(const Option& option) {
  if (std::holds_alternative<Peers>(option.value)) return "--peer";
  std::string name(option.key);
  for (auto& c : name) c = c == '_' ? '-' : c;
  for (const auto& other : options()) {
    if (&other == &option) break;
    if (other.key == option.key && other.section != option.section) {
      return "--" + std::string(option.section) + "-" + name;
    }
  }
  return "--" + name;
}

std::string placeholder(const Option& option) {
  return std::visit(Overloaded{
                        [](const Text& t) -> std::string { return t.placeholder; },
                        [](const Choice& c) {
                          std::string out;
                          for (auto choice : c.choices) out += (out.empty() ? "" : "|") + std::string(choice);
                          return out;
                        },
                        [](const Address&) -> std::string { return "HOST:PORT"; },
                        [](const Number& n) -> std::string { return n.placeholder; },
                        [](const Bytes& b) -> std::string {
                          return b.zero != nullptr ? "BYTES|" + std::string(b.zero) : "BYTES";
                        },
                        [](const Mode&) -> std::string { return "OCTAL"; },
                        [](const Switch&) -> std::string { return ""; },
                        [](const Transports&) -> std::string { return "LIST"; },
                        [](const Streams&) -> std::string { return "STREAM"; },
                        [](const FaultSpec&) -> std::string { return "SPEC"; },
                        [](const TokenFile&) -> std::string { return "FILE"; },
                        [](const Peers&) -> std::string { return "NAME=HOST:PORT"; },
                        [](const auto&) -> std::string { return "N"; },
                    },
                    option.value);
}

bool isSwitch(const Option& option) { return std::holds_alternative<Switch>(option.value); }

bool isList(const Option& option) {
  return std::holds_alternative<Ids>(option.value) || std::holds_alternative<Transports>(option.value) ||
         std::holds_alternative<Streams>(option.value);
}

namespace {

template <typename Parsed, typename Field>
Status store(Result<Parsed> parsed, Field& field) {
  if (!parsed) return std::move(parsed).error();
  field = static_cast<Field>(*parsed);
  return {};
}

Status setText(const Text& t, const std::string& text, const Origin& origin, Config& c) {
  std::filesystem::path path(text);
  if (t.path && origin.from_file && !text.empty() && path.is_relative()) {
    c.*t.field = (std::filesystem::path(origin.base_dir) / path).string();
  } else {
    c.*t.field = text;
  }
  return {};
}

// The items of a list: in the file one per array element, on the command
// line also comma-separated ("--transports rdma,tcp").
std::vector<std::string> listItems(const std::vector<std::string>& values, const Origin& origin) {
  std::vector<std::string> out;
  for (const auto& value : values) {
    for (auto& item : origin.from_file ? std::vector<std::string>{value} : splitComma(value)) {
      out.push_back(std::move(item));
    }
  }
  return out;
}

Status setBytes(const Bytes& b, const std::string& text, const std::string& label, Config& c) {
  if (b.zero != nullptr && text == b.zero) {
    c.*b.field = 0;
    return {};
  }
  auto size = parseSize(text, label);
  if (!size && b.zero != nullptr) {
    return invalidSetting(size.error().message + "; or \"" + std::string(b.zero) + "\"");
  }
  return store(std::move(size), c.*b.field);
}

Status setIds(const Ids& ids, const std::vector<std::string>& values, const Origin& origin, Config& c) {
  std::vector<uint32_t> out;
  for (const auto& item : listItems(values, origin)) {
    auto id = parseNumber(item, origin.label, 0, UINT32_MAX);
    if (!id) return std::move(id).error();
    out.push_back(static_cast<uint32_t>(*id));
  }
  c.*ids.field = std::move(out);
  return {};
}

Status setTransports(const Transports& t, const std::vector<std::string>& values, const Origin& origin,
                     Config& c) {
  std::vector<std::string> out = listItems(values, origin);
  if (auto st = checkTransports(out, origin.label); !st) return st;
  c.*t.field = std::move(out);
  return {};
}

Status setStreams(const Streams& st, const std::vector<std::string>& values, const Origin& origin,
                  Config& c) {
  std::vector<std::string> out = listItems(values, origin);
  for (const auto& name : out) {
    if (!fl_stream_name_valid(name.c_str(), name.size())) {
      return invalidSetting(origin.label + ": '" + name + "' is no stream name (1 to " +
                            std::to_string(FL_STREAM_NAME_LEN_MAX) + " characters of [A-Za-z0-9._-])");
    }
  }
  c.*st.field = std::move(out);
  return {};
}

Status setTokenFile(const TokenFile& t, const std::string& text, const Origin& origin, Config& c) {
  // The file's token_file is read once the whole file is known (token and
  // token_file exclude each other); a flag's at once.
  std::filesystem::path path(text);
  if (origin.from_file && path.is_relative()) path = std::filesystem::path(origin.base_dir) / path;
  c.*t.field = path.string();
  if (origin.from_file) return {};
  return store(readTokenFile(c.*t.field, origin.label), c.token);
}

}  // namespace

Status setFromText(const Option& option, const std::vector<std::string>& values, const Origin& origin,
                   Config& c) {
  const std::string& text = values.empty() ? std::string() : values.back();
  const std::string& label = origin.label;
  return std::visit(
      Overloaded{
          [&](const Text& t) { return setText(t, text, origin, c); },
          [&](const Choice& ch) -> Status {
            if (auto st = checkChoice(text, label, ch.choices); !st) return st;
            c.*ch.field = text;
            return {};
          },
          [&](const Address& a) -> Status {
            if (!(a.optional && text.empty())) {
              if (auto st = checkHostPort(text, label, true); !st) return st;
            }
            c.*a.field = text;
            return {};
          },
          [&](const Number& n) { return store(parseNumber(text, label, n.min, n.max), c.*n.field); },
          [&](const Bytes& b) { return setBytes(b, text, label, c); },
          [&](const Count& n) { return store(parseSize(text, label, UINT32_MAX), c.*n.field); },
          [&](const Mode& m) { return store(parseMode(text, label), c.*m.field); },
          [&](const Cpu& cpu) { return store(parseCpu(text, label), c.*cpu.field); },
          [&](const Switch& s) { return store(parseBool(text, label), c.*s.field); },
          [&](const Ids& ids) { return setIds(ids, values, origin, c); },
          [&](const Transports& t) { return setTransports(t, values, origin, c); },
          [&](const Streams& st) { return setStreams(st, values, origin, c); },
          [&](const FaultSpec& f) -> Status {
            auto spec = transport::parseFaultSpec(text);
            if (!spec) return invalidSetting(label + ": '" + text + "': " + spec.error().message);
            c.*f.field = text;
            return {};
          },
          [&](const TokenFile& t) { return setTokenFile(t, text, origin, c); },
          [&](const Peers&) -> Status {
            return invalidSetting(label + ": [[peer]] is read by its own parser");
          },
      },
      option.value);
}

Status setFromToml(const Option& option, const toml::node& node, const Origin& origin, Config& config) {
  auto values = tomlTexts(option.value, node, origin);
  if (!values) return std::move(values).error();
  return setFromText(option, *values, origin, config);
}

std::string show(const Option& option, const Config& c) {
  return std::visit(
      Overloaded{
          [&](const Text& t) -> std::string {
            const std::string& v = c.*t.field;
            if (t.secret) return v.empty() ? t.unset : "<redacted>";
            return v.empty() ? t.unset : v;
          },
          [&](const Choice& ch) { return c.*ch.field; },
          [&](const Address& a) { return (c.*a.field).empty() ? std::string(a.unset) : c.*a.field; },
          [&](const Number& n) { return std::to_string(c.*n.field); },
          [&](const Bytes& b) {
            return b.zero != nullptr && c.*b.field == 0 ? std::string(b.zero) : formatSize(c.*b.field);
          },
          [&](const Count& n) { return std::to_string(c.*n.field); },
          [&](const Mode& m) { return formatMode(c.*m.field); },
          [&](const Cpu& cpu) { return std::to_string(c.*cpu.field); },
          [&](const Switch& s) -> std::string { return c.*s.field ? "true" : "false"; },
          [&](const Ids& ids) { return (c.*ids.field).empty() ? "anyone" : join(texts(c.*ids.field)); },
          [&](const Transports& t) { return join(c.*t.field); },
          [&](const Streams& st) { return (c.*st.field).empty() ? std::string("none") : join(c.*st.field); },
          [&](const FaultSpec& f) { return (c.*f.field).empty() ? "off" : c.*f.field; },
          [&](const TokenFile& t) { return (c.*t.field).empty() ? "-" : c.*t.field; },
          [&](const Peers&) {
            std::string out;
            for (const auto& p : c.peers) {
              if (!out.empty()) out += ' ';
              out += p.name + "=" + (p.address.empty() ? "dials-in" : p.address);
              if (!p.streams.empty()) out += "[" + join(p.streams) + "]";
              std::vector<std::string> proof;
              if (!p.token.empty()) proof.emplace_back("token=<redacted>");
              if (!p.cert_name.empty()) proof.push_back("cert_name=" + p.cert_name);
              if (!proof.empty()) out += "(" + join(proof) + ")";
            }
            return "{" + out + "}";
          },
      },
      option.value);
}

std::string tomlValue(const Option& option, const Config& c) {
  auto quotedOrEmpty = [](const std::string& v) { return v.empty() ? std::string() : tomlString(v); };
  return std::visit(Overloaded{
                        [&](const Text& t) { return quotedOrEmpty(c.*t.field); },
                        [&](const Choice& ch) { return tomlString(c.*ch.field); },
                        [&](const Address& a) { return quotedOrEmpty(c.*a.field); },
                        [&](const Number& n) { return std::to_string(c.*n.field); },
                        [&](const Bytes& b) {
                          if (b.zero != nullptr && c.*b.field == 0) return tomlString(b.zero);
                          const std::string text = formatSize(c.*b.field);
                          return text == std::to_string(c.*b.field) ? text : tomlString(text);
                        },
                        [&](const Count& n) { return std::to_string(c.*n.field); },
                        [&](const Mode& m) { return tomlString(formatMode(c.*m.field)); },
                        [&](const Cpu& cpu) { return std::to_string(c.*cpu.field); },
                        [&](const Switch& s) -> std::string { return c.*s.field ? "true" : "false"; },
                        [&](const Ids& ids) {
                          return (c.*ids.field).empty() ? std::string()
                                                        : tomlList(texts(c.*ids.field), false);
                        },
                        [&](const Transports& t) { return tomlList(c.*t.field, true); },
                        [&](const Streams& st) {
                          return (c.*st.field).empty() ? std::string() : tomlList(c.*st.field, true);
                        },
                        [&](const FaultSpec& f) { return quotedOrEmpty(c.*f.field); },
                        [&](const TokenFile& t) { return quotedOrEmpty(c.*t.field); },
                        [&](const Peers&) { return std::string(); },
                    },
                    option.value);
}

std::string defaultText(const Option& option) {
  static const Config kDefaults;
  std::string text = tomlValue(option, kDefaults);
  if (!text.empty() || std::holds_alternative<Peers>(option.value)) return text;
  return show(option, kDefaults);  // the meaning of "unset": "host name", "off", "anyone", ...
}

}  // namespace framelink::config
