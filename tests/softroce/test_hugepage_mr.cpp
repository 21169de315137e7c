// A daemon data segment on 2 MiB hugepages is registered with an RDMA device and receives one
// frame (slot header + payload, two SGEs of one RDMA WRITE, as the rdma transport posts it)
// from another device; the bytes are checked in place.
//
//   FRAMELINK_RDMA_A_IP=10.77.1.1 FRAMELINK_RDMA_B_IP=10.77.1.2 framelink_rdma_hugepage_mr
//
// B_IP names the device that owns the segment (the receiving daemon), A_IP the sender's; they may
// be the same address.  Exit status: 0 passed, 1 failed, 77 skipped (no addresses given, or no
// hugepages reserved while FRAMELINK_RDMA_REQUIRE_HUGEPAGES is unset).
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "attach/segment.h"
#include "framelink/shm_layout.h"

#if FRAMELINK_SOFTROCE_HAVE_RDMA_DEVICE
#include "transport/rdma/rdma_device.h"
#endif

namespace {

constexpr int kSkip = 77;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "  ok  " : "  FAIL", what.c_str());
  std::fflush(stdout);
  if (!ok) ++g_failures;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

long nrHugepages() {
  std::ifstream in("/proc/sys/vm/nr_hugepages");
  long n = 0;
  in >> n;
  return n;
}

// KernelPageSize (kB) of the mapping that contains addr, from /proc/self/smaps; -1 if not found.
long kernelPageSizeKb(const void* addr) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  bool inside = false;
  while (std::getline(in, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR " ", &lo, &hi) == 2 &&
        line.find(':') > line.find(' ')) {
      inside = a >= lo && a < hi;
      continue;
    }
    long kb = 0;
    if (inside && std::sscanf(line.c_str(), "KernelPageSize: %ld kB", &kb) == 1) return kb;
  }
  return -1;
}

// ---- minimal owners for the verbs objects this test creates ----
struct CmChannelDel {
  void operator()(rdma_event_channel* c) const { rdma_destroy_event_channel(c); }
};
struct CmIdDel {
  void operator()(rdma_cm_id* id) const { rdma_destroy_id(id); }
};
struct PdDel {
  void operator()(ibv_pd* p) const { ibv_dealloc_pd(p); }
};
struct MrDel {
  void operator()(ibv_mr* m) const { ibv_dereg_mr(m); }
};
struct CqDel {
  void operator()(ibv_cq* c) const { ibv_destroy_cq(c); }
};
struct QpDel {
  void operator()(ibv_qp* q) const { ibv_destroy_qp(q); }
};

// One side: the device that owns `ip`, a PD, a CQ and an RC QP.  Member order = teardown order
// reversed (QP, CQ, PD, then the cm id that holds the device context).
struct Side {
  std::string ip;
  std::unique_ptr<rdma_event_channel, CmChannelDel> channel;
  std::unique_ptr<rdma_cm_id, CmIdDel> id;
  ibv_context* ctx = nullptr;
  std::unique_ptr<ibv_pd, PdDel> pd;
  std::unique_ptr<ibv_cq, CqDel> cq;
  std::unique_ptr<ibv_qp, QpDel> qp;
  int gid_index = -1;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
};

