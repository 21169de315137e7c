// The option table (proxy/config/config_options.cpp): every row reaches the TOML
// file, the flags, describe(), the defaults, --help, the shipped example
// (packaging/framelinkd.toml) and the configuration table of docs/reference/configuration.md.
#include <catch2/catch.hpp>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"
#include "config/config_options.h"
#include "config_test_util.h"

namespace fl = framelink;
namespace cfg = framelink::config;
using namespace framelink::config_test;

namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

// A real CA and the CRL it signed (framelink-site-ca.sh init), for tls_crl_file, which checks it.
const std::string kCaPem =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBoDCCAUWgAwIBAgIUa5K2n9SGAY+KHc4vgUb/fM8FwrswCgYIKoZIzj0EAwIw\n"
    "HDEaMBgGA1UEAwwRZnJhbWVsaW5rIHNpdGUgQ0EwIBcNMjYxMjA0MTc1MTAwWhgP\n"
    "MjEyNjExMTAxNzUxMDBaMBwxGjAYBgNVBAMMEWZyYW1lbGluayBzaXRlIENBMFkw\n"
    "EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE2fYUMxDVAsUbvnV0iBcVbDjCPPqJgI0q\n"
    "J8vTj3c/PkdJirXTl2d4oTiklUJTZYeuFeNCaG2CKISyoco0CiZCQaNjMGEwHQYD\n"
    "VR0OBBYEFLdfvRHOm0JTFONABa8kdl49Go1HMB8GA1UdIwQYMBaAFLdfvRHOm0JT\n"
    "FONABa8kdl49Go1HMA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0PAQH/BAQDAgEGMAoG\n"
    "CCqGSM49BAMCA0kAMEYCIQC/zpHLJdcRbyISWaul4jU+QwaaebXOgCX8oNVQwuWC\n"
    "2AIhANjxfbAFOIdAhDudp/RqUWanOQMs+QE003HMaBJyepYv\n"
    "-----END CERTIFICATE-----\n";
const std::string kCrlPem =
    "-----BEGIN X509 CRL-----\n"
    "MIG0MF0CAQEwCgYIKoZIzj0EAwIwHDEaMBgGA1UEAwwRZnJhbWVsaW5rIHNpdGUg\n"
    "Q0EXDTI2MTIwNDE3NTEwMFoYDzIxMjYxMTEwMTc1MTAwWqAOMAwwCgYDVR0UBAMC\n"
    "AQEwCgYIKoZIzj0EAwIDRwAwRAIgblPoZTBSyF0uhhcipvcVCEGrpl56umoFj9Zp\n"
    "r0htS+4CIFfc/1ZZBGQ+o+/QwJsWntb8DuMd4NCOaVFShqQ3AbRR\n"
    "-----END X509 CRL-----\n";

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
  if (n % 1024 == 0) return std::to_string(n / 1024) + "KiB";
  return std::to_string(n);
}

std::string quote(const std::string& s) { return "\"" + s + "\""; }

// A check that the field holds `value`.
template <typename T>
std::function<bool(const fl::Config&)> fieldEquals(T fl::Config::*field, T value) {
  return [=](const fl::Config& c) { return c.*field == value; };
}

// A value written alike in the file, on the command line and by describe().
template <typename T>
Sample literal(T fl::Config::*field, T value) {
  const std::string text = std::to_string(value);
  return {text, {text}, text, fieldEquals(field, value)};
}

// A string, quoted in the file.
Sample quoted(std::string fl::Config::*field, const std::string& value) {
  return {quote(value), {value}, value, fieldEquals(field, value)};
}

Sample textSample(const cfg::Text& t, const std::string& v, const TempDir& dir) {
  if (t.path) {
    const bool crl = t.field == &fl::Config::tls_crl_file;
    const std::string file = dir.write("sample" + v + ".pem", crl ? kCrlPem : kPem);
    return {quote("sample" + v + ".pem"), {file}, file, fieldEquals(t.field, file)};
  }
  // discovery.etcd holds URLs, discovery.dns_server an IPv4 address: a bare word is refused.
  std::string value = "sample-" + v;
  if (t.field == &fl::Config::discovery_etcd) value = "http://sample-" + v + ":2379";
  if (t.field == &fl::Config::discovery_dns_server) value = "127.0.0." + v + ":5353";
  return {quote(value), {value}, t.secret ? "<redacted>" : value, fieldEquals(t.field, value)};
}

