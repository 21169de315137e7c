#include "fake_verbs.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fake_verbs_state.h"

namespace framelink::transport::rdma::testing {

using namespace fake;

FakeVerbs::FakeVerbs(std::vector<DeviceSpec> devices) {
  for (auto& spec : devices) {
    auto d = std::make_unique<Device>();
    d->name = spec.name;
    d->ip = spec.ip;
    d->port_state = spec.port_state;
    d->max_inline_data = spec.max_inline_data;
    std::snprintf(d->device.name, sizeof d->device.name, "%s", spec.name.c_str());
    d->context.device = &d->device;
    d->context.async_fd = newEventFd();
    devices_.push_back(std::move(d));
  }
}

FakeVerbs::~FakeVerbs() {
  for (auto& d : devices_) ::close(d->context.async_fd);
  for (auto& [k, c] : comp_channels_) ::close(c->channel.fd);
  for (auto& [k, c] : event_channels_) {
    for (auto* e : c->events) delete e;
    ::close(c->channel.fd);
  }
}

void FakeVerbs::error(std::string what) { errors_.push_back(std::move(what)); }

FakeVerbs::Device* FakeVerbs::deviceOf(const ibv_context* ctx) const {
  for (auto& d : devices_) {
    if (&d->context == ctx) return d.get();
  }
  return nullptr;
}
FakeVerbs::Device* FakeVerbs::deviceByIp(const std::string& ip) const {
  for (auto& d : devices_) {
    if (d->ip == ip) return d.get();
  }
  return nullptr;
}

// ---------------------------------------------------------------- controls

void FakeVerbs::pauseDelivery(bool paused) {
  std::lock_guard lock(mu_);
  paused_ = paused;
  if (!paused) {
    for (auto& [k, q] : qps_) deliver(q.get());
  }
}

void FakeVerbs::stallDialersFrom(const std::string& dialer_ip, bool stall) {
  std::lock_guard lock(mu_);
  auto it = std::find(stalled_dialers_.begin(), stalled_dialers_.end(), dialer_ip);
  if (stall && it == stalled_dialers_.end()) stalled_dialers_.push_back(dialer_ip);
  if (!stall && it != stalled_dialers_.end()) stalled_dialers_.erase(it);
}

void FakeVerbs::injectSendError(ibv_wc_status status) {
  std::lock_guard lock(mu_);
  inject_ = status;
}

void FakeVerbs::injectAsyncEvent(const std::string& device, ibv_event_type type, ibv_qp* qp) {
  std::lock_guard lock(mu_);
  for (auto& d : devices_) {
    if (d->name != device) continue;
    ibv_async_event ev{};
    ev.event_type = type;
    if (qp != nullptr) {
      ev.element.qp = qp;
      auto it = qps_.find(qp);
      if (it != qps_.end()) {
        it->second->qp.state = IBV_QPS_ERR;
        flushQp(it->second.get());
      }
    } else {
      ev.element.port_num = 1;
    }
    d->async_events.push_back(ev);
    bump(d->context.async_fd);
  }
}

FakeVerbs::Stats FakeVerbs::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.live_qps = qps_.size();
  s.live_ids = ids_.size();
  s.live_cqs = cqs_.size();
  s.live_mrs = mrs_.size();
  s.live_mws = mws_.size();
  return s;
}

std::vector<std::string> FakeVerbs::errors() const {
  std::lock_guard lock(mu_);
  return errors_;
}

ibv_qp_state FakeVerbs::qpState(const ibv_qp* qp) const {
  std::lock_guard lock(mu_);
  auto it = qps_.find(qp);
  return it == qps_.end() ? IBV_QPS_UNKNOWN : it->second->qp.state;
}

std::vector<ibv_sge> FakeVerbs::lastSendSges() const {
  std::lock_guard lock(mu_);
  return last_send_sges_;
}

// ---------------------------------------------------------------- devices

