#include "attach/segment_quota.h"

#include <unistd.h>

#include <algorithm>
#include <string>

namespace framelink {

namespace {

// A host whose RAM sysconf cannot tell is sized as a small one.
constexpr uint64_t kUnknownRam = 8 * kGiB;

std::string capText(const char* key, uint64_t cap, bool is_auto, const char* flag) {
  return std::string("over limits.") + key + " = " + std::to_string(cap) + (is_auto ? " (auto, " : " (") +
         flag + ")";
}

}  // namespace

SegmentCaps segmentCaps(const Config& config, uint64_t physical_ram) {
  SegmentCaps caps;
  const uint64_t ram = physical_ram != 0 ? physical_ram : kUnknownRam;
  caps.total_auto = config.max_total_bytes == 0;
  caps.total = caps.total_auto ? ram / 2 : config.max_total_bytes;
  caps.per_uid_auto = config.max_uid_bytes == 0;
  caps.per_uid = caps.per_uid_auto ? caps.total / 2 : config.max_uid_bytes;
  return caps;
}

uint64_t physicalRam() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page_size = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

uint64_t SegmentQuota::ofUid(uid_t uid) const {
  auto it = by_uid_.find(uid);
  return it != by_uid_.end() ? it->second : 0;
}

Status SegmentQuota::admit(uid_t uid, uint64_t bytes) const {
  // The user's own cap first: that refusal is the one its own clients can fix.
  const uint64_t held = ofUid(uid);
  if (bytes > caps_.per_uid || held > caps_.per_uid - bytes) {
    return makeError(FL_ERR_QUOTA,
                     "this user's clients hold " + std::to_string(held) +
                         " bytes of segments, this attach needs " + std::to_string(bytes) + " more: " +
                         capText("max_uid_bytes", caps_.per_uid, caps_.per_uid_auto, "--max-uid-bytes") +
                         "; detach a client, ask for fewer or smaller slots, or have the "
                         "operator raise it");
  }
  if (bytes > caps_.total || total_ > caps_.total - bytes) {
    return makeError(FL_ERR_QUOTA,
                     "all clients hold " + std::to_string(total_) + " bytes of segments, this attach needs " +
                         std::to_string(bytes) + " more: " +
                         capText("max_total_bytes", caps_.total, caps_.total_auto, "--max-total-bytes") +
                         "; detach idle clients, ask for fewer or smaller slots, or have the "
                         "operator raise it");
  }
  return {};
}

void SegmentQuota::charge(uid_t uid, uint64_t bytes) {
  total_ += bytes;
  by_uid_[uid] += bytes;
}

void SegmentQuota::release(uid_t uid, uint64_t bytes) {
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end()) return;
  const uint64_t given_back = std::min(bytes, it->second);
  it->second -= given_back;
  total_ -= std::min(given_back, total_);
  if (it->second == 0) by_uid_.erase(it);
}

}  // namespace framelink
