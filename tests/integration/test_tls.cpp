// TLS on the gRPC link between two real daemons, with certificates made by
// `openssl` for this run: mutual TLS carries frames; a peer whose certificate
// the listener's CA did not sign, a plaintext peer, and a dialer that expects
// another name in the listener's certificate get nothing through, and the
// listener keeps serving a peer with the right certificate.
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"
#include "site_ca.h"

using namespace framelink::integ;

namespace {

// A throw-away PKI: a CA signing hostA, hostB and hostC (each certificate
// names its host and 127.0.0.1), and a second, unrelated CA signing "rogue".
class TestPki {
 public:
  TestPki() {
    REQUIRE(std::system("command -v openssl >/dev/null 2>&1") == 0);  // scripts/setup-deps.sh installs it
    makeCa("ca");
    makeCa("rogue-ca");
    for (const char* host : {"hostA", "hostB", "hostC"}) issue(host, "ca");
    issue("rogue", "rogue-ca");
  }

  std::string file(const std::string& name) const { return dir_.file(name); }
  // --tls-cert/--tls-key of `who`, the CA to trust, and mutual TLS.
  std::vector<std::string> args(const std::string& who, const std::string& ca = "ca") const {
    return {"--tls-cert", file(who + ".pem"), "--tls-key",        file(who + ".key"),
            "--tls-ca",   file(ca + ".pem"),  "--tls-client-auth"};
  }

 private:
  void run(const std::string& command) const {
    const std::string line = "cd '" + dir_.path() + "' && " + command + " >>openssl.log 2>&1";
    INFO("openssl: " << line << "\n" << readFile(dir_.file("openssl.log")));
    REQUIRE(std::system(line.c_str()) == 0);
  }
  void makeCa(const std::string& name) const {
    run("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=" + name +
        " -keyout " + name + ".key -out " + name + ".pem");
  }
  void issue(const std::string& host, const std::string& ca) const {
    std::ofstream(dir_.file(host + ".ext")) << "subjectAltName=DNS:" << host << ",IP:127.0.0.1\n";
    run("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=" + host + " -keyout " +
        host + ".key -out " + host + ".csr");
    run("openssl x509 -req -in " + host + ".csr -CA " + ca + ".pem -CAkey " + ca +
        ".key -CAcreateserial -days 2" + " -extfile " + host + ".ext -out " + host + ".pem");
  }

  TempDir dir_{"fl-tls"};
};

}  // namespace

TEST_CASE("tls: mutual TLS between two daemons carries frames", "[integration][tls]") {
  const std::string transport = GENERATE(as<std::string>{}, "grpc", "tcp");
  INFO("transport " << transport);
  TestPki pki;
  DaemonPair::Options opt;
  opt.transport = transport;
  opt.extra_args_a = pki.args("hostA");
  opt.extra_args_b = pki.args("hostB");
  DaemonPair pair(opt);

  requireServing(pair.a(), pair.b(), "tls-" + transport, 5);
  // The start-up log says which certificate and that TLS is mutual.
  CHECK(pair.b().log().find("tls_cert_file=" + pki.file("hostB.pem")) != std::string::npos);
  CHECK(pair.b().log().find("tls_client_auth=true") != std::string::npos);
  const bool warned = pair.a().log().find("authenticated but not encrypted") != std::string::npos;
  CHECK(warned == (transport == "tcp"));  // the operator learns that tcp frames are not encrypted
}

TEST_CASE("tls: a peer the listener cannot verify, or that cannot verify it, gets nothing through",
          "[integration][tls]") {
  struct Case {
    const char* what;
    std::vector<std::string> a_args;  // A's TLS flags (B: mutual TLS with hostB's certificate)
    bool a_has_tls;
  };
  TestPki pki;
  const Case c = GENERATE_REF(values<Case>({
      {"A's certificate is signed by another CA", {}, true},
      {"A speaks plaintext", {}, false},
      {"A expects another name in B's certificate", {"--tls-server-name", "hostZ"}, true},
  }));
  INFO(c.what);
  std::vector<std::string> a_args = c.a_args;
  if (c.a_has_tls) {
    const bool rogue = std::string(c.what).find("another CA") != std::string::npos;
    a_args = concat(rogue ? pki.args("rogue", "ca") : pki.args("hostA"), a_args);
  }
  DaemonPair::Options opt;
  opt.transport = "grpc";
  opt.extra_args = {"--credit-timeout-ms", "1500"};
  opt.extra_args_a = a_args;
  opt.extra_args_b = pki.args("hostB");
  DaemonPair pair(opt);

  Client consumer = attachConsumer(pair.b(), "tls-refused", 4, 64 * 1024);
  Client producer = attachProducer(pair.a(), "tls-refused", 4, 64 * 1024);
  submitFrame(producer.get(), 1, 1000);
  submitFrame(producer.get(), 2, 2000);
  auto done = collectCompletions(producer.get(), 2, Millis(20000));
  REQUIRE(done.size() == 2);
  for (const auto& d : done) {
    INFO("frame " << d.frame_id << " completion " << statusName(d.status));
    CHECK(d.status == FL_ERR_NO_LINK);  // the link never came up
  }
  fl_frame none{};
  CHECK(fl_receive(consumer.get(), &none, 0) == FL_EAGAIN);
  if (c.a_has_tls) {
    INFO("A must say why its link does not come up");
    CHECK(waitUntil([&] { return pair.a().log().find("no TLS connection yet") != std::string::npos; },
                    Millis(5000), Millis(50)));
  }
  REQUIRE(pair.a().alive());
  REQUIRE(pair.b().alive());

  // B still serves a peer whose certificate its CA signed.
  DaemonProcess::Options good;
  good.id = "hostC";
  good.token = "integ-secret";
  good.transports = "grpc";
  good.peers = {"hostB=" + pair.b().grpcAddress()};
  good.extra_args = pki.args("hostC");
  DaemonProcess peer_c(good);
  requireServing(peer_c, pair.b(), "tls-ok");
}