ibv_context** FakeVerbs::getDevices(int* count) {
  std::lock_guard lock(mu_);
  *count = static_cast<int>(devices_.size());
  if (devices_.empty()) return nullptr;
  auto** list = new ibv_context*[devices_.size() + 1];
  for (size_t i = 0; i < devices_.size(); ++i) list[i] = &devices_[i]->context;
  list[devices_.size()] = nullptr;
  return list;
}
void FakeVerbs::freeDevices(ibv_context** list) { delete[] list; }
const char* FakeVerbs::deviceName(ibv_context* context) {
  std::lock_guard lock(mu_);
  Device* d = deviceOf(context);
  return d ? d->name.c_str() : nullptr;
}
int FakeVerbs::queryDevice(ibv_context*, ibv_device_attr* attr) {
  *attr = {};
  attr->phys_port_cnt = 1;
  attr->max_qp_wr = 16384;
  attr->max_cqe = 65536;
  attr->max_sge = 30;
  attr->max_qp_rd_atom = 128;  // as rxe
  attr->max_qp_init_rd_atom = 128;
  attr->device_cap_flags = IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
  return 0;
}
int FakeVerbs::queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) {
  std::lock_guard lock(mu_);
  Device* d = deviceOf(context);
  if (d == nullptr || port != 1) return EINVAL;
  *attr = {};
  attr->state = d->port_state;
  attr->active_mtu = IBV_MTU_4096;
  return 0;
}
int FakeVerbs::getAsyncEvent(ibv_context* context, ibv_async_event* event) {
  std::lock_guard lock(mu_);
  Device* d = deviceOf(context);
  if (d == nullptr || d->async_events.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *event = d->async_events.front();
  d->async_events.pop_front();
  unbump(d->context.async_fd);
  return 0;
}
void FakeVerbs::ackAsyncEvent(ibv_async_event*) {}

// ---------------------------------------------------------------- memory

ibv_pd* FakeVerbs::allocPd(ibv_context* context) {
  std::lock_guard lock(mu_);
  auto pd = std::make_unique<ibv_pd>();
  *pd = {};
  pd->context = context;
  pds_.push_back(std::move(pd));
  return pds_.back().get();
}
int FakeVerbs::deallocPd(ibv_pd* pd) {
  std::lock_guard lock(mu_);
  for (auto& [k, m] : mrs_) {
    if (m->mr.pd == pd) error("ibv_dealloc_pd with a memory region still registered");
  }
  return 0;
}
ibv_mr* FakeVerbs::regMr(ibv_pd* pd, void* addr, size_t length, int access) {
  std::lock_guard lock(mu_);
  auto m = std::make_unique<Mr>();
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.lkey = next_key_++;
  m->mr.rkey = next_key_++ | 0x80000000u;
  m->access = access;
  if ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
    error("ibv_reg_mr: REMOTE_WRITE without LOCAL_WRITE (real verbs refuse it)");
  }
  ibv_mr* p = &m->mr;
  mrs_.emplace(p, std::move(m));
  return p;
}
int FakeVerbs::deregMr(ibv_mr* mr) {
  std::lock_guard lock(mu_);
  // rxe refuses it ("Attempt to deregister an MR while bound to MWs"), and
  // the registration and its pinned pages stay until the process exits.
  for (auto& [k, w] : mws_) {
    if (w->qp != nullptr && w->mr == mr) {
      error("ibv_dereg_mr of an MR a memory window is still bound to");
      errno = EINVAL;
      return EINVAL;
    }
  }
  if (mrs_.erase(mr) == 0) error("ibv_dereg_mr of an unknown MR");
  return 0;
}

// ---------------------------------------------------------------- queue pairs

void FakeVerbs::flushQp(Qp* q) {
  Cq* scq = cqs_.at(q->qp.send_cq).get();
  Cq* rcq = cqs_.at(q->qp.recv_cq).get();
  for (auto& wr : q->pending) {
    ibv_wc wc{};
    wc.wr_id = wr.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.qp_num = q->qp.qp_num;
    pushWc(scq, wc);
    q->window.push_back(wr.wr_id);
  }
  q->pending.clear();
  for (const RecvWr& r : q->recvs) {
    ibv_wc wc{};
    wc.wr_id = r.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qp.qp_num;
    pushWc(rcq, wc);
  }
  q->recvs.clear();
}

