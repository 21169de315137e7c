#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "config.h"
#include "config_options.h"
#include "framelink/shm_layout.h"

namespace fl = framelink;
namespace cfg = framelink::config;

namespace {

// A private directory for the files one test writes; removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "fl_config_XXXXXX").string();
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
    REQUIRE(!path_.empty());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path(const std::string& name) const { return path_ + "/" + name; }

  std::string write(const std::string& name, const std::string& text) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    return file;
  }

 private:
  std::string path_;
};

fl::Result<fl::Config> parseAsIs(std::vector<std::string> args) {
  args.insert(args.begin(), "framelinkd");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return fl::parseConfig(static_cast<int>(argv.size()), argv.data());
}

// Most cases are about other settings, with the default listen address
// (0.0.0.0) and no token: they accept that explicitly.  The rule itself is
// tested with parseAsIs.
fl::Result<fl::Config> parse(std::vector<std::string> args) {
  args.push_back("--allow-unauthenticated");
  return parseAsIs(std::move(args));
}

// Parsing must fail, with a message that contains every fragment given.
void requireError(const std::vector<std::string>& args, const std::vector<std::string>& fragments) {
  auto result = parse(args);
  INFO("args: " << [&] {
    std::string s;
    for (const auto& a : args) s += a + " ";
    return s;
  }());
  REQUIRE_FALSE(result.ok());
  CHECK(result.error().code == FL_EINVAL);
  for (const auto& fragment : fragments) {
    INFO("message: " << result.error().message);
    CHECK(result.error().message.find(fragment) != std::string::npos);
  }
}

const char* kFullToml = R"(
[daemon]
id = "hosta"
socket = "/tmp/fl-a.sock"
socket_mode = "0640"
socket_group = "video"
allowed_uids = [1000, 1001]
allowed_gids = [44]
log_level = "debug"
ready_file = "/tmp/ready"
cpu = 1
idle_spin_us = 7
hugepages = "off"

[link]
listen = "127.0.0.1:7701"
data_listen = "127.0.0.1:0"
token = "s3cret"
transports = ["grpc", "tcp"]
ack_timeout_ms = 1000
credit_timeout_ms = 2000
connect_timeout_ms = 300
keepalive_ms = 250
reconnect_min_ms = 10
reconnect_max_ms = 900
grpc_chunk_bytes = "1MiB"

[limits]
max_slot_size = "16MiB"
max_slots = 64
max_client_bytes = 268435456
default_slot_count = 4
default_slot_size = 1048576

[metrics]
listen = "127.0.0.1:9100"

[[peer]]
name = "hostb"
address = "127.0.0.1:7702"
streams = ["cam0", "cam1"]

[[peer]]
name = "hostc"
address = "[::1]:7703"
streams = ["*"]
)";

}  // namespace

TEST_CASE("defaults without any flag", "[config]") {
  auto c = parse({});
  REQUIRE(c.ok());
  CHECK_FALSE(c->exit_now);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  CHECK(c->id == host);
  CHECK(c->socket_path == "/run/framelink/framelinkd.sock");
  CHECK(c->socket_mode == 0660);
  CHECK(c->listen == "0.0.0.0:7700");
  CHECK(c->data_listen == "0.0.0.0:0");
  CHECK(c->transports == std::vector<std::string>{"tcp", "grpc"});
  CHECK(c->hugepages == "auto");
  CHECK(c->log_level == "info");
  CHECK(c->max_slot_size == 64 * fl::kMiB);
  CHECK(c->max_client_bytes == fl::kGiB);
  CHECK(c->peers.empty());
  CHECK(c->routeFor("cam0").empty());
}

TEST_CASE("a TOML file sets every key", "[config]") {
  TempDir dir;
  auto c = parse({"--config", dir.write("a.toml", kFullToml)});
  REQUIRE(c.ok());
  CHECK(c->id == "hosta");
  CHECK(c->socket_path == "/tmp/fl-a.sock");
  CHECK(c->socket_mode == 0640);
  CHECK(c->socket_group == "video");
  CHECK(c->allowed_uids == std::vector<uint32_t>{1000, 1001});
  CHECK(c->allowed_gids == std::vector<uint32_t>{44});
  CHECK(c->log_level == "debug");
  CHECK(c->ready_file == "/tmp/ready");
  CHECK(c->cpu == 1);
  CHECK(c->idle_spin_us == 7);
  CHECK(c->hugepages == "off");
  CHECK(c->listen == "127.0.0.1:7701");
  CHECK(c->data_listen == "127.0.0.1:0");
  CHECK(c->token == "s3cret");
  CHECK(c->transports == std::vector<std::string>{"grpc", "tcp"});
  CHECK(c->ack_timeout_ms == 1000);
  CHECK(c->credit_timeout_ms == 2000);
  CHECK(c->connect_timeout_ms == 300);
  CHECK(c->keepalive_ms == 250);
  CHECK(c->reconnect_min_ms == 10);
  CHECK(c->reconnect_max_ms == 900);
  CHECK(c->grpc_chunk_bytes == fl::kMiB);
  CHECK(c->max_slot_size == 16 * fl::kMiB);
  CHECK(c->max_slots == 64);
  CHECK(c->max_client_bytes == 256 * fl::kMiB);
  CHECK(c->default_slot_count == 4);
  CHECK(c->default_slot_size == fl::kMiB);
  CHECK(c->metrics_listen == "127.0.0.1:9100");
  REQUIRE(c->peers.size() == 2);
  CHECK(c->peers[0].name == "hostb");
  CHECK(c->peers[0].address == "127.0.0.1:7702");
  CHECK(c->peers[0].streams == std::vector<std::string>{"cam0", "cam1"});
  CHECK(c->peers[1].address == "[::1]:7703");
}

TEST_CASE("a TOML octal literal is accepted as socket_mode", "[config]") {
  TempDir dir;
  auto c = parse({"--config", dir.write("a.toml", "[daemon]\nsocket_mode = 0o600\n")});
  REQUIRE(c.ok());
  CHECK(c->socket_mode == 0600);
}

