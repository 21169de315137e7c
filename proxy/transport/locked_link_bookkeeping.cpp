#include "transport/locked_link_bookkeeping.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace framelink::transport {

namespace {

Result<UniqueFd> makeEventFd() {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) {
    return makeError(FL_ERR_RESOURCES,
                     std::string("eventfd failed: ") + std::strerror(errno) + " (raise the fd limit?)");
  }
  return UniqueFd(fd);
}

}  // namespace

Result<std::unique_ptr<LockedLinkBookkeeping>> LockedLinkBookkeeping::create(size_t send_queue_depth) {
  auto made = createWithoutEventFd(send_queue_depth);
  if (!made) return made;
  if (Status s = made.value()->openEventFd(); !s) return std::move(s).error();
  return made;
}

Status LockedLinkBookkeeping::openEventFd() {
  if (event_fd_.get() >= 0) return {};
  auto fd = makeEventFd();
  if (!fd) return std::move(fd).error();
  event_fd_ = std::move(fd).value();
  return {};
}

Result<std::unique_ptr<LockedLinkBookkeeping>> LockedLinkBookkeeping::createWithoutEventFd(
    size_t send_queue_depth) {
  if (send_queue_depth == 0) return makeError(FL_EINVAL, "send queue depth must be at least 1");
  UniqueFd event_fd;
  try {
    return std::unique_ptr<LockedLinkBookkeeping>(
        new LockedLinkBookkeeping(std::move(event_fd), send_queue_depth));
  } catch (const std::bad_alloc&) {
    return makeError(FL_ERR_RESOURCES, "out of memory for the send queue");
  }
}

LockedLinkBookkeeping::LockedLinkBookkeeping(UniqueFd event_fd, size_t send_queue_depth)
    : event_fd_(std::move(event_fd)), book_(send_queue_depth) {}

LockedLinkBookkeeping::~LockedLinkBookkeeping() = default;

// ---------------------------------------------------------------- data agent

Result<RemoteCredit> LockedLinkBookkeeping::exposeCredit(LocalCredit credit) {
  MutexLock lock(mu_);
  return book_.exposeCredit(std::move(credit));
}

void LockedLinkBookkeeping::retractCredit(uint64_t credit_id) {
  MutexLock copying(copy_mu_);
  MutexLock lock(mu_);
  book_.retractCredit(credit_id);
}

void LockedLinkBookkeeping::setWake(std::function<void()> wake) { wake_ = std::move(wake); }

void LockedLinkBookkeeping::wakeIfWaited(bool sender_waits, bool reader_waits) noexcept {
  if ((sender_waits || reader_waits) && wake_) wake_();
}

PostResult LockedLinkBookkeeping::post(const SendRequest& request) noexcept {
  PostResult result;
  bool waits = false;
  {
    MutexLock lock(mu_);
    result = book_.post(request);
    if (result == PostResult::kOk) waits = std::exchange(sender_waits_, false);
  }
  wakeIfWaited(waits, false);
  return result;
}

PostResult LockedLinkBookkeeping::postControl(std::string record) noexcept {
  PostResult result;
  bool waits = false;
  {
    MutexLock lock(mu_);
    result = book_.postControl(std::move(record));
    if (result == PostResult::kOk) waits = std::exchange(sender_waits_, false);
  }
  wakeIfWaited(waits, false);
  return result;
}

Result<RemoteSource> LockedLinkBookkeeping::exposeSource(LocalSource source) {
  MutexLock lock(mu_);
  return book_.exposeSource(std::move(source));
}

// An answer already handed to the sender goes on from its own keepalive.
void LockedLinkBookkeeping::retractSource(uint64_t source_id) noexcept {
  MutexLock lock(mu_);
  book_.retractSource(source_id);
}

PostResult LockedLinkBookkeeping::postRead(const ReadRequest& request) noexcept {
  PostResult result;
  bool waits = false;
  {
    MutexLock lock(mu_);
    uint64_t tag = 0;
    result = book_.postRead(request, &tag);
    if (result == PostResult::kOk) {
      try {
        asks_.push_back(ReadAsk{request.source.source_id, tag, request.source.length});
      } catch (...) {
        book_.reads().take(tag);  // out of memory: the caller retries, as after backpressure
        result = PostResult::kBackpressure;
      }
    }
    if (result == PostResult::kOk) waits = std::exchange(sender_waits_, false);
  }
  wakeIfWaited(waits, false);
  return result;
}