TEST_CASE("tls: a dialer whose certificate names another daemon than it claims is refused",
          "[integration][tls][identity]") {
  struct Case {
    const char* what;
    bool per_peer;  // [[peer]] cert_name on the listener, else link.tls_require_cert_name
  };
  const Case c =
      GENERATE(values<Case>({{"link.tls_require_cert_name", false}, {"[[peer]] cert_name", true}}));
  INFO(c.what);
  TestPki pki;
  TempDir dir("fl-tls-id");
  DaemonProcess::Options listener;
  listener.id = "hostB";
  listener.token = "integ-secret";
  listener.transports = "grpc";
  listener.extra_args = concat(pki.args("hostB"), {"--metrics", "127.0.0.1:0"});
  const std::string claimed = c.per_peer ? "a" : "hostA";
  if (c.per_peer) {
    const std::string file = dir.file("b.toml");
    std::ofstream(file) << "[[peer]]\nname = \"a\"\ncert_name = \"hostA\"\n";
    listener.extra_args = concat(listener.extra_args, {"--config", file});
  } else {
    listener.extra_args.push_back("--tls-require-cert-name");
  }
  DaemonProcess b(listener);

  DaemonProcess::Options honest;
  honest.id = claimed;
  honest.token = "integ-secret";
  honest.transports = "grpc";
  honest.peers = {"hostB=" + b.grpcAddress()};
  honest.extra_args = pki.args("hostA");
  DaemonProcess a(honest);
  requireServing(a, b, "tls-id-ok");

  DaemonProcess::Options impostor = honest;
  impostor.extra_args = pki.args("hostC");  // signed by the same CA, but names hostC
  DaemonProcess c_daemon(impostor);
  CHECK(waitUntil([&] { return b.metric("framelink_peer_identity_refused_total") >= 1; }, Millis(10000),
                  Millis(50)));
  CHECK(b.waitForLog("claims to be '" + claimed + "'", Millis(5000)));
  requireServing(a, b, "tls-id-still");
  CHECK(b.metric("framelink_links_up") == 1);
}

TEST_CASE("tls: a peer removed by a reload whose certificate still proves its id keeps its link",
          "[integration][tls]") {
  // Its certificate (and the shared token) would let it dial straight in
  // again: cutting its session would only make the link flap.
  TestPki pki;
  TempDir dir("fl-tls-reload");
  const std::string file = dir.file("b.toml");
  std::ofstream(file) << "[[peer]]\nname = \"hostA\"\ncert_name = \"hostA\"\n";
  DaemonProcess::Options listener;
  listener.id = "hostB";
  listener.token = "integ-secret";
  listener.transports = "grpc";
  listener.extra_args =
      concat(pki.args("hostB"), {"--metrics", "127.0.0.1:0", "--tls-require-cert-name", "--config", file});
  DaemonProcess b(listener);
  DaemonProcess::Options dialer;
  dialer.id = "hostA";
  dialer.token = "integ-secret";
  dialer.transports = "grpc";
  dialer.peers = {"hostB=" + b.grpcAddress()};
  dialer.extra_args = concat(pki.args("hostA"), {"--metrics", "127.0.0.1:0"});
  DaemonProcess a(dialer);
  requireServing(a, b, "tls-reload-before");
  REQUIRE(a.metric("framelink_link_failures_total") == 0);

  std::ofstream(file, std::ios::trunc) << "# hostA removed\n";
  REQUIRE(::kill(b.pid(), SIGHUP) == 0);
  CHECK(
      b.waitForLog("reload: [[peer]] hostA removed (no longer dialed; it may still dial in", Millis(10000)));
  std::this_thread::sleep_for(Millis(1500));
  CHECK(a.metric("framelink_link_failures_total") == 0);
  CHECK(b.metric("framelink_links_up") == 1);
  requireServing(a, b, "tls-reload-after");
}