namespace {

// Copies the bytes of `src`'s SGEs, in order, across the buffers of `dst`'s
// (which hold them all).
void scatter(const std::vector<ibv_sge>& src, const std::vector<ibv_sge>& dst) {
  size_t si = 0, off = 0;
  for (auto& sge : src) {
    auto* from = reinterpret_cast<const uint8_t*>(sge.addr);
    for (uint32_t left = sge.length; left > 0;) {
      const ibv_sge& d = dst[si];
      const uint32_t n = std::min<uint32_t>(left, d.length - static_cast<uint32_t>(off));
      std::memcpy(reinterpret_cast<uint8_t*>(d.addr) + off, from, n);
      from += n;
      left -= n;
      off += n;
      if (off == d.length) {
        ++si;
        off = 0;
      }
    }
  }
}

}  // namespace

void FakeVerbs::landSend(Qp* peer, const SendWr& wr, const RecvWr& recv, uint64_t total, ibv_wc* rwc,
                         ibv_wc* wc) {
  rwc->opcode = IBV_WC_RECV;
  uint64_t room = 0;
  bool registered = true;
  for (auto& sge : recv.sges) {
    room += sge.length;
    if (findMr(sge.lkey, peer->qp.pd, sge.addr, sge.length, IBV_ACCESS_LOCAL_WRITE) == nullptr) {
      registered = false;
    }
  }
  if (!registered || room < total) {
    rwc->status = registered ? IBV_WC_LOC_LEN_ERR : IBV_WC_LOC_PROT_ERR;
    wc->status = IBV_WC_REM_INV_REQ_ERR;
    pushWc(cqs_.at(peer->qp.recv_cq).get(), *rwc);
    peer->qp.state = IBV_QPS_ERR;
    flushQp(peer);
  } else {
    scatter(wr.sges, recv.sges);
    pushWc(cqs_.at(peer->qp.recv_cq).get(), *rwc);
  }
}

bool FakeVerbs::executeAtPeer(Qp* peer, const SendWr& wr, uint64_t total, bool is_send, ibv_wc* wc) {
  if (wr.opcode == IBV_WR_RDMA_WRITE) {
    // No immediate: the bytes land, the peer sees no completion at all.
    auto* dst = reinterpret_cast<uint8_t*>(wr.remote_addr);
    for (auto& sge : wr.sges) {
      std::memcpy(dst, reinterpret_cast<const void*>(sge.addr), sge.length);
      dst += sge.length;
    }
    return true;
  }
  if (peer->recvs.empty()) return false;  // receiver not ready: RNR retry (rnr_retry 7) until it posts
  RecvWr recv = std::move(peer->recvs.front());
  peer->recvs.pop_front();
  ibv_wc rwc{};
  rwc.wr_id = recv.wr_id;
  rwc.status = IBV_WC_SUCCESS;
  rwc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
  rwc.wc_flags = IBV_WC_WITH_IMM;
  rwc.imm_data = wr.imm;
  rwc.byte_len = static_cast<uint32_t>(total);
  rwc.qp_num = peer->qp.qp_num;
  if (is_send) {
    landSend(peer, wr, recv, total, &rwc, wc);
  } else {
    auto* dst = reinterpret_cast<uint8_t*>(wr.remote_addr);
    for (auto& sge : wr.sges) {
      std::memcpy(dst, reinterpret_cast<const void*>(sge.addr), sge.length);
      dst += sge.length;
    }
    pushWc(cqs_.at(peer->qp.recv_cq).get(), rwc);
  }
  return true;
}

