// framelinkd's configuration of secrets and security: token files, TLS files
// (read relative to the config file, and only together), the token kept out
// of describe(), and the refusal of peers from the network that neither a
// token nor TLS authenticates.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/config.h"
#include "config_test_util.h"

namespace fl = framelink;
using namespace framelink::config_test;

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

TEST_CASE("TLS: a trust file with no certificate yet trusts only this daemon's own", "[config][tls]") {
  TempDir dir;
  const std::string cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  dir.write("d.pem", cert);
  dir.write("d.key", "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n");
  const std::vector<std::string> mutual = {"--tls-cert",      dir.path("d.pem"),   "--tls-key",
                                           dir.path("d.key"), "--tls-client-auth", "--tls-ca"};
  for (const std::string& peers :
       {dir.write("empty.pem", ""), dir.write("comments.pem", "# peers\n\n  \n"), dir.path("missing.pem")}) {
    std::vector<std::string> args = mutual;
    args.push_back(peers);
    auto c = parse(args);
    INFO(peers << ": " << (c.ok() ? std::string() : c.error().message));
    REQUIRE(c.ok());
    CHECK(c->tls_no_peer_certs);
    CHECK(c->tls_ca_pem == cert);  // never empty: that would be the system's CA store
  }
  std::vector<std::string> args = mutual;
  args.push_back(dir.write("peers.pem", cert));
  auto c = parse(args);
  REQUIRE(c.ok());
  CHECK_FALSE(c->tls_no_peer_certs);
  args.back() = dir.write("not.pem", "hello\n");
  requireError(args, {"link.tls_ca_file", "not PEM"});
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

TEST_CASE("peers from the network without a token or TLS are refused unless allowed", "[config][security]") {
  auto bare = parseAsIs({});
  REQUIRE_FALSE(bare.ok());
  CHECK(bare.error().code == FL_EINVAL);
  for (const char* fragment :
       {"0.0.0.0:7700", "neither a token nor TLS", "token_file", "allow_unauthenticated"}) {
    INFO(bare.error().message);
    CHECK(bare.error().message.find(fragment) != std::string::npos);
  }
  // A data listener on the network is just as open; by default it is on listen's host.
  CHECK_FALSE(parseAsIs({"--listen", "127.0.0.1:7700", "--data-listen", "0.0.0.0:7701"}).ok());
  CHECK(parseAsIs({"--listen", "127.0.0.1:7700"}).ok());
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
