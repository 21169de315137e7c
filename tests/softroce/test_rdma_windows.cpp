// With real verbs: a peer writes into a consumer's receive memory only through the memory window
// of a live credit.  Every write outside one -- a plain RDMA_WRITE with no credit, under the
// segment's own key, a frame longer than its slot, a key granted on another link, a key whose
// credit was consumed or retracted -- is refused by the adapter (IBV_WC_REM_ACCESS_ERR on the
// writer), and the consumer's bytes stay as they were.
//
//   FRAMELINK_RDMA_A_IP=10.77.1.1 FRAMELINK_RDMA_B_IP=10.77.1.2 framelink_rdma_windows
//
// B is the receiving daemon's device, A the writer's.  Exit status: 0 passed, 1 failed, 77
// skipped (no addresses given).
#include <poll.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "framelink/framelink.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_wire.h"

namespace rdma = framelink::transport::rdma;
namespace transport = framelink::transport;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kSkip = 77;
constexpr uint64_t kSession = 0x3A11D0;
constexpr size_t kStride = 64 * 1024;  // slot: 256-byte header + payload
constexpr size_t kSlots = 3;
constexpr uint64_t kCapacity = kStride - rdma::kWireHeaderBytes;
constexpr uint8_t kFill = 0xEE;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "  ok  " : "  FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

// Registered in pieces of `piece` bytes, as the daemon registers a consumer's slots one by one.
struct Buffer {
  uint8_t* data;
  size_t size;
  std::vector<std::unique_ptr<rdma::MemoryRegistration>> mrs;
  Buffer(rdma::RdmaDevice& dev, size_t n, size_t piece, rdma::MemoryAccess access, uint8_t fill) : size(n) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, n));
    std::memset(data, fill, n);
    for (size_t off = 0; off < n; off += piece) {
      auto r = dev.registerMemory(data + off, piece, access);
      if (!r) {
        std::printf("registerMemory: %s\n", r.error().message.c_str());
        std::exit(1);
      }
      mrs.push_back(std::move(r).value());
    }
  }
  ~Buffer() {
    mrs.clear();
    std::free(data);
  }
  uint8_t* slot(size_t i) const { return data + i * kStride; }
};

struct Side {
  std::unique_ptr<transport::Transport> t;
  std::vector<transport::TransportEvent> arrivals, errors;
  void pump() {
    transport::TransportEvent ev[8];
    size_t n;
    while ((n = t->poll(ev, 8)) > 0) {
      for (size_t i = 0; i < n; ++i) {
        if (ev[i].kind == transport::TransportEvent::Kind::kFrameArrived) arrivals.push_back(ev[i]);
        if (ev[i].kind == transport::TransportEvent::Kind::kLinkError) errors.push_back(ev[i]);
      }
    }
  }
};

struct Link {
  std::unique_ptr<rdma::RdmaListener> listener;
  Side a, b;  // a writes, b receives
  bool ok = false;
};

Link connect(const std::shared_ptr<rdma::RdmaDevice>& dev_a, const std::shared_ptr<rdma::RdmaDevice>& dev_b,
             const std::string& b_ip) {
  Link l;
  auto accepted = std::make_shared<std::promise<std::unique_ptr<transport::Transport>>>();
  auto fut = accepted->get_future();
  auto listener = rdma::RdmaListener::listen(
      dev_b, b_ip, 0, [](uint64_t s) { return s == kSession; },
      [accepted](uint64_t, std::unique_ptr<transport::Transport> t) { accepted->set_value(std::move(t)); });
  if (!listener) return l;
  l.listener = std::move(listener).value();
  auto d = rdma::dialRdma(dev_a, b_ip, l.listener->port(), kSession, 15s);
  if (!d || fut.wait_for(15s) != std::future_status::ready) return l;
  l.a.t = std::move(d).value();
  l.b.t = fut.get();
  l.ok = true;
  return l;
}

template <typename F>
bool until(Link& l, F done) {
  const auto deadline = Clock::now() + 10s;
  while (!done()) {
    l.a.pump();
    l.b.pump();
    if (Clock::now() > deadline) return false;
    pollfd fds[2] = {{l.a.t->eventFd(), POLLIN, 0}, {l.b.t->eventFd(), POLLIN, 0}};
    ::poll(fds, 2, 20);
  }
  return true;
}

