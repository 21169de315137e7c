#include "fake_verbs.h"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace framelink::transport::rdma::testing {

struct FakeVerbs::Device {
  std::string name;
  std::string ip;
  ibv_port_state port_state;
  ibv_device device{};
  ibv_context context{};
  std::deque<ibv_async_event> async_events;
};
struct FakeVerbs::Mr {
  ibv_mr mr{};
  int access = 0;
};
struct FakeVerbs::CompChannel {
  ibv_comp_channel channel{};
  std::deque<ibv_cq*> events;
};
struct FakeVerbs::Cq {
  ibv_cq cq{};
  CompChannel* channel = nullptr;
  std::deque<ibv_wc> wcs;
  bool armed = false;
  uint64_t events = 0;
  uint64_t acked = 0;
};
struct FakeVerbs::Qp {
  ibv_qp qp{};
  ibv_qp_cap cap{};
  Qp* peer = nullptr;
  std::deque<SendWr> pending;   // posted, not executed (paused or waiting for a receive WR)
  std::deque<uint64_t> window;  // executed, slot not yet freed by a polled completion
  std::deque<uint64_t> recvs;   // receive WR ids
};
struct FakeVerbs::EventChannel {
  rdma_event_channel channel{};
  std::deque<rdma_cm_event*> events;
};
struct FakeVerbs::Id {
  rdma_cm_id id{};
  std::string ip;
  uint16_t port = 0;
  std::string dst_ip;
  uint16_t dst_port = 0;
  Id* peer = nullptr;
  bool requested = false;  // a connect request not yet accepted or rejected
  bool connected = false;
  int ack_timeout = -1;  // setAckTimeout; -1: the rdma_cm default
};

namespace {

int newEventFd() { return ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC | EFD_SEMAPHORE); }
void bump(int fd) {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}
void unbump(int fd) {
  uint64_t v;
  [[maybe_unused]] ssize_t n = ::read(fd, &v, sizeof v);
}
std::string ipOf(const sockaddr* sa, uint16_t* port) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (sa->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(sa);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    if (port) *port = ntohs(v4->sin_port);
  }
  return buf;
}

}  // namespace