// Lists; variant 2 goes on the command line comma-separated.
Sample idsSample(const cfg::Ids& ids, int variant) {
  if (variant == 1) {
    return {"[7, 8]", {"7", "8"}, "7,8", fieldEquals(ids.field, std::vector<uint32_t>{7, 8})};
  }
  return {"[9, 10]", {"9,10"}, "9,10", fieldEquals(ids.field, std::vector<uint32_t>{9, 10})};
}

Sample streamsSample(const cfg::Streams& st, int variant) {
  if (variant == 1) {
    return {R"(["cam0"])", {"cam0"}, "cam0", fieldEquals(st.field, std::vector<std::string>{"cam0"})};
  }
  const std::vector<std::string> both{"a.b", "c-d"};
  return {R"(["a.b", "c-d"])", {"a.b,c-d"}, "a.b,c-d", fieldEquals(st.field, both)};
}

Sample transportsSample(const cfg::Transports& t, int variant) {
  if (variant == 1) {
    return {R"(["grpc"])", {"grpc"}, "grpc", fieldEquals(t.field, std::vector<std::string>{"grpc"})};
  }
  const std::vector<std::string> both{"rdma", "tcp"};
  return {R"(["rdma", "tcp"])", {"rdma,tcp"}, "rdma,tcp", fieldEquals(t.field, both)};
}

// Two different non-default samples per option (variant 1 and 2).
Sample sampleFor(const cfg::Option& option, int variant, const TempDir& dir) {
  const fl::Config d;
  const std::string v = std::to_string(variant);
  return std::visit(Overloaded{
                        [&](const cfg::Text& t) { return textSample(t, v, dir); },
                        [&](const cfg::Choice& ch) {
                          std::vector<std::string> others;
                          for (auto choice : ch.choices) {
                            if (choice != d.*ch.field) others.emplace_back(choice);
                          }
                          return quoted(ch.field, others.at(static_cast<size_t>(variant - 1)));
                        },
                        [&](const cfg::Address& a) { return quoted(a.field, "127.0.0.1:123" + v); },
                        [&](const cfg::Number& n) {
                          const uint32_t value = d.*n.field + static_cast<uint32_t>(variant) <= n.max
                                                     ? d.*n.field + static_cast<uint32_t>(variant)
                                                     : d.*n.field - static_cast<uint32_t>(variant);
                          return literal(n.field, value);
                        },
                        [&](const cfg::Bytes& b) -> Sample {
                          // A default of 0 ("auto") has no multiple of its own.
                          const uint64_t base = d.*b.field != 0 ? d.*b.field : fl::kGiB;
                          const uint64_t value = base * static_cast<uint64_t>(variant + 1);
                          const std::string text = humanBytes(value);
                          return {std::to_string(value), {text}, text, fieldEquals(b.field, value)};
                        },
                        [&](const cfg::Count& n) {
                          return literal(n.field, d.*n.field * static_cast<uint32_t>(variant + 1));
                        },
                        [&](const cfg::Mode& m) -> Sample {
                          const uint32_t value = variant == 1 ? 0640 : 0600;
                          const std::string text = variant == 1 ? "0640" : "0600";
                          return {quote(text), {text}, text, fieldEquals(m.field, value)};
                        },
                        [&](const cfg::Cpu& cpu) { return literal(cpu.field, variant); },
                        [&](const cfg::Switch& sw) -> Sample {
                          const bool value = !(d.*sw.field);
                          const std::string text = value ? "true" : "false";
                          return {text, {}, text, fieldEquals(sw.field, value)};
                        },
                        [&](const cfg::Ids& ids) { return idsSample(ids, variant); },
                        [&](const cfg::Transports& t) { return transportsSample(t, variant); },
                        [&](const cfg::Streams& st) { return streamsSample(st, variant); },
                        [&](const cfg::FaultSpec& f) {
                          return quoted(f.field, variant == 1 ? "seed=3,drop=0.01" : "seed=4");
                        },
                        [&](const cfg::TokenFile& t) -> Sample {
                          const std::string file = dir.write("token" + v, "tok" + v + "\n");
                          return {quote("token" + v), {file}, file, [=](const fl::Config& c) {
                                    return c.*t.field == file && c.token == "tok" + v;
                                  }};
                        },
                        [&](const cfg::Peers&) { return Sample{}; },
                    },
                    option.value);
}

