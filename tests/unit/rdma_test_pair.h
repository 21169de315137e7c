// What the rdma transport's unit tests share: two fake devices on one fake
// fabric, registered memory, a connected pair of transports (with the
// memory most data-path tests send from and into: DataPath), and an endpoint
// that polls one of them and sorts its events.
#pragma once

#include <arpa/inet.h>
#include <poll.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_verbs.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_transport.h"

namespace framelink::transport::rdma::testing {

using namespace std::chrono_literals;
using Kind = TransportEvent::Kind;

inline constexpr uint64_t kSession = 0xABCD'0001;

inline std::shared_ptr<FakeVerbs> twoDevices(ibv_port_state b_state = IBV_PORT_ACTIVE) {
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
  std::vector<TransportEvent> sends, arrivals, errors, reads;
  std::vector<std::string> controls;
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
        if (ev[i].kind == Kind::kControl) controls.push_back(ev[i].control);
        if (ev[i].kind == Kind::kReadComplete) reads.push_back(ev[i]);
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

inline bool readable(int fd, int ms) {
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

  Pair() = default;
  // Delegates, so that the destructor tears down whatever connect() built
  // before a check failed.
  Pair(RdmaTransportOptions options, std::shared_ptr<FakeVerbs> with) : Pair() {
    connect(options, std::move(with));
  }
  ~Pair() {
    a.reset();
    b.reset();
    listener.reset();
  }

  // Opens both devices on `with` and connects a to b.
  void connect(RdmaTransportOptions options, std::shared_ptr<FakeVerbs> with) {
    fake = with;
    auto da = RdmaDevice::open({"", "10.0.0.1"}, fake);
    REQUIRE(da.ok());
    auto db = RdmaDevice::open({"fake_b", "10.0.0.2"}, fake);
    REQUIRE(db.ok());
    dev_a = da.value();
    dev_b = db.value();
    std::promise<std::unique_ptr<Transport>> accepted;
    auto fut = accepted.get_future();
    auto l = RdmaListener::listen(
        dev_b, "10.0.0.2", 0, [](uint64_t s) { return s == kSession; },
        [&](uint64_t, std::unique_ptr<Transport> t) { accepted.set_value(std::move(t)); }, options);
    REQUIRE(l.ok());
    listener = std::move(l).value();
    auto d = dialRdma(dev_a, "10.0.0.2", listener->port(), kSession, 2s, options);
    if (!d) FAIL("dial: " << d.error().message);
    a = std::move(d).value();
    REQUIRE(fut.wait_for(2s) == std::future_status::ready);
    b = fut.get();
    REQUIRE(a->connected());
    REQUIRE(b->connected());
  }
};

inline std::unique_ptr<Pair> makePair(RdmaTransportOptions options = {},
                                      std::shared_ptr<FakeVerbs> fake = twoDevices()) {
  auto p = std::make_unique<Pair>();
  p->connect(options, std::move(fake));
  return p;
}

// A request for `length` bytes at `payload`, which carries no memory key.
inline SendRequest request(uint64_t cookie, const RemoteCredit& c, const uint8_t* payload, uint64_t length,
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

// A request for the first `length` bytes of `src`, under its registration's
// lkey (as the daemon sends from a segment registered at attach).
inline SendRequest request(uint64_t cookie, const RemoteCredit& c, const Memory& src, uint64_t length,
                           uint64_t seq) {
  SendRequest r = request(cookie, c, src.data, length, seq);
  r.local_key = src.mr->lkey();
  return r;
}

// What most tests of the data path start from: a connected pair, a 4 KiB
// payload source registered on a's device and `dst_bytes` registered on b's
// for credits, in slots of 4 KiB (256 bytes of slot header, then the frame).
struct DataPath : Pair {
  Memory& src;
  Memory& dst;

  explicit DataPath(RdmaTransportOptions options = {}, size_t dst_bytes = 4096, uint8_t src_fill = 0xEE)
      : Pair(options, twoDevices()),
        src(mem(*dev_a, 4096, MemoryAccess::kLocalRead, src_fill)),
        dst(mem(*dev_b, dst_bytes, MemoryAccess::kCreditWindows)) {}

  // Exposes `length` bytes of dst's slot `slot` on b under `credit_id`.
  RemoteCredit credit(uint64_t credit_id, uint64_t length, size_t slot = 0) {
    auto c = b->exposeCredit({credit_id, dst.data + slot * 4096 + 256, length, nullptr});
    REQUIRE(c.ok());
    b->flush();  // the window's bind goes with b's next chain (the grant's, were there one)
    return c.value();
  }

  // Holds delivery back and posts frames 0 to 5 of 64 bytes from src into
  // `c` (cookie and sequence i): 0 to 4 flushed to the adapter, 5 not yet.
  void holdSixFrames(const RemoteCredit& c) {
    fake->pauseDelivery(true);
    for (uint64_t i = 0; i < 5; ++i) REQUIRE(a->post(request(i, c, src, 64, i)) == PostResult::kOk);
    ra()->flush();
    REQUIRE(a->post(request(5, c, src, 64, 5)) == PostResult::kOk);  // not flushed yet
  }
};

inline std::unique_ptr<DataPath> makeDataPath(RdmaTransportOptions options = {}, size_t dst_bytes = 4096,
                                              uint8_t src_fill = 0xEE) {
  return std::make_unique<DataPath>(options, dst_bytes, src_fill);
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

}  // namespace framelink::transport::rdma::testing