transport::SendRequest frame(const transport::RemoteCredit& c, const Buffer& src, uint64_t length,
                             uint64_t seq) {
  transport::SendRequest r;
  r.cookie = seq;
  r.credit = c;
  r.header.credit_id = c.credit_id;
  r.header.length = length;
  r.header.sequence = seq;
  r.header.stream_id = 7;
  r.payload = src.data;
  r.local_key = src.mrs[0]->lkey();
  return r;
}

// A plain RDMA_WRITE (no immediate: the receiver's daemon would see nothing) on a's queue pair.
bool rawWrite(Link& l, const Buffer& src, uint64_t remote_addr, uint32_t rkey, uint32_t length) {
  ibv_sge sge{reinterpret_cast<uint64_t>(src.data), length, src.mrs[0]->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = uint64_t{1} << 60;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  auto* t = static_cast<rdma::RdmaTransport*>(l.a.t.get());
  return ibv_post_send(t->cmId()->qp, &wr, &bad) == 0;
}

// The writer's link fails with the adapter's remote access error.
void refused(Link& l, const std::string& what) {
  const bool failed = until(l, [&] { return !l.a.errors.empty(); });
  const std::string msg = failed ? l.a.errors[0].message : "no error within 10 s";
  check(msg.find(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)) != std::string::npos,
        what + ": refused with REM_ACCESS_ERR (" + msg + ")");
}

bool same(const uint8_t* p, const std::vector<uint8_t>& before) {
  return std::memcmp(p, before.data(), before.size()) == 0;
}

// The two devices and the address B listens on.
struct Devices {
  std::shared_ptr<rdma::RdmaDevice> a, b;
  std::string b_ip;
};

// The consumer's slots on B (one registration each, written through credit windows) and the
// writer's source on A.  Slot 1 as it was is kept: each case starts from it, so that one write
// that lands does not hide the next.
struct Slots {
  Buffer dst, src;
  uint64_t next_id = 1;
  std::vector<uint8_t> slot1;

  Slots(rdma::RdmaDevice& dev_b, rdma::RdmaDevice& dev_a)
      : dst(dev_b, kSlots * kStride, kStride, rdma::MemoryAccess::kCreditWindows, kFill),
        src(dev_a, 2 * kStride, 2 * kStride, rdma::MemoryAccess::kLocalRead, 0x42),
        slot1(dst.slot(1), dst.slot(1) + kStride) {}

  // A credit for `slot`, exposed by l's receiving side.
  transport::RemoteCredit expose(Link& l, size_t slot) {
    auto c = l.b.t->exposeCredit({next_id++, dst.slot(slot) + rdma::kWireHeaderBytes, kCapacity, nullptr});
    if (!c) std::printf("exposeCredit: %s\n", c.error().message.c_str());
    l.b.t->flush();  // binds its window, as the grant's chain would
    // What slot 1 holds once granted (the transport poisons its header's length): the bytes a
    // refused write must leave as they are.
    if (slot == 1) slot1.assign(dst.slot(1), dst.slot(1) + kStride);
    return c ? c.value() : transport::RemoteCredit{};
  }
  void resetSlot1() { std::memcpy(dst.slot(1), slot1.data(), kStride); }
};

// An honest frame lands; its credit's key is refused once the frame arrived.  False when the
// link does not come up.
bool honestFrameThenConsumedKey(const Devices& d, Slots& s) {
  Link l = connect(d.a, d.b, d.b_ip);
  check(l.ok, "link up");
  if (!l.ok) return false;
  auto c = s.expose(l, 0);
  check(c.rkey != s.dst.mrs[0]->rkey(), "the credit's key is a window's, not its slot registration's");
  l.a.t->post(frame(c, s.src, 4096, 1));
  l.a.t->flush();
  const bool arrived = until(l, [&] { return !l.b.arrivals.empty(); });
  check(arrived && l.b.arrivals[0].status == FL_OK, "a frame through its credit's window arrives");
  std::vector<uint8_t> slot0(s.dst.slot(0), s.dst.slot(0) + kStride);
  std::memset(s.src.data, 0x77, 4096);
  l.a.t->post(frame(c, s.src, 4096, 2));
  l.a.t->flush();
  refused(l, "the same key after its frame arrived");
  check(same(s.dst.slot(0), slot0), "slot 0 unchanged after the consumed credit's key was used");
  return true;
}

