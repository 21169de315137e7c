// libFuzzer target: the rdma transport's receive path (rdma_completions.cpp,
// rdma_windows.cpp) over the fake verbs of the unit tests, with a hostile
// peer's adapter scripted by the input (FakeVerbs::peerWrite,
// injectRecvCompletion).  The receiver exposes credits on four 4 KiB slots
// of one kCreditWindows registration and retracts and re-grants them while
// the peer writes: into a credit's slot or beside it, with its window's key
// or a stale one, with or without an immediate naming a live, retracted or
// unknown credit; and completes receive WRs with any status, opcode, flags,
// byte count and immediate data.
// Invariants, after every step:
//   * no byte changes outside the header and payload of a credit live when
//     the peer wrote (the registration is canary-filled and compared with a
//     shadow copy);
//   * a FrameArrived with FL_OK names a live credit, with a length within
//     it; a completion for a retracted or unknown credit is not FL_OK;
//   * at most one LinkError; no crash (ASan, UBSan).
#include <arpa/inet.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <vector>

#include "fake_verbs.h"
#include "transport/rdma/rdma_connect.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/rdma/rdma_wire.h"

using namespace framelink;
using namespace framelink::transport;
using namespace framelink::transport::rdma;
using framelink::transport::rdma::testing::FakeVerbs;
using namespace std::chrono_literals;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_rdma_receive: %s\n", what);
  std::abort();
}

constexpr uint64_t kSession = 0xF00D;
constexpr size_t kSlots = 4;
constexpr size_t kSlotBytes = 4096;
constexpr uint8_t kCanary = 0x5A;

// The receiver (b, the listening side) and its peer's adapter.
class Link {
 public:
  bool open() {
    fake_ = std::make_shared<FakeVerbs>(std::vector<FakeVerbs::DeviceSpec>{
        {"fake_a", "10.0.0.1", IBV_PORT_ACTIVE}, {"fake_b", "10.0.0.2", IBV_PORT_ACTIVE}});
    auto da = RdmaDevice::open({"fake_a", "10.0.0.1"}, fake_);
    auto db = RdmaDevice::open({"fake_b", "10.0.0.2"}, fake_);
    if (!da.ok() || !db.ok()) return false;
    dev_a_ = da.value();
    dev_b_ = db.value();
    std::promise<std::unique_ptr<Transport>> accepted;
    auto fut = accepted.get_future();
    auto l = RdmaListener::listen(
        dev_b_, "10.0.0.2", 0, [](uint64_t s) { return s == kSession; },
        [&](uint64_t, std::unique_ptr<Transport> t) { accepted.set_value(std::move(t)); }, {});
    if (!l.ok()) return false;
    listener_ = std::move(l).value();
    auto d = dialRdma(dev_a_, "10.0.0.2", listener_->port(), kSession, 2s, {});
    if (!d) return false;
    a_ = std::move(d).value();
    if (fut.wait_for(2s) != std::future_status::ready) return false;
    b_ = fut.get();
    qp_b_ = fake_->qpOnDevice("fake_b");
    const size_t bytes = kSlots * kSlotBytes;
    mem_ = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
    std::memset(mem_, kCanary, bytes);
    shadow_.assign(mem_, mem_ + bytes);
    auto mr = dev_b_->registerMemory(mem_, bytes, MemoryAccess::kCreditWindows);
    if (!mr.ok()) return false;
    mr_ = std::move(mr).value();
    return b_ != nullptr && qp_b_ != nullptr && b_->connected();
  }

  ~Link() {
    a_.reset();
    b_.reset();
    listener_.reset();
    mr_.reset();
    std::free(mem_);
  }

  void grant(size_t slot, uint64_t capacity) {
    Slot& s = slots_[slot];
    if (s.live || failed()) return;
    const uint64_t id = ++last_id_;
    auto c = b_->exposeCredit({id, mem_ + slot * kSlotBytes + kWireHeaderBytes, capacity, nullptr});
    // The receiver's own write: it poisons the header's length (a frame must bring its own header;
    // one exposure that fails later may have done so too).
    uint8_t* length = mem_ + slot * kSlotBytes + offsetof(RdmaWireHeader, length);
    uint64_t poison = 0;
    std::memcpy(&poison, length, sizeof poison);
    if (c.ok() && poison != kPoisonedLength) fail("an exposed credit's slot header is not poisoned");
    std::memcpy(shadow_.data() + (length - mem_), length, sizeof poison);
    if (!c.ok()) return;  // refused (e.g. the link went down): nothing exposed
    b_->flush();          // its window is bound with b's next chain
    s.live = true;
    s.credit = c.value();
    s.has_credit = true;
  }

  void retract(size_t slot) {
    Slot& s = slots_[slot];
    if (!s.live) return;
    b_->retractCredit(s.credit.credit_id);
    s.live = false;
    step();
  }

