// [discovery]: daemons with no [[peer]] find each other in a real etcd
// (Debian's etcd-server, started here on ports of its own), link once per
// pair, route a stream to the daemons that announced readers of it, refuse an
// entry whose address answers with another id, and keep what runs while etcd
// is away.  The same through DNS SRV records, served by a real dnsmasq.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <openssl/evp.h>
#include <catch2/catch.hpp>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "framelink/v1/link.grpc.pb.h"
#include "harness.h"
#include "site_ca.h"

using namespace framelink::integ;

namespace {

uint16_t freePort() {
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

std::string base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
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
    REQUIRE(post("/v3/kv/put", R"({"key":")" + base64(key) + R"(","value":")" + base64(value) + "\"}")
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

DaemonProcess::Options srvMember(const std::string& id, const DnsMasq& dns, const std::string& token) {
  DaemonProcess::Options o;
  o.id = id;
  o.token = token;
  o.transports = "tcp";
  o.extra_args = {"--dns-srv", DnsMasq::kName, "--dns-server", dns.server(),    "--dns-refresh-s",
                  "1",         "--poll-ms",    "200",          "--link-idle-s", "2",
                  "--metrics", "127.0.0.1:0"};
  return o;
}

DaemonProcess::Options fleetMember(const std::string& id, const Etcd& etcd) {
  DaemonProcess::Options o;
  o.id = id;
  o.token = "fleet-secret";
  o.transports = "tcp";
  o.extra_args = {"--etcd", etcd.url(),      "--poll-ms", "200",       "--lease-ttl-s",
                  "3",      "--link-idle-s", "2",         "--metrics", "127.0.0.1:0"};
  return o;
}

// One frame from `producer` to `consumer`, verified, DELIVERED.
void sendOne(fl_client* producer, fl_client* consumer, uint64_t id) {
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

// Three daemons of one fleet, and its etcd.
struct ThreeHosts {
  Etcd etcd;
  DaemonProcess a{fleetMember("disc-a", etcd)};
  DaemonProcess b{fleetMember("disc-b", etcd)};
  DaemonProcess c{fleetMember("disc-c", etcd)};

  // A consumer of `stream` on C, once A has seen it in the registry.
  Client readerOnC(const std::string& stream, uint32_t slots) {
    Client on_c = attachConsumer(c, stream, slots, 256 * 1024);
    REQUIRE(a.waitForLog("disc-c changed (not dialed from here; readers: " + stream + " [queue group])",
                         Millis(10000)));
    return on_c;
  }
};

}  // namespace

TEST_CASE(
    "discovery: daemons with no [[peer]] find each other in etcd; links and frames go where readers are",
    "[integration][discovery]") {
  ThreeHosts fleet;
  DaemonProcess& a = fleet.a;
  DaemonProcess& b = fleet.b;
  DaemonProcess& c = fleet.c;
  // Each finds the other two, and links to none: no stream needs it.
  for (DaemonProcess* d : {&a, &b, &c}) {
    INFO(d->id());
    CHECK(waitForMetric(*d, "framelink_discovery_peers", 2) == 2);
    CHECK(d->metric("framelink_discovery_registry_up") == 1);
    CHECK(d->metric("framelink_links_up") == 0);
  }
  CHECK(a.waitForLog("discovery: disc-c found (not dialed from here; no readers)", Millis(1000)));

  // A reader on C, then a producer of its stream on A: A dials C and the frames go there.
  Client on_c = fleet.readerOnC("inspect", 4);
  Client producer = attachProducer(a, "inspect", 4, 256 * 1024);
  REQUIRE(a.waitForLog("disc-c changed (dialed at 127.0.0.1:" + std::to_string(c.grpcPort()) +
                           "; readers: inspect [queue group])",
                       Millis(10000)));
  for (uint64_t id = 1; id <= 3; ++id) sendOne(producer.get(), on_c.get(), id);
  CHECK(a.metric("framelink_links_up") == 1);
  CHECK(b.metric("framelink_links_up") == 0);

  // A subscriber on a second host: A dials B as well, and each frame goes to both.
  Client on_b = attachWith(b, FL_ROLE_CONSUMER, "inspect", true, 4, 256 * 1024);
  REQUIRE(a.waitForLog("disc-b changed (dialed at 127.0.0.1:" + std::to_string(b.grpcPort()) +
                           "; readers: inspect [subscribers])",
                       Millis(10000)));
  REQUIRE(a.waitForLog("is now routed to disc-b, disc-c", Millis(10000)));
  for (uint64_t id = 4; id <= 6; ++id) {
    submitFrame(producer.get(), id, 4096, true);
    for (fl_client* reader : {on_b.get(), on_c.get()}) {
      fl_frame f = receiveFrame(reader, Millis(15000));
      checkSyntheticFrame(f, id, 4096);
      REQUIRE(fl_release(reader, f.slot) == FL_OK);
    }
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
  }
  CHECK(waitForMetric(a, "framelink_links_up", 2) == 2);
  CHECK(b.metric("framelink_links_up") == 1);  // the link A dialed, no second one B-C

  // The producer leaves: its links end link_idle_s (2 s) later.
  producer.reset();
  CHECK(a.waitForLog("disc-c changed (not dialed from here; readers: inspect [queue group])", Millis(15000)));
  CHECK(waitUntil([&] { return a.metric("framelink_links_up") == 0; }, Millis(10000), Millis(100)));
}

TEST_CASE(
    "discovery: a host whose reader comes while the producer's frames are in flight gets its next frame",
    "[integration][discovery]") {
  ThreeHosts fleet;
  DaemonProcess& a = fleet.a;
  Client on_c = fleet.readerOnC("busy", 8);
  Client producer = attachProducer(a, "busy", 8, 256 * 1024);
  // C holds frames 1-3: they stay in flight (no ACK before C's release).
  std::vector<fl_frame> held;
  for (uint64_t id = 1; id <= 3; ++id) {
    submitFrame(producer.get(), id, 4096, true);
    held.push_back(receiveFrame(on_c.get(), Millis(15000)));
    checkSyntheticFrame(held.back(), id, 4096);
  }
  // A subscriber on B: the producer's next frame goes to B too, its frames in flight notwithstanding.
  Client on_b = attachWith(fleet.b, FL_ROLE_CONSUMER, "busy", true, 8, 256 * 1024);
  REQUIRE(a.waitForLog("stream 'busy' is now routed to disc-b, disc-c (was disc-c)", Millis(10000)));
  CHECK(a.waitForLog("its frames in flight keep the routes they had", Millis(1000)));
  submitFrame(producer.get(), 4, 4096, true);
  for (fl_client* reader : {on_b.get(), on_c.get()}) {
    fl_frame f = receiveFrame(reader, Millis(15000));
    checkSyntheticFrame(f, 4, 4096);
    REQUIRE(fl_release(reader, f.slot) == FL_OK);
  }
  for (const fl_frame& f : held) REQUIRE(fl_release(on_c.get(), f.slot) == FL_OK);
  // Frames 1-3 went to C alone, and frame 4 to both: each is DELIVERED, with its readers.
  auto done = collectCompletions(producer.get(), 4, Millis(15000));
  REQUIRE(done.size() == 4);
  for (const fl_completion& d : done) {
    INFO("frame " << d.frame_id << ": " << statusName(d.status));
    CHECK(d.status == FL_OK);
    CHECK(d.readers == (d.frame_id == 4 ? 2U : 1U));
  }

  // B's subscriber leaves while C holds frame 5: the next frame goes to C alone, at once (not to B,
  // where it would wait credit_timeout_ms for a reader), though frame 5 is in flight.
  submitFrame(producer.get(), 5, 4096, true);
  fl_frame on_b_5 = receiveFrame(on_b.get(), Millis(15000));
  REQUIRE(fl_release(on_b.get(), on_b_5.slot) == FL_OK);
  fl_frame held_5 = receiveFrame(on_c.get(), Millis(15000));
  on_b.reset();
  REQUIRE(a.waitForLog(
      "disc-b changed (dialed at 127.0.0.1:" + std::to_string(fleet.b.grpcPort()) + "; no readers)",
      Millis(10000)));
  submitFrame(producer.get(), 6, 4096, true);
  fl_frame f6 = receiveFrame(on_c.get(), Millis(15000));
  checkSyntheticFrame(f6, 6, 4096);
  REQUIRE(fl_release(on_c.get(), held_5.slot) == FL_OK);
  REQUIRE(fl_release(on_c.get(), f6.slot) == FL_OK);
  done = collectCompletions(producer.get(), 2, Millis(10000));
  REQUIRE(done.size() == 2);
  for (const fl_completion& d : done) {
    INFO("frame " << d.frame_id << ": " << statusName(d.status));
    CHECK(d.status == FL_OK);
    CHECK(d.readers == (d.frame_id == 5 ? 2U : 1U));
  }
}

namespace {

// Takes the frame waiting for `reader`, if one comes within `wait`: checked, released, its flags.
std::optional<uint32_t> takeFrame(fl_client* reader, uint64_t id, Millis wait) {
  fl_frame f{};
  if (fl_receive(reader, &f, static_cast<int>(wait.count())) != FL_OK) return std::nullopt;
  checkSyntheticFrame(f, id, 4096);
  const uint32_t flags = f.flags;
  REQUIRE(fl_release(reader, f.slot) == FL_OK);
  return flags;
}

}  // namespace

TEST_CASE(
    "discovery: a queue group on three hosts gets each frame once, on one of them; a subscriber gets every "
    "frame",
    "[integration][discovery][groups]") {
  ThreeHosts fleet;
  DaemonProcess& a = fleet.a;
  // The group "line": a member on each host, the producer's own included; a subscriber on A and on B.
  Client a_sub = attachWith(a, FL_ROLE_CONSUMER, "line", true, 8, 256 * 1024);
  Client b_sub = attachWith(fleet.b, FL_ROLE_CONSUMER, "line", true, 8, 256 * 1024);
  Client b_member = attachConsumer(fleet.b, "line", 8, 256 * 1024);
  Client c_member = attachConsumer(fleet.c, "line", 8, 256 * 1024);
  Client a_member = attachConsumer(a, "line", 8, 256 * 1024);
  REQUIRE(a.waitForLog("disc-b changed (not dialed from here; readers: line [subscribers, queue group])",
                       Millis(10000)));
  REQUIRE(a.waitForLog("disc-c changed (not dialed from here; readers: line [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "line", 8, 256 * 1024);
  CHECK(a.waitForLog("readers: line [subscribers, queue group])", Millis(10000)));

  constexpr uint64_t kFrames = 30;
  std::vector<fl_client*> members{a_member.get(), b_member.get(), c_member.get()};
  std::vector<uint64_t> got(members.size(), 0);
  // Frames each subscriber was told a member on another host had.
  uint64_t flagged_a = 0;
  uint64_t flagged_b = 0;
  for (uint64_t id = 1; id <= kFrames; ++id) {
    submitFrame(producer.get(), id, 4096, true);
    for (auto [reader, flagged] : {std::pair{a_sub.get(), &flagged_a}, std::pair{b_sub.get(), &flagged_b}}) {
      auto flags = takeFrame(reader, id, Millis(15000));
      REQUIRE(flags.has_value());
      *flagged += (*flags & FL_SLOT_GROUP_ELSEWHERE) != 0 ? 1 : 0;
    }
    // One member has it: each is looked at in turn until one does.
    bool taken = false;
    for (int round = 0; round < 1500 && !taken; ++round) {
      for (size_t m = 0; m < members.size() && !taken; ++m) {
        if (takeFrame(members[m], id, Millis(0))) {
          ++got[m];
          taken = true;
        }
      }
      if (!taken) std::this_thread::sleep_for(Millis(10));
    }
    INFO("frame " << id);
    REQUIRE(taken);
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
    CHECK(done[0].readers == 3);  // the two subscribers and one member
  }
  // No member got a frame twice, nor one another had.
  for (fl_client* m : members) {
    fl_frame extra{};
    CHECK(fl_receive(m, &extra, 300) != FL_OK);
  }
  INFO("frames on A, B, C: " << got[0] << ", " << got[1] << ", " << got[2]);
  CHECK(got[0] + got[1] + got[2] == kFrames);
  for (uint64_t n : got) CHECK(n > 0);
  // Each frame whose share went to another host's member went to each subscriber for it alone.
  CHECK(flagged_a == kFrames - got[0]);
  CHECK(flagged_b == kFrames - got[1]);
  CHECK(a.metric("framelink_frames_subscribers_only_total") == static_cast<int64_t>(kFrames - got[1]));
}

TEST_CASE(
    "discovery: an entry whose address answers with another id is refused and counted; a malformed one "
    "is left out",
    "[integration][discovery]") {
  Etcd etcd;
  DaemonProcess a(fleetMember("disc-a", etcd));
  DaemonProcess b(fleetMember("disc-b", etcd));
  REQUIRE(waitForMetric(a, "framelink_discovery_peers", 1) == 1);
  // "ghost" reads what a producer on A writes: A dials it -- at B's address, where disc-b answers.
  etcd.put("/framelink/daemons/ghost",
           R"({"id":"ghost","address":")" + b.grpcAddress() + R"(","readers":["to-ghost"],"instance":"1"})");
  Client to_ghost = attachProducer(a, "to-ghost", 4, 256 * 1024);
  etcd.put("/framelink/daemons/junk", "not json at all");
  CHECK(waitForMetric(a, "framelink_discovery_entries_refused_total", 1) >= 1);
  CHECK(a.waitForLog("the registry's entry for 'ghost' points at " + b.grpcAddress() +
                         ", where daemon 'disc-b' answers: not linked",
                     Millis(10000)));
  CHECK(a.waitForLog("registry entries left out: /framelink/daemons/junk: not a JSON object", Millis(10000)));
  CHECK(a.metric("framelink_links_up") == 0);  // none for "ghost"
  Client consumer = attachConsumer(b, "after-ghost", 4, 256 * 1024);
  REQUIRE(a.waitForLog("readers: after-ghost [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "after-ghost", 4, 256 * 1024);
  sendOne(producer.get(), consumer.get(), 1);
}

TEST_CASE("discovery: with etcd gone the links and routes stay; back, a daemon that crashed is forgotten",
          "[integration][discovery]") {
  Etcd etcd;
  DaemonProcess a(fleetMember("disc-a", etcd));
  DaemonProcess b(fleetMember("disc-b", etcd));
  auto c = std::make_unique<DaemonProcess>(fleetMember("disc-c", etcd));
  Client consumer = attachConsumer(b, "line", 4, 256 * 1024);
  REQUIRE(a.waitForLog("readers: line [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "line", 4, 256 * 1024);
  sendOne(producer.get(), consumer.get(), 1);

  CHECK(a.metric("framelink_discovery_watch_restarts_total") == 0);
  etcd.kill9();
  CHECK(a.waitForLog("failed: no etcd endpoint answered", Millis(10000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_registry_up") == 0; }, Millis(10000)));
  for (uint64_t id = 2; id <= 4; ++id)
    sendOne(producer.get(), consumer.get(), id);  // nothing that runs changed
  CHECK(a.metric("framelink_discovery_peers") == 2);

  c->kill9();  // its entry outlives it by its lease (3 s), then goes
  etcd.start();
  CHECK(a.waitForLog("discovery: etcd answers again", Millis(15000)));
  CHECK(a.metric("framelink_discovery_watch_restarts_total") >= 1);  // the watch ended with etcd
  CHECK(a.waitForLog("discovery: disc-c gone from the registry", Millis(20000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_peers") == 1; }, Millis(5000)));
  sendOne(producer.get(), consumer.get(), 5);
}

TEST_CASE(
    "discovery (DNS SRV): daemons named by SRV records ask each other what they are; frames go where "
    "readers are; one that claims a taken id or has the wrong token is left out",
    "[integration][discovery]") {
  DnsMasq dns;
  DaemonProcess a(srvMember("srv-a", dns, "fleet-secret"));
  DaemonProcess b(srvMember("srv-b", dns, "fleet-secret"));
  DaemonProcess twin(srvMember("srv-b", dns, "fleet-secret"));      // says it is srv-b too
  DaemonProcess stranger(srvMember("srv-x", dns, "other-secret"));  // not of this fleet
  const uint16_t nobody = freePort();                               // a host whose daemon is down
  dns.serve({{"a", "127.0.0.1", a.grpcPort()},
             {"b", "127.0.0.1", b.grpcPort()},
             {"down", "127.0.0.1", nobody},
             {"twin", "127.0.0.1", twin.grpcPort()},
             {"x", "127.0.0.1", stranger.grpcPort()}});
  CHECK(waitForMetric(a, "framelink_discovery_peers", 1) == 1);
  CHECK(a.metric("framelink_discovery_registry_up") == 1);
  CHECK(a.waitForLog("discovery: srv-b found (not dialed from here; no readers)", Millis(10000)));
  // Records sort by host: b's comes before twin's, and takes the id.
  CHECK(a.waitForLog("twin.fl.test (127.0.0.1:" + std::to_string(twin.grpcPort()) +
                         "): it says it is 'srv-b', as 127.0.0.1:" + std::to_string(b.grpcPort()) + " does",
                     Millis(10000)));
  CHECK(a.waitForLog(
      "x.fl.test (127.0.0.1:" + std::to_string(stranger.grpcPort()) + "): wrong or missing token",
      Millis(10000)));
  CHECK(a.waitForLog("down.fl.test (127.0.0.1:" + std::to_string(nobody) + "): ", Millis(10000)));
  // The twin and the stranger are refused claims, counted once each however often they are read;
  // a daemon that does not answer is left out, not counted.
  CHECK(waitForMetric(a, "framelink_discovery_entries_refused_total", 2) >= 2);
  std::this_thread::sleep_for(Millis(2500));  // two more reads of the records
  CHECK(a.metric("framelink_discovery_entries_refused_total") == 2);
  CHECK(a.metric("framelink_links_up") == 0);

  // A reader on B: B tells the others at once (A, with no producer, asks no one again), then a
  // producer on A: A dials B, and its first frame goes there.
  Client on_b = attachConsumer(b, "srv-line", 4, 256 * 1024);
  REQUIRE(
      a.waitForLog("srv-b changed (not dialed from here; readers: srv-line [queue group])", Millis(5000)));
  Client producer = attachProducer(a, "srv-line", 4, 256 * 1024);
  REQUIRE(a.waitForLog("srv-b changed (dialed at 127.0.0.1:" + std::to_string(b.grpcPort()) +
                           "; readers: srv-line [queue group])",
                       Millis(10000)));
  for (uint64_t id = 1; id <= 3; ++id) sendOne(producer.get(), on_b.get(), id);
  CHECK(a.metric("framelink_links_up") == 1);
  CHECK(twin.metric("framelink_links_up") == 0);

  // The DNS server goes: what runs stays.  Back (with A's and B's records), A reads it again.
  dns.stop();
  CHECK(a.waitForLog("reading the SRV records failed", Millis(10000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_registry_up") == 0; }, Millis(10000)));
  for (uint64_t id = 4; id <= 5; ++id) sendOne(producer.get(), on_b.get(), id);
  // Meanwhile B's readers change: B tells the daemons it knows all the same.
  Client more_on_b = attachConsumer(b, "srv-more", 4, 256 * 1024);
  CHECK(a.waitForLog("srv-b changed (dialed at 127.0.0.1:" + std::to_string(b.grpcPort()) +
                         "; readers: srv-line [queue group], srv-more [queue group])",
                     Millis(5000)));
  CHECK(a.metric("framelink_discovery_registry_up") == 0);  // the DNS server is still away
  dns.serve({{"a", "127.0.0.1", a.grpcPort()}, {"b", "127.0.0.1", b.grpcPort()}});
  CHECK(a.waitForLog("discovery: DNS SRV " + std::string(DnsMasq::kName) + " answers again", Millis(10000)));
  CHECK(waitUntil([&] { return a.metric("framelink_discovery_registry_up") == 1; }, Millis(10000)));
  sendOne(producer.get(), on_b.get(), 6);
}

TEST_CASE(
    "discovery (DNS SRV) under mutual TLS: an answer counts when the certificate names the record's host "
    "and the id given",
    "[integration][discovery][tls]") {
  const SiteCa site("fl-srv-ca", {});
  site.issue("srv-a", {"a.fl.test"});
  site.issue("srv-b", {"b.fl.test"});
  site.issue("srv-c", {"liar.fl.test"});  // a host of the site, whose daemon says it is srv-b
  DnsMasq dns;
  auto member = [&](const std::string& id, const std::string& cert) {
    DaemonProcess::Options o = srvMember(id, dns, "fleet-secret");
    o.extra_args = concat(o.extra_args, site.tls(cert));
    return o;
  };
  DaemonProcess a(member("srv-a", "srv-a"));
  DaemonProcess b(member("srv-b", "srv-b"));
  DaemonProcess liar(member("srv-b", "srv-c"));
  dns.serve({{"a", "127.0.0.1", a.grpcPort()},
             {"b", "127.0.0.1", b.grpcPort()},
             {"liar", "127.0.0.1", liar.grpcPort()}});
  CHECK(waitForMetric(a, "framelink_discovery_peers", 1) == 1);
  CHECK(a.waitForLog("liar.fl.test (127.0.0.1:" + std::to_string(liar.grpcPort()) +
                         "): it says it is 'srv-b', but its certificate does not name it",
                     Millis(10000)));
  Client on_b = attachConsumer(b, "srv-tls", 4, 256 * 1024);
  REQUIRE(
      a.waitForLog("srv-b changed (not dialed from here; readers: srv-tls [queue group])", Millis(10000)));
  Client producer = attachProducer(a, "srv-tls", 4, 256 * 1024);
  for (uint64_t id = 1; id <= 3; ++id) sendOne(producer.get(), on_b.get(), id);
  CHECK(liar.metric("framelink_links_up") == 0);
}

TEST_CASE(
    "discovery (DNS SRV): Describe answers with the daemon's readers and their kinds; a call with a wrong "
    "token, too many streams or a malformed word is refused or left out, and counted",
    "[integration][discovery]") {
  DnsMasq dns;
  DaemonProcess a(srvMember("srv-a", dns, "fleet-secret"));
  Client member = attachConsumer(a, "cam0", 4, 256 * 1024);
  Client subscriber = attachWith(a, FL_ROLE_CONSUMER, "cam1", true, 4, 256 * 1024);
  auto stub =
      framelink::v1::Link::NewStub(grpc::CreateChannel(a.grpcAddress(), grpc::InsecureChannelCredentials()));
  auto describe = [&](const std::string& token, const framelink::v1::DaemonStreams& asker,
                      framelink::v1::DescribeReply* reply) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata("x-framelink-token", token);
    framelink::v1::DescribeRequest request;
    *request.mutable_asker() = asker;
    return stub->Describe(&ctx, request, reply);
  };
  framelink::v1::DaemonStreams me;
  me.set_daemon_id("srv-z");
  me.set_instance(5);
  me.set_as_of_ns(1);

  // Its readers, each with its kind (published within poll_ms of the consumers attaching).
  framelink::v1::DescribeReply reply;
  REQUIRE(waitUntil(
      [&] {
        reply.Clear();
        return describe("fleet-secret", me, &reply).ok() && reply.answerer().readers_size() == 2;
      },
      Millis(5000), Millis(100)));
  CHECK(reply.answerer().daemon_id() == "srv-a");
  REQUIRE(reply.answerer().grouped_size() == 1);
  CHECK(reply.answerer().grouped(0) == "cam0");
  REQUIRE(reply.answerer().subscribed_size() == 1);
  CHECK(reply.answerer().subscribed(0) == "cam1");
  CHECK(a.metric("framelink_discovery_words_dropped_total") == 0);

  CHECK(describe("wrong-secret", me, &reply).error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK(a.metric("framelink_auth_failures_total") == 1);

  framelink::v1::DaemonStreams wordy = me;
  for (int i = 0; i < 4097; ++i) wordy.add_readers("s" + std::to_string(i));
  const grpc::Status refused = describe("fleet-secret", wordy, &reply);
  CHECK(refused.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK(refused.error_message() == "more than 4096 streams");
  CHECK(a.metric("framelink_discovery_words_dropped_total") == 1);

  // A word whose subscribed stream is none of its readers: answered, but not kept.
  framelink::v1::DaemonStreams lying = me;
  lying.set_as_of_ns(2);
  lying.add_readers("cam0");
  lying.add_subscribed("cam9");
  CHECK(describe("fleet-secret", lying, &reply).ok());
  CHECK(a.metric("framelink_discovery_words_dropped_total") == 2);
}
