// FakeVerbs' completion channels and completion queues: creation and
// teardown, arming, channel events and polling, and the completions the fake
// queue pairs push.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fake_verbs.h"
#include "fake_verbs_state.h"

namespace framelink::transport::rdma::testing {

using namespace fake;

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
  ++stats_.cq_event_reads;
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
      // The send queue completes in posting order: everything up to this
      // WR in the window is done (wr_ids need not grow: control WRs are
      // tagged).  Receive completions are not in the window.
      if (std::find(q->window.begin(), q->window.end(), wc[n].wr_id) == q->window.end()) continue;
      while (!q->window.empty()) {
        const uint64_t done = q->window.front();
        q->window.pop_front();
        if (done == wc[n].wr_id) break;
      }
    }
    ++n;
  }
  return n;
}

FakeVerbs::Mr* FakeVerbs::findMr(uint32_t lkey, ibv_pd* pd, uint64_t addr, uint64_t length,
                                 int access) const {
  for (auto& [k, m] : mrs_) {
    auto start = reinterpret_cast<uint64_t>(m->mr.addr);
    if (m->mr.lkey == lkey && m->mr.pd == pd && (m->access & access) == access && addr >= start &&
        addr + length <= start + m->mr.length) {
      return m.get();
    }
  }
  return nullptr;
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

}  // namespace framelink::transport::rdma::testing