// A config file that sets `key = literal` in the option's section, plus what
// the option needs to be accepted alone (a certificate for the tls_ keys, and
// mutual TLS for tls_require_cert_name).
std::string fileWith(const cfg::Option& option, const std::string& literal, const TempDir& dir) {
  std::map<std::string, std::string> sections;
  if (option.key.rfind("tls_", 0) == 0) {
    const std::string base = dir.write("base.pem", kPem);
    const std::string ca = dir.write("ca.pem", kCaPem);  // the CA of kCrlPem
    for (const char* key : {"tls_cert_file", "tls_key_file", "tls_ca_file"}) {
      const bool crl_ca = option.key == "tls_crl_file" && std::string(key) == "tls_ca_file";
      if (option.key != key) sections["link"] += std::string(key) + " = " + quote(crl_ca ? ca : base) + "\n";
    }
  }
  if (option.key == "tls_require_cert_name") sections["link"] += "tls_client_auth = true\n";
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
    // id and data_listen are derived (the host name, listen's port + 1).
    if (isPeers(option) || option.key == "id" || option.key == "data_listen" ||
        option.key == "allow_unauthenticated") {
      continue;
    }
    INFO(cfg::keyName(option));
    CHECK(cfg::show(option, *c) == cfg::show(option, defaults));
    // describe() is one line of key=value words.
    CHECK(cfg::show(option, defaults).find(' ') == std::string::npos);
  }
  CHECK(cfg::defaultText(*cfg::findOption("daemon", "id")) == "hostname");
  CHECK(cfg::defaultText(*cfg::findOption("link", "data_listen")) == "listen+1");
  CHECK(cfg::defaultText(*cfg::findOption("daemon", "socket_mode")) == "\"0660\"");
  CHECK(cfg::defaultText(*cfg::findOption("daemon", "allowed_uids")) == "anyone");
  CHECK(cfg::defaultText(*cfg::findOption("link", "keepalive_ms")) == "1000");
  CHECK(cfg::defaultText(*cfg::findOption("link", "transports")) == R"(["tcp", "grpc"])");
  CHECK(cfg::defaultText(*cfg::findOption("link", "allow_unauthenticated")) == "false");
  CHECK(cfg::defaultText(*cfg::findOption("limits", "max_client_bytes")) == "\"1GiB\"");
  CHECK(cfg::defaultText(*cfg::findOption("limits", "max_total_bytes")) == "\"auto\"");
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
                   [&](const cfg::Streams&) { value = "no/name", toml = "[\"no/name\"]", flag = value; },
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

