#include "transport/rdma/rdma_windows.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "transport/rdma/rdma_transport.h"

namespace framelink::transport::rdma {

uint32_t CreditWindows::bind(uint32_t key, ibv_mr* mr, const uint8_t* addr, uint64_t length,
                             ibv_send_wr* wr) noexcept {
  if (bound_.count(key) != 0) {
    errno = EEXIST;
    return 0;
  }
  Window w;
  if (!free_.empty()) {
    w = free_.back();
    free_.pop_back();
  } else {
    w.mw = api_.allocMw(pd_, IBV_MW_TYPE_2);
    if (w.mw == nullptr) return 0;
    w.rkey = w.mw->rkey;
  }
  // A new 8-bit key per bind: a peer that kept the key of the slot's
  // earlier credit finds it refused by the adapter.
  w.rkey = ibv_inc_rkey(w.rkey);
  try {
    bound_.emplace(key, w);
  } catch (...) {
    free_.push_back(w);
    errno = ENOMEM;
    return 0;
  }
  *wr = {};
  wr->opcode = IBV_WR_BIND_MW;
  wr->bind_mw.mw = w.mw;
  wr->bind_mw.rkey = w.rkey;
  wr->bind_mw.bind_info.mr = mr;
  wr->bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(addr);
  wr->bind_mw.bind_info.length = length;
  wr->bind_mw.bind_info.mw_access_flags = access_;
  return w.rkey;
}

void CreditWindows::unbind(uint32_t key) noexcept {
  auto it = bound_.find(key);
  if (it == bound_.end()) return;
  free_.push_back(it->second);
  bound_.erase(it);
}

bool CreditWindows::invalidate(uint32_t key, ibv_send_wr* wr) noexcept {
  auto it = bound_.find(key);
  if (it == bound_.end()) return false;
  try {
    invalidating_.emplace(it->second.rkey, it->second);
  } catch (...) {
    return false;  // stays bound: the credit's slot is not regranted before its window ends
  }
  *wr = {};
  wr->opcode = IBV_WR_LOCAL_INV;
  wr->invalidate_rkey = it->second.rkey;
  bound_.erase(it);
  return true;
}

void CreditWindows::posted(const ibv_send_wr& wr) noexcept {
  if (wr.opcode == IBV_WR_LOCAL_INV) {
    recycle(wr);
  } else {
    // A type-2 bind names the window by its current key (rxe checks it):
    // the next bind must carry the key this one gives it.
    wr.bind_mw.mw->rkey = wr.bind_mw.rkey;
  }
}

void CreditWindows::recycle(const ibv_send_wr& invalidate_wr) noexcept {
  auto it = invalidating_.find(invalidate_wr.invalidate_rkey);
  if (it == invalidating_.end()) return;
  try {
    free_.push_back(it->second);
  } catch (...) {
    api_.deallocMw(it->second.mw);
  }
  invalidating_.erase(it);
}

void CreditWindows::clear() noexcept {
  for (auto& [k, w] : bound_) api_.deallocMw(w.mw);
  for (auto& [k, w] : invalidating_) api_.deallocMw(w.mw);
  for (auto& w : free_) api_.deallocMw(w.mw);
  bound_.clear();
  invalidating_.clear();
  free_.clear();
}

}  // namespace framelink::transport::rdma

// ---------------------------------------------------------------- the transport's credits

