// framelinkd's configuration: TOML keys and flags, validation, routing.  The
// option table row by row, the shipped example and the documentation's table are
// tested in test_config_table.cpp; secrets, TLS and the security defaults in
// test_config_security.cpp.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/config_options.h"
#include "config_test_util.h"
#include "framelink/shm_layout.h"

namespace fl = framelink;
namespace cfg = framelink::config;
using namespace framelink::config_test;

namespace {

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
  CHECK(c->data_listen == "0.0.0.0:7701");  // fixed: a firewall rule can be written in advance
  CHECK(c->transports == std::vector<std::string>{"tcp", "grpc"});
  CHECK(c->hugepages == "auto");
  CHECK(c->log_level == "info");
  CHECK(c->max_slot_size == 64 * fl::kMiB);
  CHECK(c->max_client_bytes == fl::kGiB);
  CHECK(c->peers.empty());
  CHECK(routes(*c, "cam0").empty());
}

TEST_CASE("the tcp data port is the one after the gRPC port unless set", "[config]") {
  auto derived = [](std::vector<std::string> args) {
    auto c = parse(std::move(args));
    REQUIRE(c.ok());
    return c->data_listen;
  };
  CHECK(derived({"--listen", "10.0.0.5:9000"}) == "10.0.0.5:9001");
  CHECK(derived({"--listen", "[::1]:7700"}) == "[::1]:7701");
  CHECK(derived({"--listen", "127.0.0.1:0"}) == "127.0.0.1:0");  // any free port, as the gRPC one
  CHECK(derived({"--listen", "10.0.0.5:9000", "--data-listen", "10.0.0.5:1234"}) == "10.0.0.5:1234");
  auto last_port = parse({"--listen", "127.0.0.1:65535"});
  REQUIRE_FALSE(last_port.ok());
  CHECK_THAT(last_port.error().message, Catch::Contains("data_listen"));
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
  CHECK(routes(*c, "cam9") == "hostd");
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
  requireError({"--config", peer}, {"peer[0].stream", peer, "did you mean 'peer[0].streams'?"});
  const auto top = dir.write("top.toml", "id = \"a\"\n");
  requireError({"--config", top}, {"'id'", top});
  // A typo, or a key of another table, gets the key it most likely meant.
  requireError({"--config", key}, {"did you mean 'daemon.socket'?"});
  requireError({"--config", table}, {"did you mean [daemon]?"});
  requireError({"--config", top}, {"did you mean 'daemon.id'?"});
  requireError({"--config", dir.write("moved.toml", "[daemon]\ntoken_file = \"/etc/t\"\n")},
               {"daemon.token_file", "did you mean 'link.token_file'?"});
  requireError({"--config", dir.write("plural.toml", "[link]\ntransport = [\"tcp\"]\n")},
               {"did you mean 'link.transports'?"});
  // Nothing near: no guess.
  auto far = parseAsIs({"--config", dir.write("far.toml", "[daemon]\ncompletely_unrelated = 1\n")});
  REQUIRE_FALSE(far.ok());
  CHECK(far.error().message.find("did you mean") == std::string::npos);
  CHECK(far.error().message.find("lists every key") != std::string::npos);
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
    requireError({"--config", dir.write("k.toml", "[link]\nkeepalive_ms = 6000\n")},
                 {"link_timeout_ms (10000)", "twice keepalive_ms (6000)"});
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
  SECTION("no peer: no route") { CHECK(routes(c, "cam0").empty()); }
  SECTION("exactly one peer without routes takes every stream") {
    c.peers = {{"b", "h:1", {}}};
    CHECK(routes(c, "cam0") == "b");
    CHECK(routes(c, "anything") == "b");
  }
  SECTION("two peers without routes: ambiguous, no route") {
    c.peers = {{"b", "h:1", {}}, {"c", "h:2", {}}};
    CHECK(routes(c, "cam0").empty());
  }
  SECTION("an exact name wins over '*', whatever the order") {
    c.peers = {{"star", "h:1", {"*"}}, {"exact", "h:2", {"cam0"}}};
    CHECK(routes(c, "cam0") == "exact");
    CHECK(routes(c, "cam1") == "star");
  }
  SECTION("listed streams only, no default: other streams have no route") {
    c.peers = {{"b", "h:1", {"cam0"}}};
    CHECK(routes(c, "cam0") == "b");
    CHECK(routes(c, "cam1").empty());
  }
  SECTION("the one peer without a streams list is the default for the rest") {
    c.peers = {{"b", "h:1", {"cam0"}}, {"d", "h:2", {}}};
    CHECK(routes(c, "cam0") == "b");
    CHECK(routes(c, "cam1") == "d");
  }
  SECTION("'*' wins over the peer without a list") {
    c.peers = {{"d", "h:2", {}}, {"star", "h:1", {"*"}}};
    CHECK(routes(c, "cam1") == "star");
  }
  SECTION("routes from flags") {
    auto parsed = parse({"--peer", "b=h:1", "--peer", "c=h:2", "--route", "cam0=c", "--route", "*=b"});
    REQUIRE(parsed.ok());
    CHECK(routes(*parsed, "cam0") == "c");
    CHECK(routes(*parsed, "cam7") == "b");
  }
  SECTION("a stream listed on several peers goes to each, in the order configured") {
    c.peers = {{"b", "h:1", {"cam0"}}, {"star", "h:3", {"*"}}, {"c", "h:2", {"cam1", "cam0"}}};
    CHECK(routes(c, "cam0") == "b,c");
    CHECK(routes(c, "cam1") == "c");
    CHECK(routes(c, "cam2") == "star");
  }
  SECTION("--route STREAM=P1,P2 routes to both; repeating a peer changes nothing") {
    auto parsed = parse({"--peer", "b=h:1", "--peer", "c=h:2", "--route", "cam0=b,c", "--route", "cam0=c"});
    REQUIRE(parsed.ok());
    CHECK(routes(*parsed, "cam0") == "b,c");
    CHECK(routes(*parsed, "cam1").empty());
  }
  SECTION("a route naming an unknown peer among several is refused") {
    requireError({"--peer", "b=h:1", "--route", "cam0=b,nosuch"},
                 {"no peer named 'nosuch'", "--peer nosuch="});
    requireError({"--peer", "b=h:1", "--route", "cam0=b,"}, {"no peer named ''"});
  }
  SECTION("at most kMaxRoutesPerStream peers per stream") {
    std::vector<std::string> args;
    std::string list;
    for (size_t i = 0; i <= fl::kMaxRoutesPerStream; ++i) {
      args.insert(args.end(), {"--peer", "p" + std::to_string(i) + "=h:" + std::to_string(i + 1)});
      list += (i == 0 ? "" : ",") + std::string("p") + std::to_string(i);
    }
    args.insert(args.end(), {"--route", "cam0=" + list});
    requireError(args,
                 {"stream 'cam0' is routed to " + std::to_string(fl::kMaxRoutesPerStream + 1) + " peers",
                  "at most " + std::to_string(fl::kMaxRoutesPerStream)});
  }
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

TEST_CASE("limits.max_uid_bytes and max_total_bytes: auto by default, sizes, and their errors", "[config]") {
  auto defaults = parse({});
  REQUIRE(defaults.ok());
  CHECK(defaults.value().max_uid_bytes == 0);  // auto
  CHECK(defaults.value().max_total_bytes == 0);
  CHECK(fl::describe(defaults.value()).find("max_uid_bytes=auto max_total_bytes=auto") != std::string::npos);
  TempDir dir;
  const auto file =
      dir.write("mem.toml", "[limits]\nmax_uid_bytes = \"2GiB\"\nmax_total_bytes = 8589934592\n");
  auto from_file = parse({"--config", file});
  REQUIRE(from_file.ok());
  CHECK(from_file.value().max_uid_bytes == 2 * fl::kGiB);
  CHECK(from_file.value().max_total_bytes == 8 * fl::kGiB);
  CHECK(fl::describe(from_file.value()).find("max_uid_bytes=2GiB max_total_bytes=8GiB") != std::string::npos);
  auto flag_wins = parse({"--config", file, "--max-uid-bytes", "auto", "--max-total-bytes", "512M"});
  REQUIRE(flag_wins.ok());
  CHECK(flag_wins.value().max_uid_bytes == 0);
  CHECK(flag_wins.value().max_total_bytes == 512 * fl::kMiB);
  CHECK(parse({"--config", dir.write("auto.toml", "[limits]\nmax_total_bytes = \"auto\"\n")}).ok());
  requireError({"--max-total-bytes", "0"}, {"--max-total-bytes", "greater than 0", "\"auto\""});
  requireError({"--max-uid-bytes", "lots"}, {"--max-uid-bytes", "'lots'", "\"auto\""});
  requireError({"--config", dir.write("zero.toml", "[limits]\nmax_uid_bytes = 0\n")},
               {"limits.max_uid_bytes", "greater than 0"});
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
