// Unit tests of the rdma device and connection code against FakeVerbs:
// device selection, the memory registry, connection setup and its refusals,
// and the listener under a flood of stalled handshakes.  No RDMA device
// needed.  The data path: test_rdma_transport.cpp.
#include <arpa/inet.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_verbs.h"
#include "rdma_test_pair.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_status.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_wire.h"

namespace framelink::transport::rdma::testing {

// ---------------------------------------------------------------- device

TEST_CASE("rdma device selection and its errors", "[rdma]") {
  auto fake = twoDevices();
  SECTION("by name") {
    auto d = RdmaDevice::open({"fake_b", ""}, fake);
    REQUIRE(d.ok());
    CHECK(d.value()->name() == "fake_b");
    CHECK(d.value()->numaNode() == -1);
  }
  SECTION("by the IP it owns") {
    auto d = RdmaDevice::open({"", "10.0.0.1"}, fake);
    REQUIRE(d.ok());
    CHECK(d.value()->name() == "fake_a");
  }
  SECTION("no devices at all") {
    auto none = std::make_shared<FakeVerbs>(std::vector<FakeVerbs::DeviceSpec>{});
    auto d = RdmaDevice::open({"mlx5_0", ""}, none);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().code == FL_ERR_TRANSPORT);
    CHECK_THAT(d.error().message, Catch::Contains("no RDMA devices") && Catch::Contains("rdma_rxe"));
  }
  SECTION("unknown name lists the devices present") {
    auto d = RdmaDevice::open({"mlx5_0", ""}, fake);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(d.error().message, Catch::Contains("'mlx5_0' not found") && Catch::Contains("fake_a, fake_b"));
  }
  SECTION("IP that is not on this host / not on an RDMA device") {
    auto d = RdmaDevice::open({"", "192.168.9.9"}, fake);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(d.error().message, Catch::Contains("192.168.9.9"));
  }
  SECTION("IP of another device than the named one") {
    auto d = RdmaDevice::open({"fake_b", "10.0.0.1"}, fake);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(d.error().message, Catch::Contains("belongs to RDMA device 'fake_a'"));
  }
  SECTION("any-address without a name") {
    auto d = RdmaDevice::open({"", "0.0.0.0"}, fake);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().code == FL_EINVAL);
  }
  SECTION("port not ACTIVE") {
    auto down = twoDevices(IBV_PORT_DOWN);
    auto d = RdmaDevice::open({"fake_b", ""}, down);
    REQUIRE_FALSE(d.ok());
    CHECK_THAT(d.error().message, Catch::Contains("no ACTIVE port") && Catch::Contains("DOWN"));
  }
  CHECK(fake->errors().empty());
}

TEST_CASE("rdma memory registry: access modes, ranges, deregistration", "[rdma]") {
  auto fake = twoDevices();
  auto dev = RdmaDevice::open({"fake_a", ""}, fake).value();
  std::vector<uint8_t> buf(8192);
  {
    auto w = dev->registerMemory(buf.data(), 4096, MemoryAccess::kCreditWindows);
    REQUIRE(w.ok());
    auto r = dev->registerMemory(buf.data() + 4096, 4096, MemoryAccess::kLocalRead);
    REQUIRE(r.ok());
    uint32_t key = 0;
    ibv_mr* window_mr = dev->windowRegion(buf.data() + 100, 200);
    REQUIRE(window_mr != nullptr);
    CHECK(window_mr->lkey == w.value()->lkey());
    CHECK(dev->lookupLocal(buf.data() + 4096, 4096, &key));
    CHECK(key == r.value()->lkey());
    CHECK(dev->windowRegion(buf.data() + 4096, 10) == nullptr);   // local-read only
    CHECK_FALSE(dev->lookupLocal(buf.data() + 4000, 200, &key));  // spans two registrations
    auto overlap = dev->registerMemory(buf.data() + 10, 10, MemoryAccess::kLocalRead);
    CHECK_FALSE(overlap.ok());
    CHECK(fake->stats().live_mrs == 2);
  }
  uint32_t key = 0;
  CHECK_FALSE(dev->lookupLocal(buf.data(), 10, &key));
  CHECK(fake->stats().live_mrs == 0);
  CHECK(fake->errors().empty());
}

// ---------------------------------------------------------------- connection