void FakeVerbs::deliver(Qp* q) {
  Cq* scq = cqs_.at(q->qp.send_cq).get();
  while (!q->pending.empty()) {
    if (q->qp.state == IBV_QPS_ERR) {
      flushQp(q);
      return;
    }
    SendWr& wr = q->pending.front();
    const bool local = wr.opcode == IBV_WR_BIND_MW || wr.opcode == IBV_WR_LOCAL_INV;
    // Pausing holds the wire back; window WRs never leave the adapter.
    if (paused_ && !local) return;
    ibv_wc wc{};
    wc.wr_id = wr.wr_id;
    wc.qp_num = q->qp.qp_num;
    wc.opcode = IBV_WC_RDMA_WRITE;
    wc.status = IBV_WC_SUCCESS;
    Qp* peer = q->peer;
    uint64_t total = 0;
    for (auto& sge : wr.sges) total += sge.length;
    const bool is_send = wr.opcode == IBV_WR_SEND_WITH_IMM;
    const bool is_read = wr.opcode == IBV_WR_RDMA_READ;
    if (is_send) wc.opcode = IBV_WC_SEND;
    if (is_read) wc.opcode = IBV_WC_RDMA_READ;
    if (local) {
      wc.opcode = wr.opcode == IBV_WR_BIND_MW ? IBV_WC_BIND_MW : IBV_WC_LOCAL_INV;
      wc.status = executeWindowWr(q, wr);
    } else if (inject_) {
      wc.status = *inject_;
      inject_.reset();
    } else if (peer == nullptr || peer->qp.state != IBV_QPS_RTS) {
      wc.status = IBV_WC_RETRY_EXC_ERR;
    } else if (is_read) {
      // The peer's adapter answers from the window; the bytes land in the
      // reader's SGEs.  No receive WR is involved on either side.
      wc.status = checkReadKeys(q, wr, total);
      if (wc.status == IBV_WC_SUCCESS) {
        const auto* src = reinterpret_cast<const uint8_t*>(wr.remote_addr);
        for (auto& sge : wr.sges) {
          std::memcpy(reinterpret_cast<void*>(sge.addr), src, sge.length);
          src += sge.length;
        }
        wc.byte_len = static_cast<uint32_t>(total);
        ++stats_.reads;
      } else if (wc.status == IBV_WC_REM_ACCESS_ERR) {
        // The responder's queue pair fails too (a NAK for an access error).
        peer->qp.state = IBV_QPS_ERR;
        flushQp(peer);
      }
    } else {
      wc.status = checkKeys(q, wr, total, is_send);
      // No receive WR at the peer: the WR stays queued until one is posted.
      if (wc.status == IBV_WC_SUCCESS && !executeAtPeer(peer, wr, total, is_send, &wc)) return;
    }
    q->window.push_back(wr.wr_id);
    const bool signalled = wr.signalled;
    q->pending.pop_front();
    if (wc.status != IBV_WC_SUCCESS) {
      pushWc(scq, wc);  // errors complete whether signalled or not
      q->qp.state = IBV_QPS_ERR;
      flushQp(q);
      return;
    }
    if (signalled) pushWc(scq, wc);
  }
}

ibv_qp* FakeVerbs::qpOnDevice(const std::string& device) const {
  std::lock_guard lock(mu_);
  for (auto& [k, q] : qps_) {
    const Device* d = deviceOf(q->qp.context);
    if (d != nullptr && d->name == device) return &q->qp;
  }
  return nullptr;
}

ibv_wc_status FakeVerbs::peerWrite(ibv_qp* qp, uint32_t rkey, uint64_t remote_addr,
                                   const std::vector<uint8_t>& bytes, std::optional<uint32_t> imm) {
  std::lock_guard lock(mu_);
  Qp* target = qps_.at(qp).get();
  if (target->peer == nullptr) return IBV_WC_RETRY_EXC_ERR;
  SendWr wr{};
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.imm = imm.value_or(0);
  wr.remote_addr = remote_addr;
  wr.rkey = rkey;
  wr.inline_bytes = bytes;  // taken as inline data: no local key to check
  if (!bytes.empty()) {
    wr.sges.push_back(
        ibv_sge{reinterpret_cast<uint64_t>(wr.inline_bytes.data()), static_cast<uint32_t>(bytes.size()), 0});
  }
  const ibv_wc_status status = checkKeys(target->peer, wr, bytes.size(), false);
  if (status != IBV_WC_SUCCESS) return status;
  ibv_wc wc{};
  if (!executeAtPeer(target, wr, bytes.size(), false, &wc)) return IBV_WC_RNR_RETRY_EXC_ERR;
  return IBV_WC_SUCCESS;
}

bool FakeVerbs::injectRecvCompletion(ibv_qp* qp, ibv_wc wc) {
  std::lock_guard lock(mu_);
  Qp* q = qps_.at(qp).get();
  if (q->recvs.empty()) return false;
  wc.wr_id = q->recvs.front().wr_id;
  wc.qp_num = q->qp.qp_num;
  q->recvs.pop_front();
  pushWc(cqs_.at(q->qp.recv_cq).get(), wc);
  return true;
}