#ifdef FRAMELINK_SOURCE_DIR
// The shipped example must stay loadable as-is and, with every setting
// uncommented, must name only keys the parser knows.
TEST_CASE("packaging/framelinkd.toml documents valid keys", "[config]") {
  const std::string example = std::string(FRAMELINK_SOURCE_DIR) + "/packaging/framelinkd.toml";
  TempDir dir;
  {
    // As installed: the token file and the mutual TLS files the package
    // generates, and nothing else (in particular not allow_unauthenticated)
    // -- a secure default.
    std::ifstream original(example);
    REQUIRE(original);
    std::string as_installed((std::istreambuf_iterator<char>(original)), std::istreambuf_iterator<char>());
    const auto activate = [&](const std::string& key, const std::string& packaged, const std::string& here) {
      INFO(key << " = " << packaged);
      const auto at = as_installed.find(key + " = \"" + packaged + "\"");
      REQUIRE(at != std::string::npos);
      REQUIRE((at == 0 || as_installed[at - 1] == '\n'));  // active, not commented out
      as_installed.replace(as_installed.find(packaged, at), packaged.size(), here);
    };
    activate("token_file", "/etc/framelink/peer.token", dir.write("peer.token", "generated-secret\n"));
    const std::string cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    activate("tls_cert_file", "/etc/framelink/tls/host.crt", dir.write("host.crt", cert));
    activate("tls_key_file", "/etc/framelink/tls/host.key",
             dir.write("host.key", "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"));
    // As the package writes it before the operator adds a peer's certificate.
    activate("tls_ca_file", "/etc/framelink/tls/peers.pem", dir.write("peers.pem", "# append here\n"));
    auto installed = parseAsIs({"--config", dir.write("installed.toml", as_installed)});
    INFO((installed.ok() ? std::string() : installed.error().message));
    REQUIRE(installed.ok());
    CHECK(installed->token == "generated-secret");
    CHECK_FALSE(installed->allow_unauthenticated);
    CHECK(installed->tlsEnabled());
    CHECK(installed->tls_client_auth);
    // A dialer's certificate must name the id it claims: the shared token alone proves none.
    CHECK(installed->tls_require_cert_name);
    CHECK(installed->tls_no_peer_certs);
    CHECK(installed->tls_ca_pem == cert);
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
  // Both token and token_file are shown (and both registries, etcd and dns_srv); the parser
  // rightly refuses both at once.
  auto both = parse({"--config", file});
  REQUIRE_FALSE(both.ok());
  CHECK(both.error().message.find("keep one") != std::string::npos);
  std::string one_token;
  std::istringstream lines(text);
  while (std::getline(lines, line)) {
    if (line.rfind("token_file", 0) == 0 || line.rfind("dns_srv", 0) == 0) continue;
    one_token += line + "\n";
  }
  // The TLS files named there do not exist here: every tls_ key is known
  // (the error is about reading the file), then parse without them.
  auto tls = parse({"--config", dir.write("tls.toml", one_token)});
  REQUIRE_FALSE(tls.ok());
  CHECK(tls.error().message.find("link.tls_cert_file: cannot read '/etc/framelink/tls/host.crt'") !=
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
  CHECK(tls_keys == 7);
  auto c = parse({"--config", dir.write("one.toml", no_tls)});
  INFO((c.ok() ? std::string() : c.error().message));
  REQUIRE(c.ok());
  CHECK(routes(*c, "cam0") == "host-b");
  CHECK(c->socket_group == "framelink");
}

TEST_CASE("packaging/framelinkd.toml shows every key with its default", "[config][table]") {
  // "#key = value" (commented out) or "key = value" (set by the package), under [section].
  std::map<std::string, std::string> shown;
  std::set<std::string> set_by_package;
  std::istringstream lines(readFile(std::string(FRAMELINK_SOURCE_DIR) + "/packaging/framelinkd.toml"));
  std::string line, section;
  while (std::getline(lines, line)) {
    const bool commented = line.rfind("#", 0) == 0 && line.rfind("# ", 0) != 0;
    if (commented) line.erase(0, 1);
    if (line.rfind("[", 0) == 0) {
      section = line.substr(line.find_first_not_of('['), line.find(']') - line.find_first_not_of('['));
      continue;
    }
    const size_t eq = line.find(" = ");
    if (eq == std::string::npos || line.rfind("#", 0) == 0) continue;
    shown[section + "." + line.substr(0, eq)] = line.substr(eq + 3);
    if (!commented) set_by_package.insert(section + "." + line.substr(0, eq));
  }
  for (const auto& option : cfg::options()) {
    if (!option.in_file || isPeers(option)) continue;
    const std::string key = cfg::keyName(option);
    INFO("packaging/framelinkd.toml must show " << key << ", commented out, with its default");
    REQUIRE(shown.count(key) == 1);
    // Keys without a default show an example instead.
    const std::string literal = cfg::tomlValue(option, fl::Config{});
    if (!literal.empty() && set_by_package.count(key) == 0) CHECK(shown[key] == literal);
  }
  for (const auto& [key, value] : shown) {
    INFO(key);
    CHECK((key.rfind("peer.", 0) == 0 ||
           cfg::findOption(key.substr(0, key.find('.')), key.substr(key.find('.') + 1))));
  }
}

TEST_CASE("the documentation's configuration table is the option table", "[config][table]") {
  const std::string page = readFile(std::string(FRAMELINK_SOURCE_DIR) + "/docs/reference/configuration.md");
  const std::string begin = "<!-- BEGIN config-reference";
  const std::string end = "<!-- END config-reference -->";
  const size_t from = page.find(begin);
  REQUIRE(from != std::string::npos);
  const size_t body = page.find('\n', from) + 1;
  const size_t to = page.find(end, body);
  REQUIRE(to != std::string::npos);
  INFO(
      "docs/reference/configuration.md's table differs from the option table "
      "(proxy/config/config_options.cpp); "
      "regenerate it: scripts/update-config-reference.sh build/proxy/framelinkd");
  CHECK(page.substr(body, to - body) == fl::configReference());

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