TEST_CASE("admin_group: the TOML key and the flag of the same name; empty by default", "[config]") {
  auto none = parse({});
  REQUIRE(none.ok());
  CHECK(none->admin_group.empty());  // the socket's group, resolved when the socket exists
  TempDir dir;
  const auto file = dir.write("a.toml", "[daemon]\nsocket_group = \"video\"\nadmin_group = \"wheel\"\n");
  auto from_file = parse({"--config", file});
  REQUIRE(from_file.ok());
  CHECK(from_file->admin_group == "wheel");
  CHECK(from_file->socket_group == "video");
  auto overridden = parse({"--config", file, "--admin-group", "operators"});
  REQUIRE(overridden.ok());
  CHECK(overridden->admin_group == "operators");
  CHECK(fl::describe(*overridden).find("admin_group=operators") != std::string::npos);
  auto wrong_type = parse({"--config", dir.write("b.toml", "[daemon]\nadmin_group = 4\n")});
  REQUIRE_FALSE(wrong_type.ok());
  CHECK(wrong_type.error().message.find("admin_group") != std::string::npos);
}

TEST_CASE("flags override the file", "[config]") {
  TempDir dir;
  const auto file = dir.write("a.toml", kFullToml);
  auto c = parse({"--config",
                  file,
                  "--id",
                  "other",
                  "--socket-mode",
                  "0600",
                  "--listen",
                  "0.0.0.0:0",
                  "--token",
                  "flagtoken",
                  "--transports",
                  "tcp",
                  "--hugepages",
                  "auto",
                  "--log-level",
                  "warn",
                  "--allow-uid",
                  "7",
                  "--max-slot-size",
                  "8M",
                  "--max-slots",
                  "32",
                  "--cpu",
                  "-1",
                  "--idle-spin-us",
                  "0",
                  "--ack-timeout-ms",
                  "5",
                  "--peer",
                  "hostb=10.0.0.9:7700",
                  "--peer",
                  "hostd=10.0.0.4:7700",
                  "--route",
                  "cam9=hostd",
                  "--metrics",
                  "127.0.0.1:0",
                  "--ready-file",
                  "/tmp/r2"});
  REQUIRE(c.ok());
  CHECK(c->id == "other");
  CHECK(c->socket_mode == 0600);
  CHECK(c->listen == "0.0.0.0:0");
  CHECK(c->token == "flagtoken");
  CHECK(c->transports == std::vector<std::string>{"tcp"});
  CHECK(c->hugepages == "auto");
  CHECK(c->log_level == "warn");
  CHECK(c->allowed_uids == std::vector<uint32_t>{7});   // replaced, not appended
  CHECK(c->allowed_gids == std::vector<uint32_t>{44});  // not given: from the file
  CHECK(c->max_slot_size == 8 * fl::kMiB);
  CHECK(c->max_slots == 32);
  CHECK(c->cpu == -1);
  CHECK(c->idle_spin_us == 0);
  CHECK(c->ack_timeout_ms == 5);
  CHECK(c->credit_timeout_ms == 2000);  // not given: from the file
  CHECK(c->metrics_listen == "127.0.0.1:0");
  CHECK(c->ready_file == "/tmp/r2");
  REQUIRE(c->peers.size() == 3);
  CHECK(c->peers[0].address == "10.0.0.9:7700");  // same name: address replaced, routes kept
  CHECK(c->peers[0].streams == std::vector<std::string>{"cam0", "cam1"});
  CHECK(c->peers[2].name == "hostd");
  CHECK(c->routeFor("cam9") == "hostd");
}

TEST_CASE("--token-file reads the secret without its trailing newline", "[config]") {
  TempDir dir;
  auto c = parse({"--token-file", dir.write("token", "abc123\n")});
  REQUIRE(c.ok());
  CHECK(c->token == "abc123");

  auto crlf = parse({"--token-file", dir.write("token2", "xyz\r\n")});
  REQUIRE(crlf.ok());
  CHECK(crlf->token == "xyz");

  requireError({"--token-file", dir.path("missing")}, {"--token-file", "cannot read"});
  requireError({"--token-file", dir.write("empty", "\n")}, {"--token-file", "is empty"});
  requireError({"--token", "a", "--token-file", dir.path("token")}, {"--token"});
}

TEST_CASE("link.token_file is read relative to the config file", "[config]") {
  TempDir dir;
  dir.write("peer.token", "tok\n");
  auto c = parse({"--config", dir.write("a.toml", "[link]\ntoken_file = \"peer.token\"\n")});
  REQUIRE(c.ok());
  CHECK(c->token == "tok");
  requireError({"--config", dir.write("b.toml", "[link]\ntoken = \"x\"\ntoken_file = \"peer.token\"\n")},
               {"token_file", "keep one"});
}

TEST_CASE("TLS settings: files are read, relative to the config file, and go together", "[config][tls]") {
  TempDir dir;
  const std::string cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  const std::string key = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";
  dir.write("d.pem", cert);
  dir.write("d.key", key);
  dir.write("ca.pem", cert);
  dir.write("not.pem", "hello\n");

  auto off = parse({});
  REQUIRE(off.ok());
  CHECK_FALSE(off->tlsEnabled());
  CHECK(fl::describe(*off).find(" tls_cert_file=off ") != std::string::npos);

  auto c = parse({"--config", dir.write("a.toml",
                                        "[link]\ntls_cert_file = \"d.pem\"\ntls_key_file = \"d.key\"\n"
                                        "tls_ca_file = \"ca.pem\"\ntls_client_auth = true\n"
                                        "tls_server_name = \"hostb\"\n")});
  INFO((c.ok() ? std::string() : c.error().message));
  REQUIRE(c.ok());
  CHECK(c->tlsEnabled());
  CHECK(c->tls_cert_file == dir.path("d.pem"));
  CHECK(c->tls_cert_pem == cert);
  CHECK(c->tls_key_pem == key);
  CHECK(c->tls_ca_pem == cert);
  CHECK(c->tls_client_auth);
  CHECK(c->tls_server_name == "hostb");
  const std::string text = fl::describe(*c);
  CHECK(text.find("tls_cert_file=" + dir.path("d.pem")) != std::string::npos);
  CHECK(text.find("tls_client_auth=true") != std::string::npos);
  CHECK(text.find("MIIE") == std::string::npos);  // never the key

  auto flags = parse({"--tls-cert", dir.path("d.pem"), "--tls-key", dir.path("d.key")});
  REQUIRE(flags.ok());
  CHECK(flags->tlsEnabled());
  CHECK_FALSE(flags->tls_client_auth);
  CHECK(flags->tls_ca_pem.empty());  // the system's CA store
  CHECK(fl::describe(*flags).find("tls_ca_file=system") != std::string::npos);

  requireError({"--tls-cert", dir.path("d.pem")}, {"--tls-key", "go together"});
  requireError({"--tls-key", dir.path("d.key")}, {"--tls-cert", "go together"});
  requireError({"--tls-ca", dir.path("ca.pem")}, {"without a certificate"});
  requireError({"--tls-client-auth"}, {"without a certificate"});
  requireError({"--tls-cert", dir.path("d.pem"), "--tls-key", dir.path("d.key"), "--tls-client-auth"},
               {"--tls-ca", "CA that signs"});
  requireError({"--tls-cert", dir.path("missing.pem"), "--tls-key", dir.path("d.key")},
               {"link.tls_cert_file", "cannot read", "missing.pem"});
  requireError({"--tls-cert", dir.path("d.pem"), "--tls-key", dir.path("not.pem")},
               {"link.tls_key_file", "not PEM", "private key"});
  requireError({"--config", dir.write("b.toml", "[link]\ntls_client_auth = \"yes\"\n")},
               {"link.tls_client_auth", "true or false"});
}