TEST_CASE("rdma connect brings both QPs to RTS; refusals say why", "[rdma]") {
  auto p = makePair();
  CHECK(p->fake->qpState(p->ra()->cmId()->qp) == IBV_QPS_RTS);
  CHECK(p->fake->qpState(p->rb()->cmId()->qp) == IBV_QPS_RTS);
  CHECK(std::string(p->a->name()) == "rdma");
  // Receive WRs are posted before the connection is accepted.
  CHECK(p->ra()->verbsCounters().recv_wrs == RdmaTransportOptions{}.recv_queue_depth);

  auto refused = dialRdma(p->dev_a, "10.0.0.2", p->listener->port(), kSession + 1, 2s);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == FL_ERR_AUTH);
  auto nobody = dialRdma(p->dev_a, "10.0.0.2", p->listener->port() + 100, kSession, 2s);
  REQUIRE_FALSE(nobody.ok());
  CHECK(nobody.error().code == FL_ERR_TRANSPORT);
  CHECK_THAT(nobody.error().message, Catch::Contains("listening"));
  auto unreachable = dialRdma(p->dev_a, "10.9.9.9", p->listener->port(), kSession, 2s);
  REQUIRE_FALSE(unreachable.ok());
  CHECK_THAT(unreachable.error().message, Catch::Contains("resolve"));
  CHECK(p->fake->errors().empty());
}

// ---------------------------------------------------------------- listener under attack

namespace {

// The listener's device, a genuine dialer's and five more hosts'.
std::shared_ptr<FakeVerbs> manyHosts() {
  std::vector<FakeVerbs::DeviceSpec> devices{{"fake_a", "10.0.0.1"}, {"fake_b", "10.0.0.2"}};
  for (int i = 3; i <= 7; ++i)
    devices.push_back({"fake_" + std::to_string(i), "10.0.0." + std::to_string(i)});
  return std::make_shared<FakeVerbs>(devices);
}

sockaddr_in ipv4(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// Connect data naming kSession, with the proof of `token`.
RdmaConnectData connectData(const std::string& token = {}) {
  RdmaConnectData data{kRdmaConnectMagic, kRdmaProtocolVersion, 0, kSession, {}};
  tokenDigest(token, kSession, data.token);
  return data;
}

// A dialer that sends a connect request -- by default well-formed, naming a
// session the listener accepts -- from `ip` and then does nothing: no QP, no
// RTU.  `length` bytes of `data` are sent.
struct StalledDialer {
  std::shared_ptr<FakeVerbs> fake;
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  StalledDialer(std::shared_ptr<FakeVerbs> f, const std::string& ip, uint16_t port,
                RdmaConnectData data = connectData(), size_t length = sizeof(RdmaConnectData))
      : fake(std::move(f)) {
    channel = fake->createEventChannel();
    REQUIRE(fake->createId(channel, &id, nullptr, RDMA_PS_TCP) == 0);
    sockaddr_in src = ipv4(ip, 0), dst = ipv4("10.0.0.2", port);
    REQUIRE(fake->resolveAddr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                              100) == 0);
    REQUIRE(fake->resolveRoute(id, 100) == 0);
    REQUIRE(fake->setAckTimeout(id, 14) == 0);
    rdma_conn_param param{};
    param.private_data = &data;
    param.private_data_len = static_cast<uint8_t>(length);
    param.rnr_retry_count = 7;
    REQUIRE(fake->connect(id, &param) == 0);
  }
  // The status in the listener's reject data (0 when it sent none), or -1
  // when nothing was rejected within `wait`.
  int rejected(std::chrono::milliseconds wait) {
    const auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      rdma_cm_event* ev = nullptr;
      while (fake->getCmEvent(channel, &ev) == 0) {
        const bool is_reject = ev->event == RDMA_CM_EVENT_REJECTED;
        RdmaRejectData why{};
        if (is_reject && ev->param.conn.private_data_len >= sizeof why) {
          std::memcpy(&why, ev->param.conn.private_data, sizeof why);
        }
        fake->ackCmEvent(ev);
        if (is_reject) return why.status;
      }
      if (std::chrono::steady_clock::now() > deadline) return -1;
      readable(channel->fd, 10);
    }
  }
  ~StalledDialer() {
    fake->destroyId(id);
    fake->destroyEventChannel(channel);
  }
};

