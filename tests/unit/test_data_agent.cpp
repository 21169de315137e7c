// The data agent's loop and wiring: peer messages out of bounds close their
// link, a corrupt ring detaches one client; and the segments and attach
// validation it relies on.  The protocol's two sides have their own files
// (test_outbound_streams.cpp, test_inbound_streams.cpp).
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "agent_fixture.h"
#include "attach/attach_server.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

TEST_CASE("out-of-bounds peer messages close that link with a PROTOCOL fin", "[agent][security]") {
  // Each message is one a well-behaved peer never sends; every size a peer
  // controls is bounded before anything is allocated for it.
  const int which = GENERATE(0, 1, 2, 3);
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 64 * 1024);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  producer.push(0, 10);  // opens the stream towards the peer
  auto open = f.capture.next([](auto& m) { return m.has_stream_open(); });
  const uint64_t stream_id = open.stream_open().stream_id();
  v1::PeerMessage bad;
  std::string expect;
  switch (which) {
    case 0: {  // more credits than any consumer could have
      auto* g = bad.mutable_credit_grant();
      g->set_stream_id(stream_id);
      for (int i = 0; i < 65537; ++i) {
        auto* c = g->add_credits();
        c->set_credit_id(uint64_t(i) + 1);
        c->set_length(4096);
      }
      expect = "credits";
      break;
    }
    case 1: {  // a credit of zero bytes
      auto* c = bad.mutable_credit_grant()->add_credits();
      bad.mutable_credit_grant()->set_stream_id(stream_id);
      c->set_credit_id(1);
      c->set_length(0);
      expect = "zero length";
      break;
    }
    case 2: {  // an ACK of more frames than may be in flight
      bad.mutable_ack()->set_stream_id(stream_id);
      for (int i = 0; i < 5000; ++i) bad.mutable_ack()->add_sequences(uint64_t(i) + 1);
      expect = "ACK";
      break;
    }
    case 3: {  // a stream name that is not one
      bad.mutable_stream_open()->set_stream_id(9);
      bad.mutable_stream_open()->set_name(std::string(300, 'x'));
      expect = "stream";
      break;
    }
  }
  INFO("case " << which);
  f.peerSays(bad);
  auto fin = f.capture.next([](auto& m) { return m.has_fin(); });
  CHECK(int(fin.fin().code()) == FL_ERR_PROTOCOL);
  CHECK_THAT(fin.fin().reason(), Catch::Contains(expect, Catch::CaseSensitive::No));
  // The producer's frame is not failed by it: it waits for the next link.
  CHECK(producer.idleFor(50ms));
}

TEST_CASE("a control record that ACKs more frames than its budget closes that link with a PROTOCOL fin",
          "[agent][security]") {
  // An ACK run names 4096 frames in a few bytes, and each frame named costs
  // the agent a lookup: one record must not keep it busy for seconds.
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 64 * 1024);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  producer.push(0, 10);  // opens the stream towards the peer
  const uint64_t stream_id =
      f.capture.next([](auto& m) { return m.has_stream_open(); }).stream_open().stream_id();
  v1::ControlBatch batch;
  for (uint64_t first = 1; first <= peer::kMaxAckFramesPerRecord + 1; first += peer::kMaxAcksPerMessage) {
    auto* ack = batch.add_messages()->mutable_ack();
    ack->set_stream_id(stream_id);
    ack->add_runs(first);
    ack->add_runs(peer::kMaxAcksPerMessage);
  }
  INFO(batch.ByteSizeLong() << " bytes");
  REQUIRE(f.pair.b->postControl(batch.SerializeAsString()) == transport::PostResult::kOk);
  f.pair.b->flush();
  auto fin = f.capture.next([](auto& m) { return m.has_fin(); });
  CHECK(int(fin.fin().code()) == FL_ERR_PROTOCOL);
  CHECK_THAT(fin.fin().reason(), Catch::Contains("ACKs more than 65536 frames"));
  CHECK(producer.idleFor(50ms));  // its frame waits for the next link
}

