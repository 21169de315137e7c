// FakeVerbs' type-2 memory windows: allocation, bind and invalidation by
// work request, and the rkey check of a WRITE or a READ (window or MR).
#include <cerrno>

#include "fake_verbs.h"
#include "fake_verbs_state.h"

namespace framelink::transport::rdma::testing {

ibv_mw* FakeVerbs::allocMw(ibv_pd* pd, ibv_mw_type type) {
  std::lock_guard lock(mu_);
  if (type != IBV_MW_TYPE_2) {
    errno = EINVAL;
    return nullptr;
  }
  auto w = std::make_unique<Mw>();
  w->mw.context = pd->context;
  w->mw.pd = pd;
  w->mw.type = type;
  // Index in the upper 24 bits, an 8-bit key below, as rxe makes them.
  w->mw.rkey = (next_key_++ << 8) | 0x5Au;
  w->key = w->mw.rkey;
  ibv_mw* p = &w->mw;
  mws_.emplace(p, std::move(w));
  return p;
}

int FakeVerbs::deallocMw(ibv_mw* mw) {
  std::lock_guard lock(mu_);
  if (mws_.erase(mw) == 0) {
    error("ibv_dealloc_mw of an unknown MW");
    return EINVAL;
  }
  return 0;
}

bool FakeVerbs::windowWr(const ibv_send_wr* wr, SendWr* out) {
  if (wr->num_sge != 0) return false;
  out->wr_id = wr->wr_id;
  out->opcode = wr->opcode;
  out->signalled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
  if (wr->opcode == IBV_WR_BIND_MW) {
    out->mw = wr->bind_mw.mw;
    out->mw_rkey = wr->bind_mw.mw->rkey;  // rxe copies it into the WQE, as here
    out->rkey = wr->bind_mw.rkey;
    out->bind = wr->bind_mw.bind_info;
  } else {
    out->rkey = wr->invalidate_rkey;
  }
  return true;
}

ibv_wc_status FakeVerbs::executeWindowWr(Qp* q, const SendWr& wr) {
  if (wr.opcode == IBV_WR_LOCAL_INV) {
    for (auto& [k, w] : mws_) {
      if (w->key == wr.rkey && w->qp == q) {
        w->qp = nullptr;
        w->mr = nullptr;
        ++stats_.invalidations;
        return IBV_WC_SUCCESS;
      }
    }
    error("IBV_WR_LOCAL_INV of an rkey no window of this QP has");
    return IBV_WC_MW_BIND_ERR;
  }
  auto it = mws_.find(wr.mw);
  auto mr = mrs_.find(wr.bind.mr);
  if (it == mws_.end() || mr == mrs_.end()) {
    error("IBV_WR_BIND_MW of an unknown MW or MR");
    return IBV_WC_MW_BIND_ERR;
  }
  Mw& w = *it->second;
  const Mr& m = *mr->second;
  const auto start = reinterpret_cast<uint64_t>(m.mr.addr);
  const bool fits = wr.bind.addr >= start && wr.bind.addr + wr.bind.length <= start + m.mr.length;
  // What rxe checks: a free type-2 window, same PD as QP and MR, an MR with
  // MW_BIND (and LOCAL_WRITE for remote write, C10-75), the window named by the
  // key the application's ibv_mw had when it posted the bind, which must be
  // the adapter's key when the bind executes, same index, a new key.
  if (w.qp != nullptr || w.mw.pd != q->qp.pd || m.mr.pd != q->qp.pd || !(m.access & IBV_ACCESS_MW_BIND) ||
      ((wr.bind.mw_access_flags & IBV_ACCESS_REMOTE_WRITE) && !(m.access & IBV_ACCESS_LOCAL_WRITE)) ||
      !fits || wr.mw_rkey != w.key || (wr.rkey & ~0xFFu) != (w.key & ~0xFFu) || wr.rkey == w.key) {
    error("IBV_WR_BIND_MW refused (window bound, PD, MR access, range or key)");
    return IBV_WC_MW_BIND_ERR;
  }
  w.key = wr.rkey;
  w.qp = q;
  w.mr = &m.mr;
  w.addr = wr.bind.addr;
  w.length = wr.bind.length;
  w.access = wr.bind.mw_access_flags;
  ++stats_.binds;
  return IBV_WC_SUCCESS;
}

const FakeVerbs::Mw* FakeVerbs::findWindow(uint32_t rkey, const Qp* qp, uint64_t addr, uint64_t length,
                                           int access) const {
  for (auto& [k, w] : mws_) {
    if (w->key == rkey && w->qp == qp && (w->access & access) && addr >= w->addr &&
        addr + length <= w->addr + w->length) {
      return w.get();
    }
  }
  return nullptr;
}

ibv_wc_status FakeVerbs::checkKeys(const Qp* q, const SendWr& wr, uint64_t total, bool is_send) const {
  ibv_wc_status status = IBV_WC_SUCCESS;
  for (auto& sge : wr.sges) {
    if (wr.inline_bytes.empty() && findMr(sge.lkey, q->qp.pd, sge.addr, sge.length, 0) == nullptr) {
      status = IBV_WC_LOC_PROT_ERR;
    }
  }
  if (is_send) return status;
  const Qp* peer = q->peer;
  bool target = findWindow(wr.rkey, peer, wr.remote_addr, total) != nullptr;
  for (auto& [k, m] : mrs_) {
    auto start = reinterpret_cast<uint64_t>(m->mr.addr);
    if (m->mr.rkey == wr.rkey && m->mr.pd == peer->qp.pd && (m->access & IBV_ACCESS_REMOTE_WRITE) &&
        wr.remote_addr >= start && wr.remote_addr + total <= start + m->mr.length) {
      target = true;
    }
  }
  if (status == IBV_WC_SUCCESS && !target) status = IBV_WC_REM_ACCESS_ERR;
  return status;
}

ibv_wc_status FakeVerbs::checkReadKeys(const Qp* q, const SendWr& wr, uint64_t total) const {
  for (auto& sge : wr.sges) {
    if (findMr(sge.lkey, q->qp.pd, sge.addr, sge.length, IBV_ACCESS_LOCAL_WRITE) == nullptr) {
      return IBV_WC_LOC_PROT_ERR;
    }
  }
  const Qp* peer = q->peer;
  if (findWindow(wr.rkey, peer, wr.remote_addr, total, IBV_ACCESS_REMOTE_READ) != nullptr) {
    return IBV_WC_SUCCESS;
  }
  for (auto& [k, m] : mrs_) {
    auto start = reinterpret_cast<uint64_t>(m->mr.addr);
    if (m->mr.rkey == wr.rkey && m->mr.pd == peer->qp.pd && (m->access & IBV_ACCESS_REMOTE_READ) &&
        wr.remote_addr >= start && wr.remote_addr + total <= start + m->mr.length) {
      return IBV_WC_SUCCESS;
    }
  }
  return IBV_WC_REM_ACCESS_ERR;
}

}  // namespace framelink::transport::rdma::testing