struct Watched {
  std::atomic<uint64_t> timed_out{0}, refused{0};
  std::mutex mu;
  std::vector<std::unique_ptr<Transport>> accepted;
  std::atomic<uint64_t> auth_failures{0};
  RdmaListenerCounters counters() { return {&timed_out, &refused, &auth_failures}; }
};

std::unique_ptr<RdmaListener> watchedListener(const std::shared_ptr<RdmaDevice>& device, Watched& w,
                                              std::chrono::milliseconds handshake_timeout,
                                              const std::string& token = {}) {
  auto l = RdmaListener::listen(
      device, "10.0.0.2", 0, [](uint64_t s) { return s == kSession; },
      [&w](uint64_t, std::unique_ptr<Transport> t) {
        std::lock_guard<std::mutex> lock(w.mu);
        w.accepted.push_back(std::move(t));
      },
      {}, handshake_timeout, w.counters(), [token](uint64_t) { return token; });
  REQUIRE(l.ok());
  return std::move(l).value();
}

// The listener accepted `n` requests (each has a QP on the listener's side;
// stalled dialers have none).
bool waitForQps(FakeVerbs& fake, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (fake.stats().live_qps != n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// The listener handed on `n` connections (it sees ESTABLISHED a moment
// after the dialer does).
bool waitForAccepted(Watched& w, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(w.mu);
      if (w.accepted.size() == n) return true;
    }
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
}

}  // namespace

TEST_CASE("rdma listener: a stalled handshake delays no other peer and is dropped at its deadline",
          "[rdma]") {
  auto fake = manyHosts();
  auto dev_a = RdmaDevice::open({"", "10.0.0.1"}, fake).value();
  auto dev_b = RdmaDevice::open({"fake_b", "10.0.0.2"}, fake).value();
  Watched w;
  const auto handshake_timeout = 1500ms;
  auto listener = watchedListener(dev_b, w, handshake_timeout);
  fake->stallDialersFrom("10.0.0.3", true);
  StalledDialer stalled(fake, "10.0.0.3", listener->port());
  REQUIRE(waitForQps(*fake, 1));  // accepted; waiting for an ESTABLISHED that never comes

  // A genuine peer connects at once, not after the stranger's deadline.
  const auto start = std::chrono::steady_clock::now();
  auto good = dialRdma(dev_a, "10.0.0.2", listener->port(), kSession, 5s);
  const auto took =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  if (!good) FAIL("dial: " << good.error().message);
  INFO("the genuine dial took " << took.count() << " ms");
  CHECK(took < handshake_timeout);
  REQUIRE(waitForAccepted(w, 1));
  CHECK(w.timed_out.load() == 0);  // the stalled one was still pending meanwhile
  {
    std::lock_guard<std::mutex> lock(w.mu);
    REQUIRE(w.accepted.size() == 1);
    CHECK(w.accepted[0]->connected());
  }
  CHECK(good.value()->connected());

  // At its deadline the stalled one is destroyed (its dialer sees a reject) and counted.
  CHECK(stalled.rejected(5s) >= 0);
  CHECK(w.timed_out.load() == 1);
  CHECK(w.refused.load() == 0);
  CHECK(waitForQps(*fake, 2));  // only the genuine pair's QPs are left
  good.value().reset();
  w.accepted.clear();
  listener.reset();
  CHECK(fake->errors().empty());
}