bool openSide(Side& s, const std::string& ip) {
  s.ip = ip;
  s.channel.reset(rdma_create_event_channel());
  rdma_cm_id* id = nullptr;
  if (!s.channel || rdma_create_id(s.channel.get(), &id, nullptr, RDMA_PS_TCP) != 0) {
    std::printf("  rdma_create_id: %s\n", std::strerror(errno));
    return false;
  }
  s.id.reset(id);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  if (inet_pton(AF_INET, ip.c_str(), &sin.sin_addr) != 1) {
    std::printf("  '%s' is not an IPv4 address\n", ip.c_str());
    return false;
  }
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&sin)) != 0 || id->verbs == nullptr) {
    std::printf("  no RDMA device has %s (rdma_bind_addr: %s)\n", ip.c_str(), std::strerror(errno));
    return false;
  }
  s.ctx = id->verbs;
  ibv_port_attr pa{};
  if (ibv_query_port(s.ctx, id->port_num, &pa) != 0) return false;
  s.mtu = pa.active_mtu;
  // The RoCEv2 GID of the IPv4 address (::ffff:a.b.c.d); the first match.
  for (int i = 0; i < pa.gid_tbl_len; ++i) {
    ibv_gid g{};
    if (ibv_query_gid(s.ctx, id->port_num, i, &g) != 0) continue;
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(g.raw, prefix, 12) == 0 && std::memcmp(g.raw + 12, &sin.sin_addr, 4) == 0) {
      s.gid_index = i;
      s.gid = g;
      break;
    }
  }
  if (s.gid_index < 0) {
    std::printf("  %s: no IPv4 GID for %s\n", ibv_get_device_name(s.ctx->device), ip.c_str());
    return false;
  }
  s.pd.reset(ibv_alloc_pd(s.ctx));
  s.cq.reset(ibv_create_cq(s.ctx, 16, nullptr, nullptr, 0));
  ibv_qp_init_attr ia{};
  ia.send_cq = s.cq.get();
  ia.recv_cq = s.cq.get();
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 8;
  ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = 2;
  ia.cap.max_recv_sge = 1;
  if (s.pd) s.qp.reset(ibv_create_qp(s.pd.get(), &ia));
  if (!s.pd || !s.cq || !s.qp) {
    std::printf("  PD/CQ/QP on %s: %s\n", ibv_get_device_name(s.ctx->device), std::strerror(errno));
    return false;
  }
  std::printf("  %s -> %s port %u gid[%d] active_mtu %d\n", ip.c_str(), ibv_get_device_name(s.ctx->device),
              id->port_num, s.gid_index, 128 << s.mtu);
  return true;
}