namespace {

// A peer that sends frames for credits it was never granted, as fast as the
// agent polls, and never reads: each frame is refused with a NACK, and every
// control record the agent posts is turned away (kBackpressure), as by a
// transport whose own backlog is full.  Stops after `frames`.
class JunkFlood final : public transport::Transport {
 public:
  explicit JunkFlood(uint64_t frames) : left_(frames), fd_(::eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  std::shared_ptr<std::atomic<uint64_t>> refused_records = std::make_shared<std::atomic<uint64_t>>(0);

  const char* name() const noexcept override { return "junk"; }
  bool connected() const noexcept override { return true; }
  Result<transport::RemoteCredit> exposeCredit(transport::LocalCredit) override {
    return makeError(FL_ERR_LINK_LOST, "the flood takes no credits");
  }
  void retractCredit(uint64_t) override {}
  transport::PostResult post(const transport::SendRequest&) noexcept override {
    return transport::PostResult::kBackpressure;
  }
  transport::PostResult postControl(std::string) noexcept override {
    refused_records->fetch_add(1);
    return transport::PostResult::kBackpressure;
  }
  size_t poll(transport::TransportEvent* out, size_t max) noexcept override {
    size_t n = 0;
    for (; n < max && left_ > 0; ++n, --left_) {
      out[n] = transport::TransportEvent{};
      out[n].kind = transport::TransportEvent::Kind::kFrameArrived;
      out[n].header.stream_id = 1;
      out[n].header.sequence = ++sequence_;
      out[n].header.credit_id = 1'000'000 + sequence_;
    }
    uint64_t drained = 0;
    if (left_ == 0 && ::read(fd_.get(), &drained, sizeof(drained)) < 0) drained = 0;  // idle from here
    return n;
  }
  int eventFd() const noexcept override { return fd_.get(); }
  void shutdown() noexcept override { left_ = 0; }
  transport::TransportCounters counters() const noexcept override { return {}; }

 private:
  uint64_t left_;
  uint64_t sequence_ = 0;
  UniqueFd fd_;
};

}  // namespace

TEST_CASE("a peer that sends junk frames and reads nothing loses its link with a PROTOCOL fin",
          "[agent][security]") {
  // Without a bound each refused frame's NACK would wait for the peer in
  // memory for ever.  A NACK is some 60 bytes: 300000 frames draw twice the
  // bound.
  AgentFixture f;
  auto flood = std::make_unique<JunkFlood>(300'000);
  auto refused_records = flood->refused_records;
  f.linkUp(1, std::move(flood));
  auto fin = f.capture.next([](auto& m) { return m.has_fin(); });
  CHECK(int(fin.fin().code()) == FL_ERR_PROTOCOL);
  CHECK_THAT(fin.fin().reason(), Catch::Contains("has not read") && Catch::Contains("control records"));
  CHECK(refused_records->load() > 0);
}

TEST_CASE("peer ids that linked and went are forgotten once nothing refers to them", "[agent][security]") {
  // A holder of a shared token may present a new daemon id on every link:
  // each would otherwise stay in the peer table, walked every round, for the
  // daemon's life.
  Config config;
  config.id = "local";
  config.peers.push_back(PeerConfig{"configured", "127.0.0.1:1", {}});
  config.idle_spin_us = 0;
  config.ack_timeout_ms = 1000;  // replay state is kept for four of them after the last link
  Metrics metrics;
  ManualClock clock;
  DataAgent agent(config, metrics, clock);
  std::vector<TcpPair> pairs;
  auto linkUp = [&](uint64_t link_id, const std::string& peer) {
    TcpPair& p = pairs.emplace_back(makeTcpPair());
    CmdLinkUp up;
    up.link_id = link_id;
    up.identity.peer_name = peer;
    up.identity.transport_name = "tcp";
    up.transport = std::shared_ptr<transport::Transport>(std::move(p.a));
    auto writer = std::make_shared<SessionWriter>([](const v1::PeerMessage&, bool) { return true; },
                                                  SessionWriter::Inline{});
    up.session = PeerSession{writer, [] {}};
    agent.post(std::move(up));
  };
  auto forgotten = [&] { return metrics.counters.peers_forgotten.load(); };
  auto afterMs = [&](uint64_t ms) {
    clock.advanceMs(ms);
    REQUIRE(agent.runUntilIdle(50));
  };
  constexpr uint64_t kStrangers = 40;
  for (uint64_t i = 0; i < kStrangers; ++i) linkUp(i + 1, "stranger-" + std::to_string(i));
  // One of them opens a stream: what answers its replays outlives the link.
  constexpr uint64_t kKeeper = 100;
  linkUp(kKeeper, "keeper");
  v1::PeerMessage open;
  open.mutable_stream_open()->set_stream_id(1);
  open.mutable_stream_open()->set_name("cam");
  agent.post(CmdPeerMessage{kKeeper, std::make_shared<v1::PeerMessage>(open)});
  afterMs(600);
  CHECK(forgotten() == 0);  // every one is linked

  for (uint64_t i = 0; i < kStrangers; ++i) agent.post(CmdLinkDown{i + 1, "gone"});
  agent.post(CmdLinkDown{kKeeper, "gone"});
  afterMs(600);
  CHECK(forgotten() == kStrangers);  // the configured peer and the keeper stay
  afterMs(600);
  CHECK(forgotten() == kStrangers);  // nothing is forgotten twice
  afterMs(4000);
  CHECK(forgotten() == kStrangers + 1);  // the keeper's stream state went unused, and the keeper with it

  // A forgotten id that links again is a new peer like any: its stream opens
  // and it stays while linked.
  linkUp(200, "stranger-0");
  linkUp(201, "keeper");
  agent.post(CmdPeerMessage{201, std::make_shared<v1::PeerMessage>(open)});
  afterMs(600);
  afterMs(5000);
  CHECK(forgotten() == kStrangers + 1);
  CHECK(metrics.counters.links_up.load() == 2);
}

TEST_CASE("keepalives flooding in while the agent takes none queue one command, with the newest news",
          "[agent][security]") {
  KeepaliveNews news;
  size_t posts = 0;
  for (uint64_t i = 1; i <= 10000; ++i) {
    posts += news.rtt(i * 1000) ? 1 : 0;
    posts += news.dataReceived(i) ? 1 : 0;
  }
  CHECK(posts == 1);
  KeepaliveNews::Said said = news.take();
  CHECK(said.rtt_ns == 10000 * 1000);
  CHECK(said.has_data);
  CHECK(said.data_received == 10000);
  // Taken: nothing new until the reader says more, and then one command again.
  said = news.take();
  CHECK(said.rtt_ns == 0);
  CHECK_FALSE(said.has_data);
  CHECK(news.dataReceived(10001));
  CHECK_FALSE(news.rtt(7));
  said = news.take();
  CHECK(said.has_data);
  CHECK(said.data_received == 10001);
  CHECK(said.rtt_ns == 7);
}

TEST_CASE("the agent takes a link's round trip from its keepalive news", "[agent]") {
  AgentFixture f;
  f.linkUp();
  auto news = std::make_shared<KeepaliveNews>();
  REQUIRE(news->rtt(2'500'000));
  f.agent->post(CmdLinkKeepalive{1, news});
  f.agent->post(CmdLinkKeepalive{99, news});  // a link that is gone: ignored
  const std::string sample = "framelink_link_rtt_seconds{peer=\"remote\"} 0.0025";
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    f.clock.advanceMs(100);
    std::this_thread::sleep_for(10ms);
    seen = f.metrics.prometheus().find(sample) != std::string::npos;
  }
  CHECK(seen);
}

TEST_CASE("a corrupt submit ring detaches only that client", "[agent][corrupt]") {
  AgentFixture f;
  TestClient bad = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  TestClient good = makeClient(2, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{bad.session});
  f.agent->post(CmdClientAttached{good.session});
  f.linkUp();
  __atomic_store_n(&bad.submit()->tail, uint64_t{1000}, __ATOMIC_RELEASE);
  uint64_t one = 1;
  REQUIRE(::write(bad.submit_bell.get(), &one, sizeof(one)) == sizeof(one));
  // The agent shuts the attach socket down: the application end sees EOF.
  char byte;
  auto end = std::chrono::steady_clock::now() + kDeadline;
  ssize_t n = -1;
  while (std::chrono::steady_clock::now() < end) {
    n = ::recv(bad.peer_socket.get(), &byte, 1, MSG_DONTWAIT);
    if (n == 0) break;
    std::this_thread::sleep_for(1ms);
  }
  CHECK(n == 0);
  CHECK(__atomic_load_n(&bad.session->segments->header()->daemon_state, __ATOMIC_ACQUIRE) ==
        FL_DAEMON_DETACHED);
  good.push(0, 10);
  good.push(7, 10);
  CHECK(good.pop().status == FL_ERR_BAD_SLOT);  // the good client is still served (in order)
}

TEST_CASE("the heartbeat comes from the agent's rounds, once a period", "[agent][heartbeat]") {
  Config config;
  config.idle_spin_us = 0;
  Metrics metrics;
  ManualClock clock;
  int beats = 0;
  DataAgent agent(config, metrics, clock, AgentHeartbeat{1'000'000'000, [&beats] { ++beats; }});
  REQUIRE(agent.runUntilIdle(10));
  CHECK(beats == 1);  // at once: the supervisor hears from a new agent without waiting a period
  clock.advanceMs(500);
  REQUIRE(agent.runUntilIdle(10));
  CHECK(beats == 1);
  clock.advanceMs(600);
  REQUIRE(agent.runUntilIdle(10));
  CHECK(beats == 2);
  // Rounds without time passing do not beat again.
  REQUIRE(agent.runUntilIdle(10));
  CHECK(beats == 2);
}

TEST_CASE("a running agent beats from its own thread, also while it has nothing to do",
          "[agent][heartbeat]") {
  Config config;
  config.idle_spin_us = 0;
  Metrics metrics;
  ManualClock clock;
  std::atomic<int> beats{0};
  std::atomic<bool> other_thread{true};
  const auto test_thread = std::this_thread::get_id();
  auto beat = [&] {
    if (std::this_thread::get_id() == test_thread) other_thread = false;
    ++beats;
  };
  DataAgent agent(config, metrics, clock, AgentHeartbeat{1'000'000'000, beat});
  agent.start();
  // The idle agent wakes at least every 50 ms of real time to look at its deadlines.
  auto waitFor = [&beats](int n) {
    for (int i = 0; i < 500 && beats.load() < n; ++i) std::this_thread::sleep_for(10ms);
    return beats.load() >= n;
  };
  CHECK(waitFor(1));
  clock.advanceMs(1001);
  CHECK(waitFor(2));
  agent.stop();
  CHECK(other_thread);
  const int at_stop = beats.load();
  clock.advanceMs(5000);
  std::this_thread::sleep_for(100ms);
  CHECK(beats.load() == at_stop);  // a stopped agent is silent
}

TEST_CASE("no heartbeat without a period or a callback", "[agent][heartbeat]") {
  CHECK_FALSE(AgentHeartbeat{}.enabled());
  CHECK_FALSE(AgentHeartbeat{1000, nullptr}.enabled());
  CHECK_FALSE(AgentHeartbeat{0, [] {}}.enabled());
  CHECK(AgentHeartbeat{1000, [] {}}.enabled());
}

TEST_CASE("segment geometry keeps every region inside its segment", "[segment]") {
  for (uint32_t slots : {1u, 2u, 3u, 8u, 100u}) {
    for (uint64_t size : {uint64_t{1}, uint64_t{4096}, uint64_t{65537}, uint64_t{4} << 20}) {
      for (bool huge : {false, true}) {
        SegmentGeometry g = computeGeometry(slots, size, huge);
        CHECK(g.ring_capacity >= slots);
        CHECK((g.ring_capacity & (g.ring_capacity - 1)) == 0);
        CHECK(g.submit_ring_offset >= sizeof(fl_segment_header));
        CHECK(g.completion_ring_offset >= g.submit_ring_offset + fl_ring_bytes(g.ring_capacity, 16));
        CHECK(g.control_size >= g.completion_ring_offset + fl_ring_bytes(g.ring_capacity, 32));
        CHECK(g.slot_stride >= size + sizeof(fl_slot_header));
        CHECK(g.slot_stride % FL_PAGE_SIZE == 0);
        CHECK(g.slots_offset % FL_PAGE_SIZE == 0);
        // Each header immediately before its payload (one RDMA write lands
        // both), never overlapping the previous slot's payload.
        CHECK(g.slot_header_stride == g.slot_stride);
        CHECK(g.slot_headers_offset + sizeof(fl_slot_header) == g.slots_offset);
        CHECK(g.slot_stride - size >= sizeof(fl_slot_header));
        CHECK(g.data_size >= g.slots_offset + g.slot_stride * slots);
        if (huge) CHECK(g.data_size % FL_HUGE_PAGE_SIZE == 0);
      }
    }
  }
}

TEST_CASE("a consumer's data segment cannot be mapped writable by the client", "[segment][security]") {
  SegmentRequest req;
  req.role = FL_ROLE_CONSUMER;
  req.slot_count = 2;
  req.slot_size = 4096;
  req.client_id = 1;
  req.stream = "s";
  req.hugepages = HugepageMode::kOff;
  auto seg = ClientSegments::create(req);
  REQUIRE(seg.ok());
  REQUIRE(seg.value()->keepReadOnlyDataFd());
  // What the client gets: a read-only file (the daemon keeps its writable one).
  int fd = seg.value()->clientDataFd(FL_ROLE_CONSUMER);
  void* rw = ::mmap(nullptr, seg.value()->geometry().data_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(rw == MAP_FAILED);
  void* ro = ::mmap(nullptr, seg.value()->geometry().data_size, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(ro != MAP_FAILED);
  ::munmap(ro, seg.value()->geometry().data_size);
  CHECK(::ftruncate(fd, 0) != 0);  // sealed: no SIGBUS for the daemon
}

TEST_CASE("attach request validation", "[attach]") {
  Config config;
  config.max_slots = 16;
  config.max_slot_size = 1 << 20;
  config.max_client_bytes = 8 << 20;
  auto request = [] {
    fl_attach_request r{};
    r.magic = FL_ATTACH_MAGIC;
    r.version = FL_ATTACH_VERSION;
    r.role = FL_ROLE_PRODUCER;
    r.slot_count = 4;
    r.slot_size = 4096;
    std::strcpy(r.stream, "cam-0.raw_1");
    return r;
  };
  auto check = [&](fl_attach_request r, int expected, uid_t uid = 0, gid_t gid = 0) {
    Status s = AttachServer::validateRequest(config, r, uid, gid);
    if (expected == FL_OK) {
      CHECK(s.ok());
    } else {
      REQUIRE_FALSE(s.ok());
      CHECK(s.error().code == expected);
      CHECK_FALSE(s.error().message.empty());
    }
  };
  check(request(), FL_OK);
  auto r = request();
  r.magic = 1;
  check(r, FL_ERR_VERSION);
  r = request();
  r.version = FL_ATTACH_VERSION + 1;
  check(r, FL_ERR_VERSION);
  r = request();
  r.role = 3;
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  r.flags = 1;
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  std::strcpy(r.stream, "bad name");
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  std::memset(r.stream, 'a', sizeof(r.stream));  // not terminated
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  r.stream[0] = '\0';
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  r.slot_count = 17;
  check(r, FL_ERR_LIMIT);
  r = request();
  r.slot_size = (1 << 20) + 1;
  check(r, FL_ERR_LIMIT);
  r = request();
  r.slot_count = 16;
  r.slot_size = 1 << 20;
  check(r, FL_ERR_LIMIT);  // 16 MiB > max_client_bytes
  r = request();
  r.slot_count = 0;
  r.slot_size = 0;
  config.default_slot_count = 3;
  config.default_slot_size = 8192;
  Status s = AttachServer::validateRequest(config, r, 0, 0);
  CHECK(s.ok());
  CHECK(r.slot_count == 3);
  CHECK(r.slot_size == 8192);

  config.allowed_uids = {4242};
  config.allowed_gids = {4343};
  check(request(), FL_ERR_ATTACH_REFUSED, 1000, 1000);
  check(request(), FL_OK, 4242, 1000);
  check(request(), FL_OK, 1000, 4343);
}