TEST_CASE("--help and --version ask the caller to print and exit 0", "[config]") {
  auto help = parse({"--help"});
  REQUIRE(help.ok());
  CHECK(help->exit_now);
  CHECK(help->exit_message.find("--peer") != std::string::npos);
  CHECK(help->exit_message.find("--token-file") != std::string::npos);

  auto version = parse({"--version"});
  REQUIRE(version.ok());
  CHECK(version->exit_now);
  CHECK(version->exit_message.rfind("framelinkd 0.", 0) == 0);
}

TEST_CASE("unknown keys and tables in the file are errors naming the key and the file", "[config]") {
  TempDir dir;
  const auto key = dir.write("key.toml", "[daemon]\nid = \"a\"\nsokcet = \"/tmp/x\"\n");
  requireError({"--config", key}, {"daemon.sokcet", key, "line 3"});
  const auto table = dir.write("table.toml", "[deamon]\nid = \"a\"\n");
  requireError({"--config", table}, {"deamon", table});
  const auto peer = dir.write("peer.toml", "[[peer]]\nname = \"b\"\naddress = \"h:1\"\nstream = [\"x\"]\n");
  requireError({"--config", peer}, {"peer[0].stream", peer});
  const auto top = dir.write("top.toml", "id = \"a\"\n");
  requireError({"--config", top}, {"'id'", top});
}

TEST_CASE("file problems are reported with the file name", "[config]") {
  TempDir dir;
  requireError({"--config", dir.path("nope.toml")}, {"nope.toml"});
  const auto syntax = dir.write("bad.toml", "[daemon\nid = 1\n");
  requireError({"--config", syntax}, {syntax + ":1"});
  requireError({"--config", dir.write("type.toml", "[daemon]\ncpu = \"one\"\n")}, {"daemon.cpu", "integer"});
  requireError({"--config", dir.write("type2.toml", "[link]\ntransports = \"tcp\"\n")},
               {"link.transports", "array"});
  requireError({"--config", dir.write("neg.toml", "[limits]\nmax_slots = -1\n")}, {"limits.max_slots"});
  requireError({"--config", dir.write("peer.toml", "[[peer]]\nname = \"b\"\n")}, {"address"});
  requireError({"--config", dir.write("peert.toml", "[peer]\nname = \"b\"\n")}, {"[[peer]]"});
}

