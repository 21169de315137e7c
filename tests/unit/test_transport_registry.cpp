// The transport registry (proxy/link/transport_registry.*) and the daemon's table
// of transports (proxy/link/peer_transports.cpp): how a transport is chosen, what
// a refused one says, and the loopback transport between two daemons.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/data_agent.h"
#include "config/config.h"
#include "config/config_values.h"
#include "config/transport_names.h"
#include "link/peer_links.h"
#include "link/peer_transports.h"
#include "link/transport_registry.h"
#include "metrics/metrics.h"

namespace framelink {
namespace {

// A transport that can or cannot run, and says why not.
class FakeTransport final : public TransportEntry {
 public:
  FakeTransport(std::string name, bool usable, std::string why = {})
      : name_(std::move(name)), usable_(usable), why_(std::move(why)) {}
  std::string_view name() const noexcept override { return name_; }
  bool usable(uint64_t, std::string* why) const override {
    if (!usable_ && why != nullptr) *why = why_;
    return usable_;
  }
  Status listen(const ListenContext&) override { return {}; }
  Result<std::shared_ptr<transport::Transport>> dial(const DialContext&) override {
    return makeError(FL_ERR_TRANSPORT, "not dialled in these tests");
  }

 private:
  std::string name_;
  bool usable_;
  std::string why_;
};

TransportRegistry fakeRegistry(bool b_usable = true) {
  std::vector<std::unique_ptr<TransportEntry>> entries;
  entries.push_back(std::make_unique<FakeTransport>("a", true));
  entries.push_back(std::make_unique<FakeTransport>("b", b_usable, "b has no device"));
  entries.push_back(std::make_unique<FakeTransport>("c", true));
  return TransportRegistry(std::move(entries));
}

std::vector<std::string> namesOf(const std::vector<TransportEntry*>& ts) {
  std::vector<std::string> out;
  for (const auto* t : ts) out.emplace_back(t->name());
  return out;
}

}  // namespace

TEST_CASE("registry: the configured transports are taken in the configured order", "[registry]") {
  auto registry = fakeRegistry();
  auto selected = registry.select({"c", "a", "b"});
  REQUIRE(selected.ok());
  CHECK(namesOf(selected.value()) == std::vector<std::string>{"c", "a", "b"});

  // The dialer offers them in that order; the listener takes the first it allows.
  auto offer = TransportRegistry::offer(selected.value(), {});
  CHECK(namesOf(offer.transports) == std::vector<std::string>{"c", "a", "b"});
  CHECK(offer.reason.empty());
  auto choice = registry.choose({"c", "a"}, {"a", "c"}, "self", 0);
  REQUIRE(choice.transport != nullptr);
  CHECK(choice.transport->name() == "c");
  choice = registry.choose({"b", "a", "c"}, {"c", "a", "b"}, "self", 0);
  REQUIRE(choice.transport != nullptr);
  CHECK(choice.transport->name() == "b");
}

TEST_CASE("registry: an unknown or repeated name is refused, naming the registered ones", "[registry]") {
  auto registry = fakeRegistry();
  auto unknown = registry.select({"a", "udp"});
  REQUIRE(!unknown.ok());
  CHECK(unknown.error().message.find("'udp'") != std::string::npos);
  CHECK(unknown.error().message.find("a,b,c") != std::string::npos);
  auto twice = registry.select({"a", "c", "a"});
  REQUIRE(!twice.ok());
  CHECK(twice.error().message.find("twice") != std::string::npos);

  // The configuration names the daemon's registered transports.
  Status st = checkTransports({"tcp", "udp"}, "--transports");
  REQUIRE(!st.ok());
  for (auto name : kTransportNames) CHECK(st.error().message.find(std::string(name)) != std::string::npos);
  CHECK(st.error().message.find("'udp'") != std::string::npos);
  CHECK(checkTransports({"loopback", "tcp"}, "--transports").ok());
}

TEST_CASE("registry: a transport that cannot run is passed over and says why", "[registry]") {
  auto registry = fakeRegistry(/*b_usable=*/false);
  auto choice = registry.choose({"b", "c"}, {"a", "b", "c"}, "self", 0);
  REQUIRE(choice.transport != nullptr);
  CHECK(choice.transport->name() == "c");
  CHECK(choice.reason == "not b: b has no device");

  // Offered by the peer but not allowed here: the reason names this daemon's list.
  choice = registry.choose({"a", "c"}, {"c"}, "self", 0);
  REQUIRE(choice.transport != nullptr);
  CHECK(choice.reason == "not a: peer self does not allow it (transports c)");

  choice = registry.choose({"b"}, {"b"}, "self", 0);
  CHECK(choice.transport == nullptr);
  CHECK(choice.reason == "not b: b has no device");

  // The dialer leaves it out of its offer, with the same reason.
  auto selected = registry.select({"b", "a"});
  REQUIRE(selected.ok());
  auto offer = TransportRegistry::offer(selected.value(), {});
  CHECK(namesOf(offer.transports) == std::vector<std::string>{"a"});
  CHECK(offer.reason == "not b: b has no device");
}

TEST_CASE("registry: a transport held back after a failure waits only while another can run", "[registry]") {
  auto registry = fakeRegistry();
  auto held = [](const TransportEntry& t) {
    return t.name() == "c" ? std::string("it failed") : std::string();
  };
  auto both = registry.select({"c", "a"});
  REQUIRE(both.ok());
  auto offer = TransportRegistry::offer(both.value(), held);
  CHECK(namesOf(offer.transports) == std::vector<std::string>{"a"});
  CHECK(offer.reason == "not c: it failed");

  auto alone = registry.select({"c"});
  REQUIRE(alone.ok());
  offer = TransportRegistry::offer(alone.value(), held);
  CHECK(namesOf(offer.transports) == std::vector<std::string>{"c"});
}

TEST_CASE("daemon transports: the table is kTransportNames, in its order", "[registry]") {
  auto registry = makeDaemonTransports(RdmaSupport{nullptr, "no RDMA device in this test"});
  std::vector<std::string> want(kTransportNames.begin(), kTransportNames.end());
  CHECK(registry.names() == want);
  std::string why;
  REQUIRE(registry.find("rdma") != nullptr);
  CHECK(!registry.find("rdma")->usable(0, &why));
  CHECK(why == "no RDMA device in this test");
}

TEST_CASE("daemon transports: loopback refuses a peer in another process, and says so", "[registry]") {
  auto registry = makeDaemonTransports({});
  TransportEntry* loopback = registry.find("loopback");
  REQUIRE(loopback != nullptr);
  std::string why;
  CHECK(!loopback->usable(0, &why));  // not configured: not listening
  CHECK(why.find("not in this daemon's transports") != std::string::npos);

  Config config;
  Metrics metrics;
  constexpr uint64_t kSelf = 0x5e1f;
  REQUIRE(loopback->listen(ListenContext{config, metrics, kSelf, {}}).ok());
  CHECK(loopback->usable(0, nullptr));      // the dialer, before the HelloAck
  CHECK(loopback->usable(kSelf, nullptr));  // a daemon of this process
  why.clear();
  CHECK(!loopback->usable(0xe15e, &why));  // an instance no daemon of this process has
  CHECK(why.find("another process") != std::string::npos);

  v1::HelloAck ack;
  ack.set_instance(0xe15e);
  const std::string peer = "p", host = "127.0.0.1";
  auto dialed = loopback->dial(DialContext{config, peer, host, ack, 1, nullptr, -1});
  REQUIRE(!dialed.ok());
  CHECK(dialed.error().message.find("another process") != std::string::npos);
  loopback->stop();
  CHECK(!loopback->usable(kSelf, nullptr));
}

// Two daemons of this process, A dialing B, each with its PeerLinks and data agent.
struct TwoDaemons {
  struct Side {
    Config config;
    Metrics metrics;
    std::unique_ptr<DataAgent> agent;
    std::unique_ptr<PeerLinks> links;
  };
  Side a, b;