int FakeVerbs::postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  std::lock_guard lock(mu_);
  ++stats_.post_send_calls;
  Qp* q = qps_.at(qp).get();
  for (; wr != nullptr; wr = wr->next) {
    if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) {
      *bad_wr = wr;
      return EINVAL;
    }
    if (q->pending.size() + q->window.size() + 1 > q->cap.max_send_wr) {
      error("ibv_post_send beyond the send queue depth");
      *bad_wr = wr;
      return ENOMEM;
    }
    if (wr->opcode == IBV_WR_BIND_MW || wr->opcode == IBV_WR_LOCAL_INV) {
      SendWr w{};
      if (!windowWr(wr, &w)) {
        *bad_wr = wr;
        return EINVAL;
      }
      ++stats_.send_wrs;
      if (w.signalled) ++stats_.signalled_wrs;
      q->pending.push_back(std::move(w));
      continue;
    }
    if ((wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM && wr->opcode != IBV_WR_SEND_WITH_IMM &&
         wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ) ||
        wr->num_sge < 1 || wr->num_sge > 2 ||
        (wr->opcode == IBV_WR_RDMA_READ && (wr->send_flags & IBV_SEND_INLINE))) {
      *bad_wr = wr;
      return EINVAL;
    }
    SendWr w{wr->wr_id,
             wr->opcode,
             (wr->send_flags & IBV_SEND_SIGNALED) != 0,
             wr->imm_data,
             wr->opcode == IBV_WR_SEND_WITH_IMM ? 0 : wr->wr.rdma.remote_addr,
             wr->opcode == IBV_WR_SEND_WITH_IMM ? 0 : wr->wr.rdma.rkey,
             std::vector<ibv_sge>(wr->sg_list, wr->sg_list + wr->num_sge),
             {}};
    if (wr->send_flags & IBV_SEND_INLINE) {
      // The adapter copies the bytes now: the caller may reuse its buffer at
      // once, and no memory key is checked.
      uint64_t total = 0;
      for (const ibv_sge& sge : w.sges) total += sge.length;
      if (total > q->cap.max_inline_data) {
        error("IBV_SEND_INLINE of " + std::to_string(total) + " bytes beyond the QP's max_inline_data " +
              std::to_string(q->cap.max_inline_data));
        *bad_wr = wr;
        return EINVAL;
      }
      for (const ibv_sge& sge : w.sges) {
        const auto* p = reinterpret_cast<const uint8_t*>(sge.addr);
        w.inline_bytes.insert(w.inline_bytes.end(), p, p + sge.length);
      }
      w.sges = {ibv_sge{reinterpret_cast<uint64_t>(w.inline_bytes.data()), static_cast<uint32_t>(total), 0}};
      ++stats_.inline_wrs;
    }
    ++stats_.send_wrs;
    if (w.signalled) ++stats_.signalled_wrs;
    last_send_sges_ = w.sges;
    q->pending.push_back(std::move(w));
  }
  deliver(q);
  return 0;
}

int FakeVerbs::postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  std::lock_guard lock(mu_);
  ++stats_.post_recv_calls;
  Qp* q = qps_.at(qp).get();
  for (; wr != nullptr; wr = wr->next) {
    if (q->recvs.size() + 1 > q->cap.max_recv_wr) {
      error("ibv_post_recv beyond the receive queue depth");
      *bad_wr = wr;
      return ENOMEM;
    }
    if (wr->num_sge < 0 || wr->num_sge > static_cast<int>(q->cap.max_recv_sge)) {
      error("ibv_post_recv with more SGEs than max_recv_sge");
      *bad_wr = wr;
      return EINVAL;
    }
    q->recvs.push_back(RecvWr{wr->wr_id, std::vector<ibv_sge>(wr->sg_list, wr->sg_list + wr->num_sge)});
    ++stats_.recv_wrs;
  }
  if (q->qp.state == IBV_QPS_ERR) flushQp(q);
  if (q->peer != nullptr) deliver(q->peer);
  return 0;
}

int FakeVerbs::modifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  std::lock_guard lock(mu_);
  Qp* q = qps_.at(qp).get();
  if (attr_mask & IBV_QP_STATE) {
    q->qp.state = attr->qp_state;
    if (attr->qp_state == IBV_QPS_ERR) flushQp(q);
  }
  return 0;
}

}  // namespace framelink::transport::rdma::testing
