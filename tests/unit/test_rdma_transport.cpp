// Unit tests of the rdma transport against FakeVerbs: device selection,
// connection setup, the send path (batching, selective signalling,
// backpressure), the receive path (landed headers, unknown credits) and how
// every kind of verbs failure is reported.  No RDMA device needed.
#include <arpa/inet.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_verbs.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_status.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_wire.h"

namespace framelink::transport::rdma::testing {
namespace {

using namespace std::chrono_literals;
using Kind = TransportEvent::Kind;

constexpr uint64_t kSession = 0xABCD'0001;

std::shared_ptr<FakeVerbs> twoDevices(ibv_port_state b_state = IBV_PORT_ACTIVE) {
  return std::make_shared<FakeVerbs>(std::vector<FakeVerbs::DeviceSpec>{
      {"fake_a", "10.0.0.1", IBV_PORT_ACTIVE}, {"fake_b", "10.0.0.2", b_state}});
}

// Page-aligned memory, registered on a device.
struct Memory {
  uint8_t* data = nullptr;
  size_t size = 0;
  std::unique_ptr<MemoryRegistration> mr;
  Memory(RdmaDevice& device, size_t n, MemoryAccess access, uint8_t fill = 0xEE) : size(n) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
    std::memset(data, fill, n);
    auto r = device.registerMemory(data, n, access);
    REQUIRE(r.ok());
    mr = std::move(r).value();
  }
  ~Memory() {
    mr.reset();
    std::free(data);
  }
};

struct Endpoint {
  Transport* t = nullptr;
  std::vector<TransportEvent> sends, arrivals, errors;
  std::vector<Kind> order;
  void pump() {
    TransportEvent ev[16];
    size_t n;
    while ((n = t->poll(ev, 16)) > 0) {
      for (size_t i = 0; i < n; ++i) {
        order.push_back(ev[i].kind);
        if (ev[i].kind == Kind::kSendComplete) sends.push_back(ev[i]);
        if (ev[i].kind == Kind::kFrameArrived) arrivals.push_back(ev[i]);
        if (ev[i].kind == Kind::kLinkError) errors.push_back(ev[i]);
      }
    }
  }
  // Exactly one completion per cookie 0..n-1, in order; nothing OK after the LinkError.
  void checkCompletions(size_t n) {
    REQUIRE(sends.size() == n);
    for (size_t i = 0; i < n; ++i) CHECK(sends[i].cookie == i);
    bool after = false;
    size_t s = 0;
    for (Kind k : order) {
      if (k == Kind::kLinkError) after = true;
      if (k == Kind::kSendComplete) {
        if (after) CHECK(sends[s].status != FL_OK);
        ++s;
      }
    }
  }
};

bool readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

struct Pair {
  std::shared_ptr<FakeVerbs> fake;
  std::shared_ptr<RdmaDevice> dev_a, dev_b;
  std::unique_ptr<RdmaListener> listener;
  std::unique_ptr<Transport> a, b;  // dialer, listener side
  RdmaTransport* ra() const { return static_cast<RdmaTransport*>(a.get()); }
  RdmaTransport* rb() const { return static_cast<RdmaTransport*>(b.get()); }
  // Registered memory lives as the daemon's segments do: longer than the
  // transports that may still write into it or read from it while tearing down.
  std::vector<std::unique_ptr<Memory>> memory;
  Memory& mem(RdmaDevice& device, size_t n, MemoryAccess access, uint8_t fill = 0xEE) {
    memory.push_back(std::make_unique<Memory>(device, n, access, fill));
    return *memory.back();
  }
  ~Pair() {
    a.reset();
    b.reset();
    listener.reset();
  }
};

std::unique_ptr<Pair> makePair(RdmaTransportOptions options = {},
                               std::shared_ptr<FakeVerbs> fake = twoDevices()) {
  auto p = std::make_unique<Pair>();
  p->fake = fake;
  auto a = RdmaDevice::open({"", "10.0.0.1"}, fake);
  REQUIRE(a.ok());
  auto b = RdmaDevice::open({"fake_b", "10.0.0.2"}, fake);
  REQUIRE(b.ok());
  p->dev_a = a.value();
  p->dev_b = b.value();
  std::promise<std::unique_ptr<Transport>> accepted;
  auto fut = accepted.get_future();
  auto l = RdmaListener::listen(
      p->dev_b, "10.0.0.2", 0, [](uint64_t s) { return s == kSession; },
      [&](uint64_t, std::unique_ptr<Transport> t) { accepted.set_value(std::move(t)); }, options);
  REQUIRE(l.ok());
  p->listener = std::move(l).value();
  auto d = dialRdma(p->dev_a, "10.0.0.2", p->listener->port(), kSession, 2s, options);
  if (!d) FAIL("dial: " << d.error().message);
  p->a = std::move(d).value();
  REQUIRE(fut.wait_for(2s) == std::future_status::ready);
  p->b = fut.get();
  REQUIRE(p->a->connected());
  REQUIRE(p->b->connected());
  return p;
}

SendRequest request(uint64_t cookie, const RemoteCredit& c, const uint8_t* payload, uint64_t length,
                    uint64_t seq) {
  SendRequest r;
  r.cookie = cookie;
  r.credit = c;
  r.header.credit_id = c.credit_id;
  r.header.length = length;
  r.header.sequence = seq;
  r.header.stream_id = 9;
  r.payload = payload;
  return r;
}

// Pumps until `done` or 2 s.
template <typename F>
void until(Endpoint& x, Endpoint& y, F done) {
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (!done()) {
    x.pump();
    y.pump();
    if (done()) return;
    if (std::chrono::steady_clock::now() > deadline) {
      FAIL("timed out: " << x.sends.size() << " sends, " << x.errors.size() << "/" << y.errors.size()
                         << " errors, " << y.arrivals.size() << " arrivals");
    }
    pollfd fds[2] = {{x.t->eventFd(), POLLIN, 0}, {y.t->eventFd(), POLLIN, 0}};
    ::poll(fds, 2, 10);
  }
}

}  // namespace

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
    auto w = dev->registerMemory(buf.data(), 4096, MemoryAccess::kRemoteWrite);
    REQUIRE(w.ok());
    auto r = dev->registerMemory(buf.data() + 4096, 4096, MemoryAccess::kLocalRead);
    REQUIRE(r.ok());
    uint32_t key = 0;
    CHECK(dev->lookupRemote(buf.data() + 100, 200, &key));
    CHECK(key == w.value()->rkey());
    CHECK(dev->lookupLocal(buf.data() + 4096, 4096, &key));
    CHECK(key == r.value()->lkey());
    CHECK_FALSE(dev->lookupRemote(buf.data() + 4096, 10, &key));  // local-read only
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
  CHECK(p->ra()->counters().recv_wrs == RdmaTransportOptions{}.recv_queue_depth);

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