namespace framelink::transport::rdma {

Result<RemoteCredit> RdmaTransport::exposeCredit(LocalCredit credit) {
  if (credit.buffer == nullptr) return makeError(FL_EINVAL, "exposeCredit: null buffer");
  if (book_.failed()) return makeError(FL_ERR_LINK_LOST, "exposeCredit: the link is down");
  uint8_t* landing = credit.buffer - kWireHeaderBytes;
  const uint64_t landing_length = kWireHeaderBytes + credit.capacity;
  ibv_mr* mr = device_->windowRegion(landing, landing_length);
  if (mr == nullptr) {
    return makeError(FL_EINVAL, "exposeCredit(" + std::to_string(credit.credit_id) +
                                    "): the buffer and the 256-byte slot header before it are not inside "
                                    "one receive registration on " +
                                    device_->name());
  }
  poisonHeader(landing);  // before the peer can learn the key
  const auto key = static_cast<uint32_t>(credit.credit_id);
  const uint64_t id = credit.credit_id;
  auto rkey = bindWindow(windows_, key, mr, landing, landing_length, "exposeCredit", id);
  if (!rkey) return rkey.error();
  // The bind goes on the send queue with the next flush, ahead of the grant
  // that carries the key, and the queue executes in order: the window is up
  // before the peer can learn its key.
  auto remote = book_.exposeCredit(std::move(credit), reinterpret_cast<uint64_t>(landing), rkey.value());
  if (!remote) unbindWindow(windows_, key);
  return remote;
}

// The window ends when its invalidation, posted now, has executed -- after
// everything posted before it on this send queue (windowOpen until then);
// from then a write the peer posts under its key fails on its side with
// REM_ACCESS_ERR.  The data agent grants the slot again only after that.
// The credit's memory is kept (and its header readable for a frame that
// landed just before) until the invalidation has executed.
void RdmaTransport::retractCredit(uint64_t credit_id) {
  const auto key = static_cast<uint32_t>(credit_id);
  WindowHold hold;
  if (const LocalCredit* c = book_.credits().lookup(key); c != nullptr && c->credit_id == credit_id) {
    hold.memory = c->keepalive;
    hold.retracted_credit = credit_id;
  }
  book_.retractCredit(credit_id);
  endWindow(windows_, key, std::move(hold));
  flushChain();
}

// ---------------------------------------------------------------- the transport's sources (pull)

Result<RemoteSource> RdmaTransport::exposeSource(LocalSource source) {
  if (read_depth_ == 0) {
    return makeError(FL_ERR_TRANSPORT, "rdma links on " + device_->name() + " cannot be read");
  }
  if (source.payload == nullptr && source.length > 0) {
    return makeError(FL_EINVAL, "exposeSource: null payload with non-zero length");
  }
  if (book_.failed()) return makeError(FL_ERR_LINK_LOST, "exposeSource: the link is down");
  const uint64_t id = source.source_id;
  if (source.length == 0) return book_.exposeSource(std::move(source));  // nothing to read: no window
  ibv_mr* mr = device_->sourceRegion(source.payload, source.length);
  if (mr == nullptr) {
    return makeError(FL_EINVAL, "exposeSource(" + std::to_string(id) +
                                    "): the payload is not inside one producer registration on " +
                                    device_->name());
  }
  const auto key = static_cast<uint32_t>(id);
  auto rkey = bindWindow(source_windows_, key, mr, source.payload, source.length, "exposeSource", id);
  if (!rkey) return rkey.error();
  // As for a credit: the bind executes before the offer that carries its key.
  const auto addr = reinterpret_cast<uint64_t>(source.payload);
  auto remote = book_.exposeSource(std::move(source), addr, rkey.value());
  if (!remote) unbindWindow(source_windows_, key);
  return remote;
}

// The window ends at once; the slot's memory stays registered and mapped
// until the invalidation has executed (a read the peer posted before may
// still be answered until then).
void RdmaTransport::retractSource(uint64_t source_id) {
  const LocalSource* s = book_.sources().lookup(source_id);
  if (s == nullptr) return;
  const bool windowed = s->length > 0;  // an empty source has no window
  WindowHold hold{s->keepalive};
  book_.retractSource(source_id);
  if (!windowed) return;
  endWindow(source_windows_, static_cast<uint32_t>(source_id), std::move(hold));
  flushChain();
}

Result<uint32_t> RdmaTransport::bindWindow(CreditWindows& windows, uint32_t key, ibv_mr* mr,
                                           const uint8_t* addr, uint64_t length, const char* what,
                                           uint64_t id) {
  if (window_backlog_.size() + (window_posted_seq_ - window_done_seq_) >= options_.window_queue_depth) {
    return makeError(FL_ERR_RESOURCES, std::string(what) + ": all " +
                                           std::to_string(options_.window_queue_depth) +
                                           " memory-window work requests are in use; try again later");
  }
  ibv_send_wr bind{};
  const uint32_t rkey = windows.bind(key, mr, addr, length, &bind);
  if (rkey == 0) {
    if (errno == EEXIST) {
      return makeError(FL_EINVAL, std::string(what) + "(" + std::to_string(id) +
                                      "): " + (&windows == &windows_ ? "credit" : "source") + " key " +
                                      std::to_string(key) + " is exposed already");
    }
    return makeError(FL_ERR_RESOURCES, std::string(what) + ": ibv_alloc_mw: " + std::strerror(errno));
  }
  try {
    window_backlog_.push_back(PendingWindowWr{bind, WindowHold{}, &windows});
  } catch (...) {
    windows.unbind(key);
    return makeError(FL_ERR_RESOURCES,
                     std::string(what) + ": out of memory queueing the memory window's bind");
  }
  return rkey;
}

void RdmaTransport::unbindWindow(CreditWindows& windows, uint32_t key) noexcept {
  window_backlog_.pop_back();  // the bind bindWindow() queued last: nothing has flushed it since
  windows.unbind(key);
}

void RdmaTransport::endWindow(CreditWindows& windows, uint32_t key, WindowHold hold) noexcept {
  ibv_send_wr inv{};
  if (!windows.invalidate(key, &inv)) {
    releaseHold(hold);  // no window: the peer cannot write there
    return;
  }
  if (book_.failed() || torn_down_) {
    // The QP is in error: no write reaches any window; it stays bound (and
    // its memory kept) until tearDown() deallocates it.
    windows.recycle(inv);
    try {
      unended_windows_.push_back(std::move(hold));
    } catch (...) {
      // Out of memory: the memory stays with the retracted credit or goes.
    }
    return;
  }
  try {
    if (&windows == &windows_) {
      // A credit's: its slot is not granted on another link until this has executed (windowOpen).
      ++ending_windows_[key];
      hold.ending_credit = true;
      hold.ending_key = key;
    }
    window_backlog_.push_back(PendingWindowWr{inv, std::move(hold), &windows});
  } catch (...) {
    fail(FL_ERR_RESOURCES, "rdma link to " + peer_name_ + ": out of memory ending a memory window");
  }
}

void RdmaTransport::releaseHold(WindowHold& hold) noexcept {
  if (hold.retracted_credit != 0) book_.credits().forgetRetracted(hold.retracted_credit);
  if (hold.ending_credit) {
    auto it = ending_windows_.find(hold.ending_key);
    if (it != ending_windows_.end() && --it->second == 0) ending_windows_.erase(it);
  }
  hold = WindowHold{};
}

bool RdmaTransport::windowOpen(uint64_t credit_id) const noexcept {
  // A queue pair in error takes no write: every window on it is shut.
  if (book_.failed() || torn_down_) return false;
  return ending_windows_.count(static_cast<uint32_t>(credit_id)) != 0;
}

bool RdmaTransport::creditsWritable() const noexcept {
  return window_backlog_.empty() && window_done_seq_ == window_posted_seq_;
}

uint32_t RdmaTransport::buildWindowWrs() noexcept {
  const uint32_t depth = options_.window_queue_depth;
  uint32_t built = 0;
  while (!window_backlog_.empty() && window_posted_seq_ + built - window_done_seq_ < depth) {
    const uint64_t wseq = window_posted_seq_ + built;
    PendingWindowWr& entry = window_ring_[wseq % depth];
    entry = std::move(window_backlog_.front());
    window_backlog_.pop_front();
    entry.wr.wr_id = kWindowTag | wseq;
    entry.wr.send_flags = 0;
    entry.wr.next = nullptr;
    if (built > 0) window_ring_[(wseq - 1) % depth].wr.next = &entry.wr;
    ++built;
  }
  if (built > 0) window_ring_[(window_posted_seq_ + built - 1) % depth].wr.send_flags = IBV_SEND_SIGNALED;
  return built;
}

void RdmaTransport::handleWindowWc(const ibv_wc& wc) noexcept {
  const uint64_t wseq = wc.wr_id & ~kWindowTag;
  if (wc.status != IBV_WC_SUCCESS) {
    // Flushed or failed: the windows may still be bound, and what they hold
    // stays in the ring until tearDown().
    if (!book_.failed()) {
      failOnWc(wc, FL_ERR_LINK_LOST,
               "rdma link to " + peer_name_ + ": a memory-window work request completed with " +
                   ibv_wc_status_str(wc.status));
    }
    return;
  }
  if (wseq < window_done_seq_ || wseq >= window_posted_seq_) return;  // not one of ours any more
  const uint32_t depth = options_.window_queue_depth;
  for (; window_done_seq_ <= wseq; ++window_done_seq_) {
    releaseHold(window_ring_[window_done_seq_ % depth].hold);
  }
}

}  // namespace framelink::transport::rdma
