#include "transport/transport_core.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace framelink::transport {

const char* validateSendRequest(const SendRequest& r) noexcept {
  if (r.header.credit_id != r.credit.credit_id) return "header.credit_id does not name request.credit";
  if (r.header.length > r.credit.length) return "frame length exceeds the credit's capacity";
  if (r.header.attr_length > FL_MAX_ATTR_BYTES) return "attr_length exceeds FL_MAX_ATTR_BYTES";
  if (r.header.length > 0 && r.payload == nullptr) return "null payload with non-zero length";
  return "";
}

Result<std::unique_ptr<TransportCore>> TransportCore::create(size_t send_queue_depth) {
  if (send_queue_depth == 0) return makeError(FL_EINVAL, "send queue depth must be at least 1");
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    return makeError(FL_ERR_RESOURCES,
                     std::string("eventfd failed: ") + std::strerror(errno) + " (raise the fd limit?)");
  }
  return std::unique_ptr<TransportCore>(new TransportCore(UniqueFd(fd), send_queue_depth));
}

TransportCore::TransportCore(UniqueFd event_fd, size_t send_queue_depth)
    : event_fd_(std::move(event_fd)), ring_(send_queue_depth) {}

TransportCore::~TransportCore() = default;

// ---------------------------------------------------------------- credits

Result<RemoteCredit> TransportCore::exposeCredit(LocalCredit credit) {
  if (credit.buffer == nullptr && credit.capacity > 0) {
    return makeError(FL_EINVAL, "exposeCredit: null buffer with non-zero capacity");
  }
  if (failed()) return makeError(FL_ERR_LINK_LOST, "exposeCredit: the link is down");
  RemoteCredit remote{credit.credit_id, credit.capacity, 0, 0};
  MutexLock lock(credits_mu_);
  if (credits_.count(credit.credit_id) != 0 || receiving_ == credit.credit_id) {
    return makeError(FL_EINVAL, "exposeCredit: credit id " + std::to_string(credit.credit_id) +
                                    " is already exposed (credit ids must be unique per link)");
  }
  credits_.emplace(credit.credit_id, std::move(credit));
  return remote;
}

void TransportCore::retractCredit(uint64_t credit_id) {
  MutexLock lock(credits_mu_);
  credits_.erase(credit_id);
  // A frame may be landing in this buffer right now: the buffer stays mapped
  // (keepalive), and the frame is reported as for an unknown credit.
  if (receiving_ == credit_id) receiving_retracted_ = true;
}

std::optional<LocalCredit> TransportCore::beginReceive(uint64_t credit_id) noexcept {
  MutexLock lock(credits_mu_);
  auto it = credits_.find(credit_id);
  if (it == credits_.end()) return std::nullopt;
  LocalCredit credit = std::move(it->second);
  credits_.erase(it);
  receiving_ = credit_id;
  receiving_retracted_ = false;
  return credit;
}

bool TransportCore::endReceive() noexcept {
  MutexLock lock(credits_mu_);
  bool ok = !receiving_retracted_;
  receiving_.reset();
  receiving_retracted_ = false;
  return ok;
}

// ---------------------------------------------------------------- sending

PostResult TransportCore::post(const SendRequest& request) noexcept {
  if (*validateSendRequest(request) != '\0') return PostResult::kInvalid;
  {
    MutexLock lock(send_mu_);
    if (failed_) return PostResult::kNotConnected;
    if (count_ == ring_.size()) {
      MutexLock c(counters_mu_);
      ++counters_.backpressure;
      return PostResult::kBackpressure;
    }
    ring_[(head_ + count_) % ring_.size()] = request;
    ++count_;
  }
  send_cv_.notify_one();
  return PostResult::kOk;
}

PostResult TransportCore::postControl(std::string record) noexcept {
  if (record.empty() || record.size() > kMaxControlBytes) return PostResult::kInvalid;
  {
    MutexLock lock(send_mu_);
    if (failed_) return PostResult::kNotConnected;
    if (control_bytes_ + record.size() > kMaxControlBacklogBytes) {
      MutexLock c(counters_mu_);
      ++counters_.backpressure;
      return PostResult::kBackpressure;
    }
    try {
      control_bytes_ += record.size();
      control_.push_back(std::move(record));
    } catch (...) {
      control_bytes_ -= record.size();
      return PostResult::kBackpressure;
    }
  }
  send_cv_.notify_one();
  return PostResult::kOk;
}