// Plain writes with no credit for the slot: under another slot's credit key, and under the
// slot registration's own key.
void plainWrites(const Devices& d, Slots& s) {
  {
    s.resetSlot1();
    Link l = connect(d.a, d.b, d.b_ip);
    auto c = s.expose(l, 0);
    check(rawWrite(l, s.src, reinterpret_cast<uint64_t>(s.dst.slot(1) + 256), c.rkey, 4096), "posted");
    refused(l, "plain RDMA_WRITE into slot 1 under slot 0's key");
    check(same(s.dst.slot(1), s.slot1), "slot 1 unchanged");
  }
  {
    s.resetSlot1();
    Link l = connect(d.a, d.b, d.b_ip);
    check(rawWrite(l, s.src, reinterpret_cast<uint64_t>(s.dst.slot(1) + 256), s.dst.mrs[1]->rkey(), 4096),
          "posted");
    refused(l, "plain RDMA_WRITE into slot 1 under its registration's own key");
    check(same(s.dst.slot(1), s.slot1), "slot 1 unchanged");
  }
}

void frameLongerThanSlot(const Devices& d, Slots& s) {
  s.resetSlot1();
  Link l = connect(d.a, d.b, d.b_ip);
  auto c = s.expose(l, 0);
  c.length = kStride + 4096;
  l.a.t->post(frame(c, s.src, kStride + 4096 - rdma::kWireHeaderBytes, 1));
  l.a.t->flush();
  refused(l, "a frame running 4 KiB past its slot");
  check(same(s.dst.slot(1), s.slot1), "slot 1 (the neighbour) unchanged");
}

void keyFromAnotherLink(const Devices& d, Slots& s) {
  s.resetSlot1();
  Link l1 = connect(d.a, d.b, d.b_ip);
  Link l2 = connect(d.a, d.b, d.b_ip);
  auto c = s.expose(l1, 1);
  l2.a.t->post(frame(c, s.src, 4096, 1));
  l2.a.t->flush();
  refused(l2, "link 1's key used on link 2");
  check(same(s.dst.slot(1), s.slot1), "slot 1 unchanged");
}

void retractedCreditKey(const Devices& d, Slots& s) {
  s.resetSlot1();
  Link l = connect(d.a, d.b, d.b_ip);
  auto c = s.expose(l, 1);
  l.b.t->retractCredit(c.credit_id);
  l.b.pump();
  l.a.t->post(frame(c, s.src, 4096, 1));
  l.a.t->flush();
  refused(l, "a retracted credit's key");
  check(same(s.dst.slot(1), s.slot1), "slot 1 unchanged");
}

}  // namespace

int main() {
  const char* a_ip = std::getenv("FRAMELINK_RDMA_A_IP");
  const char* b_ip = std::getenv("FRAMELINK_RDMA_B_IP");
  if (a_ip == nullptr || b_ip == nullptr) {
    std::printf("SKIP: set FRAMELINK_RDMA_A_IP and FRAMELINK_RDMA_B_IP\n");
    return kSkip;
  }
  auto dev_a = rdma::RdmaDevice::open({"", a_ip});
  auto dev_b = rdma::RdmaDevice::open({"", b_ip});
  if (!dev_a || !dev_b) {
    std::printf("FAIL: %s\n", (!dev_a ? dev_a.error() : dev_b.error()).message.c_str());
    return 1;
  }
  const Devices devices{*dev_a, *dev_b, b_ip};
  Slots slots(**dev_b, **dev_a);
  if (!honestFrameThenConsumedKey(devices, slots)) return 1;
  plainWrites(devices, slots);
  frameLongerThanSlot(devices, slots);
  keyFromAnotherLink(devices, slots);
  retractedCreditKey(devices, slots);
  std::printf("%s: %d failure(s)\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
