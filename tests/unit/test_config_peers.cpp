// [[peer]] credentials: a peer's own token (token / token_file), the name its
// TLS certificate must carry (cert_name, link.tls_require_cert_name), peers
// that only dial in (no address), and token files others can read.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "config_test_util.h"

namespace fl = framelink;
using namespace framelink::config_test;

namespace {

// A [link] table with mutual TLS, its files in `dir`.
std::string mutualTls(const TempDir& dir) {
  const std::string pem = dir.write("tls.pem", kPem);
  return "tls_cert_file = \"" + pem + "\"\ntls_key_file = \"" + pem + "\"\ntls_ca_file = \"" + pem +
         "\"\ntls_client_auth = true\n";
}

}  // namespace

TEST_CASE("a [[peer]] may carry its own token, inline or from a file", "[config][peer-auth]") {
  TempDir dir;
  dir.write("b.token", "b-secret\n");
  auto c = parse({"--config", dir.write("p.toml", R"(
[link]
token = "shared"
[[peer]]
name = "b"
address = "127.0.0.1:7702"
token_file = "b.token"
[[peer]]
name = "c"
token = "c-secret"
[[peer]]
name = "d"
address = "127.0.0.1:7704"
)")});
  INFO((c.ok() ? std::string() : c.error().message));
  REQUIRE(c.ok());
  REQUIRE(c->peers.size() == 3);
  CHECK(c->peers[0].token == "b-secret");
  CHECK(c->peers[0].token_file == dir.path("b.token"));  // relative to the config file
  CHECK(c->peers[1].token == "c-secret");
  CHECK(c->peers[1].address.empty());  // c only dials in
  CHECK(c->peers[2].token.empty());
  // A peer's own token, else the shared one; ids without a [[peer]] get the shared one too.
  CHECK(c->peerToken("b") == "b-secret");
  CHECK(c->peerToken("c") == "c-secret");
  CHECK(c->peerToken("d") == "shared");
  CHECK(c->peerToken("stranger") == "shared");
  CHECK(c->peerTokens());

  const std::string line = fl::describe(*c);
  for (const char* secret : {"b-secret", "c-secret", "shared"}) CHECK(line.find(secret) == std::string::npos);
  CHECK(line.find("b=127.0.0.1:7702(token=<redacted>)") != std::string::npos);
  CHECK(line.find("c=dials-in(token=<redacted>)") != std::string::npos);
  CHECK(line.find("d=127.0.0.1:7704") != std::string::npos);

  auto plain = parse({"--token", "shared", "--peer", "b=h:1"});
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->peerTokens());
  CHECK(plain->peerToken("b") == "shared");
}

TEST_CASE("--peer gives a file's dial-in peer an address and keeps its token", "[config][peer-auth]") {
  TempDir dir;
  const auto file = dir.write("p.toml", "[[peer]]\nname = \"a\"\ntoken = \"a-secret\"\n");
  auto c = parse({"--config", file, "--peer", "a=127.0.0.1:7700"});
  REQUIRE(c.ok());
  REQUIRE(c->peers.size() == 1);
  CHECK(c->peers[0].address == "127.0.0.1:7700");
  CHECK(c->peers[0].token == "a-secret");
}

TEST_CASE("per-peer credentials: what is refused, and why", "[config][peer-auth]") {
  TempDir dir;
  dir.write("t", "x\n");
  auto peer = [&](const std::string& name, const std::string& body) {
    return dir.write(name, "[[peer]]\nname = \"b\"\n" + body);
  };
  requireError({"--config", peer("both.toml", "token = \"x\"\ntoken_file = \"t\"\n")},
               {"peer[0]", "token", "token_file", "keep one"});
  requireError({"--config", peer("missing.toml", "token_file = \"nope\"\n")},
               {"peer[0].token_file", "cannot read"});
  requireError({"--config", peer("empty.toml", "token = \"\"\n")}, {"peer[0].token", "empty"});
  requireError({"--config", peer("number.toml", "token = 7\n")}, {"peer[0].token", "string"});
  requireError({"--config", peer("nothing.toml", "streams = [\"cam\"]\n")},
               {"[[peer]]", "address", "dials in", "token"});
  // A certificate name is only known with mutual TLS.
  requireError({"--config", peer("cert.toml", "address = \"h:1\"\ncert_name = \"hostB\"\n")},
               {"cert_name", "tls_client_auth"});
  requireError({"--config", dir.write("req.toml", "[link]\ntls_require_cert_name = true\n")},
               {"tls_require_cert_name", "tls_client_auth"});

  auto tls =
      parse({"--config", dir.write("tls.toml", "[link]\n" + mutualTls(dir) +
                                                   "tls_require_cert_name = true\n"
                                                   "[[peer]]\nname = \"b\"\ncert_name = \"hostB\"\n")});
  INFO((tls.ok() ? std::string() : tls.error().message));
  REQUIRE(tls.ok());
  CHECK(tls->tls_require_cert_name);
  CHECK(tls->peers[0].cert_name == "hostB");
  CHECK(tls->peers[0].address.empty());
  CHECK(fl::describe(*tls).find("b=dials-in(cert_name=hostB)") != std::string::npos);
}

TEST_CASE("peers that each have their own token authenticate the listener", "[config][peer-auth][security]") {
  TempDir dir;
  // No shared token: only the listed peers, each with its own, may dial in.
  const auto own = dir.write("own.toml", "[[peer]]\nname = \"b\"\ntoken = \"b-secret\"\n");
  auto c = parseAsIs({"--config", own});
  INFO((c.ok() ? std::string() : c.error().message));
  REQUIRE(c.ok());
  CHECK_FALSE(c->unauthenticatedFromNetwork());
  CHECK(c->peerToken("b") == "b-secret");
  CHECK(c->peerToken("stranger").empty());
  // A peer without one still leaves the others unauthenticated.
  const auto mixed = dir.write("mixed.toml", "[[peer]]\nname = \"b\"\naddress = \"h:1\"\n");
  CHECK_FALSE(parseAsIs({"--config", mixed}).ok());
}

TEST_CASE("a token that would cross the network without TLS is named, with where it goes",
          "[config][peer-auth][security]") {
  TempDir dir;
  auto open = parseAsIs({"--token", "s3cret", "--listen", "0.0.0.0:7700"});
  REQUIRE(open.ok());
  CHECK(open->tokenInClearAt() == "link.listen 0.0.0.0:7700");
  // On this host only, with no peer elsewhere: nothing to capture.
  auto local = parseAsIs({"--token", "s3cret", "--listen", "127.0.0.1:0", "--data-listen", "127.0.0.1:0"});
  REQUIRE(local.ok());
  CHECK(local->tokenInClearAt().empty());
  // Listening on this host, but dialing a peer elsewhere with its own token.
  auto dials = parseAsIs({"--config", dir.write("dial.toml",
                                                "[link]\nlisten = \"127.0.0.1:0\"\n"
                                                "data_listen = \"127.0.0.1:0\"\n"
                                                "[[peer]]\nname = \"b\"\naddress = \"10.0.0.2:7700\"\n"
                                                "token = \"b-secret\"\n")});
  INFO((dials.ok() ? std::string() : dials.error().message));
  REQUIRE(dials.ok());
  CHECK(dials->tokenInClearAt() == "peer b at 10.0.0.2:7700");
  // TLS carries it encrypted; no token, nothing to leak.
  auto tls = parseAsIs({"--config", dir.write("tls.toml", "[link]\ntoken = \"s3cret\"\n" + mutualTls(dir))});
  INFO((tls.ok() ? std::string() : tls.error().message));
  REQUIRE(tls.ok());
  CHECK(tls->tokenInClearAt().empty());
  auto none = parse({"--listen", "0.0.0.0:7700"});
  REQUIRE(none.ok());
  CHECK(none->tokenInClearAt().empty());
}

TEST_CASE("token files that others than the daemon's user can read are named at start",
          "[config][security]") {
  TempDir dir;
  const std::string shared = dir.write("shared.token", "s\n");
  const std::string own = dir.write("b.token", "b\n");
  REQUIRE(::chmod(shared.c_str(), 0640) == 0);
  REQUIRE(::chmod(own.c_str(), 0604) == 0);
  auto c = parse({"--config", dir.write("p.toml",
                                        "[link]\ntoken_file = \"shared.token\"\n"
                                        "[[peer]]\nname = \"b\"\ntoken_file = \"b.token\"\n")});
  REQUIRE(c.ok());
  const std::vector<std::string> warnings = fl::exposedTokenFiles(*c);
  REQUIRE(warnings.size() == 2);
  CHECK(warnings[0].find(shared) != std::string::npos);
  CHECK(warnings[0].find("0640") != std::string::npos);
  CHECK(warnings[0].find("chmod 0600") != std::string::npos);
  CHECK(warnings[1].find(own) != std::string::npos);

  REQUIRE(::chmod(shared.c_str(), 0600) == 0);
  REQUIRE(::chmod(own.c_str(), 0400) == 0);
  CHECK(fl::exposedTokenFiles(*c).empty());
  // A token on the command line or inline in the file has no file to check.
  auto inline_token = parse({"--token", "s"});
  REQUIRE(inline_token.ok());
  CHECK(fl::exposedTokenFiles(*inline_token).empty());
}

TEST_CASE(
    "a second peer without a streams list is warned about: the streams that went to the first go nowhere",
    "[config][routes]") {
  auto one = parse({"--peer", "hostb=10.0.0.2:7700"});
  REQUIRE(one.ok());
  CHECK(one->routesFor("cam0") == std::vector<std::string>{"hostb"});
  CHECK(one->routeWarnings().empty());

  auto two = parse({"--peer", "hostb=10.0.0.2:7700", "--peer", "hostc=10.0.0.3:7700"});
  REQUIRE(two.ok());
  CHECK(two->routesFor("cam0").empty());
  REQUIRE(two->routeWarnings().size() == 1);
  const std::string warning = two->routeWarnings()[0];
  INFO(warning);
  CHECK(warning.find("peers hostb, hostc have no streams list") != std::string::npos);
  CHECK(warning.find("FL_ERR_NO_ROUTE") != std::string::npos);
  CHECK(warning.find("--route cam0=hostb") != std::string::npos);
  CHECK(two->whyNoRoute("cam0") ==
        "none of the 2 configured peers takes stream 'cam0' (no peer's streams list names it or \"*\", and 2 "
        "peers have no list, so none takes the rest)");
  CHECK(parse({})->whyNoRoute("cam0") == "no peer is configured for stream 'cam0'");

  // Routed, or one takes the rest: nothing to say.
  auto routed =
      parse({"--peer", "hostb=10.0.0.2:7700", "--peer", "hostc=10.0.0.3:7700", "--route", "*=hostc"});
  REQUIRE(routed.ok());
  CHECK(routed->routesFor("cam0") == std::vector<std::string>{"hostc"});
  CHECK(routed->routeWarnings().empty());
}

TEST_CASE("--check-config checks as a start would and says so, without starting", "[config]") {
  TempDir dir;
  const std::string good = dir.write("good.toml", R"(
[daemon]
id = "hosta"
[[peer]]
name = "hostb"
address = "10.0.0.2:7700"
[[peer]]
name = "hostc"
address = "10.0.0.3:7700"
)");
  auto checked = parse({"--config", good, "--check-config"});
  REQUIRE(checked.ok());
  CHECK(checked->exit_now);
  INFO(checked->exit_message);
  CHECK(checked->exit_message.rfind("framelinkd: the configuration is valid: config=" + good, 0) == 0);
  CHECK(checked->exit_message.find("\nwarning: peers hostb, hostc have no streams list") !=
        std::string::npos);

  // An invalid file is refused with the message a start would give.
  const std::string bad = dir.write("bad.toml", "[daemon]\nid = \"hosta\"\nsocket_mode = \"rw\"\n");
  auto refused = parse({"--config", bad, "--check-config"});
  auto started = parse({"--config", bad});
  REQUIRE_FALSE(refused.ok());
  REQUIRE_FALSE(started.ok());
  CHECK(refused.error().message == started.error().message);
}

TEST_CASE("[discovery] dns_srv: what is refused, and why", "[config][discovery]") {
  auto ok = parse({"--dns-srv", "_framelink._tcp.line1.example", "--dns-server", "127.0.0.1:5353"});
  REQUIRE(ok.ok());
  CHECK(ok->discoveryEnabled());
  CHECK(ok->discovery_dns_refresh_s == 5);
  requireError({"--dns-srv", "_framelink._tcp.line1.example", "--etcd", "http://10.0.0.10:2379"},
               {"discovery.etcd and discovery.dns_srv are both set"});
  requireError({"--dns-srv", "line one"}, {"discovery.dns_srv 'line one' is not a DNS name"});
  requireError({"--dns-srv", "_framelink._tcp.x", "--dns-server", "dns.example"},
               {"discovery.dns_server 'dns.example' is not IPv4[:PORT]"});
  requireError({"--dns-srv", "_framelink._tcp.x", "--dns-server", "10.0.0.2:70000"}, {"is not IPv4[:PORT]"});
}