// ---------------------------------------------------------------- data path

TEST_CASE("rdma write lands header and payload in the credited slot", "[rdma]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& slot = p->mem(*p->dev_b, 256 + 4096, MemoryAccess::kRemoteWrite);
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  for (size_t i = 0; i < 1000; ++i) src.data[i] = static_cast<uint8_t>(i * 13);

  auto credit = p->b->exposeCredit({0x7'0000'0005ull, slot.data + 256, 4096, nullptr});
  REQUIRE(credit.ok());
  CHECK(credit->remote_addr == reinterpret_cast<uint64_t>(slot.data));
  CHECK(credit->rkey == slot.mr->rkey());
  CHECK(credit->length == 4096u);

  SendRequest r = request(1, credit.value(), src.data, 1000, 77);
  r.header.frame_id = 0xF1;
  r.header.wafer_id = 0xA2;
  r.header.timestamp_ns = 123456789;
  r.header.crc32c = 0xC0FFEE;
  r.header.has_crc32c = 1;
  r.header.maybe_redelivered = 1;
  r.header.stream_id = 0x5555'6666'7777'8888ull;
  r.header.attr_length = 3;
  std::memcpy(r.header.attrs, "abc", 3);
  REQUIRE(p->a->post(r) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 1 && rx.arrivals.size() == 1; });
  CHECK(tx.sends[0].status == FL_OK);
  const auto& ev = rx.arrivals[0];
  REQUIRE(ev.status == FL_OK);
  CHECK(ev.header.credit_id == 0x7'0000'0005ull);
  CHECK(ev.header.stream_id == 0x5555'6666'7777'8888ull);
  CHECK(ev.header.sequence == 77u);
  CHECK(ev.header.frame_id == 0xF1u);
  CHECK(ev.header.length == 1000u);
  CHECK(ev.header.has_crc32c == 1u);
  CHECK(ev.header.maybe_redelivered == 1u);
  CHECK(ev.header.attr_length == 3u);
  CHECK(std::memcmp(slot.data + 256, src.data, 1000) == 0);
  CHECK(slot.data[256 + 1000] == 0xEE);
  // What landed is a valid slot header for the consumer.
  fl_slot_header landed;
  std::memcpy(&landed, slot.data, sizeof landed);
  CHECK(landed.frame_id == 0xF1u);
  CHECK(landed.wafer_id == 0xA2u);
  CHECK(landed.timestamp_ns == 123456789u);
  CHECK(landed.length == 1000u);
  CHECK(landed.sequence == 77u);
  CHECK(landed.crc32c == 0xC0FFEEu);
  CHECK(landed.flags == (FL_SLOT_HAS_CRC32C | FL_SLOT_MAYBE_REDELIVERED));
  CHECK(landed.attr_length == 3u);
  CHECK(std::memcmp(landed.attrs, "abc", 3) == 0);
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma batching: N posts go to the adapter as one chain on flush, selectively signalled", "[rdma]") {
  RdmaTransportOptions o;
  o.signal_interval = 4;
  o.max_batch = 64;
  auto p = makePair(o);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  constexpr size_t kFrames = 10;
  Memory& dst = p->mem(*p->dev_b, kFrames * 4096, MemoryAccess::kRemoteWrite);
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead, 0x11);
  const auto before = p->fake->stats();
  for (size_t i = 0; i < kFrames; ++i) {
    auto c = p->b->exposeCredit({i + 1, dst.data + i * 4096 + 256, 1024, nullptr});
    REQUIRE(c.ok());
    REQUIRE(p->a->post(request(i, c.value(), src.data, 100 + i, i + 1)) == PostResult::kOk);
  }
  CHECK(p->fake->stats().post_send_calls == before.post_send_calls);  // nothing before flush
  p->ra()->flush();
  auto after = p->fake->stats();
  CHECK(after.post_send_calls == before.post_send_calls + 1);
  CHECK(after.send_wrs == before.send_wrs + kFrames);
  // Every 4th WR and the last one of the chain: WRs 4, 8 and 10.
  CHECK(after.signalled_wrs == before.signalled_wrs + 3);
  until(tx, rx, [&] { return tx.sends.size() == kFrames && rx.arrivals.size() == kFrames; });
  tx.checkCompletions(kFrames);
  for (auto& s : tx.sends) CHECK(s.status == FL_OK);
  for (size_t i = 0; i < kFrames; ++i) {
    CHECK(rx.arrivals[i].header.credit_id == i + 1);
    CHECK(rx.arrivals[i].header.length == 100 + i);
  }
  p->ra()->flush();  // nothing waits: no empty chain is posted
  CHECK(p->fake->stats().post_send_calls == after.post_send_calls);
  CHECK(p->fake->errors().empty());
}