bool TransportCore::nextSend(Outgoing* out) noexcept {
  out->control.clear();
  out->has_frame = false;
  MutexLock lock(send_mu_);
  lock.wait(send_cv_,
            [&]() FL_REQUIRES(send_mu_) { return failed_ || stopped_ || count_ > 0 || !control_.empty(); });
  if (failed_ || stopped_) return false;
  if (!control_.empty()) {
    {
      MutexLock c(counters_mu_);
      counters_.control_sent += control_.size();
    }
    out->control.swap(control_);
    control_bytes_ = 0;
  }
  if (count_ > 0) {
    out->frame = ring_[head_];
    out->has_frame = true;
    head_ = (head_ + 1) % ring_.size();
    --count_;
    in_flight_ = true;
    in_flight_cookie_ = out->frame.cookie;
  }
  return true;
}

void TransportCore::stopSending() noexcept {
  {
    MutexLock lock(send_mu_);
    stopped_ = true;
  }
  send_cv_.notify_all();
}

void TransportCore::completeSend(uint64_t cookie, int status, uint64_t bytes) noexcept {
  MutexLock lock(send_mu_);
  if (!in_flight_ || in_flight_cookie_ != cookie) return;  // not the request nextSend() gave out
  in_flight_ = false;
  if (failed_ && status == FL_OK) status = FL_ERR_LINK_LOST;
  if (status == FL_OK) {
    MutexLock c(counters_mu_);
    ++counters_.frames_sent;
    counters_.bytes_sent += bytes;
  }
  TransportEvent ev = TransportEvent::sendComplete(cookie, status);
  {
    MutexLock e(events_mu_);
    pushEventLocked(std::move(ev));
  }
  signal();
}

// ---------------------------------------------------------------- events

void TransportCore::frameArrived(const FrameHeader& header, int status, std::string message) noexcept {
  if (status == FL_ERR_UNKNOWN_CREDIT) {
    MutexLock c(counters_mu_);
    ++counters_.unknown_credit_frames;
  }
  TransportEvent ev;
  ev.kind = TransportEvent::Kind::kFrameArrived;
  ev.status = status;
  ev.header = header;
  ev.message = std::move(message);
  {
    MutexLock e(events_mu_);
    pushEventLocked(std::move(ev));
  }
  signal();
}

void TransportCore::controlArrived(std::string record) noexcept {
  {
    MutexLock c(counters_mu_);
    ++counters_.control_received;
  }
  {
    MutexLock e(events_mu_);
    pushEventLocked(TransportEvent::controlRecord(record));
  }
  signal();
}

bool TransportCore::fail(int status, std::string message) noexcept {
  {
    MutexLock lock(send_mu_);
    if (failed_) return false;
    failed_ = true;
    MutexLock e(events_mu_);
    TransportEvent link;
    link.kind = TransportEvent::Kind::kLinkError;
    link.status = status;
    link.message = std::move(message);
    pushEventLocked(std::move(link));
    // The request being written (if any) is not reported here: its payload
    // may still be read until the write returns, and the implementation
    // unblocks that write (socket shutdown, call cancel) right after this.
    // Its completeSend() then reports FL_ERR_LINK_LOST.
    for (; count_ > 0; --count_) {
      pushEventLocked(TransportEvent::sendComplete(ring_[head_].cookie, FL_ERR_LINK_LOST));
      head_ = (head_ + 1) % ring_.size();
    }
    control_.clear();
    control_bytes_ = 0;
  }
  send_cv_.notify_all();
  signal();
  return true;
}

bool TransportCore::failed() const noexcept {
  MutexLock lock(send_mu_);
  return failed_;
}

bool TransportCore::connected() const noexcept { return !failed(); }

void TransportCore::pushEventLocked(TransportEvent event) noexcept {
  try {
    events_.push_back(std::move(event));
  } catch (...) {
    // Out of memory while reporting: nothing sensible is left to do but drop
    // the event; the ACK timeout on the control link recovers the frame.
  }
}

void TransportCore::signal() noexcept {
  uint64_t one = 1;
  // EAGAIN only when the counter would overflow: it is readable then anyway.
  [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
}

size_t TransportCore::poll(TransportEvent* out, size_t max) noexcept {
  uint64_t value = 0;
  [[maybe_unused]] ssize_t n = ::read(event_fd_.get(), &value, sizeof value);
  size_t taken = 0;
  bool more = false;
  {
    MutexLock e(events_mu_);
    while (taken < max && !events_.empty()) {
      out[taken++] = std::move(events_.front());
      events_.pop_front();
    }
    more = !events_.empty();
  }
  if (more) signal();  // level-triggered for the caller: still readable
  return taken;
}

TransportCore::Counters TransportCore::counters() const noexcept {
  MutexLock c(counters_mu_);
  return counters_;
}

void TransportCore::countReceived(uint64_t bytes) noexcept {
  MutexLock c(counters_mu_);
  ++counters_.frames_received;
  counters_.bytes_received += bytes;
}

}  // namespace framelink::transport
