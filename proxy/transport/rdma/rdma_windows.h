// The type-2 memory windows of one rdma queue pair: how a peer's rights to
// write into this daemon's memory are limited to its live credits.
//
// Consumer data segments are registered without remote access
// (MemoryAccess::kCreditWindows).  Exposing a credit binds a window to
// exactly [slot header, end of the credit's capacity) with remote write, by
// an IBV_WR_BIND_MW on the link's own send queue; its rkey goes to the peer
// with the credit.  A type-2 window is bound to that queue pair, so the key
// is refused on any other link, and its low 8 bits change with every bind,
// so the key of a slot's earlier credit is refused too.  When the credit is
// consumed (its frame arrived) or retracted, an IBV_WR_LOCAL_INV on the same
// send queue ends it; the send queue executes in order, so the window can be
// bound again by any WR posted after that one.
//
// Windows are allocated on first need and kept for the queue pair's life:
// binding a cached window costs one work request, no system call.
//
// Pull uses a second set the same way, remote read only: exposing a source
// binds a window to exactly the offered slot's payload in the producer's
// data segment (registered MW_BIND only), and retracting it invalidates it.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "transport/rdma/verbs_api.h"

namespace framelink::transport::rdma {

class CreditWindows {
 public:
  // `access`: what a window grants, IBV_ACCESS_REMOTE_WRITE (credits) or
  // IBV_ACCESS_REMOTE_READ (sources).
  CreditWindows(VerbsApi& api, ibv_pd* pd, unsigned int access = IBV_ACCESS_REMOTE_WRITE) noexcept
      : api_(api), pd_(pd), access_(access) {}
  CreditWindows(const CreditWindows&) = delete;
  CreditWindows& operator=(const CreditWindows&) = delete;
  ~CreditWindows() { clear(); }

  // Fills `wr` with the bind of a window for credit key `key` to
  // [addr, addr + length) of `mr`, with this set's access only, and returns the rkey
  // the window has once `wr` has executed.  0 (errno set) when no window
  // could be allocated, or `key` holds one already (EEXIST).
  uint32_t bind(uint32_t key, ibv_mr* mr, const uint8_t* addr, uint64_t length, ibv_send_wr* wr) noexcept;
  // The bind `wr` of `key` was not posted: the window is free again at once.
  void unbind(uint32_t key) noexcept;
  // Fills `wr` with the invalidation of `key`'s window.  The window is
  // reused only after posted(wr) (or recycle(wr) when the QP is gone).
  // False when `key` has no window.
  bool invalidate(uint32_t key, ibv_send_wr* wr) noexcept;
  // `wr` (a bind or an invalidation built here) is on the send queue.
  void posted(const ibv_send_wr& wr) noexcept;
  void recycle(const ibv_send_wr& invalidate_wr) noexcept;

  size_t bound() const noexcept { return bound_.size(); }
  // Deallocates every window (the queue pair is gone or going).
  void clear() noexcept;

 private:
  struct Window {
    ibv_mw* mw = nullptr;
    uint32_t rkey = 0;  // the key of its latest bind
  };
  VerbsApi& api_;
  ibv_pd* const pd_;
  const unsigned int access_;
  std::unordered_map<uint32_t, Window> bound_;         // by credit key
  std::unordered_map<uint32_t, Window> invalidating_;  // by rkey: LOCAL_INV built, not yet posted
  std::vector<Window> free_;
};

}  // namespace framelink::transport::rdma