TEST_CASE("tls: a CA appended to tls_ca_file is trusted within seconds, without a restart or a reload",
          "[integration][tls]") {
  // B starts as the package leaves it: a tls_ca_file with no certificate in
  // it.  Its gRPC's default roots hold the CA that signed A (as if it were in
  // the system's store): an empty trust file must still trust no one.
  TestPki pki;
  TempDir dir("fl-tls-watch");
  const std::string trust = dir.file("peers.pem");
  std::ofstream(trust) << "# the certificates of the peers this daemon trusts\n";
  REQUIRE(::setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", pki.file("ca.pem").c_str(), 1) == 0);
  DaemonProcess::Options listener;
  listener.id = "hostB";
  listener.token = "integ-secret";
  listener.transports = "grpc";
  listener.extra_args = {"--tls-cert", pki.file("hostB.pem"), "--tls-key", pki.file("hostB.key"), "--tls-ca",
                         trust,        "--tls-client-auth",   "--metrics", "127.0.0.1:0"};
  DaemonProcess b(listener);
  ::unsetenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH");
  CHECK(b.waitForLog("holds no peer certificate yet", Millis(5000)));
  DaemonProcess::Options dialer;
  dialer.id = "hostA";
  dialer.token = "integ-secret";
  dialer.transports = "grpc";
  dialer.peers = {"hostB=" + b.grpcAddress()};
  dialer.extra_args = concat(pki.args("hostA"), {"--metrics", "127.0.0.1:0", "--reconnect-max-ms", "500"});
  DaemonProcess a(dialer);
  // Refused while B trusts no one: A's dials fail for twice the files' refresh.
  CHECK(a.waitForLog("no TLS connection yet", Millis(10000)));
  std::this_thread::sleep_for(Millis(2 * 5000));
  CHECK(b.metric("framelink_links_up") == 0);

  // The operator appends the CA (for a self-signed host certificate: the host's certificate).
  std::ofstream(trust, std::ios::app) << readFile(pki.file("ca.pem"));
  INFO("B's log:\n" << b.log());
  REQUIRE(waitUntil([&] { return b.metric("framelink_links_up") == 1; }, Millis(15000), Millis(100)));
  requireServing(a, b, "tls-watch");
  // A reload reports the change as applied, not as one for the next restart.
  REQUIRE(::kill(b.pid(), SIGHUP) == 0);
  CHECK(b.waitForLog("reload: [link] tls_ca_file: the certificates in it changed", Millis(10000)));
  CHECK(b.log().find("at the next restart") == std::string::npos);

  // A dialer whose trust file is empty trusts no listener either, though its
  // default roots would.
  const std::string none = dir.file("c-peers.pem");
  std::ofstream(none) << "";
  REQUIRE(::setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", pki.file("ca.pem").c_str(), 1) == 0);
  DaemonProcess::Options lonely;
  lonely.id = "hostC";
  lonely.token = "integ-secret";
  lonely.transports = "grpc";
  lonely.peers = {"hostB=" + b.grpcAddress()};
  lonely.extra_args = {
      "--tls-cert",        pki.file("hostC.pem"), "--tls-key", pki.file("hostC.key"), "--tls-ca", none,
      "--tls-client-auth", "--reconnect-max-ms",  "500"};
  DaemonProcess c(lonely);
  ::unsetenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH");
  CHECK(c.waitForLog("no TLS connection yet", Millis(10000)));
  std::this_thread::sleep_for(Millis(3000));
  CHECK(b.metric("framelink_links_up") == 1);  // A's alone
  // The control: with no tls_ca_file at all, those default roots are what a
  // dialer trusts (the system's store, as documented), and it links.
  REQUIRE(::setenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", pki.file("ca.pem").c_str(), 1) == 0);
  lonely.id = "hostD";
  lonely.extra_args = {"--tls-cert", pki.file("hostC.pem"), "--tls-key", pki.file("hostC.key")};
  DaemonProcess d(lonely);
  ::unsetenv("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH");
  CHECK(waitUntil([&] { return b.metric("framelink_links_up") == 2; }, Millis(15000), Millis(100)));
}

TEST_CASE(
    "tls: hosts with certificates from the site CA link as the ids they name; a new host touches only itself",
    "[integration][tls]") {
  const SiteCa site("fl-site-ca", {"hostA", "hostB", "hostC"});
  auto tls = [&](const std::string& host) { return site.tls(host); };
  DaemonProcess::Options listener;
  listener.id = "hostB";
  listener.token = "integ-secret";
  listener.transports = "grpc";
  listener.extra_args = concat(tls("hostB"), {"--metrics", "127.0.0.1:0"});
  DaemonProcess b(listener);  // no [[peer]]: it names none of the hosts that dial it
  DaemonProcess::Options dialer;
  dialer.token = "integ-secret";
  dialer.transports = "grpc";
  dialer.peers = {"hostB=" + b.grpcAddress()};
  dialer.id = "hostA";
  dialer.extra_args = tls("hostA");
  DaemonProcess a(dialer);
  requireServing(a, b, "site-ca-a");
  // A host added later: its own certificate and configuration, nothing changed on B.
  dialer.id = "hostC";
  dialer.extra_args = tls("hostC");
  DaemonProcess c(dialer);
  requireServing(c, b, "site-ca-c");
  CHECK(b.metric("framelink_links_up") == 2);
  // A certificate the CA issued to another host does not pass for hostD.
  dialer.id = "hostD";
  dialer.extra_args = tls("hostA");
  DaemonProcess impostor(dialer);
  CHECK(waitUntil([&] { return b.metric("framelink_peer_identity_refused_total") >= 1; }, Millis(10000),
                  Millis(50)));
  CHECK(b.waitForLog("claims to be 'hostD'", Millis(5000)));
  CHECK(b.metric("framelink_links_up") == 2);
}

TEST_CASE("tls: a reload with the site CA's new CRL cuts the revoked host's link and refuses it, either way",
          "[integration][tls]") {
  const SiteCa site("fl-site-crl", {"hostA", "hostB", "hostC"});
  const std::string crl = site.file("crl.pem");  // what the hosts read: the CA's CRL, copied
  auto publish = [&] {
    REQUIRE(std::system(("cp '" + site.file("ca/crl.pem") + "' '" + crl + "'").c_str()) == 0);
  };
  publish();
  auto tls = [&](const std::string& host) { return concat(site.tls(host), {"--tls-crl", crl}); };
  DaemonProcess::Options options;
  options.token = "integ-secret";
  options.transports = "grpc";
  options.id = "hostB";
  options.extra_args = concat(tls("hostB"), {"--metrics", "127.0.0.1:0"});
  DaemonProcess b(options);
  options.peers = {"hostB=" + b.grpcAddress()};
  options.id = "hostA";
  options.extra_args = concat(tls("hostA"), {"--reconnect-max-ms", "500", "--metrics", "127.0.0.1:0"});
  DaemonProcess a(options);
  requireServing(a, b, "crl-before");
  REQUIRE(b.metric("framelink_links_up") == 1);

  // hostA's key is lost: the CA revokes it, B gets the new CRL and reloads.
  site.run("revoke '" + site.file("ca") + "' hostA");
  publish();
  const int64_t refused = b.metric("framelink_peer_identity_refused_total");
  REQUIRE(::kill(b.pid(), SIGHUP) == 0);
  CHECK(b.waitForLog("1 certificates revoked (links of those peers are cut", Millis(10000)));
  // The link up is cut at once, by B, and says why; A's redials are refused from then on.
  CHECK(b.waitForLog("peer hostA: link cut: its certificate", Millis(10000)));
  CHECK(waitUntil([&] { return b.metric("framelink_links_up") == 0; }, Millis(10000), Millis(50)));
  CHECK(waitUntil([&] { return b.metric("framelink_peer_identity_refused_total") >= refused + 2; },
                  Millis(10000), Millis(50)));
  CHECK(b.waitForLog("is revoked by the CRL of", Millis(5000)));
  std::this_thread::sleep_for(Millis(1500));  // three redials of A
  CHECK(b.metric("framelink_links_up") == 0);
  CHECK(a.metric("framelink_links_up") == 0);

  // A dialer with the CRL refuses a listener whose certificate it lists.
  options.peers = {"hostA=" + a.grpcAddress()};
  options.id = "hostC";
  options.extra_args = concat(tls("hostC"), {"--metrics", "127.0.0.1:0"});
  DaemonProcess c(options);
  CHECK(c.waitForLog("not linked: its certificate", Millis(10000)));
  CHECK(c.metric("framelink_links_up") == 0);
  CHECK(c.metric("framelink_peer_identity_refused_total") >= 1);

  // A CRL that another CA signed counts for nothing: the configuration is refused, saying why.
  site.run("init '" + site.file("other-ca") + "'");
  std::vector<std::string> check = {"--check-config"};
  for (std::string arg : tls("hostB")) check.push_back(arg == crl ? site.file("other-ca/crl.pem") : arg);
  ChildProcess checked("check-other-crl", check, {}, daemonBinary());
  CHECK(checked.wait(Millis(10000)) == 2);
  CHECK(checked.output().find("is not signed by a CA of link.tls_ca_file") != std::string::npos);
}