TEST_CASE("rdma listener: handshakes are bounded in all and per address; beyond, rejected at once",
          "[rdma]") {
  auto fake = manyHosts();
  auto dev_a = RdmaDevice::open({"", "10.0.0.1"}, fake).value();
  auto dev_b = RdmaDevice::open({"fake_b", "10.0.0.2"}, fake).value();
  Watched w;
  auto listener = watchedListener(dev_b, w, 60s);
  for (int host = 3; host <= 7; ++host) fake->stallDialersFrom("10.0.0." + std::to_string(host), true);
  const size_t per_host = RdmaListener::kMaxPendingPerHost;
  std::vector<std::unique_ptr<StalledDialer>> stalled;
  for (size_t i = 0; i < per_host; ++i) {
    stalled.push_back(std::make_unique<StalledDialer>(fake, "10.0.0.3", listener->port()));
  }
  REQUIRE(waitForQps(*fake, per_host));
  // One more from the same host: rejected at once, saying why.
  StalledDialer extra(fake, "10.0.0.3", listener->port());
  CHECK(extra.rejected(5s) == FL_ERR_RESOURCES);
  CHECK(w.refused.load() == 1);
  // Another host is not affected.
  auto good = dialRdma(dev_a, "10.0.0.2", listener->port(), kSession, 5s);
  if (!good) FAIL("dial: " << good.error().message);
  REQUIRE(waitForAccepted(w, 1));  // no longer pending

  // Fill the table from three more hosts: 64 in all.
  for (int host = 4; host <= 6; ++host) {
    for (size_t i = 0; i < per_host; ++i) {
      stalled.push_back(
          std::make_unique<StalledDialer>(fake, "10.0.0." + std::to_string(host), listener->port()));
    }
  }
  REQUIRE(stalled.size() == RdmaListener::kMaxPendingHandshakes);
  REQUIRE(waitForQps(*fake, RdmaListener::kMaxPendingHandshakes + 2));  // + the genuine pair
  StalledDialer fifth_host(fake, "10.0.0.7", listener->port());
  CHECK(fifth_host.rejected(5s) == FL_ERR_RESOURCES);
  auto refused = dialRdma(dev_a, "10.0.0.2", listener->port(), kSession, 5s);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code == FL_ERR_RESOURCES);
  CHECK_THAT(refused.error().message, Catch::Contains("too many rdma handshakes"));
  CHECK(w.refused.load() == 3);
  CHECK(w.timed_out.load() == 0);

  // Stopping does not wait for any of them; each is rejected on the way out.
  const auto start = std::chrono::steady_clock::now();
  listener.reset();
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  for (auto& s : stalled) CHECK(s->rejected(1s) >= 0);
  CHECK(waitForQps(*fake, 2));
  good.value().reset();
  w.accepted.clear();
  CHECK(fake->errors().empty());
}

TEST_CASE("rdma listener: knowing a session id is not enough; the dialer proves the Session's token",
          "[rdma]") {
  auto fake = manyHosts();
  auto dev_a = RdmaDevice::open({"", "10.0.0.1"}, fake).value();
  auto dev_b = RdmaDevice::open({"fake_b", "10.0.0.2"}, fake).value();
  Watched w;
  auto listener = watchedListener(dev_b, w, 60s, "secret");
  for (int host = 3; host <= 5; ++host) fake->stallDialersFrom("10.0.0." + std::to_string(host), true);

  // Another host that learnt the pending session id (it crosses the network
  // in clear) and names it, as version 2 did, without a proof: refused.
  StalledDialer bare(fake, "10.0.0.3", listener->port(), connectData(), kRdmaConnectPrefixBytes);
  CHECK(bare.rejected(5s) == FL_ERR_PROTOCOL);
  // With a proof of a guessed token: refused and counted as an auth failure.
  StalledDialer guessed(fake, "10.0.0.4", listener->port(), connectData("guess"));
  CHECK(guessed.rejected(5s) == FL_ERR_AUTH);
  CHECK(w.auth_failures.load() == 1);
  // A daemon of the previous version is told so.
  RdmaConnectData old = connectData("secret");
  old.version = 2;
  StalledDialer previous(fake, "10.0.0.5", listener->port(), old, kRdmaConnectPrefixBytes);
  CHECK(previous.rejected(5s) == FL_ERR_PEER_VERSION);
  CHECK(fake->stats().live_qps == 0);  // none of them got a QP

  auto wrong = dialRdma(dev_a, "10.0.0.2", listener->port(), kSession, 2s, {}, -1, "Secret");
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().code == FL_ERR_AUTH);
  CHECK_THAT(wrong.error().message, Catch::Contains("the token is wrong"));
  auto good = dialRdma(dev_a, "10.0.0.2", listener->port(), kSession, 2s, {}, -1, "secret");
  if (!good) FAIL("dial: " << good.error().message);
  REQUIRE(waitForAccepted(w, 1));
  CHECK(w.auth_failures.load() == 2);
  good.value().reset();
  w.accepted.clear();
  listener.reset();
  CHECK(fake->errors().empty());
}

}  // namespace framelink::transport::rdma::testing