std::string_view LockedLinkBookkeeping::lastRefusal() const noexcept {
  MutexLock lock(mu_);
  return book_.lastRefusal();  // a string literal: outlives the lock
}

size_t LockedLinkBookkeeping::poll(TransportEvent* out, size_t max) noexcept {
  // The eventfd is read only when signal() wrote it since the last read: the
  // agent polls on every turn, and a read of a quiet eventfd is a system call
  // for nothing.  signal() sets the flag after its write, so a write the
  // exchange missed is read on the next turn (the eventfd stays readable).
  if (signalled_.exchange(false, std::memory_order_acq_rel)) {
    uint64_t value = 0;
    [[maybe_unused]] ssize_t n = ::read(event_fd_.get(), &value, sizeof value);
  }
  size_t taken = 0;
  bool more = false;
  bool reader_waits = false;
  {
    MutexLock lock(mu_);
    taken = book_.events().take(out, max);
    more = !book_.events().empty();
    // A reader waiting for room reads on.
    if (book_.events().size() < kMaxQueuedEvents) reader_waits = std::exchange(reader_waits_, false);
  }
  if (more) signal();  // level-triggered for the caller: still readable
  wakeIfWaited(false, reader_waits);
  return taken;
}

bool LockedLinkBookkeeping::connected() const noexcept { return !failed(); }

TransportCounters LockedLinkBookkeeping::counters() const noexcept {
  MutexLock lock(mu_);
  return book_.counters();
}

// ---------------------------------------------------------------- sender

LockedLinkBookkeeping::Take LockedLinkBookkeeping::takeSend(Outgoing* out,
                                                            const SendBatching& batching) noexcept {
  out->control.clear();
  out->has_answer = false;
  out->answer = ReadAnswer{};  // lets the last answer's source go
  out->frames.clear();
  MutexLock lock(mu_);
  if (book_.failed() || stopped_) return Take::kStopped;
  if (book_.ring().empty() && book_.control().empty() && asks_.empty() && answers_.empty()) {
    sender_waits_ = true;
    return Take::kNothing;
  }
  if (!book_.control().empty()) {
    book_.countControlSent(book_.control().size());
    book_.control().takeAll(&out->control);
  }
  out->asks.clear();
  out->asks.swap(asks_);
  // Answers before frames, as tcp writes them: a reader waits for each, and
  // at most kMaxReadsOutstanding of them can be queued.
  if (!answers_.empty()) {
    out->answer = std::move(answers_.front());
    out->has_answer = true;
    answers_.pop_front();
  } else {
    takeFrames(out, batching);
  }
  return Take::kTaken;
}

void LockedLinkBookkeeping::takeFrames(Outgoing* out, const SendBatching& batching) noexcept {
  SendRing& ring = book_.ring();
  const size_t most = std::max<size_t>(batching.max_frames, 1);
  try {
    out->frames.reserve(most);
    in_flight_.reserve(in_flight_.size() + most);
  } catch (...) {  // bad_alloc: nothing taken; the sender's next takeSend() tries again
    return;
  }
  uint64_t bytes = 0;
  while (!ring.empty() && out->frames.size() < most) {
    const SendRequest& next = ring.front();
    if (!out->frames.empty()) {
      const bool fits =
          next.header.length <= batching.max_frame_bytes && bytes + next.header.length <= batching.max_bytes;
      if (!fits) break;
    }
    bytes += next.header.length;
    out->frames.push_back(next);  // within the capacity reserved above
    in_flight_.push_back(next.cookie);
    ring.pop();
    // A first frame too large to share a message goes alone.
    if (out->frames.size() == 1 && out->frames[0].header.length > batching.max_frame_bytes) break;
  }
  if (out->frames.size() > 1) book_.countBatch(out->frames.size());
}

void LockedLinkBookkeeping::stopSending() noexcept {
  bool waits = false;
  {
    MutexLock lock(mu_);
    stopped_ = true;
    waits = std::exchange(sender_waits_, false);
  }
  wakeIfWaited(waits, false);
}

void LockedLinkBookkeeping::completeSend(uint64_t cookie, int status, uint64_t bytes) noexcept {
  {
    MutexLock lock(mu_);
    const auto it = std::find(in_flight_.begin(), in_flight_.end(), cookie);
    if (it == in_flight_.end()) return;  // not a frame takeSend() gave out
    in_flight_.erase(it);
    book_.sendDone(cookie, status, bytes);
  }
  signal();
}

// ---------------------------------------------------------------- receiver

