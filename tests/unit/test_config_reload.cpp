// A reload's plan (config_reload.h): what applies while the daemon runs,
// what waits for a restart, and the digest that tells configurations apart.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "config/config_reload.h"
#include "config_test_util.h"

using namespace framelink;
using namespace framelink::config_test;

namespace {

Config parsed(const TempDir& dir, const std::string& toml) {
  auto c = parse({"--config", dir.write("f.toml", toml)});
  INFO((c ? std::string() : c.error().message));
  REQUIRE(c.ok());
  return c.value();
}

bool has(const std::vector<std::string>& lines, const std::string& fragment) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(fragment) != std::string::npos; });
}

const char* kBase = R"(
[daemon]
log_level = "info"
[link]
token = "one"
[limits]
max_slots = 64
[[peer]]
name = "b"
address = "10.0.0.2:7700"
streams = ["cam0"]
[[peer]]
name = "c"
address = "10.0.0.3:7700"
token = "c-one"
)";

}  // namespace

TEST_CASE("a reload applies peers, routes, tokens and log level, and names what waits for a restart",
          "[config][reload]") {
  TempDir dir;
  const Config running = parsed(dir, kBase);
  const Config read = parsed(dir, R"(
[daemon]
log_level = "debug"
[link]
token = "two"
credit_timeout_ms = 2000
[limits]
max_slots = 32
[[peer]]
name = "b"
address = "10.0.0.9:7700"
streams = ["cam0", "cam1"]
[[peer]]
name = "d"
address = "10.0.0.4:7700"
)");
  const ReloadPlan plan = planReload(running, read);
  INFO([&] {
    std::string s;
    for (const auto& l : plan.applied) s += l + "\n";
    return s;
  }());
  CHECK(has(plan.applied, "[daemon] log_level info -> debug"));
  // c had a token of its own, the credential its removal takes away.
  CHECK(has(plan.applied, "[[peer]] c removed (its links end and its token is refused)"));
  CHECK(has(plan.applied, "[[peer]] d added (dials 10.0.0.4:7700)"));
  CHECK(has(plan.applied, "[[peer]] b address 10.0.0.2:7700 -> 10.0.0.9:7700"));
  CHECK(has(plan.applied, "[[peer]] b streams cam0 -> cam0,cam1"));
  CHECK(has(plan.applied, "[link] token rotated"));
  CHECK(has(plan.applied, "[link] credit_timeout_ms 30000 -> 2000"));
  // Applied: the next configuration has the new peers, token and level ...
  CHECK(plan.next.log_level == "debug");
  CHECK(plan.next.token == "two");
  CHECK(plan.next.credit_timeout_ms == 2000);
  REQUIRE(plan.next.peers.size() == 2);
  CHECK(plan.next.routesFor("cam1") == std::vector<std::string>{"b"});
  // ... and keeps the running value of what needs a restart, which is named.
  CHECK(plan.next.max_slots == 64);
  CHECK(plan.restart == std::vector<std::string>{"[limits] max_slots"});
}

TEST_CASE("a reload of the same file changes nothing, and a rotated peer token is seen", "[config][reload]") {
  TempDir dir;
  const Config running = parsed(dir, kBase);
  const ReloadPlan same = planReload(running, parsed(dir, kBase));
  CHECK(same.applied.empty());
  CHECK(same.restart.empty());
  CHECK(configHash(same.next) == configHash(running));

  std::string rotated = kBase;
  rotated.replace(rotated.find("c-one"), 5, "c-two");
  const Config read = parsed(dir, rotated);
  const ReloadPlan plan = planReload(running, read);
  CHECK(plan.applied == std::vector<std::string>{"[[peer]] c token rotated (new links use it)"});
  // The digest sees secrets, which describe() redacts.
  CHECK(describe(read) == describe(running));
  CHECK(configHash(read) != configHash(running));
  CHECK(configHash(read).size() == 16);
}

TEST_CASE("a certificate added to tls_ca_file applies at once; other TLS files wait for a restart",
          "[config][reload]") {
  TempDir dir;
  const std::string pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  dir.write("host.pem", pem);
  dir.write("peers.pem", pem);
  dir.write("other.pem", pem);
  std::string base = kBase;
  base.insert(base.find("token = \"one\"\n") + 14,
              "tls_cert_file = \"host.pem\"\ntls_key_file = \"host.pem\"\n"
              "tls_ca_file = \"peers.pem\"\ntls_client_auth = true\n");
  const Config running = parsed(dir, base);
  dir.write("peers.pem", pem + pem);  // the new peer's certificate appended, as docs/start/install.md says
  const ReloadPlan plan = planReload(running, parsed(dir, base));
  CHECK(plan.applied ==
        std::vector<std::string>{"[link] tls_ca_file: the certificates in it changed (links set "
                                 "up from now use it; links up run on)"});
  CHECK(plan.restart.empty());
  CHECK(plan.next.tls_ca_pem == pem + pem);
  // Another file is another option: the running one stays until a restart.
  std::string moved = base;
  moved.replace(moved.find("\"peers.pem\""), 11, "\"other.pem\"");
  const ReloadPlan later = planReload(running, parsed(dir, moved));
  CHECK(later.applied.empty());
  CHECK(later.restart == std::vector<std::string>{"[link] tls_ca_file"});
  CHECK(later.next.tls_ca_pem == running.tls_ca_pem);
}