TEST_CASE("validation errors say what to fix", "[config]") {
  SECTION("socket mode") {
    requireError({"--socket-mode", "0980"}, {"--socket-mode", "octal"});
    requireError({"--socket-mode", "rw"}, {"--socket-mode", "octal"});
    requireError({"--socket-mode", "1777"}, {"--socket-mode", "0777"});
    TempDir dir;
    requireError({"--config", dir.write("m.toml", "[daemon]\nsocket_mode = \"999\"\n")},
                 {"daemon.socket_mode", "octal"});
  }
  SECTION("transports") {
    requireError({"--transports", "tcp,udp"}, {"--transports", "'udp'", "tcp, grpc, rdma"});
    requireError({"--transports", "tcp,tcp"}, {"twice"});
    requireError({"--transports", ""}, {"--transports"});
    TempDir dir;
    requireError({"--config", dir.write("t.toml", "[link]\ntransports = [\"ib\"]\n")},
                 {"link.transports", "'ib'"});
    CHECK(parse({"--transports", "rdma,tcp,grpc"}).ok());
  }
  SECTION("fault injection (tests only)") {
    requireError({"--fault-inject", "drop=1.5"}, {"--fault-inject", "drop", "probabilit"});
    requireError({"--fault-inject", "lose=0.1"}, {"--fault-inject", "lose", "unknown key"});
    auto ok = parse({"--fault-inject", "seed=3,drop=0.01"});
    REQUIRE(ok.ok());
    CHECK(ok.value().fault_inject == "seed=3,drop=0.01");
    CHECK(fl::describe(ok.value()).find("fault_inject=seed=3,drop=0.01") != std::string::npos);
    CHECK(parse({}).value().fault_inject.empty());
  }
  SECTION("peers") {
    requireError({"--peer", "hostb"}, {"--peer", "NAME=HOST:PORT"});
    requireError({"--peer", "hostb=nohostport"}, {"--peer hostb", "HOST:PORT"});
    requireError({"--peer", "hostb=h:0"}, {"port 0"});
    requireError({"--peer", "hostb=h:99999"}, {"port"});
    requireError({"--peer", "bad name=h:1"}, {"name"});
    requireError({"--peer", "hostb=::1:7700"}, {"brackets"});
  }
  SECTION("routes") {
    requireError({"--peer", "a=h:1", "--route", "cam0=b"},
                 {"--route cam0=b", "no peer named 'b'", "--peer b="});
    requireError({"--route", "cam0"}, {"--route", "STREAM=PEER"});
    requireError({"--peer", "a=h:1", "--route", "bad/stream=a"}, {"stream name"});
    requireError({"--peer", "a=h:1", "--peer", "b=h:2", "--route", "cam0=a", "--route", "cam0=b"},
                 {"'cam0'", "both"});
  }
  SECTION("hugepages and log level") {
    requireError({"--hugepages", "yes"}, {"--hugepages", "auto, on, off"});
    requireError({"--log-level", "verbose"}, {"--log-level", "trace, debug, info, warn, error"});
    TempDir dir;
    requireError({"--config", dir.write("h.toml", "[daemon]\nhugepages = \"always\"\n")},
                 {"daemon.hugepages"});
    requireError({"--config", dir.write("l.toml", "[daemon]\nlog_level = \"loud\"\n")}, {"daemon.log_level"});
  }
  SECTION("sizes and counts of 0") {
    requireError({"--max-slot-size", "0"}, {"--max-slot-size", "greater than 0"});
    requireError({"--max-slots", "0"}, {"--max-slots", "greater than 0"});
    requireError({"--max-client-bytes", "0"}, {"--max-client-bytes", "greater than 0"});
    requireError({"--ack-timeout-ms", "0"}, {"--ack-timeout-ms"});
    requireError({"--max-slot-size", "12XB"}, {"--max-slot-size", "not a size"});
    TempDir dir;
    requireError({"--config", dir.write("z.toml", "[limits]\ndefault_slot_size = 0\n")},
                 {"limits.default_slot_size", "greater than 0"});
    requireError({"--config", dir.write("z2.toml", "[limits]\ndefault_slot_count = 0\n")},
                 {"limits.default_slot_count"});
    requireError({"--config", dir.write("z3.toml", "[link]\ngrpc_chunk_bytes = 0\n")},
                 {"link.grpc_chunk_bytes"});
    requireError({"--config", dir.write("z4.toml", "[link]\nkeepalive_ms = 0\n")}, {"link.keepalive_ms"});
  }
  SECTION("settings that contradict each other") {
    requireError({"--max-slot-size", "1M", "--default-slot-size", "4M"},
                 {"default_slot_size", "max_slot_size"});
    requireError({"--max-slots", "4", "--default-slots", "8"}, {"default_slot_count", "max_slots"});
    requireError({"--max-client-bytes", "1M"}, {"max_client_bytes"});
    TempDir dir;
    requireError({"--config", dir.write("r.toml", "[link]\nreconnect_min_ms = 10000\n")},
                 {"reconnect_min_ms", "reconnect_max_ms"});
  }
  SECTION("addresses, cpu, socket path, unknown flags") {
    requireError({"--listen", "7700"}, {"--listen", "HOST:PORT"});
    requireError({"--metrics", "localhost"}, {"--metrics"});
    requireError({"--cpu", "-2"}, {"--cpu"});
    requireError({"--idle-spin-us", "-5"}, {"--idle-spin-us"});
    requireError({"--socket", "/tmp/" + std::string(200, 'x')}, {"at most 107"});
    requireError({"--no-such-flag"}, {"--help"});
    requireError({"--id", "a", "--id", "b"}, {"--id"});
  }
}

TEST_CASE("lowering a limit on the command line lowers the built-in default with it", "[config]") {
  auto parsed = parse({"--max-slot-size", "1M", "--max-slots", "4"});
  REQUIRE(parsed.ok());
  CHECK(parsed.value().default_slot_size == (1u << 20));
  CHECK(parsed.value().default_slot_count == 4);
  auto explicit_defaults = parse({"--default-slot-size", "64K", "--default-slots", "2"});
  REQUIRE(explicit_defaults.ok());
  CHECK(explicit_defaults.value().default_slot_size == 64 * 1024);
  CHECK(explicit_defaults.value().default_slot_count == 2);
}

TEST_CASE("routing", "[config][routing]") {
  fl::Config c;
  SECTION("no peer: no route") { CHECK(c.routeFor("cam0").empty()); }
  SECTION("exactly one peer without routes takes every stream") {
    c.peers = {{"b", "h:1", {}}};
    CHECK(c.routeFor("cam0") == "b");
    CHECK(c.routeFor("anything") == "b");
  }
  SECTION("two peers without routes: ambiguous, no route") {
    c.peers = {{"b", "h:1", {}}, {"c", "h:2", {}}};
    CHECK(c.routeFor("cam0").empty());
  }
  SECTION("an exact name wins over '*', whatever the order") {
    c.peers = {{"star", "h:1", {"*"}}, {"exact", "h:2", {"cam0"}}};
    CHECK(c.routeFor("cam0") == "exact");
    CHECK(c.routeFor("cam1") == "star");
  }
  SECTION("listed streams only, no default: other streams have no route") {
    c.peers = {{"b", "h:1", {"cam0"}}};
    CHECK(c.routeFor("cam0") == "b");
    CHECK(c.routeFor("cam1").empty());
  }
  SECTION("the one peer without a streams list is the default for the rest") {
    c.peers = {{"b", "h:1", {"cam0"}}, {"d", "h:2", {}}};
    CHECK(c.routeFor("cam0") == "b");
    CHECK(c.routeFor("cam1") == "d");
  }
  SECTION("'*' wins over the peer without a list") {
    c.peers = {{"d", "h:2", {}}, {"star", "h:1", {"*"}}};
    CHECK(c.routeFor("cam1") == "star");
  }
  SECTION("routes from flags") {
    auto parsed = parse({"--peer", "b=h:1", "--peer", "c=h:2", "--route", "cam0=c", "--route", "*=b"});
    REQUIRE(parsed.ok());
    CHECK(parsed->routeFor("cam0") == "c");
    CHECK(parsed->routeFor("cam7") == "b");
  }
}

TEST_CASE("describe redacts the token", "[config]") {
  auto c = parse({"--token", "hunter2", "--peer", "b=h:1", "--route", "cam0=b", "--socket-mode", "0600"});
  REQUIRE(c.ok());
  const std::string line = fl::describe(*c);
  CHECK(line.find("hunter2") == std::string::npos);
  CHECK(line.find("token=<redacted>") != std::string::npos);
  CHECK(line.find("socket_mode=0600") != std::string::npos);
  CHECK(line.find("b=h:1[cam0]") != std::string::npos);
  auto none = parse({});
  REQUIRE(none.ok());
  CHECK(fl::describe(*none).find("token=none") != std::string::npos);
}

