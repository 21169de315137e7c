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

SegmentQuota::SegmentQuota(SegmentCaps caps) : caps_(caps), ledger_(std::make_shared<Ledger>()) {}

uint64_t SegmentQuota::total() const {
  MutexLock lock(ledger_->mu);
  return ledger_->total;
}

uint64_t SegmentQuota::draining() const {
  MutexLock lock(ledger_->mu);
  return ledger_->draining;
}

uint64_t SegmentQuota::ofUid(uid_t uid) const {
  MutexLock lock(ledger_->mu);
  auto it = ledger_->by_uid.find(uid);
  return it != ledger_->by_uid.end() ? it->second : 0;
}

Status SegmentQuota::admit(uid_t uid, uint64_t bytes) const {
  MutexLock lock(ledger_->mu);
  auto it = ledger_->by_uid.find(uid);
  const uint64_t held = it != ledger_->by_uid.end() ? it->second : 0;
  auto d = ledger_->draining_by_uid.find(uid);
  const uint64_t held_draining = d != ledger_->draining_by_uid.end() ? d->second : 0;
  // What to do: where detached clients' segments are part of it, time lifts
  // it (the message must fit an attach reply, so this replaces the advice).
  auto advice = [](uint64_t draining, const char* detach) {
    return draining == 0 ? std::string("; ") + detach +
                               ", ask for fewer or smaller slots, or have the operator raise it"
                         : "; " + std::to_string(draining) +
                               " of them are of detached clients, held until their frames end";
  };
  // The user's own cap first: that refusal is the one its own clients can fix.
  if (bytes > caps_.per_uid || held > caps_.per_uid - bytes) {
    return makeError(FL_ERR_QUOTA,
                     "this user's clients hold " + std::to_string(held) +
                         " bytes of segments, this attach needs " + std::to_string(bytes) + " more: " +
                         capText("max_uid_bytes", caps_.per_uid, caps_.per_uid_auto, "--max-uid-bytes") +
                         advice(held_draining, "detach a client"));
  }
  if (bytes > caps_.total || ledger_->total > caps_.total - bytes) {
    return makeError(FL_ERR_QUOTA,
                     "all clients hold " + std::to_string(ledger_->total) +
                         " bytes of segments, this attach needs " + std::to_string(bytes) + " more: " +
                         capText("max_total_bytes", caps_.total, caps_.total_auto, "--max-total-bytes") +
                         advice(ledger_->draining, "detach idle clients"));
  }
  return {};
}

bool SegmentQuota::fitsOnceDrained(uid_t uid, uint64_t bytes) const {
  MutexLock lock(ledger_->mu);
  if (ledger_->draining == 0) return false;
  auto it = ledger_->by_uid.find(uid);
  auto d = ledger_->draining_by_uid.find(uid);
  const uint64_t held =
      (it != ledger_->by_uid.end() ? it->second : 0) - (d != ledger_->draining_by_uid.end() ? d->second : 0);
  const uint64_t all = ledger_->total - ledger_->draining;
  return bytes <= caps_.per_uid && held <= caps_.per_uid - bytes && bytes <= caps_.total &&
         all <= caps_.total - bytes;
}

std::shared_ptr<SegmentQuota::Charge> SegmentQuota::charge(uid_t uid, uint64_t bytes) {
  {
    MutexLock lock(ledger_->mu);
    ledger_->total += bytes;
    ledger_->by_uid[uid] += bytes;
  }
  return std::make_shared<Charge>(ledger_, uid, bytes);
}

void SegmentQuota::Charge::detached() {
  MutexLock lock(ledger_->mu);
  if (detached_) return;
  detached_ = true;
  ledger_->draining += bytes_;
  ledger_->draining_by_uid[uid_] += bytes_;
}

namespace {

void giveBack(std::map<uid_t, uint64_t>& by_uid, uint64_t& total, uid_t uid, uint64_t bytes) {
  auto it = by_uid.find(uid);
  if (it == by_uid.end()) return;
  const uint64_t given_back = std::min(bytes, it->second);
  it->second -= given_back;
  total -= std::min(given_back, total);
  if (it->second == 0) by_uid.erase(it);
}

}  // namespace

SegmentQuota::Charge::~Charge() {
  MutexLock lock(ledger_->mu);
  giveBack(ledger_->by_uid, ledger_->total, uid_, bytes_);
  if (detached_) giveBack(ledger_->draining_by_uid, ledger_->draining, uid_, bytes_);
}

}  // namespace framelink
