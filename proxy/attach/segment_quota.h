// The caps on the segment memory local clients make the daemon hold: every
// byte of a client's segments is populated at attach (MAP_POPULATE) and, for
// an rdma consumer, pinned, so none of it can be reclaimed or swapped while
// they exist.  The bytes of all clients together and of each uid's clients
// are counted at attach and given back when the segments go.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>

#include "attach/segment.h"
#include "common/result.h"
#include "common/thread_annotations.h"
#include "config/config.h"

namespace framelink {

// What a client's segments take of the host's memory: both, whole.
inline uint64_t segmentBytes(const SegmentGeometry& geometry) noexcept {
  return geometry.control_size + geometry.data_size;
}

struct SegmentCaps {
  uint64_t total = 0;    // limits.max_total_bytes
  uint64_t per_uid = 0;  // limits.max_uid_bytes
  bool total_auto = false;
  bool per_uid_auto = false;
};

// The caps of `config`, "auto" (0) resolved against `physical_ram` bytes.
// auto: all clients together half of the RAM, which leaves the other half to
// the applications, the page cache and the kernel whatever the host's size
// (a fixed number would be too much for a small host and needlessly tight
// for a big one); one uid half of the total cap, so that one user alone
// cannot fill the daemon and another still finds room.
SegmentCaps segmentCaps(const Config& config, uint64_t physical_ram);

// The host's RAM in bytes (sysconf); 0 when unknown.
uint64_t physicalRam();

// The bytes clients' segments hold, against SegmentCaps.  A charge is taken
// at attach and given back when the segments go -- not when the client
// detaches: frames in flight, lends, pull reads and rdma windows keep a
// detached client's segments (populated, perhaps pinned) until they end, and
// until then their bytes still count ("draining").  The attach thread checks,
// creates the segments and charges in one go, so no other attach comes
// between the check and the charge; charges are given back on whatever thread
// drops the segments last.
class SegmentQuota {
 public:
  class Charge;

  explicit SegmentQuota(SegmentCaps caps);

  // Empty when `bytes` more for `uid` fit under both caps; else FL_ERR_QUOTA
  // with a message that names the cap, the numbers and what to do.
  Status admit(uid_t uid, uint64_t bytes) const;
  // Whether `bytes` more for `uid` would fit once every detached client's
  // segments have gone (a refusal that time may lift).
  bool fitsOnceDrained(uid_t uid, uint64_t bytes) const;
  // Charges `bytes` to `uid` until the charge is destroyed.
  std::shared_ptr<Charge> charge(uid_t uid, uint64_t bytes);

  const SegmentCaps& caps() const noexcept { return caps_; }
  uint64_t total() const;
  uint64_t ofUid(uid_t uid) const;
  // Bytes of detached clients whose segments are still held.
  uint64_t draining() const;

 private:
  struct Ledger {
    mutable Mutex mu;
    uint64_t total FL_GUARDED_BY(mu) = 0;
    uint64_t draining FL_GUARDED_BY(mu) = 0;
    std::map<uid_t, uint64_t> by_uid FL_GUARDED_BY(mu);
    std::map<uid_t, uint64_t> draining_by_uid FL_GUARDED_BY(mu);
  };

  SegmentCaps caps_;
  std::shared_ptr<Ledger> ledger_;
};

// One client's bytes, charged while it lives (the client's ClientSegments
// holds it).  detached() when the client goes: the bytes count as draining
// until the last holder of the segments lets go.
class SegmentQuota::Charge {
 public:
  Charge(std::shared_ptr<Ledger> ledger, uid_t uid, uint64_t bytes) noexcept
      : ledger_(std::move(ledger)), uid_(uid), bytes_(bytes) {}
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge();

  void detached();
  uint64_t bytes() const noexcept { return bytes_; }

 private:
  std::shared_ptr<Ledger> ledger_;
  uid_t uid_;
  uint64_t bytes_;
  bool detached_ = false;  // under ledger_->mu
};

}  // namespace framelink