TEST_CASE("rdma post flushes by itself once max_batch WRs wait", "[rdma]") {
  RdmaTransportOptions o;
  o.max_batch = 8;
  auto p = makePair(o);
  Memory& dst = p->mem(*p->dev_b, 4096, MemoryAccess::kRemoteWrite);
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  const auto before = p->fake->stats();
  for (uint64_t i = 0; i < 20; ++i) {
    auto c = p->b->exposeCredit({i + 1, dst.data + 256, 64, nullptr});
    REQUIRE(c.ok());
    REQUIRE(p->a->post(request(i, c.value(), src.data, 64, i)) == PostResult::kOk);
  }
  CHECK(p->fake->stats().post_send_calls == before.post_send_calls + 2);
  p->ra()->flush();
  CHECK(p->fake->stats().post_send_calls == before.post_send_calls + 3);
  CHECK(p->fake->stats().send_wrs == before.send_wrs + 20);
}

TEST_CASE("rdma backpressure at the send queue depth, and no frame lost after it", "[rdma]") {
  RdmaTransportOptions o;
  o.send_queue_depth = 8;
  o.signal_interval = 4;
  auto p = makePair(o);
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& dst = p->mem(*p->dev_b, 4096, MemoryAccess::kRemoteWrite);
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  std::vector<RemoteCredit> credits;
  for (uint64_t i = 0; i < 20; ++i)
    credits.push_back(p->b->exposeCredit({i + 1, dst.data + 256, 64, nullptr}).value());
  p->fake->pauseDelivery(true);
  size_t posted = 0;
  while (posted < 20 &&
         p->a->post(request(posted, credits[posted], src.data, 64, posted)) == PostResult::kOk) {
    ++posted;
  }
  CHECK(posted == 8);
  p->ra()->flush();
  CHECK(p->a->post(request(99, credits[8], src.data, 64, 8)) == PostResult::kBackpressure);
  CHECK(p->ra()->counters().backpressure == 2);
  p->fake->pauseDelivery(false);
  until(tx, rx, [&] {
    while (posted < 20 &&
           p->a->post(request(posted, credits[posted], src.data, 64, posted)) == PostResult::kOk) {
      ++posted;
    }
    p->ra()->flush();
    return tx.sends.size() == 20 && rx.arrivals.size() == 20;
  });
  tx.checkCompletions(20);
  for (auto& a : rx.arrivals) CHECK(a.status == FL_OK);
  CHECK(p->fake->errors().empty());  // never more WRs than the queue holds
}