  // The peer writes `n` bytes of `fill` at `delta` from the slot's header
  // (its remote address) under its (possibly stale) key, or one off by `key_delta`.
  void write(size_t slot, int64_t delta, size_t n, uint8_t fill, int key_delta, std::optional<uint32_t> imm) {
    const Slot& s = slots_[slot];
    if (!s.has_credit) return;
    const uint64_t addr = s.credit.remote_addr + static_cast<uint64_t>(delta);  // the header lands there
    std::vector<uint8_t> bytes(n, fill);
    // A header that announces what was written, when the fill makes it one.
    if (n >= kWireHeaderBytes && (fill & 1) != 0) {
      RdmaWireHeader w{};
      std::memset(&w, 0, sizeof w);
      w.length = n - kWireHeaderBytes;
      std::memcpy(bytes.data(), &w, sizeof w);
    }
    fake_->peerWrite(qp_b_, s.credit.rkey + key_delta, addr, bytes, imm);
    step();
  }

  std::optional<uint32_t> immFor(size_t slot, uint8_t how) const {
    const Slot& s = slots_[slot];
    switch (how % 4) {
      case 0:
        return std::nullopt;
      case 1:
        return htonl(static_cast<uint32_t>(s.credit.credit_id));
      case 2:
        return htonl(static_cast<uint32_t>(last_id_ + 1));  // never granted yet
      default:
        return htonl(kControlImmLast);
    }
  }

  void complete(const ibv_wc& wc) {
    fake_->injectRecvCompletion(qp_b_, wc);
    step();
  }

  bool failed() const { return link_errors_ != 0; }

  // Lets the receiver take its completions, then checks the memory and the events.
  void step() {
    // The memory first: what landed came while the liveness as it stands
    // held (a frame's FL_OK below consumes its credit).
    checkMemory();
    TransportEvent ev[16];
    size_t n;
    while ((n = b_->poll(ev, 16)) > 0) {
      for (size_t i = 0; i < n; ++i) checkEvent(ev[i]);
    }
    TransportEvent drain[16];
    while (a_->poll(drain, 16) > 0) {
    }
  }

 private:
  struct Slot {
    bool live = false;
    bool has_credit = false;  // `credit` was granted once (live or not)
    RemoteCredit credit;
  };

  void checkEvent(const TransportEvent& e) {
    if (e.kind == TransportEvent::Kind::kLinkError) {
      if (++link_errors_ > 1) fail("a second LinkError");
      return;
    }
    if (e.kind != TransportEvent::Kind::kFrameArrived || e.status != FL_OK) return;
    for (Slot& s : slots_) {
      if (s.live && s.credit.credit_id == e.header.credit_id) {
        if (e.header.length > s.credit.length) fail("FL_OK for a frame longer than its credit");
        s.live = false;  // consumed by its frame
        return;
      }
    }
    fail("FL_OK for a credit that is not live");
  }

  // Every byte that changed since the last step lies in the header and
  // payload of a live credit.
  void checkMemory() {
    for (size_t i = 0; i < shadow_.size(); ++i) {
      if (mem_[i] == shadow_[i]) continue;
      const size_t slot = i / kSlotBytes;
      const size_t at = i % kSlotBytes;
      const Slot& s = slots_[slot];
      const bool inside = s.has_credit && at < kWireHeaderBytes + s.credit.length;
      if (!inside || !s.live) fail("a byte changed outside the slot of a live credit");
      shadow_[i] = mem_[i];
    }
  }

  std::shared_ptr<FakeVerbs> fake_;
  std::shared_ptr<RdmaDevice> dev_a_, dev_b_;
  std::unique_ptr<RdmaListener> listener_;
  std::unique_ptr<Transport> a_, b_;
  ibv_qp* qp_b_ = nullptr;
  uint8_t* mem_ = nullptr;
  std::unique_ptr<MemoryRegistration> mr_;
  std::vector<uint8_t> shadow_;
  Slot slots_[kSlots];
  uint64_t last_id_ = 0;
  int link_errors_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Link link;
  if (!link.open()) fail("the fake link did not come up");
  size_t i = 0;
  auto next = [&] { return i < size ? data[i++] : uint8_t{0}; };
  while (i < size && !link.failed()) {
    const uint8_t op = next();
    const size_t slot = (op >> 4) % kSlots;
    switch (op % 5) {
      case 0:
        link.grant(slot, (uint64_t{next()} << 4) % (kSlotBytes - kWireHeaderBytes + 1));
        break;
      case 1:
        link.retract(slot);
        break;
      case 2: {
        const int64_t delta = int64_t{static_cast<int8_t>(next())} * 16;
        const size_t n = size_t{next()} * 8;
        const uint8_t fill = next();
        const int key_delta = (op & 0x40) != 0 ? static_cast<int8_t>(next()) : 0;
        link.write(slot, delta, n, fill, key_delta, link.immFor(slot, op >> 2));
        break;
      }
      case 3: {
        ibv_wc wc{};
        const uint8_t how = next();
        wc.status = (how & 1) != 0 ? static_cast<ibv_wc_status>(next() % 23) : IBV_WC_SUCCESS;
        wc.opcode = (how & 2) != 0 ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
        wc.wc_flags = (how & 4) != 0 ? 0 : IBV_WC_WITH_IMM;
        wc.byte_len = uint32_t{next()} << 4 | next();
        wc.imm_data = link.immFor(slot, how >> 3).value_or(htonl(uint32_t{next()}));
        link.complete(wc);
        break;
      }
      case 4:
        link.step();
        break;
    }
  }
  return 0;
}