  explicit TwoDaemons(std::vector<std::string> transports) {
    for (auto* s : {&a, &b}) {
      s->config.id = s == &a ? "host-a" : "host-b";
      s->config.listen = "127.0.0.1:0";
      s->config.data_listen = "127.0.0.1:0";
      s->config.transports = transports;
      s->config.reconnect_min_ms = 20;
      s->config.reconnect_max_ms = 100;
      s->config.connect_timeout_ms = 2000;
    }
  }
  // B first (A needs its port), then A.
  void start(TransportRegistry for_a, TransportRegistry for_b) {
    startSide(b, std::move(for_b), 0xb0b);
    a.config.peers.push_back(PeerConfig{"host-b", "127.0.0.1:" + std::to_string(b.links->grpcPort()), {}});
    startSide(a, std::move(for_a), 0xa11ce);
  }
  ~TwoDaemons() {
    for (auto* s : {&a, &b}) {
      if (s->links) s->links->stop();
      if (s->agent) s->agent->stop();
    }
  }
  static bool up(const Side& s) { return s.metrics.counters.links_up.load() == 1; }

 private:
  static void startSide(Side& s, TransportRegistry transports, uint64_t instance) {
    s.agent = std::make_unique<DataAgent>(s.config, s.metrics);
    s.agent->start();
    auto links = PeerLinks::start(s.config, *s.agent, s.metrics, instance, std::move(transports));
    REQUIRE(links.ok());
    s.links = std::move(links.value());
  }
};

bool waitFor(const std::function<bool()>& pred,
             std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

// A transport whose dial always fails and that, like rdma, is offered again
// only after its fallback interval.
class FlakyTransport final : public TransportEntry {
 public:
  std::string_view name() const noexcept override { return "flaky"; }
  bool usable(uint64_t, std::string*) const override { return true; }
  Status listen(const ListenContext&) override { return {}; }
  Result<std::shared_ptr<transport::Transport>> dial(const DialContext&) override {
    dials.fetch_add(1);
    return makeError(FL_ERR_TRANSPORT, "no route to the flaky network");
  }
  std::chrono::milliseconds fallbackFor(const Config& config) const override {
    return std::chrono::milliseconds(config.rdma_retry_ms);
  }
  std::atomic<int> dials{0};
};

TransportRegistry withFlaky(FlakyTransport** flaky) {
  auto entries = daemonTransportEntries({});
  auto f = std::make_unique<FlakyTransport>();
  if (flaky != nullptr) *flaky = f.get();
  entries.insert(entries.begin(), std::move(f));
  return TransportRegistry(std::move(entries));
}

// The peer-link tests run gRPC (Session calls): left out under ThreadSanitizer.
TEST_CASE("peer links: two daemons of one process link over loopback", "[registry][grpc]") {
  TwoDaemons pair({"loopback"});
  pair.start(makeDaemonTransports({}), makeDaemonTransports({}));
  CHECK(waitFor([&] { return TwoDaemons::up(pair.a) && TwoDaemons::up(pair.b); }));
  CHECK(pair.a.links->listenPort("tcp") == 0);  // tcp is not configured: no data port
}

TEST_CASE("peer links: a failed transport is passed over, and the link moves back to it at its deadline",
          "[registry][grpc]") {
  TwoDaemons pair({"flaky", "loopback"});
  pair.a.config.rdma_retry_ms = 300;
  FlakyTransport* flaky = nullptr;
  pair.start(withFlaky(&flaky), withFlaky(nullptr));
  // B takes flaky (A prefers it), A's dial fails: the next dial offers loopback alone.
  REQUIRE(waitFor([&] { return flaky->dials.load() >= 1; }));
  bool up_between = false;
  CHECK(waitFor([&] {
    if (flaky->dials.load() == 1 && TwoDaemons::up(pair.a)) up_between = true;
    return flaky->dials.load() >= 2;
  }));
  // The loopback link came up in between, and was ended to try flaky again.
  CHECK(up_between);
  CHECK(waitFor([&] { return TwoDaemons::up(pair.a); }));
}

}  // namespace framelink