#ifdef FRAMELINK_SOURCE_DIR
// The shipped example must stay loadable as-is and, with every setting
// uncommented, must name only keys the parser knows.
TEST_CASE("packaging/framelinkd.toml documents valid keys", "[config]") {
  const std::string example = std::string(FRAMELINK_SOURCE_DIR) + "/packaging/framelinkd.toml";
  TempDir dir;
  {
    // As installed: the token file the package generates, and nothing else
    // (in particular not allow_unauthenticated) -- a secure default.
    std::ifstream original(example);
    REQUIRE(original);
    std::string as_installed((std::istreambuf_iterator<char>(original)), std::istreambuf_iterator<char>());
    const std::string packaged_token = "/etc/framelink/peer.token";
    const auto at = as_installed.find("token_file = \"" + packaged_token + "\"");
    REQUIRE(at != std::string::npos);
    REQUIRE((at == 0 || as_installed[at - 1] == '\n'));  // active, not commented out
    const std::string token = dir.write("peer.token", "generated-secret\n");
    as_installed.replace(as_installed.find(packaged_token, at), packaged_token.size(), token);
    auto installed = parseAsIs({"--config", dir.write("installed.toml", as_installed)});
    REQUIRE(installed.ok());
    CHECK(installed->token == "generated-secret");
    CHECK_FALSE(installed->allow_unauthenticated);
  }

  std::ifstream in(example);
  REQUIRE(in);
  std::string text, line;
  int uncommented = 0;
  while (std::getline(in, line)) {
    // "#key = value" and "#[[peer]]" are settings; "# words" is prose.
    if (line.size() > 1 && line[0] == '#' && line[1] != ' ') {
      line.erase(0, 1);
      ++uncommented;
    }
    text += line + "\n";
  }
  CHECK(uncommented >= 30);
  const auto file = dir.write("all.toml", text);
  // Both token and token_file are shown; the parser rightly refuses both at once.
  auto both = parse({"--config", file});
  REQUIRE_FALSE(both.ok());
  CHECK(both.error().message.find("keep one") != std::string::npos);
  std::string one_token;
  std::istringstream lines(text);
  while (std::getline(lines, line)) {
    if (line.rfind("token_file", 0) == 0) continue;
    one_token += line + "\n";
  }
  // The TLS files named there do not exist here: every tls_ key is known
  // (the error is about reading the file), then parse without them.
  auto tls = parse({"--config", dir.write("tls.toml", one_token)});
  REQUIRE_FALSE(tls.ok());
  CHECK(tls.error().message.find("link.tls_cert_file: cannot read '/etc/framelink/tls/framelinkd.pem'") !=
        std::string::npos);
  std::string no_tls;
  std::istringstream again(one_token);
  int tls_keys = 0;
  while (std::getline(again, line)) {
    if (line.rfind("tls_", 0) == 0) {
      ++tls_keys;
      continue;
    }
    no_tls += line + "\n";
  }
  CHECK(tls_keys == 5);
  auto c = parse({"--config", dir.write("one.toml", no_tls)});
  INFO((c.ok() ? std::string() : c.error().message));
  REQUIRE(c.ok());
  CHECK(c->routeFor("cam0") == "host-b");
  CHECK(c->socket_group == "framelink");
}
#endif

TEST_CASE("peers from the network without a token or TLS are refused unless allowed", "[config][security]") {
  auto bare = parseAsIs({});
  REQUIRE_FALSE(bare.ok());
  CHECK(bare.error().code == FL_EINVAL);
  for (const char* fragment :
       {"0.0.0.0:7700", "neither a token nor TLS", "token_file", "allow_unauthenticated"}) {
    INFO(bare.error().message);
    CHECK(bare.error().message.find(fragment) != std::string::npos);
  }
  // A data listener on the network is just as open.
  CHECK_FALSE(parseAsIs({"--listen", "127.0.0.1:7700"}).ok());
  // Any one of these makes it acceptable.
  CHECK(parseAsIs({"--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"}).ok());
  CHECK(parseAsIs({"--listen", "[::1]:0", "--data-listen", "localhost:0"}).ok());
  CHECK(parseAsIs({"--token", "s3cret"}).ok());
  auto allowed = parseAsIs({"--allow-unauthenticated"});
  REQUIRE(allowed.ok());
  CHECK(allowed->allow_unauthenticated);
  CHECK(allowed->unauthenticatedFromNetwork());
  CHECK(fl::describe(allowed.value()).find("allow_unauthenticated=true") != std::string::npos);
  TempDir dir;
  const auto file = dir.write("open.toml", "[link]\nallow_unauthenticated = true\n");
  CHECK(parseAsIs({"--config", file}).ok());
  const auto bad = dir.write("bad.toml", "[link]\nallow_unauthenticated = \"yes\"\n");
  auto refused = parseAsIs({"--config", bad});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message.find("true or false") != std::string::npos);
}

TEST_CASE("limits.max_clients_per_uid: default, file, flag over file, and its errors", "[config]") {
  auto defaults = parse({});
  REQUIRE(defaults.ok());
  CHECK(defaults.value().max_clients_per_uid == 256);
  CHECK(fl::describe(defaults.value()).find("max_clients_per_uid=256") != std::string::npos);
  TempDir dir;
  const auto file = dir.write("clients.toml", "[limits]\nmax_clients_per_uid = 12\n");
  auto from_file = parse({"--config", file});
  REQUIRE(from_file.ok());
  CHECK(from_file.value().max_clients_per_uid == 12);
  auto flag_wins = parse({"--config", file, "--max-clients-per-uid", "3"});
  REQUIRE(flag_wins.ok());
  CHECK(flag_wins.value().max_clients_per_uid == 3);
  requireError({"--max-clients-per-uid", "0"}, {"--max-clients-per-uid", "greater than 0"});
  requireError({"--max-clients-per-uid", "many"}, {"--max-clients-per-uid", "not a non-negative"});
  requireError({"--config", dir.write("zero.toml", "[limits]\nmax_clients_per_uid = 0\n")},
               {"limits.max_clients_per_uid", "greater than 0"});
  requireError({"--config", dir.write("neg.toml", "[limits]\nmax_clients_per_uid = -2\n")},
               {"limits.max_clients_per_uid", "negative"});
  requireError({"--config", dir.write("str.toml", "[limits]\nmax_clients_per_uid = \"4\"\n")},
               {"limits.max_clients_per_uid", "integer"});
}