bool connectQp(Side& self, const Side& peer) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = self.id->port_num;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(self.qp.get(), &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return false;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = std::min(self.mtu, peer.mtu);
  a.dest_qp_num = peer.qp->qp_num;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer.gid;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(self.gid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = self.id->port_num;
  if (ibv_modify_qp(self.qp.get(), &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return false;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(self.qp.get(), &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

uint8_t patternByte(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

#if FRAMELINK_SOFTROCE_HAVE_RDMA_DEVICE
// The device owner the rdma transport uses: open by address, register for credit windows.
void registerWithRdmaDevice(uint8_t* base, uint64_t len, const std::string& ip) {
  namespace rdma = framelink::transport::rdma;
  auto device = rdma::RdmaDevice::open({.device_name = "", .bind_ip = ip});
  check(static_cast<bool>(device),
        "RdmaDevice::open(bind_ip " + ip + ")" + (device ? "" : ": " + device.error().message));
  if (!device) return;
  auto mr = (*device)->registerMemory(base, len, rdma::MemoryAccess::kCreditWindows);
  check(static_cast<bool>(mr), "RdmaDevice::registerMemory(data segment, " + std::to_string(len) +
                                   " bytes, kCreditWindows)" + (mr ? "" : ": " + mr.error().message));
}
#endif

// 1. A real daemon data segment (consumer side: the slots the peer writes into), 2 MiB pages only.
//    Null when there is none; *exit_code then says whether the test is skipped or failed.
std::shared_ptr<framelink::ClientSegments> createHugepageSegment(bool require_huge, int* exit_code) {
  framelink::SegmentRequest req;
  req.role = FL_ROLE_CONSUMER;
  req.slot_count = 4;
  req.slot_size = 1 << 20;
  req.client_id = 1;
  req.stream = "hugepage-mr";
  req.hugepages = framelink::HugepageMode::kOn;
  req.daemon_pid = static_cast<uint64_t>(getpid());
  auto seg = framelink::ClientSegments::create(req);
  if (seg) return std::move(seg).value();
  if (!require_huge && nrHugepages() == 0) {
    std::printf("SKIP: no hugepages reserved (echo 64 > /proc/sys/vm/nr_hugepages): %s\n",
                seg.error().message.c_str());
    *exit_code = kSkip;
    return nullptr;
  }
  check(false, "ClientSegments::create(hugepages on): " + seg.error().message);
  *exit_code = 1;
  return nullptr;
}

// The data segment [base, base + len) really lies on 2 MiB pages, as its header says.
void checkOnHugepages(const framelink::ClientSegments& segment, const uint8_t* base, uint64_t len) {
  check(segment.onHugepages(), "ClientSegments reports the data segment on hugepages");
  check(segment.header()->data_on_hugepages == 1, "segment header says data_on_hugepages");
  check(reinterpret_cast<uintptr_t>(base) % FL_HUGE_PAGE_SIZE == 0 && len % FL_HUGE_PAGE_SIZE == 0,
        "data segment is 2 MiB aligned and sized (" + std::to_string(len) + " bytes)");
  const long kb = kernelPageSizeKb(base);
  check(kb == 2048,
        "kernel maps it with 2048 kB pages (smaps KernelPageSize: " + std::to_string(kb) + " kB)");
}

// Posts one signalled RDMA WRITE from `a`: `src` (slot header, then frame_len payload bytes, as
// two SGEs under `lkey`, as the rdma transport posts a frame) to `remote` under `rkey`.  False
// when ibv_post_send refuses it (reported).
bool postFrameWrite(const Side& a, const std::vector<uint8_t>& src, uint32_t lkey, uint64_t frame_len,
                    uint8_t* remote, uint32_t rkey) {
  ibv_sge sge[2] = {};
  sge[0].addr = reinterpret_cast<uintptr_t>(src.data());
  sge[0].length = sizeof(fl_slot_header);
  sge[0].lkey = lkey;
  sge[1].addr = reinterpret_cast<uintptr_t>(src.data() + sizeof(fl_slot_header));
  sge[1].length = static_cast<uint32_t>(frame_len);
  sge[1].lkey = lkey;
  ibv_send_wr wr{};
  wr.wr_id = 42;
  wr.sg_list = sge;
  wr.num_sge = 2;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote);
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(a.qp.get(), &wr, &bad) != 0) {
    check(false, std::string("ibv_post_send: ") + std::strerror(errno));
    return false;
  }
  return true;
}

// The write's completion on `a`'s CQ arrives within 30 s, successful.
void checkWriteCompletes(const Side& a) {
  ibv_wc wc{};
  int n = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((n = ibv_poll_cq(a.cq.get(), 1, &wc)) == 0 && std::chrono::steady_clock::now() < deadline)
    usleep(100);
  check(n == 1 && wc.status == IBV_WC_SUCCESS,
        n == 1 ? std::string("RDMA WRITE completion: ") + ibv_wc_status_str(wc.status)
               : std::string("RDMA WRITE completion within 30 s"));
}

// Slot `slot` (its header at dst_header) holds `src` byte for byte; the other slots are untouched.
void checkFrameLanded(const framelink::ClientSegments& segment, uint32_t slot, const uint8_t* dst_header,
                      const std::vector<uint8_t>& src, uint64_t frame_len) {
  check(std::memcmp(dst_header, src.data(), src.size()) == 0,
        "slot " + std::to_string(slot) + " holds the frame byte for byte (" + std::to_string(frame_len) +
            " + header bytes)");
  bool untouched = true;
  for (uint32_t s = 0; s < segment.slotCount(); ++s) {
    if (s == slot) continue;
    const uint8_t* p = segment.slot(s);
    for (uint64_t i = 0; i < 4096 && untouched; ++i) untouched = p[i] == 0;
  }
  check(untouched, "the other slots are untouched");
}

// 3. Raw verbs: register the whole segment [base, base + len) on B's device and RDMA-WRITE one
//    frame into slot 1 from a buffer on A's device: slot header and payload as two SGEs of one
//    work request.  False when the frame could not be sent (reported).
bool writeFrameOverRdma(const framelink::ClientSegments& segment, uint8_t* base, uint64_t len,
                        const std::string& ip_a, const std::string& ip_b) {
  Side a, b;
  if (!openSide(b, ip_b) || !openSide(a, ip_a)) {
    check(false, "open the RDMA devices of " + ip_b + " and " + ip_a);
    return false;
  }
  std::unique_ptr<ibv_mr, MrDel> seg_mr(
      ibv_reg_mr(b.pd.get(), base, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  check(seg_mr != nullptr, "ibv_reg_mr(hugepage data segment, " + std::to_string(len) +
                               " bytes, remote write)" +
                               (seg_mr ? "" : std::string(": ") + std::strerror(errno)));
  if (!seg_mr) return false;

  const uint32_t slot = 1;
  const uint64_t frame_len = 1 << 20;
  std::vector<uint8_t> src(sizeof(fl_slot_header) + frame_len);
  for (uint64_t i = 0; i < src.size(); ++i) src[i] = patternByte(i + 7);
  std::unique_ptr<ibv_mr, MrDel> src_mr(
      ibv_reg_mr(a.pd.get(), src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE));
  if (!src_mr || !connectQp(a, b) || !connectQp(b, a)) {
    check(false, std::string("source MR and QP connection: ") + std::strerror(errno));
    return false;
  }
  auto* dst_header = reinterpret_cast<uint8_t*>(segment.slotHeader(slot));
  uint8_t* dst_payload = segment.slot(slot);
  check(dst_header + sizeof(fl_slot_header) == dst_payload,
        "the slot header lies immediately before its payload (one RDMA write lands both)");
  std::memset(dst_header, 0, sizeof(fl_slot_header) + frame_len);

  if (!postFrameWrite(a, src, src_mr->lkey, frame_len, dst_header, seg_mr->rkey)) return false;
  checkWriteCompletes(a);
  checkFrameLanded(segment, slot, dst_header, src, frame_len);
  return true;
}

}  // namespace

int main() {
  const std::string ip_b = env("FRAMELINK_RDMA_B_IP");
  const std::string ip_a = env("FRAMELINK_RDMA_A_IP").empty() ? ip_b : env("FRAMELINK_RDMA_A_IP");
  if (ip_b.empty()) {
    std::printf("SKIP: set FRAMELINK_RDMA_B_IP (and FRAMELINK_RDMA_A_IP) to addresses on RDMA devices\n");
    return kSkip;
  }
  const bool require_huge = !env("FRAMELINK_RDMA_REQUIRE_HUGEPAGES").empty();
  std::printf("hugepage MR check: segment on the device of %s, sender on %s, nr_hugepages=%ld\n",
              ip_b.c_str(), ip_a.c_str(), nrHugepages());

  int exit_code = 0;
  const std::shared_ptr<framelink::ClientSegments> seg = createHugepageSegment(require_huge, &exit_code);
  if (!seg) return exit_code;
  const framelink::ClientSegments& segment = *seg;
  uint8_t* base = segment.slot(0) - segment.geometry().slots_offset;
  const uint64_t len = segment.geometry().data_size;
  checkOnHugepages(segment, base, len);

#if FRAMELINK_SOFTROCE_HAVE_RDMA_DEVICE
  // 2. Registration through the daemon's device owner.
  registerWithRdmaDevice(base, len, ip_b);
#else
  std::printf("  (built without proxy/transport/rdma: RdmaDevice registration not checked)\n");
#endif

  if (!writeFrameOverRdma(segment, base, len, ip_a, ip_b)) return 1;

  std::printf("%s: %d check(s) failed\n", g_failures == 0 ? "PASS" : "FAIL", g_failures);
  return g_failures == 0 ? 0 : 1;
}
