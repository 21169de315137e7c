#include "transport/link_bookkeeping.h"

#include <algorithm>
#include <new>
#include <string>

#include "common/log_limit.h"
#include "framelink/framelink.h"

namespace framelink::transport {

void warnLinkFailed(int status, const std::string& message) {
  // Never destroyed: a transport's thread may still fail its link while the
  // process exits.
  static LogLimiter& log = *new LogLimiter(std::chrono::seconds(1), kLoggedLinkEventsPerSecond);
  if (status != FL_ERR_SHUTDOWN) log.warn("{}", message);
}

const char* validateSendRequest(const SendRequest& r) noexcept {
  if (r.header.credit_id != r.credit.credit_id) return "header.credit_id does not name request.credit";
  if (r.header.length > r.credit.length) return "frame length exceeds the credit's capacity";
  if (r.header.attr_length > FL_MAX_ATTR_BYTES) return "attr_length exceeds FL_MAX_ATTR_BYTES";
  if (r.header.length > 0 && r.payload == nullptr) return "null payload with non-zero length";
  return "";
}

const char* validateReadRequest(const ReadRequest& r) noexcept {
  if (r.source.length > r.capacity) return "the source is larger than the read's buffer";
  if (r.source.length > 0 && r.buffer == nullptr) return "null buffer with a non-empty source";
  return "";
}

// ---------------------------------------------------------------- EventQueue

void EventQueue::push(TransportEvent event) noexcept {
  if (count_ == events_.size()) {
    try {
      std::vector<TransportEvent> grown(std::max<size_t>(64, 2 * events_.size()));
      for (size_t i = 0; i < count_; ++i) grown[i] = std::move(events_[(head_ + i) % events_.size()]);
      events_.swap(grown);
      head_ = 0;
    } catch (...) {
      return;  // out of memory while reporting: see the declaration
    }
  }
  events_[(head_ + count_) % events_.size()] = std::move(event);
  ++count_;
}

size_t EventQueue::take(TransportEvent* out, size_t max) noexcept {
  size_t taken = 0;
  for (; taken < max && count_ > 0; ++taken) {
    out[taken] = std::move(events_[head_]);
    head_ = (head_ + 1) % events_.size();
    --count_;
  }
  return taken;
}

// ---------------------------------------------------------------- ControlQueue

bool ControlQueue::push(std::string& record) noexcept {
  const size_t size = record.size();
  try {
    records_.push_back(std::move(record));
  } catch (...) {
    return false;
  }
  bytes_ += size;
  return true;
}

std::string ControlQueue::pop() noexcept {
  std::string record = std::move(records_.front());
  records_.pop_front();
  bytes_ -= record.size();
  return record;
}

void ControlQueue::takeAll(std::deque<std::string>* out) noexcept {
  out->clear();
  out->swap(records_);
  bytes_ = 0;
}

void ControlQueue::clear() noexcept {
  records_.clear();
  bytes_ = 0;
}

// ---------------------------------------------------------------- CreditTable

Status CreditTable::add(LocalCredit credit) {
  const uint64_t id = credit.credit_id;
  const uint64_t key = id & options_.key_mask;
  auto it = credits_.find(key);
  const bool taken = it != credits_.end() && !it->second.retracted;
  if ((taken && it->second.credit.credit_id == id) || (landing_ && landing_->credit_id == id)) {
    return makeError(FL_EINVAL, "exposeCredit: credit id " + std::to_string(id) +
                                    " is already exposed (credit ids must be unique per link)");
  }
  if (taken) {
    return makeError(FL_EINVAL, "exposeCredit: credit id " + std::to_string(id) +
                                    " has the same low 32 bits as exposed credit " +
                                    std::to_string(it->second.credit.credit_id) +
                                    " (the rdma immediate data)");
  }
  if (it != credits_.end()) {
    it->second = Entry{std::move(credit), false};  // replaces a retracted one (its FIFO entry goes stale)
  } else {
    credits_.emplace(key, Entry{std::move(credit), false});
  }
  return {};
}

void CreditTable::retract(uint64_t credit_id) noexcept {
  // A frame landing in this buffer right now: its credit is reported as
  // retracted, and the buffer stays mapped (keepalive) until it landed.
  if (landing_ && landing_->credit_id == credit_id) landing_retracted_ = true;
  const uint64_t key = credit_id & options_.key_mask;
  auto it = credits_.find(key);
  if (it == credits_.end() || it->second.credit.credit_id != credit_id || it->second.retracted) return;
  if (options_.keep_retracted == 0) {
    credits_.erase(it);
    return;
  }
  it->second.retracted = true;
  try {
    retracted_.push_back(key);
  } catch (...) {
    credits_.erase(it);  // out of memory: forgotten at once, like without keep_retracted
    return;
  }
  while (retracted_.size() > options_.keep_retracted) {
    auto old = credits_.find(retracted_.front());
    if (old != credits_.end() && old->second.retracted) credits_.erase(old);
    retracted_.pop_front();
  }
}

void CreditTable::forgetRetracted(uint64_t credit_id) noexcept {
  auto it = credits_.find(credit_id & options_.key_mask);
  // Its FIFO entry goes stale, as when a retracted credit is replaced.
  if (it != credits_.end() && it->second.retracted && it->second.credit.credit_id == credit_id) {
    credits_.erase(it);
  }
}

const LocalCredit* CreditTable::lookup(uint64_t key) const noexcept {
  auto it = credits_.find(key);
  return it == credits_.end() ? nullptr : &it->second.credit;
}

const LocalCredit* CreditTable::beginLanding(uint64_t key) noexcept {
  auto it = credits_.find(key);
  if (it == credits_.end()) return nullptr;
  landing_ = std::move(it->second.credit);
  landing_retracted_ = it->second.retracted;
  credits_.erase(it);
  return &*landing_;
}

bool CreditTable::endLanding() noexcept {
  const bool valid = landingValid();
  landing_.reset();
  landing_retracted_ = false;
  return valid;
}

void CreditTable::clear() noexcept {
  credits_.clear();
  retracted_.clear();
  landing_.reset();
  landing_retracted_ = false;
}

// ---------------------------------------------------------------- LinkBookkeeping

LinkBookkeeping::LinkBookkeeping(size_t send_queue_depth, CreditTableOptions credits)
    : credits_(credits), ring_(send_queue_depth) {}

Result<RemoteCredit> LinkBookkeeping::exposeCredit(LocalCredit credit, uint64_t remote_addr, uint32_t rkey) {
  if (credit.buffer == nullptr && credit.capacity > 0) {
    return makeError(FL_EINVAL, "exposeCredit: null buffer with non-zero capacity");
  }
  if (failed_) return makeError(FL_ERR_LINK_LOST, "exposeCredit: the link is down");
  const RemoteCredit remote{credit.credit_id, credit.capacity, remote_addr, rkey};
  if (Status added = credits_.add(std::move(credit)); !added) return std::move(added).error();
  return remote;
}

// ---------------------------------------------------------------- pull

Status SourceTable::add(LocalSource source) {
  const uint64_t id = source.source_id;
  try {
    if (!sources_.emplace(id, std::move(source)).second) {
      return makeError(FL_EINVAL, "exposeSource: source " + std::to_string(id) + " is exposed already");
    }
  } catch (const std::bad_alloc&) {
    return makeError(FL_ERR_RESOURCES, "exposeSource: out of memory");
  }
  return {};
}

const LocalSource* SourceTable::lookup(uint64_t source_id) const noexcept {
  auto it = sources_.find(source_id);
  return it == sources_.end() ? nullptr : &it->second;
}

uint64_t ReadTable::add(const ReadRequest& request) noexcept {
  try {
    reads_.emplace(next_tag_, request);
  } catch (...) {
    return 0;
  }
  return next_tag_++;
}

const ReadRequest* ReadTable::lookup(uint64_t tag) const noexcept {
  auto it = reads_.find(tag);
  return it == reads_.end() ? nullptr : &it->second;
}

std::optional<ReadRequest> ReadTable::take(uint64_t tag) noexcept {
  auto it = reads_.find(tag);
  if (it == reads_.end()) return std::nullopt;
  ReadRequest r = it->second;
  reads_.erase(it);
  return r;
}

std::vector<ReadRequest> ReadTable::takeAll() noexcept {
  std::vector<std::pair<uint64_t, ReadRequest>> sorted(reads_.begin(), reads_.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  reads_.clear();
  std::vector<ReadRequest> out;
  out.reserve(sorted.size());
  for (auto& [tag, r] : sorted) out.push_back(r);
  return out;
}

Result<RemoteSource> LinkBookkeeping::exposeSource(LocalSource source, uint64_t remote_addr, uint32_t rkey) {
  if (source.payload == nullptr && source.length > 0) {
    return makeError(FL_EINVAL, "exposeSource: null payload with non-zero length");
  }
  if (failed_) return makeError(FL_ERR_LINK_LOST, "exposeSource: the link is down");
  const RemoteSource remote{source.source_id, source.length, remote_addr, rkey};
  if (Status added = sources_.add(std::move(source)); !added) return std::move(added).error();
  return remote;
}

PostResult LinkBookkeeping::postRead(const ReadRequest& request, uint64_t* tag, const char* also_invalid,
                                     bool queue_full) noexcept {
  if (const char* why = validateReadRequest(request); *why != '\0') return refuse(why);
  if (also_invalid != nullptr) return refuse(also_invalid);
  if (failed_) return PostResult::kNotConnected;
  if (queue_full || reads_.size() >= kMaxReadsOutstanding) {
    ++counters_.backpressure;
    return PostResult::kBackpressure;
  }
  *tag = reads_.add(request);
  return *tag == 0 ? PostResult::kBackpressure : PostResult::kOk;
}

bool LinkBookkeeping::readDone(uint64_t tag, int status, uint64_t bytes, std::string message) noexcept {
  std::optional<ReadRequest> read = reads_.take(tag);
  if (!read) return false;
  if (failed_ && status == FL_OK) status = FL_ERR_LINK_LOST;
  if (status == FL_OK) {
    ++counters_.reads_completed;
    counters_.bytes_read += bytes;
  }
  events_.push(TransportEvent::readComplete(read->cookie, status, std::move(message)));
  return true;
}

PostResult LinkBookkeeping::admitControl(const std::string& record, size_t backlog) noexcept {
  if (record.empty()) return refuse("an empty control record");
  if (record.size() > kMaxControlBytes) return refuse("the control record exceeds kMaxControlBytes");
  if (failed_) return PostResult::kNotConnected;
  if (backlog + record.size() > kMaxControlBacklogBytes) {
    ++counters_.backpressure;
    return PostResult::kBackpressure;
  }
  return PostResult::kOk;
}

PostResult LinkBookkeeping::postControl(std::string record) noexcept {
  const PostResult admitted = admitControl(record, control_.bytes());
  if (admitted != PostResult::kOk) return admitted;
  // Out of memory: the caller keeps the record and retries.
  return control_.push(record) ? PostResult::kOk : PostResult::kBackpressure;
}

void LinkBookkeeping::frameArrived(const FrameHeader& header, int status, std::string message) noexcept {
  if (status == FL_OK) {
    ++counters_.frames_received;
    counters_.bytes_received += header.length;
  } else if (status == FL_ERR_UNKNOWN_CREDIT) {
    ++counters_.unknown_credit_frames;
  }
  TransportEvent ev;
  ev.kind = TransportEvent::Kind::kFrameArrived;
  ev.status = status;
  ev.header = header;
  ev.message = std::move(message);
  events_.push(std::move(ev));
}

void LinkBookkeeping::controlArrived(std::string& record) noexcept {
  ++counters_.control_received;
  events_.push(TransportEvent::controlRecord(record));
}

void LinkBookkeeping::sendDone(uint64_t cookie, int status, uint64_t bytes) noexcept {
  if (failed_ && status == FL_OK) status = FL_ERR_LINK_LOST;
  if (status == FL_OK) {
    ++counters_.frames_sent;
    counters_.bytes_sent += bytes;
  }
  events_.push(TransportEvent::sendComplete(cookie, status));
}

std::vector<std::shared_ptr<void>> SourceTable::takeMemory() {
  std::vector<std::shared_ptr<void>> memory;
  memory.reserve(sources_.size());
  for (auto& [id, source] : sources_) {
    if (source.keepalive) memory.push_back(std::move(source.keepalive));
  }
  sources_.clear();
  return memory;
}

bool LinkBookkeeping::fail(int status, std::string message, std::span<const uint64_t> writing) noexcept {
  if (failed_) return false;
  failed_ = true;
  TransportEvent link;
  link.kind = TransportEvent::Kind::kLinkError;
  link.status = status;
  link.message = std::move(message);
  events_.push(std::move(link));
  for (uint64_t cookie : writing) events_.push(TransportEvent::sendComplete(cookie, FL_ERR_LINK_LOST));
  for (; !ring_.empty(); ring_.pop()) {
    events_.push(TransportEvent::sendComplete(ring_.front().cookie, FL_ERR_LINK_LOST));
  }
  for (const ReadRequest& r : reads_.takeAll()) {
    events_.push(TransportEvent::readComplete(r.cookie, FL_ERR_LINK_LOST,
                                              "the link went down before the read completed"));
  }
  sources_.clear();
  control_.clear();
  return true;
}

}  // namespace framelink::transport
