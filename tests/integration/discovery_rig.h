// Shared by the [discovery] tests: a real etcd and a real dnsmasq, each on
// loopback ports of its own, and daemons that find each other through them.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "client_util.h"
#include "common/base64.h"
#include "framelink/framelink.h"
#include "harness.h"

namespace framelink::integ {

inline uint16_t freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// One etcd member on loopback, its data in a temp dir that outlives a kill
// (start() again brings the same store back).
class Etcd {
 public:
  Etcd() : client_port_(freePort()), peer_port_(freePort()) { start(); }

  void start() {
    const std::string binary = "/usr/bin/etcd";
    INFO("the discovery tests need etcd: apt-get install etcd-server (scripts/setup-deps.sh installs it)");
    REQUIRE(::access(binary.c_str(), X_OK) == 0);
    const std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    process_ = std::make_unique<ChildProcess>(
        "etcd",
        std::vector<std::string>{"--name", "fl", "--data-dir", dir_.file("data"), "--listen-client-urls",
                                 client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
                                 "--initial-advertise-peer-urls", peer, "--initial-cluster", "fl=" + peer,
                                 "--log-level", "warn"},
        std::vector<std::string>{}, binary);
    REQUIRE(waitUntil(
        [&] { return post("/v3/kv/range", R"({"key":"Lw=="})").find("header") != std::string::npos; },
        Millis(20000), Millis(100)));
  }
  void kill9() { process_->kill9(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(client_port_); }

  // The reply's body, "" when etcd did not answer.
  std::string post(const std::string& path, const std::string& body) const {
    httplib::Client c(url());
    c.set_connection_timeout(std::chrono::seconds(1));
    auto res = c.Post(path, body, "application/json");
    return res ? res->body : std::string();
  }
  void put(const std::string& key, const std::string& value) const {
    REQUIRE(post("/v3/kv/put", R"({"key":")" + framelink::base64Encode(key) + R"(","value":")" +
                                   framelink::base64Encode(value) + "\"}")
                .find("header") != std::string::npos);
  }

 private:
  TempDir dir_{"fl-etcd"};
  uint16_t client_port_, peer_port_;
  std::unique_ptr<ChildProcess> process_;
};

// dnsmasq on a loopback port of its own, serving _framelink._tcp.fl.test: an
// SRV record per daemon (its host NAME.fl.test, its gRPC port) and the
// host's A record.  serve() again replaces the records (dnsmasq reads its
// command line once: it is started again, as a DNS server's update would be).
class DnsMasq {
 public:
  static constexpr const char* kName = "_framelink._tcp.fl.test";
  struct Record {
    std::string host;
    std::string ip;
    uint16_t port;
  };

  DnsMasq() : port_(freePort()) {}
  void serve(const std::vector<Record>& records) {
    const std::string binary = "/usr/sbin/dnsmasq";
    INFO("the DNS SRV tests need dnsmasq: apt-get install dnsmasq-base (scripts/setup-deps.sh installs it)");
    REQUIRE(::access(binary.c_str(), X_OK) == 0);
    stop();
    std::vector<std::string> args{"--keep-in-foreground",
                                  "--conf-file=/dev/null",
                                  "--port=" + std::to_string(port_),
                                  "--listen-address=127.0.0.1",
                                  "--bind-interfaces",
                                  "--no-resolv",
                                  "--no-hosts",
                                  "--pid-file=",
                                  "--log-facility=-"};
    if (::getuid() == 0) args.push_back("--user=root");  // else it would drop to nobody
    for (const Record& r : records) {
      args.push_back("--srv-host=" + std::string(kName) + "," + r.host + ".fl.test," +
                     std::to_string(r.port));
      args.push_back("--host-record=" + r.host + ".fl.test," + r.ip);
    }
    process_ = std::make_unique<ChildProcess>("dnsmasq", args, std::vector<std::string>{}, binary);
    REQUIRE(waitUntil([&] { return process_->output().find("started") != std::string::npos; }, Millis(5000)));
  }
  void stop() {
    if (process_) process_->kill9();
    process_.reset();
  }
  std::string server() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  uint16_t port_;
  std::unique_ptr<ChildProcess> process_;
};

inline DaemonProcess::Options srvMember(const std::string& id, const DnsMasq& dns, const std::string& token) {
  DaemonProcess::Options o;
  o.id = id;
  o.token = token;
  o.transports = "tcp";
  o.extra_args = {
      "--dns-srv", DnsMasq::kName, "--dns-server", dns.server(), "--dns-refresh-s", "1", "--link-idle-s",
      "2",         "--metrics",    "127.0.0.1:0"};
  return o;
}

inline DaemonProcess::Options fleetMember(const std::string& id, const Etcd& etcd,
                                          const std::string& lease_ttl_s = "3") {
  DaemonProcess::Options o;
  o.id = id;
  o.token = "fleet-secret";
  o.transports = "tcp";
  // poll_ms stays its default (30 s): what changes here is told at once.
  o.extra_args = {"--etcd",        etcd.url(), "--lease-ttl-s", lease_ttl_s,
                  "--link-idle-s", "2",        "--metrics",     "127.0.0.1:0"};
  return o;
}

// One frame from `producer` to `consumer`, verified, DELIVERED.
inline void sendOne(fl_client* producer, fl_client* consumer, uint64_t id) {
  const uint64_t length = 4096 + id * 17;
  submitFrame(producer, id, length, true);
  fl_frame f = receiveFrame(consumer, Millis(15000));
  checkSyntheticFrame(f, id, length);
  REQUIRE(fl_release(consumer, f.slot) == FL_OK);
  auto done = collectCompletions(producer, 1, Millis(15000));
  REQUIRE(done.size() == 1);
  INFO("completion of frame " << id << ": " << statusName(done[0].status));
  CHECK(done[0].status == FL_OK);
}

}  // namespace framelink::integ