// ---- the option table: every row reaches the file, the flags, describe(), the docs ----

namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

const std::string kPem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

// A non-default value for one option: as a TOML literal, as flag arguments
// (one per repetition), as describe() prints it, and a check on Config.
struct Sample {
  std::string toml;
  std::vector<std::string> flag;
  std::string shown;
  std::function<bool(const fl::Config&)> holds;
};

// 4194304 -> "4MiB": what describe() should print for a size.
std::string humanBytes(uint64_t n) {
  if (n % fl::kGiB == 0) return std::to_string(n / fl::kGiB) + "GiB";
  if (n % fl::kMiB == 0) return std::to_string(n / fl::kMiB) + "MiB";
  return std::to_string(n);
}

std::string quote(const std::string& s) { return "\"" + s + "\""; }

// Two different non-default samples per option (variant 1 and 2).
Sample sampleFor(const cfg::Option& option, int variant, const TempDir& dir) {
  const fl::Config d;
  const std::string v = std::to_string(variant);
  return std::visit(
      Overloaded{
          [&](const cfg::Text& t) -> Sample {
            if (t.path) {
              const std::string file = dir.write("sample" + v + ".pem", kPem);
              return {quote("sample" + v + ".pem"), {file}, file, [=](const fl::Config& c) {
                        return c.*t.field == file;
                      }};
            }
            const std::string value = "sample-" + v;
            return {quote(value), {value}, t.secret ? "<redacted>" : value, [=](const fl::Config& c) {
                      return c.*t.field == value;
                    }};
          },
          [&](const cfg::Choice& ch) -> Sample {
            std::vector<std::string> others;
            for (auto choice : ch.choices) {
              if (choice != d.*ch.field) others.emplace_back(choice);
            }
            const std::string value = others.at(static_cast<size_t>(variant - 1));
            return {quote(value), {value}, value, [=](const fl::Config& c) { return c.*ch.field == value; }};
          },
          [&](const cfg::Address& a) -> Sample {
            const std::string value = "127.0.0.1:123" + v;
            return {quote(value), {value}, value, [=](const fl::Config& c) { return c.*a.field == value; }};
          },
          [&](const cfg::Number& n) -> Sample {
            const uint32_t value = d.*n.field + static_cast<uint32_t>(variant) <= n.max
                                       ? d.*n.field + static_cast<uint32_t>(variant)
                                       : d.*n.field - static_cast<uint32_t>(variant);
            const std::string text = std::to_string(value);
            return {text, {text}, text, [=](const fl::Config& c) { return c.*n.field == value; }};
          },
          [&](const cfg::Bytes& b) -> Sample {
            const uint64_t value = d.*b.field * static_cast<uint64_t>(variant + 1);
            return {std::to_string(value), {humanBytes(value)}, humanBytes(value), [=](const fl::Config& c) {
                      return c.*b.field == value;
                    }};
          },
          [&](const cfg::Count& n) -> Sample {
            const uint32_t value = d.*n.field * static_cast<uint32_t>(variant + 1);
            const std::string text = std::to_string(value);
            return {text, {text}, text, [=](const fl::Config& c) { return c.*n.field == value; }};
          },
          [&](const cfg::Mode& m) -> Sample {
            const uint32_t value = variant == 1 ? 0640 : 0600;
            const std::string text = variant == 1 ? "0640" : "0600";
            return {quote(text), {text}, text, [=](const fl::Config& c) { return c.*m.field == value; }};
          },
          [&](const cfg::Cpu& cpu) -> Sample {
            return {v, {v}, v, [=](const fl::Config& c) { return c.*cpu.field == variant; }};
          },
          [&](const cfg::Switch& sw) -> Sample {
            const bool value = !(d.*sw.field);
            const std::string text = value ? "true" : "false";
            return {text, {}, text, [=](const fl::Config& c) { return c.*sw.field == value; }};
          },
          [&](const cfg::Ids& ids) -> Sample {
            if (variant == 1) {
              return {"[7, 8]", {"7", "8"}, "7,8", [=](const fl::Config& c) {
                        return c.*ids.field == std::vector<uint32_t>{7, 8};
                      }};
            }
            return {"[9, 10]", {"9,10"}, "9,10", [=](const fl::Config& c) {
                      return c.*ids.field == std::vector<uint32_t>{9, 10};
                    }};
          },
          [&](const cfg::Transports& t) -> Sample {
            if (variant == 1) {
              return {R"(["grpc"])", {"grpc"}, "grpc", [=](const fl::Config& c) {
                        return c.*t.field == std::vector<std::string>{"grpc"};
                      }};
            }
            return {R"(["rdma", "tcp"])", {"rdma,tcp"}, "rdma,tcp", [=](const fl::Config& c) {
                      return c.*t.field == std::vector<std::string>{"rdma", "tcp"};
                    }};
          },
          [&](const cfg::FaultSpec& f) -> Sample {
            const std::string value = variant == 1 ? "seed=3,drop=0.01" : "seed=4";
            return {quote(value), {value}, value, [=](const fl::Config& c) { return c.*f.field == value; }};
          },
          [&](const cfg::TokenFile& t) -> Sample {
            const std::string file = dir.write("token" + v, "tok" + v + "\n");
            return {quote("token" + v), {file}, file, [=](const fl::Config& c) {
                      return c.*t.field == file && c.token == "tok" + v;
                    }};
          },
          [&](const cfg::Peers&) -> Sample { return {}; },
      },
      option.value);
}

// A config file that sets `key = literal` in the option's section, plus what
// the option needs to be accepted alone (a certificate for the tls_ keys).
std::string fileWith(const cfg::Option& option, const std::string& literal, const TempDir& dir) {
  std::map<std::string, std::string> sections;
  if (option.key.rfind("tls_", 0) == 0) {
    const std::string base = dir.write("base.pem", kPem);
    for (const char* key : {"tls_cert_file", "tls_key_file", "tls_ca_file"}) {
      if (option.key != key) sections["link"] += std::string(key) + " = " + quote(base) + "\n";
    }
  }
  if (!literal.empty())
    sections[std::string(option.section)] += std::string(option.key) + " = " + literal + "\n";
  std::string text;
  for (const auto& [section, lines] : sections) text += "[" + section + "]\n" + lines;
  return dir.write("sample.toml", text);
}