TEST_CASE("rdma refuses unregistered memory without crashing", "[rdma]") {
  auto p = makePair();
  Memory& dst = p->mem(*p->dev_b, 8192, MemoryAccess::kRemoteWrite);
  Memory& local = p->mem(*p->dev_b, 4096, MemoryAccess::kLocalRead);
  std::vector<uint8_t> plain(4096);
  // Credit buffers: no registration, a local-read one, no header room, past the end.
  CHECK(p->b->exposeCredit({1, plain.data() + 256, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({2, local.data + 256, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({3, dst.data, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({4, dst.data + 256, 8192, nullptr}).error().code == FL_EINVAL);
  // Duplicate ids, and ids that collide in the immediate data.
  REQUIRE(p->b->exposeCredit({5, dst.data + 256, 100, nullptr}).ok());
  CHECK(p->b->exposeCredit({5, dst.data + 4096, 100, nullptr}).error().code == FL_EINVAL);
  CHECK(p->b->exposeCredit({5 + (uint64_t{1} << 32), dst.data + 4096, 100, nullptr}).error().code ==
        FL_EINVAL);
  // Payloads.
  RemoteCredit c{5, 100, reinterpret_cast<uint64_t>(dst.data), dst.mr->rkey()};
  CHECK(p->a->post(request(1, c, plain.data(), 100, 1)) == PostResult::kInvalid);
  CHECK(p->a->post(request(1, c, nullptr, 0, 1)) == PostResult::kOk);  // zero length needs no memory
  CHECK(p->a->post(request(2, c, nullptr, 10, 1)) == PostResult::kInvalid);
}

TEST_CASE("rdma unknown, retracted and reused credits are reported; the link stays up", "[rdma]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& dst = p->mem(*p->dev_b, 3 * 4096, MemoryAccess::kRemoteWrite);
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead, 0x42);
  auto kept = std::make_shared<int>(1);
  auto retracted = p->b->exposeCredit({50, dst.data + 256, 1000, kept}).value();
  p->b->retractCredit(50);
  p->b->retractCredit(51);       // never exposed
  CHECK(kept.use_count() == 2);  // mapped while a write can still land
  auto good = p->b->exposeCredit({60, dst.data + 4096 + 256, 1000, nullptr}).value();
  // A credit id the receiver never exposed, aimed at valid memory.
  RemoteCredit never{61, 1000, good.remote_addr + 4096, good.rkey};
  REQUIRE(p->a->post(request(0, retracted, src.data, 500, 1)) == PostResult::kOk);
  REQUIRE(p->a->post(request(1, good, src.data, 500, 2)) == PostResult::kOk);
  REQUIRE(p->a->post(request(2, never, src.data, 10, 3)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 3 && rx.arrivals.size() == 3; });
  // The credit was consumed by frame 2: using it again is an unknown credit.
  // (Only after frame 2 was seen: a write into the same slot before that
  // would overwrite its header, as it would on real hardware.)
  REQUIRE(p->a->post(request(3, good, src.data, 10, 4)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 4 && rx.arrivals.size() == 4; });
  CHECK(rx.arrivals[0].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(rx.arrivals[0].header.credit_id == 50u);
  CHECK(rx.arrivals[0].header.sequence == 1u);
  CHECK(kept.use_count() == 1);
  CHECK(rx.arrivals[1].status == FL_OK);
  CHECK(rx.arrivals[2].status == FL_ERR_UNKNOWN_CREDIT);
  CHECK(rx.arrivals[2].header.credit_id == 61u);
  CHECK(rx.arrivals[3].status == FL_ERR_UNKNOWN_CREDIT);
  for (auto& s : tx.sends) CHECK(s.status == FL_OK);
  CHECK(rx.errors.empty());
  CHECK(tx.errors.empty());
  CHECK(p->b->connected());
  CHECK(p->rb()->counters().unknown_credit_frames == 3);
}

// ---------------------------------------------------------------- errors

TEST_CASE("rdma work completion statuses map to frame, link and device scope", "[rdma]") {
  struct Case {
    ibv_wc_status status;
    ErrorScope scope;
    int frame_status;
    int link_status;
  };
  const Case cases[] = {
      {IBV_WC_REM_ACCESS_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_LOC_PROT_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_LOC_LEN_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_REM_INV_REQ_ERR, ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST},
      {IBV_WC_RETRY_EXC_ERR, ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST},
      {IBV_WC_RNR_RETRY_EXC_ERR, ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST},
      {IBV_WC_WR_FLUSH_ERR, ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST},
      {IBV_WC_FATAL_ERR, ErrorScope::kDevice, FL_ERR_LINK_LOST, kStatusDevice},
      {IBV_WC_LOC_QP_OP_ERR, ErrorScope::kDevice, FL_ERR_LINK_LOST, kStatusDevice},
  };
  for (const Case& c : cases) {
    CAPTURE(ibv_wc_status_str(c.status));
    WcClassification k = classifyWcStatus(c.status);
    CHECK(k.scope == c.scope);
    CHECK(k.frame_status == c.frame_status);
    CHECK(k.link_status == c.link_status);

    // And end to end: the 2nd of 4 frames fails.
    auto p = makePair();
    Endpoint tx{p->a.get()}, rx{p->b.get()};
    Memory& dst = p->mem(*p->dev_b, 4096, MemoryAccess::kRemoteWrite);
    Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
    std::vector<RemoteCredit> credits;
    for (uint64_t i = 0; i < 4; ++i)
      credits.push_back(p->b->exposeCredit({i + 1, dst.data + 256, 64, nullptr}).value());
    REQUIRE(p->a->post(request(0, credits[0], src.data, 64, 1)) == PostResult::kOk);
    p->ra()->flush();
    until(tx, rx, [&] { return tx.sends.size() == 1; });
    p->fake->injectSendError(c.status);
    for (uint64_t i = 1; i < 4; ++i)
      REQUIRE(p->a->post(request(i, credits[i], src.data, 64, i + 1)) == PostResult::kOk);
    p->ra()->flush();
    until(tx, rx, [&] { return tx.sends.size() == 4 && !tx.errors.empty(); });
    tx.checkCompletions(4);
    CHECK(tx.sends[0].status == FL_OK);
    CHECK(tx.sends[1].status == c.frame_status);
    CHECK(tx.sends[2].status == FL_ERR_LINK_LOST);
    CHECK(tx.sends[3].status == FL_ERR_LINK_LOST);
    REQUIRE(tx.errors.size() == 1);
    CHECK(tx.errors[0].status == c.link_status);
    CHECK_THAT(tx.errors[0].message, Catch::Contains(ibv_wc_status_str(c.status)));
    CHECK_FALSE(p->a->connected());
    CHECK(p->a->post(request(9, credits[0], src.data, 64, 9)) == PostResult::kNotConnected);
    CHECK(p->a->exposeCredit({99, dst.data + 256, 1, nullptr}).error().code == FL_ERR_LINK_LOST);
    // The peer learns through rdma_cm (the failing side disconnects).
    until(tx, rx, [&] { return !rx.errors.empty(); });
    CHECK(rx.errors[0].status == FL_ERR_LINK_LOST);
    tx.pump();
    CHECK(tx.errors.size() == 1);
  }
}

TEST_CASE("rdma write to a bad rkey fails that frame and the link", "[rdma]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& dst = p->mem(*p->dev_b, 4096, MemoryAccess::kRemoteWrite);
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  auto c = p->b->exposeCredit({1, dst.data + 256, 64, nullptr}).value();
  c.rkey ^= 1;
  REQUIRE(p->a->post(request(0, c, src.data, 64, 1)) == PostResult::kOk);
  p->ra()->flush();
  until(tx, rx, [&] { return tx.sends.size() == 1 && !tx.errors.empty(); });
  CHECK(tx.sends[0].status == FL_ERR_TRANSPORT);
  CHECK(tx.errors[0].status == FL_ERR_LINK_LOST);
  CHECK(dst.data[256] == 0xEE);
}

TEST_CASE("rdma asynchronous events fail the links they concern, once", "[rdma]") {
  struct Case {
    ibv_event_type type;
    bool qp;
    int status;
  };
  const Case cases[] = {{IBV_EVENT_DEVICE_FATAL, false, kStatusDevice},
                        {IBV_EVENT_PORT_ERR, false, kStatusDevice},
                        {IBV_EVENT_QP_FATAL, true, FL_ERR_LINK_LOST},
                        {IBV_EVENT_QP_ACCESS_ERR, true, FL_ERR_LINK_LOST}};
  for (const Case& c : cases) {
    CAPTURE(ibv_event_type_str(c.type));
    auto p = makePair();
    Endpoint tx{p->a.get()}, rx{p->b.get()};
    Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
    Memory& dst = p->mem(*p->dev_b, 4096, MemoryAccess::kRemoteWrite);
    auto credit = p->b->exposeCredit({1, dst.data + 256, 64, nullptr}).value();
    p->fake->pauseDelivery(true);
    REQUIRE(p->a->post(request(0, credit, src.data, 64, 1)) == PostResult::kOk);
    p->ra()->flush();
    p->fake->injectAsyncEvent("fake_a", c.type, c.qp ? p->ra()->cmId()->qp : nullptr);
    REQUIRE(readable(p->a->eventFd(), 2000));
    until(tx, rx, [&] { return !tx.errors.empty() && tx.sends.size() == 1; });
    CHECK(tx.errors[0].status == c.status);
    CHECK(tx.sends[0].status == FL_ERR_LINK_LOST);
    p->fake->injectAsyncEvent("fake_a", c.type, nullptr);  // a second one changes nothing
    std::this_thread::sleep_for(20ms);
    tx.pump();
    CHECK(tx.errors.size() == 1);
    p->fake->pauseDelivery(false);
  }
}

TEST_CASE("rdma peer disconnect fails the link once and flushes posted sends", "[rdma]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  Memory& dst = p->mem(*p->dev_b, 4096, MemoryAccess::kRemoteWrite);
  auto credit = p->b->exposeCredit({1, dst.data + 256, 64, nullptr}).value();
  p->fake->pauseDelivery(true);
  for (uint64_t i = 0; i < 5; ++i)
    REQUIRE(p->a->post(request(i, credit, src.data, 64, i)) == PostResult::kOk);
  p->ra()->flush();
  REQUIRE(p->a->post(request(5, credit, src.data, 64, 5)) == PostResult::kOk);  // not flushed yet
  p->b->shutdown();
  rx.pump();
  REQUIRE(rx.errors.size() == 1);
  CHECK(rx.errors[0].status == FL_ERR_SHUTDOWN);
  until(tx, rx, [&] { return !tx.errors.empty() && tx.sends.size() == 6; });
  tx.checkCompletions(6);
  for (auto& s : tx.sends) CHECK(s.status == FL_ERR_LINK_LOST);
  CHECK(tx.errors.size() == 1);
  CHECK(tx.errors[0].status == FL_ERR_LINK_LOST);
  CHECK_THAT(tx.errors[0].message, Catch::Contains("disconnected"));
  p->fake->pauseDelivery(false);
}

TEST_CASE("rdma shutdown completes everything and tears down in order", "[rdma]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  Memory& dst = p->mem(*p->dev_b, 4096, MemoryAccess::kRemoteWrite);
  auto credit = p->b->exposeCredit({1, dst.data + 256, 64, nullptr}).value();
  p->fake->pauseDelivery(true);
  for (uint64_t i = 0; i < 5; ++i)
    REQUIRE(p->a->post(request(i, credit, src.data, 64, i)) == PostResult::kOk);
  p->ra()->flush();
  REQUIRE(p->a->post(request(5, credit, src.data, 64, 5)) == PostResult::kOk);
  const auto before = p->fake->stats();
  p->a->shutdown();
  tx.pump();  // everything is reported by the time shutdown() returns
  tx.checkCompletions(6);
  for (auto& s : tx.sends) CHECK(s.status == FL_ERR_LINK_LOST);
  REQUIRE(tx.errors.size() == 1);
  CHECK(tx.errors[0].status == FL_ERR_SHUTDOWN);
  auto after = p->fake->stats();
  CHECK(after.live_qps == before.live_qps - 1);
  CHECK(after.live_cqs == before.live_cqs - 1);
  CHECK(after.live_ids == before.live_ids - 1);
  CHECK(p->a->post(request(7, credit, src.data, 64, 7)) == PostResult::kNotConnected);
  p->a->shutdown();  // idempotent
  tx.pump();
  CHECK(tx.errors.size() == 1);
  until(tx, rx, [&] { return !rx.errors.empty(); });
  p->b->shutdown();
  p->fake->pauseDelivery(false);
  CHECK(p->fake->errors().empty());  // no QP/CQ/id destroyed out of order, every CQ event acked
}

TEST_CASE("rdma eventFd is readable exactly while something is to be polled", "[rdma]") {
  auto p = makePair();
  Endpoint tx{p->a.get()}, rx{p->b.get()};
  Memory& src = p->mem(*p->dev_a, 4096, MemoryAccess::kLocalRead);
  Memory& dst = p->mem(*p->dev_b, 3 * 4096, MemoryAccess::kRemoteWrite);
  tx.pump();
  rx.pump();
  CHECK_FALSE(readable(p->a->eventFd(), 0));
  CHECK_FALSE(readable(p->b->eventFd(), 0));
  for (uint64_t i = 0; i < 3; ++i) {
    auto c = p->b->exposeCredit({i + 1, dst.data + i * 4096 + 256, 64, nullptr}).value();
    REQUIRE(p->a->post(request(i, c, src.data, 64, i)) == PostResult::kOk);
  }
  CHECK_FALSE(readable(p->b->eventFd(), 0));  // not flushed yet
  p->ra()->flush();
  REQUIRE(readable(p->a->eventFd(), 1000));
  REQUIRE(readable(p->b->eventFd(), 1000));
  TransportEvent ev;
  size_t arrived = 0;
  while (arrived < 3) {
    REQUIRE(readable(p->b->eventFd(), 1000));
    arrived += p->b->poll(&ev, 1);
  }
  CHECK(p->b->poll(&ev, 1) == 0);
  CHECK_FALSE(readable(p->b->eventFd(), 0));
  size_t done = 0;
  while (done < 3) {
    REQUIRE(readable(p->a->eventFd(), 1000));
    done += p->a->poll(&ev, 1);
  }
  CHECK(p->a->poll(&ev, 1) == 0);
  CHECK_FALSE(readable(p->a->eventFd(), 0));
  p->b->shutdown();
  REQUIRE(readable(p->a->eventFd(), 1000));
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

// A dialer that sends a well-formed connect request (naming a session the
// listener accepts) from `ip` and then does nothing: no QP, no RTU.
struct StalledDialer {
  std::shared_ptr<FakeVerbs> fake;
  rdma_event_channel* channel = nullptr;
  rdma_cm_id* id = nullptr;
  StalledDialer(std::shared_ptr<FakeVerbs> f, const std::string& ip, uint16_t port) : fake(std::move(f)) {
    channel = fake->createEventChannel();
    REQUIRE(fake->createId(channel, &id, nullptr, RDMA_PS_TCP) == 0);
    sockaddr_in src = ipv4(ip, 0), dst = ipv4("10.0.0.2", port);
    REQUIRE(fake->resolveAddr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                              100) == 0);
    REQUIRE(fake->resolveRoute(id, 100) == 0);
    REQUIRE(fake->setAckTimeout(id, 14) == 0);
    RdmaConnectData data{kRdmaConnectMagic, kRdmaProtocolVersion, 0, kSession};
    rdma_conn_param param{};
    param.private_data = &data;
    param.private_data_len = sizeof data;
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
  RdmaListenerCounters counters() { return {&timed_out, &refused}; }
};

std::unique_ptr<RdmaListener> watchedListener(const std::shared_ptr<RdmaDevice>& device, Watched& w,
                                              std::chrono::milliseconds handshake_timeout) {
  auto l = RdmaListener::listen(
      device, "10.0.0.2", 0, [](uint64_t s) { return s == kSession; },
      [&w](uint64_t, std::unique_ptr<Transport> t) {
        std::lock_guard<std::mutex> lock(w.mu);
        w.accepted.push_back(std::move(t));
      },
      {}, handshake_timeout, w.counters());
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

}  // namespace framelink::transport::rdma::testing
