// The caps on the segment memory local clients make the daemon hold: every
// byte of a client's segments is populated at attach (MAP_POPULATE) and, for
// an rdma consumer, pinned, so none of it can be reclaimed or swapped while
// the client is attached.  The bytes of all clients together and of each
// uid's clients are counted at attach and given back when the client goes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>

#include "attach/segment.h"
#include "common/result.h"
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

// The bytes attached clients hold, against SegmentCaps.  Owned by the attach
// thread, which checks, creates the segments and charges in one go, so no
// other attach comes between the check and the charge.
class SegmentQuota {
 public:
  explicit SegmentQuota(SegmentCaps caps) : caps_(caps) {}

  // Empty when `bytes` more for `uid` fit under both caps; else FL_ERR_QUOTA
  // with a message that names the cap, the numbers and what to do.
  Status admit(uid_t uid, uint64_t bytes) const;
  void charge(uid_t uid, uint64_t bytes);
  void release(uid_t uid, uint64_t bytes);

  const SegmentCaps& caps() const noexcept { return caps_; }
  uint64_t total() const noexcept { return total_; }
  uint64_t ofUid(uid_t uid) const;

 private:
  SegmentCaps caps_;
  uint64_t total_ = 0;
  std::map<uid_t, uint64_t> by_uid_;
};

}  // namespace framelink