// The value describe() prints for [section] key.
std::string described(const std::string& line, std::string_view section, std::string_view key) {
  const size_t start = line.find("[" + std::string(section) + "]");
  if (start == std::string::npos) return "(no section)";
  const size_t end = std::min(line.find(" [", start + 1), line.size());
  const std::string needle = " " + std::string(key) + "=";
  const size_t at = line.find(needle, start);
  if (at == std::string::npos || at > end) return "(no key)";
  const size_t value = at + needle.size();
  return line.substr(value, line.find(' ', value) - value);
}

#ifdef FRAMELINK_SOURCE_DIR
std::string readFile(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
#endif

bool isPeers(const cfg::Option& option) { return std::holds_alternative<cfg::Peers>(option.value); }

}  // namespace

TEST_CASE("every key round-trips: TOML -> Config -> describe()", "[config][table]") {
  TempDir dir;
  int tested = 0;
  for (const auto& option : cfg::options()) {
    if (!option.in_file || isPeers(option)) continue;
    INFO(cfg::keyName(option));
    const Sample sample = sampleFor(option, 1, dir);
    CHECK_FALSE(sample.holds(fl::Config{}));  // the sample is not the default
    auto c = parse({"--config", fileWith(option, sample.toml, dir)});
    INFO((c.ok() ? std::string() : c.error().message));
    REQUIRE(c.ok());
    CHECK(sample.holds(*c));
    CHECK(described(fl::describe(*c), option.section, option.key) == sample.shown);
    ++tested;
  }
  CHECK(tested >= 38);
}

TEST_CASE("every key has a flag named after it, and the flag overrides the file", "[config][table]") {
  TempDir dir;
  std::set<std::string> names{"--config", "--help", "--version", "--print-config-reference", "--route"};
  for (const auto& option : cfg::options()) {
    if (isPeers(option)) continue;
    const std::string flag = cfg::flagName(option);
    INFO(cfg::keyName(option) << " " << flag);
    std::string dashed(option.key);
    for (auto& ch : dashed) ch = ch == '_' ? '-' : ch;
    CHECK((flag == "--" + dashed || flag == "--" + std::string(option.section) + "-" + dashed));
    CHECK(names.insert(flag).second);
    std::vector<std::string> spellings{flag};
    for (auto alias : option.aliases) {
      CHECK(names.insert(std::string(alias)).second);
      spellings.emplace_back(alias);
    }

    const bool is_switch = cfg::isSwitch(option);
    // A switch can only turn on: the file leaves it off.
    const Sample in_file = sampleFor(option, 1, dir);
    const Sample given = sampleFor(option, 2, dir);
    for (const auto& spelling : spellings) {
      INFO("as " << spelling);
      std::vector<std::string> args;
      if (option.in_file) args = {"--config", fileWith(option, is_switch ? "" : in_file.toml, dir)};
      if (is_switch) {
        args.push_back(spelling);
      } else {
        for (const auto& value : given.flag) args.insert(args.end(), {spelling, value});
      }
      // Authenticated by a token, so that --allow-unauthenticated is tested alone.
      if (option.key != "token" && option.key != "token_file" && option.key != "allow_unauthenticated") {
        args.insert(args.end(), {"--token", "t"});
      }
      auto c = parseAsIs(args);
      INFO((c.ok() ? std::string() : c.error().message));
      REQUIRE(c.ok());
      CHECK(given.holds(*c));
      CHECK(described(fl::describe(*c), option.section, option.key) == given.shown);
    }
  }
}

TEST_CASE("the defaults are Config's, and the table shows them", "[config][table]") {
  auto c = parse({});
  REQUIRE(c.ok());
  const fl::Config defaults;
  for (const auto& option : cfg::options()) {
    if (isPeers(option) || option.key == "id" || option.key == "allow_unauthenticated") continue;
    INFO(cfg::keyName(option));
    CHECK(cfg::show(option, *c) == cfg::show(option, defaults));
    // describe() is one line of key=value words.
    CHECK(cfg::show(option, defaults).find(' ') == std::string::npos);
  }
  CHECK(cfg::defaultText(*cfg::findOption("daemon", "id")) == "hostname");
  CHECK(cfg::defaultText(*cfg::findOption("daemon", "socket_mode")) == "\"0660\"");
  CHECK(cfg::defaultText(*cfg::findOption("daemon", "allowed_uids")) == "anyone");
  CHECK(cfg::defaultText(*cfg::findOption("link", "keepalive_ms")) == "1000");
  CHECK(cfg::defaultText(*cfg::findOption("link", "transports")) == R"(["tcp", "grpc"])");
  CHECK(cfg::defaultText(*cfg::findOption("link", "allow_unauthenticated")) == "false");
  CHECK(cfg::defaultText(*cfg::findOption("limits", "max_client_bytes")) == "\"1GiB\"");
  CHECK(cfg::defaultText(*cfg::findOption("metrics", "listen")) == "off");
  CHECK(cfg::findOption("link", "fault_inject") == nullptr);  // a flag, not a key
}