std::optional<LocalCredit> LockedLinkBookkeeping::beginReceive(uint64_t credit_id) noexcept {
  MutexLock lock(mu_);
  const LocalCredit* credit = book_.credits().beginLanding(credit_id);
  if (credit == nullptr) return std::nullopt;
  return *credit;  // the reader's own copy: it writes into the buffer without mu_ (copyIntoLanding)
}

bool LockedLinkBookkeeping::landingValid() const noexcept {
  MutexLock lock(mu_);
  return book_.credits().landingValid();
}

bool LockedLinkBookkeeping::endReceive() noexcept {
  MutexLock lock(mu_);
  return book_.credits().endLanding();
}

bool LockedLinkBookkeeping::roomForEvents() noexcept {
  MutexLock lock(mu_);
  if (book_.failed() || book_.events().size() < kMaxQueuedEvents) return true;
  reader_waits_ = true;
  return false;
}

void LockedLinkBookkeeping::frameArrived(const FrameHeader& header, int status,
                                         std::string message) noexcept {
  {
    MutexLock lock(mu_);
    book_.frameArrived(header, status, std::move(message));
  }
  signal();
}

void LockedLinkBookkeeping::controlArrived(std::string record) noexcept {
  {
    MutexLock lock(mu_);
    book_.controlArrived(record);
  }
  signal();
}

int LockedLinkBookkeeping::answerRead(const ReadAsk& asked) noexcept {
  bool waits = false;
  {
    MutexLock lock(mu_);
    if (book_.failed()) return FL_OK;  // nothing goes out any more
    if (answers_.size() >= kMaxReadsOutstanding) return FL_ERR_PROTOCOL;
    const LocalSource* source = book_.sources().lookup(asked.source_id);
    ReadAnswer answer;
    answer.asked = asked;
    answer.known = source != nullptr && source->length == asked.length;
    if (answer.known) {
      answer.payload = source->payload;
      answer.keepalive = source->keepalive;
    }
    try {
      answers_.push_back(std::move(answer));
    } catch (...) {
      return FL_ERR_RESOURCES;
    }
    book_.countReadServed(answers_.back().known);
    waits = std::exchange(sender_waits_, false);
  }
  wakeIfWaited(waits, false);
  return FL_OK;
}

std::optional<ReadRequest> LockedLinkBookkeeping::findRead(uint64_t tag) const noexcept {
  MutexLock lock(mu_);
  const ReadRequest* read = book_.reads().lookup(tag);
  if (read == nullptr) return std::nullopt;
  return *read;
}

bool LockedLinkBookkeeping::readOutstanding(uint64_t tag) const noexcept {
  MutexLock lock(mu_);
  return book_.reads().lookup(tag) != nullptr;
}

bool LockedLinkBookkeeping::readDone(uint64_t tag, int status, uint64_t bytes, std::string message) noexcept {
  {
    MutexLock lock(mu_);
    if (!book_.readDone(tag, status, bytes, std::move(message))) return false;
  }
  signal();
  return true;
}

// ---------------------------------------------------------------- any thread

bool LockedLinkBookkeeping::fail(int status, std::string message) noexcept {
  // Dropped once the locks are released: an answer's keepalive may be the
  // last reference to its source's memory.
  std::deque<ReadAnswer> dropped;
  bool sender_waits = false;
  bool reader_waits = false;
  {
    // After a chunk being copied into a read's buffer: the read's
    // completion gives the buffer back.
    MutexLock copying(copy_mu_);
    MutexLock lock(mu_);
    // The request being written (in_flight_) completes in its completeSend().
    if (!book_.fail(status, std::move(message))) return false;
    asks_.clear();
    dropped.swap(answers_);
    sender_waits = std::exchange(sender_waits_, false);
    reader_waits = std::exchange(reader_waits_, false);
  }
  signal();
  wakeIfWaited(sender_waits, reader_waits);
  return true;
}

bool LockedLinkBookkeeping::failed() const noexcept {
  MutexLock lock(mu_);
  return book_.failed();
}

void LockedLinkBookkeeping::signal() noexcept {
  if (event_fd_.get() < 0) return;  // not opened yet: nobody polls
  uint64_t one = 1;
  // EAGAIN only when the counter would overflow: it is readable then anyway.
  [[maybe_unused]] ssize_t n = ::write(event_fd_.get(), &one, sizeof one);
  signalled_.store(true, std::memory_order_release);
}

}  // namespace framelink::transport