FakeVerbs::FakeVerbs(std::vector<DeviceSpec> devices) {
  for (auto& spec : devices) {
    auto d = std::make_unique<Device>();
    d->name = spec.name;
    d->ip = spec.ip;
    d->port_state = spec.port_state;
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
  if (mrs_.erase(mr) == 0) error("ibv_dereg_mr of an unknown MR");
  return 0;
}

// ---------------------------------------------------------------- completion queues

ibv_comp_channel* FakeVerbs::createCompChannel(ibv_context* context) {
  std::lock_guard lock(mu_);
  auto c = std::make_unique<CompChannel>();
  c->channel.context = context;
  c->channel.fd = newEventFd();
  ibv_comp_channel* p = &c->channel;
  comp_channels_.emplace(p, std::move(c));
  return p;
}
int FakeVerbs::destroyCompChannel(ibv_comp_channel* channel) {
  std::lock_guard lock(mu_);
  for (auto& [k, cq] : cqs_) {
    if (cq->channel && &cq->channel->channel == channel) error("ibv_destroy_comp_channel while a CQ uses it");
  }
  auto it = comp_channels_.find(channel);
  if (it == comp_channels_.end()) return EINVAL;
  ::close(it->second->channel.fd);
  comp_channels_.erase(it);
  return 0;
}
ibv_cq* FakeVerbs::createCq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
  std::lock_guard lock(mu_);
  auto c = std::make_unique<Cq>();
  c->cq.context = context;
  c->cq.cq_context = cq_context;
  c->cq.cqe = cqe;
  c->cq.channel = channel;
  if (channel != nullptr) c->channel = comp_channels_.at(channel).get();
  ibv_cq* p = &c->cq;
  cqs_.emplace(p, std::move(c));
  return p;
}
int FakeVerbs::destroyCq(ibv_cq* cq) {
  std::lock_guard lock(mu_);
  auto it = cqs_.find(cq);
  if (it == cqs_.end()) return EINVAL;
  if (it->second->events != it->second->acked) {
    error("ibv_destroy_cq with unacked CQ events (real verbs block for ever)");
  }
  for (auto& [k, q] : qps_) {
    if (q->qp.send_cq == cq || q->qp.recv_cq == cq) error("ibv_destroy_cq while a QP uses it");
  }
  if (it->second->channel) {
    auto& evs = it->second->channel->events;
    for (auto e = evs.begin(); e != evs.end();) {
      if (*e == cq) {
        e = evs.erase(e);
        unbump(it->second->channel->channel.fd);
      } else {
        ++e;
      }
    }
  }
  cqs_.erase(it);
  return 0;
}
int FakeVerbs::reqNotifyCq(ibv_cq* cq, int) {
  std::lock_guard lock(mu_);
  cqs_.at(cq)->armed = true;
  return 0;
}
int FakeVerbs::getCqEvent(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  std::lock_guard lock(mu_);
  auto& c = comp_channels_.at(channel);
  if (c->events.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *cq = c->events.front();
  c->events.pop_front();
  unbump(c->channel.fd);
  *cq_context = (*cq)->cq_context;
  ++cqs_.at(*cq)->events;
  return 0;
}
void FakeVerbs::ackCqEvents(ibv_cq* cq, unsigned int count) {
  std::lock_guard lock(mu_);
  cqs_.at(cq)->acked += count;
}
int FakeVerbs::pollCq(ibv_cq* cq, int entries, ibv_wc* wc) {
  std::lock_guard lock(mu_);
  auto& c = cqs_.at(cq);
  int n = 0;
  while (n < entries && !c->wcs.empty()) {
    wc[n] = c->wcs.front();
    c->wcs.pop_front();
    // A polled send completion frees its send-queue slot and those of the
    // unsignalled WRs before it.
    for (auto& [k, q] : qps_) {
      if (q->qp.qp_num != wc[n].qp_num) continue;
      while (!q->window.empty() && q->window.front() <= wc[n].wr_id && !(wc[n].wr_id >> 63))
        q->window.pop_front();
    }
    ++n;
  }
  return n;
}

void FakeVerbs::pushWc(Cq* cq, const ibv_wc& wc) {
  cq->wcs.push_back(wc);
  if (cq->wcs.size() > static_cast<size_t>(cq->cq.cqe)) error("CQ overrun");
  if (cq->armed && cq->channel != nullptr) {
    cq->armed = false;
    cq->channel->events.push_back(&cq->cq);
    bump(cq->channel->channel.fd);
  }
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
  for (uint64_t id : q->recvs) {
    ibv_wc wc{};
    wc.wr_id = id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qp.qp_num;
    pushWc(rcq, wc);
  }
  q->recvs.clear();
}

void FakeVerbs::deliver(Qp* q) {
  Cq* scq = cqs_.at(q->qp.send_cq).get();
  while (!q->pending.empty()) {
    if (q->qp.state == IBV_QPS_ERR) {
      flushQp(q);
      return;
    }
    if (paused_) return;
    SendWr& wr = q->pending.front();
    ibv_wc wc{};
    wc.wr_id = wr.wr_id;
    wc.qp_num = q->qp.qp_num;
    wc.opcode = IBV_WC_RDMA_WRITE;
    wc.status = IBV_WC_SUCCESS;
    Qp* peer = q->peer;
    uint64_t total = 0;
    for (auto& sge : wr.sges) total += sge.length;
    if (inject_) {
      wc.status = *inject_;
      inject_.reset();
    } else if (peer == nullptr || peer->qp.state != IBV_QPS_RTS) {
      wc.status = IBV_WC_RETRY_EXC_ERR;
    } else {
      for (auto& sge : wr.sges) {
        bool ok = false;
        for (auto& [k, m] : mrs_) {
          auto start = reinterpret_cast<uint64_t>(m->mr.addr);
          if (m->mr.lkey == sge.lkey && m->mr.pd == q->qp.pd && sge.addr >= start &&
              sge.addr + sge.length <= start + m->mr.length) {
            ok = true;
          }
        }
        if (!ok) wc.status = IBV_WC_LOC_PROT_ERR;
      }
      Mr* target = nullptr;
      for (auto& [k, m] : mrs_) {
        auto start = reinterpret_cast<uint64_t>(m->mr.addr);
        if (m->mr.rkey == wr.rkey && m->mr.pd == peer->qp.pd && (m->access & IBV_ACCESS_REMOTE_WRITE) &&
            wr.remote_addr >= start && wr.remote_addr + total <= start + m->mr.length) {
          target = m.get();
        }
      }
      if (wc.status == IBV_WC_SUCCESS && target == nullptr) wc.status = IBV_WC_REM_ACCESS_ERR;
      if (wc.status == IBV_WC_SUCCESS) {
        if (peer->recvs.empty()) return;  // receiver not ready: RNR retry (rnr_retry 7) until it posts
        auto* dst = reinterpret_cast<uint8_t*>(wr.remote_addr);
        for (auto& sge : wr.sges) {
          std::memcpy(dst, reinterpret_cast<const void*>(sge.addr), sge.length);
          dst += sge.length;
        }
        ibv_wc rwc{};
        rwc.wr_id = peer->recvs.front();
        peer->recvs.pop_front();
        rwc.status = IBV_WC_SUCCESS;
        rwc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
        rwc.wc_flags = IBV_WC_WITH_IMM;
        rwc.imm_data = wr.imm;
        rwc.byte_len = static_cast<uint32_t>(total);
        rwc.qp_num = peer->qp.qp_num;
        pushWc(cqs_.at(peer->qp.recv_cq).get(), rwc);
      }
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
    if (wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM || wr->num_sge < 1 || wr->num_sge > 2) {
      *bad_wr = wr;
      return EINVAL;
    }
    SendWr w{wr->wr_id,        (wr->send_flags & IBV_SEND_SIGNALED) != 0,
             wr->imm_data,     wr->wr.rdma.remote_addr,
             wr->wr.rdma.rkey, std::vector<ibv_sge>(wr->sg_list, wr->sg_list + wr->num_sge)};
    ++stats_.send_wrs;
    if (w.signalled) ++stats_.signalled_wrs;
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
    q->recvs.push_back(wr->wr_id);
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

// ---------------------------------------------------------------- rdma_cm

void FakeVerbs::queueCmEvent(Id* id, rdma_cm_event_type type, int status, Id* listen_id, const void* pd,
                             uint8_t pd_len) {
  rdma_event_channel* ch = listen_id ? listen_id->id.channel : id->id.channel;
  if (ch == nullptr) return;
  auto it = event_channels_.find(ch);
  if (it == event_channels_.end()) return;
  auto* ev = new rdma_cm_event{};
  ev->id = &id->id;
  ev->listen_id = listen_id ? &listen_id->id : nullptr;
  ev->event = type;
  ev->status = status;
  if (pd != nullptr && pd_len > 0) {
    auto& store = event_private_data_[ev];
    store.assign(static_cast<const uint8_t*>(pd), static_cast<const uint8_t*>(pd) + pd_len);
    ev->param.conn.private_data = store.data();
    ev->param.conn.private_data_len = pd_len;
  }
  it->second->events.push_back(ev);
  bump(it->second->channel.fd);
  ++stats_.cm_events;
}

rdma_event_channel* FakeVerbs::createEventChannel() {
  std::lock_guard lock(mu_);
  auto c = std::make_unique<EventChannel>();
  c->channel.fd = newEventFd();
  rdma_event_channel* p = &c->channel;
  event_channels_.emplace(p, std::move(c));
  return p;
}
void FakeVerbs::destroyEventChannel(rdma_event_channel* channel) {
  std::lock_guard lock(mu_);
  for (auto& [k, id] : ids_) {
    if (id->id.channel == channel) error("rdma_destroy_event_channel while an id uses it");
  }
  auto it = event_channels_.find(channel);
  if (it == event_channels_.end()) return;
  for (auto* e : it->second->events) {
    event_private_data_.erase(e);
    delete e;
  }
  ::close(it->second->channel.fd);
  event_channels_.erase(it);
}
int FakeVerbs::createId(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  std::lock_guard lock(mu_);
  auto i = std::make_unique<Id>();
  i->id.channel = channel;
  i->id.context = context;
  i->id.ps = ps;
  *id = &i->id;
  ids_.emplace(*id, std::move(i));
  return 0;
}
void FakeVerbs::disconnectLocked(Id* i) {
  if (!i->connected) return;
  i->connected = false;
  if (i->id.qp) {
    Qp* q = qps_.at(i->id.qp).get();
    q->qp.state = IBV_QPS_ERR;
    flushQp(q);
  }
  queueCmEvent(i, RDMA_CM_EVENT_DISCONNECTED, 0);
  if (Id* p = i->peer) {
    if (p->connected) {
      p->connected = false;
      if (p->id.qp) {
        Qp* q = qps_.at(p->id.qp).get();
        q->qp.state = IBV_QPS_ERR;
        flushQp(q);
      }
      queueCmEvent(p, RDMA_CM_EVENT_DISCONNECTED, 0);
    }
  }
}
int FakeVerbs::destroyId(rdma_cm_id* id) {
  std::lock_guard lock(mu_);
  auto it = ids_.find(id);
  if (it == ids_.end()) return EINVAL;
  Id* i = it->second.get();
  if (i->id.qp != nullptr) error("rdma_destroy_id before rdma_destroy_qp");
  if (i->requested && i->peer) queueCmEvent(i->peer, RDMA_CM_EVENT_REJECTED, 28);
  disconnectLocked(i);
  if (i->peer) i->peer->peer = nullptr;
  for (auto l = listeners_.begin(); l != listeners_.end();) {
    l = l->second == i ? listeners_.erase(l) : std::next(l);
  }
  ids_.erase(it);
  return 0;
}
int FakeVerbs::migrateId(rdma_cm_id* id, rdma_event_channel* channel) {
  std::lock_guard lock(mu_);
  id->channel = channel;
  return 0;
}
int FakeVerbs::bindAddr(rdma_cm_id* id, sockaddr* addr) {
  std::lock_guard lock(mu_);
  Id* i = ids_.at(id).get();
  i->ip = ipOf(addr, &i->port);
  if (i->ip == "0.0.0.0") return 0;
  Device* d = deviceByIp(i->ip);
  if (d == nullptr) {
    errno = EADDRNOTAVAIL;
    return -1;
  }
  id->verbs = &d->context;
  id->port_num = 1;
  return 0;
}
int FakeVerbs::listen(rdma_cm_id* id, int) {
  std::lock_guard lock(mu_);
  Id* i = ids_.at(id).get();
  if (i->port == 0) i->port = next_port_++;
  listeners_[{i->ip, i->port}] = i;
  return 0;
}
uint16_t FakeVerbs::getSrcPort(rdma_cm_id* id) {
  std::lock_guard lock(mu_);
  return ids_.at(id)->port;
}
int FakeVerbs::resolveAddr(rdma_cm_id* id, sockaddr* src, sockaddr* dst, int) {
  std::lock_guard lock(mu_);
  Id* i = ids_.at(id).get();
  i->dst_ip = ipOf(dst, &i->dst_port);
  Device* to = deviceByIp(i->dst_ip);
  Device* from = src ? deviceByIp(ipOf(src, nullptr)) : to;
  if (to == nullptr || from == nullptr) {
    queueCmEvent(i, RDMA_CM_EVENT_ADDR_ERROR, -EHOSTUNREACH);
    return 0;
  }
  i->ip = from->ip;
  id->verbs = &from->context;
  id->port_num = 1;
  queueCmEvent(i, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
  return 0;
}
int FakeVerbs::resolveRoute(rdma_cm_id* id, int) {
  std::lock_guard lock(mu_);
  queueCmEvent(ids_.at(id).get(), RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  return 0;
}
int FakeVerbs::setAckTimeout(rdma_cm_id* id, uint8_t timeout) {
  std::lock_guard lock(mu_);
  if (timeout > 31) {
    errno = EINVAL;
    return -1;
  }
  ids_.at(id)->ack_timeout = timeout;
  return 0;
}
int FakeVerbs::createQp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* attr) {
  std::lock_guard lock(mu_);
  if (id->verbs == nullptr || pd->context != id->verbs) {
    errno = EINVAL;
    return -1;
  }
  auto q = std::make_unique<Qp>();
  q->qp.context = id->verbs;
  q->qp.pd = pd;
  q->qp.send_cq = attr->send_cq;
  q->qp.recv_cq = attr->recv_cq;
  q->qp.qp_type = attr->qp_type;
  q->qp.qp_num = next_qp_num_++;
  q->qp.state = IBV_QPS_INIT;
  q->cap = attr->cap;
  if (attr->sq_sig_all) error("sq_sig_all set: selective signalling expected");
  id->qp = &q->qp;
  qps_.emplace(id->qp, std::move(q));
  return 0;
}
void FakeVerbs::destroyQp(rdma_cm_id* id) {
  std::lock_guard lock(mu_);
  auto it = qps_.find(id->qp);
  if (it == qps_.end()) return;
  for (auto& [k, q] : qps_) {
    if (q->peer == it->second.get()) q->peer = nullptr;
  }
  qps_.erase(it);
  id->qp = nullptr;
}
int FakeVerbs::connect(rdma_cm_id* id, rdma_conn_param* param) {
  std::lock_guard lock(mu_);
  Id* i = ids_.at(id).get();
  auto l = listeners_.find({i->dst_ip, i->dst_port});
  if (l == listeners_.end()) l = listeners_.find({"0.0.0.0", i->dst_port});
  if (l == listeners_.end()) {
    queueCmEvent(i, RDMA_CM_EVENT_REJECTED, 8);  // IB_CM_REJ_INVALID_SERVICE_ID
    return 0;
  }
  if (param->rnr_retry_count != 7) error("rdma_connect without rnr_retry_count 7");
  if (i->ack_timeout < 0) error("rdma_connect without an ACK timeout (the rdma_cm default is ~0.5 s)");
  Id* listener = l->second;
  auto c = std::make_unique<Id>();
  c->id.channel = listener->id.channel;
  c->id.context = listener->id.context;
  c->id.ps = id->ps;
  c->id.verbs = &deviceByIp(i->dst_ip)->context;
  c->id.port_num = 1;
  auto* peer_addr = reinterpret_cast<sockaddr_in*>(&c->id.route.addr.dst_addr);
  peer_addr->sin_family = AF_INET;
  ::inet_pton(AF_INET, i->ip.c_str(), &peer_addr->sin_addr);
  c->ip = i->dst_ip;
  c->port = i->dst_port;
  c->peer = i;
  c->requested = true;
  i->peer = c.get();
  Id* conn = c.get();
  ids_.emplace(&conn->id, std::move(c));
  queueCmEvent(conn, RDMA_CM_EVENT_CONNECT_REQUEST, 0, listener, param->private_data,
               param->private_data_len);
  return 0;
}
int FakeVerbs::accept(rdma_cm_id* id, rdma_conn_param* param) {
  std::lock_guard lock(mu_);
  Id* c = ids_.at(id).get();
  Id* d = c->peer;
  if (d != nullptr && c->id.qp != nullptr &&
      std::find(stalled_dialers_.begin(), stalled_dialers_.end(), d->ip) != stalled_dialers_.end()) {
    if (c->ack_timeout < 0) error("rdma_accept without an ACK timeout (the rdma_cm default is ~0.5 s)");
    return 0;  // the reply went out; the dialer never completes the connection
  }
  if (d == nullptr || c->id.qp == nullptr || d->id.qp == nullptr) {
    errno = EINVAL;
    return -1;
  }
  if (param->rnr_retry_count != 7) error("rdma_accept without rnr_retry_count 7");
  if (c->ack_timeout < 0) error("rdma_accept without an ACK timeout (the rdma_cm default is ~0.5 s)");
  c->requested = false;
  Qp* a = qps_.at(c->id.qp).get();
  Qp* b = qps_.at(d->id.qp).get();
  a->peer = b;
  b->peer = a;
  a->qp.state = IBV_QPS_RTS;
  b->qp.state = IBV_QPS_RTS;
  c->connected = d->connected = true;
  queueCmEvent(c, RDMA_CM_EVENT_ESTABLISHED, 0);
  queueCmEvent(d, RDMA_CM_EVENT_ESTABLISHED, 0);
  return 0;
}
int FakeVerbs::reject(rdma_cm_id* id, const void* private_data, uint8_t length) {
  std::lock_guard lock(mu_);
  Id* c = ids_.at(id).get();
  c->requested = false;
  if (c->peer) queueCmEvent(c->peer, RDMA_CM_EVENT_REJECTED, 28, nullptr, private_data, length);
  return 0;
}
int FakeVerbs::disconnect(rdma_cm_id* id) {
  std::lock_guard lock(mu_);
  Id* i = ids_.at(id).get();
  if (!i->connected) {
    errno = EINVAL;
    return -1;
  }
  disconnectLocked(i);
  return 0;
}
int FakeVerbs::getCmEvent(rdma_event_channel* channel, rdma_cm_event** event) {
  std::lock_guard lock(mu_);
  auto& c = event_channels_.at(channel);
  if (c->events.empty()) {
    errno = EAGAIN;
    return -1;
  }
  *event = c->events.front();
  c->events.pop_front();
  unbump(c->channel.fd);
  return 0;
}
int FakeVerbs::ackCmEvent(rdma_cm_event* event) {
  std::lock_guard lock(mu_);
  event_private_data_.erase(event);
  delete event;
  ++stats_.cm_events_acked;
  return 0;
}

}  // namespace framelink::transport::rdma::testing