TEST_CASE("refused values: the message names the key or flag and the value", "[config][table]") {
  TempDir dir;
  for (const auto& option : cfg::options()) {
    if (isPeers(option)) continue;
    // A value of the right TOML type that the option refuses, and one for the flag.
    std::string toml, flag, value;
    std::visit(Overloaded{
                   [&](const cfg::Text&) {},  // free text
                   [&](const cfg::Choice&) { value = "bogus", toml = quote(value), flag = value; },
                   [&](const cfg::Address&) { value = "nohostport", toml = quote(value), flag = value; },
                   [&](const cfg::Number& n) {
                     value = n.max == UINT32_MAX ? "4294967296" : std::to_string(uint64_t{n.max} + 1);
                     toml = flag = value;
                   },
                   [&](const cfg::Bytes&) { value = "12XB", toml = quote(value), flag = value; },
                   [&](const cfg::Count&) { value = "12XB", toml = quote(value), flag = value; },
                   [&](const cfg::Mode&) { value = "999", toml = quote(value), flag = value; },
                   [&](const cfg::Cpu&) { value = "-2", toml = flag = value; },
                   [&](const cfg::Switch&) { value = "yes", toml = quote(value); },
                   [&](const cfg::Ids&) { value = "x7", toml = "[\"x7\"]", flag = value; },
                   [&](const cfg::Transports&) { value = "ib", toml = "[\"ib\"]", flag = value; },
                   [&](const cfg::FaultSpec&) { value = "lose=0.1", flag = value; },
                   [&](const cfg::TokenFile&) { value = "missing-file", toml = quote(value), flag = value; },
                   [&](const cfg::Peers&) {},
               },
               option.value);
    if (value.empty()) continue;
    INFO(cfg::keyName(option) << " = " << value);
    if (option.in_file && !toml.empty()) {
      auto c = parse({"--config", fileWith(option, toml, dir)});
      REQUIRE_FALSE(c.ok());
      INFO(c.error().message);
      CHECK(c.error().message.find(cfg::keyName(option)) != std::string::npos);
      CHECK(c.error().message.find(value) != std::string::npos);
    }
    if (!flag.empty()) {
      auto c = parse({cfg::flagName(option), flag});
      REQUIRE_FALSE(c.ok());
      INFO(c.error().message);
      CHECK(c.error().message.find(cfg::flagName(option)) != std::string::npos);
      CHECK(c.error().message.find(value) != std::string::npos);
    }
  }
  // Numbers at the bottom of their range.
  requireError({"--keepalive-ms", "0"}, {"--keepalive-ms", "'0'", "greater than 0"});
  requireError({"--rdma-port", "65536"}, {"--rdma-port", "65536", "65535"});
  CHECK(parse({"--rdma-port", "65535"}).ok());
}

TEST_CASE("--help lists every flag; old spellings still work", "[config][table]") {
  auto help = parse({"--help"});
  REQUIRE(help.ok());
  for (const auto& option : cfg::options()) {
    INFO(cfg::keyName(option));
    CHECK(help->exit_message.find(cfg::flagName(option)) != std::string::npos);
  }
  TempDir dir;
  const std::string pem = dir.write("d.pem", kPem);
  auto old = parse({"--tls-cert", pem, "--tls-key", pem, "--tls-ca", pem, "--metrics", "127.0.0.1:0",
                    "--default-slots", "2", "--allow-uid", "5", "--allow-gid", "6"});
  INFO((old.ok() ? std::string() : old.error().message));
  REQUIRE(old.ok());
  CHECK(old->tls_cert_file == pem);
  CHECK(old->tls_ca_file == pem);
  CHECK(old->metrics_listen == "127.0.0.1:0");
  CHECK(old->default_slot_count == 2);
  CHECK(old->allowed_uids == std::vector<uint32_t>{5});
  CHECK(old->allowed_gids == std::vector<uint32_t>{6});
}

TEST_CASE("peer names, routes and the daemon id follow the stream-name rule", "[config]") {
  const std::string longest(FL_STREAM_NAME_LEN_MAX, 'p');
  const std::string too_long(FL_STREAM_NAME_LEN_MAX + 1, 'p');
  CHECK(parse({"--peer", longest + "=h:1", "--route", longest + "=" + longest, "--id", longest}).ok());
  requireError({"--peer", too_long + "=h:1"}, {"--peer", too_long, "1-63"});
  requireError({"--peer", "a=h:1", "--route", too_long + "=a"}, {"--route", "stream name", "1-63"});
  requireError({"--id", too_long}, {"daemon.id", too_long});
  requireError({"--id", "host a"}, {"daemon.id", "'host a'"});
  TempDir dir;
  requireError(
      {"--config", dir.write("p.toml", "[[peer]]\nname = \"" + too_long + "\"\naddress = \"h:1\"\n")},
      {"[[peer]]", too_long, "1-63"});
}

#ifdef FRAMELINK_SOURCE_DIR
TEST_CASE("packaging/framelinkd.toml shows every key with its default", "[config][table]") {
  // "#key = value" (commented out) or "key = value", under [section].
  std::map<std::string, std::string> shown;
  std::istringstream lines(readFile(std::string(FRAMELINK_SOURCE_DIR) + "/packaging/framelinkd.toml"));
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.rfind("#", 0) == 0 && line.rfind("# ", 0) != 0) line.erase(0, 1);
    if (line.rfind("[", 0) == 0) {
      section = line.substr(line.find_first_not_of('['), line.find(']') - line.find_first_not_of('['));
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos || line.rfind("#", 0) == 0) continue;
    shown[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
  }
  for (const auto& option : cfg::options()) {
    if (!option.in_file || isPeers(option)) continue;
    const std::string key = cfg::keyName(option);
    INFO("packaging/framelinkd.toml must show " << key << ", commented out, with its default");
    REQUIRE(shown.count(key) == 1);
    // Keys without a default show an example instead.
    const std::string literal = cfg::tomlValue(option, fl::Config{});
    if (!literal.empty()) CHECK(shown[key] == literal);
  }
  for (const auto& [key, value] : shown) {
    INFO(key);
    CHECK((key.rfind("peer.", 0) == 0 ||
           cfg::findOption(key.substr(0, key.find('.')), key.substr(key.find('.') + 1))));
  }
}

TEST_CASE("the README's configuration table is the option table", "[config][table]") {
  const std::string readme = readFile(std::string(FRAMELINK_SOURCE_DIR) + "/README.md");
  const std::string begin = "<!-- BEGIN config-reference";
  const std::string end = "<!-- END config-reference -->";
  const size_t from = readme.find(begin);
  REQUIRE(from != std::string::npos);
  const size_t body = readme.find('\n', from) + 1;
  const size_t to = readme.find(end, body);
  REQUIRE(to != std::string::npos);
  INFO(
      "README.md's configuration table differs from the option table (proxy/config_options.cpp); "
      "regenerate it: scripts/update-config-reference.sh build/proxy/framelinkd");
  CHECK(readme.substr(body, to - body) == fl::configReference());

  auto printed = parse({"--print-config-reference"});
  REQUIRE(printed.ok());
  CHECK(printed->exit_now);
  CHECK(printed->exit_message == fl::configReference());
  for (const auto& option : cfg::options()) {
    INFO(cfg::keyName(option));
    CHECK(printed->exit_message.find("`" + cfg::flagName(option)) != std::string::npos);
  }
}
#endif
