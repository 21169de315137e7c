// FakeVerbs' rdma_cm: event channels, ids, address resolution, connect,
// accept, reject and disconnect on the fake fabric (by IP and port).
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fake_verbs.h"
#include "fake_verbs_state.h"

namespace framelink::transport::rdma::testing {

using namespace fake;

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
  const Device* device = nullptr;
  for (const auto& d : devices_) {
    if (&d->context == id->verbs) device = d.get();
  }
  if (device != nullptr && attr->cap.max_inline_data > device->max_inline_data) {
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
  ++stats_.cm_event_reads;
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
