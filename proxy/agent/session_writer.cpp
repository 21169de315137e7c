#include "agent/session_writer.h"

#include <time.h>

#include <algorithm>
#include <string>
#include <utility>

namespace framelink {

namespace {

bool isEcho(const v1::PeerMessage& message) {
  return message.has_keepalive() && message.keepalive().echo_ns() != 0;
}

int64_t sessionClockNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SessionWriter::SessionWriter(WriteFn write, std::chrono::milliseconds keepalive, std::function<void()> cut)
    : SessionWriter(std::move(write), keepalive, std::chrono::milliseconds(0), std::move(cut)) {}

SessionWriter::SessionWriter(WriteFn write, std::chrono::milliseconds keepalive,
                             std::chrono::milliseconds silence, std::function<void()> cut)
    : write_(std::move(write)),
      keepalive_(keepalive),
      silence_(silence),
      cut_(std::move(cut)),
      heard_ns_(sessionClockNs()) {
  thread_ = std::thread([this] { run(); });
}

SessionWriter::SessionWriter(AsyncTag, StartFn start, std::chrono::milliseconds keepalive,
                             std::chrono::milliseconds silence, std::function<void()> cut,
                             SessionTimers& timers)
    : keepalive_(keepalive),
      silence_(silence),
      cut_(std::move(cut)),
      heard_ns_(sessionClockNs()),
      start_(std::move(start)),
      timers_(&timers) {}

std::shared_ptr<SessionWriter> SessionWriter::makeAsync(StartFn start, std::chrono::milliseconds keepalive,
                                                        std::chrono::milliseconds silence,
                                                        std::function<void()> cut, SessionTimers& timers) {
  auto writer = std::make_shared<SessionWriter>(AsyncTag{}, std::move(start), keepalive, silence,
                                                std::move(cut), timers);
  MutexLock lock(writer->mutex_);
  writer->next_keepalive_ = std::chrono::steady_clock::now() + keepalive;
  writer->arm(writer, std::chrono::steady_clock::now());
  return writer;
}

SessionWriter::SessionWriter(WriteFn write, Inline)
    : write_(std::move(write)), keepalive_(0), inline_(true) {}

SessionWriter::~SessionWriter() { close(); }

void SessionWriter::send(v1::PeerMessage message) {
  if (inline_) {
    {
      MutexLock lock(mutex_);
      if (closing_ || failed_ || last_queued_) return;
    }
    if (!write_(message, false)) {
      MutexLock lock(mutex_);
      fail("writing to the peer failed");
    }
    return;
  }
  bool cut = false;
  {
    MutexLock lock(mutex_);
    if (closing_ || failed_ || last_queued_) return;
    if (isEcho(message)) {
      echo_ns_ = message.keepalive().echo_ns();
    } else {
      const size_t bytes = message.ByteSizeLong();
      if (bytes > kMaxQueuedBytes - queued_bytes_) {
        fail("the peer has not read its Session: " + std::to_string(queued_bytes_ + bytes) +
             " bytes of messages wait for it (at most " + std::to_string(kMaxQueuedBytes) + ")");
        cut = true;
      } else {
        queued_bytes_ += bytes;
        queue_.push_back(Queued{std::move(message), bytes});
      }
    }
  }
  // Outside the lock: ending the call makes the blocked write return, and
  // the writer's thread takes the lock then.
  if (cut && cut_) cut_();
  if (start_) {
    pump();
  } else {
    cv_.notify_one();
  }
}

bool SessionWriter::sendLast(v1::PeerMessage message) {
  send(std::move(message));
  const bool cuts = !inline_ && cut_;
  {
    MutexLock lock(mutex_);
    last_queued_ = true;
    cut_when_written_ = cuts;
  }
  if (start_) {
    pump();
  } else {
    cv_.notify_one();
  }
  return cuts;
}

void SessionWriter::heard() noexcept { heard_ns_.store(sessionClockNs(), std::memory_order_relaxed); }

void SessionWriter::fail(std::string why) {
  if (failed_) return;
  failed_ = true;
  failure_ = std::move(why);
  queue_.clear();
  queued_bytes_ = 0;
  echo_ns_ = 0;
}

void SessionWriter::close() {
  SessionTimers::Id timer = 0;
  {
    MutexLock lock(mutex_);
    closing_ = true;
    timer = timer_;
    timer_ = 0;  // tick() arms no other once closing_ is set
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  // Not under mutex_: cancel() waits for a tick() running, which takes it.
  if (timer != 0) timers_->cancel(timer);
}

void SessionWriter::writeDone(bool ok) {
  {
    MutexLock lock(mutex_);
    writing_ = false;
    in_flight_.Clear();
    if (failed_) return;
    if (!ok) {
      fail("writing to the peer failed");
      return;
    }
  }
  pump();
}

void SessionWriter::pump() {
  MutexLock lock(mutex_);
  if (writing_ || failed_ || closing_) return;
  if (echo_ns_ == 0 && queue_.empty()) {
    if (!cut_when_written_ || cut_done_) return;
    cut_done_ = true;
    closing_ = true;  // nothing more goes on a call that is ending
    lock.unlock();
    if (cut_) cut_();
    return;
  }
  in_flight_ = takeNext();
  const bool more = echo_ns_ != 0 || !queue_.empty();
  writing_ = true;
  // The message stays put until writeDone(): nothing else touches
  // in_flight_ while writing_ is set.
  const v1::PeerMessage* message = &in_flight_;
  lock.unlock();
  if (!start_(*message, more)) {
    MutexLock relock(mutex_);
    writing_ = false;
    fail("writing to the peer failed: the call ended");
  }
}

void SessionWriter::arm(const std::weak_ptr<SessionWriter>& self, std::chrono::steady_clock::time_point now) {
  const auto wait = silence_.count() > 0 ? std::min(keepalive_, silence_) : keepalive_;
  timer_ = timers_->at(std::min(next_keepalive_, now + wait), [self] {
    if (auto writer = self.lock()) writer->tick(self);
  });
}

void SessionWriter::tick(const std::weak_ptr<SessionWriter>& self) {
  bool cut = false;
  {
    MutexLock lock(mutex_);
    timer_ = 0;
    if (failed_ || closing_) return;
    const auto now = std::chrono::steady_clock::now();
    if (std::string why = silenceFailure(); !why.empty()) {
      fail(std::move(why));
      cut = true;
    } else {
      if (now >= next_keepalive_) {
        next_keepalive_ = now + keepalive_;
        if (!cut_when_written_ && !last_queued_) queue_.push_back(Queued{keepaliveMessage(), 0});
      }
      arm(self, now);
    }
  }
  if (cut) {
    if (cut_) cut_();
    return;
  }
  pump();
}

v1::PeerMessage SessionWriter::takeNext() {
  v1::PeerMessage message;
  if (echo_ns_ != 0) {
    // First: the peer's round trip should not include our queue.
    message.mutable_keepalive()->set_echo_ns(echo_ns_);
    message.mutable_keepalive()->set_data_received(data_received_.load(std::memory_order_relaxed));
    echo_ns_ = 0;
  } else {
    message = std::move(queue_.front().message);
    queued_bytes_ -= queue_.front().bytes;
    queue_.pop_front();
  }
  // This end's own keepalive goes a period after the last message it wrote
  // that was not an echo.
  if (message.keepalive().echo_ns() == 0) next_keepalive_ = std::chrono::steady_clock::now() + keepalive_;
  return message;
}

v1::PeerMessage SessionWriter::keepaliveMessage() const {
  v1::PeerMessage keepalive;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  keepalive.mutable_keepalive()->set_timestamp_ns(uint64_t(ts.tv_sec) * 1000000000ULL + uint64_t(ts.tv_nsec));
  keepalive.mutable_keepalive()->set_data_received(data_received_.load(std::memory_order_relaxed));
  return keepalive;
}

std::string SessionWriter::silenceFailure() const {
  const int64_t quiet_ns = sessionClockNs() - heard_ns_.load(std::memory_order_relaxed);
  if (silence_.count() <= 0 || quiet_ns <= int64_t{silence_.count()} * 1'000'000) return {};
  // Our writes may still go (flow control has room, or the path carries
  // them): only the peer's silence says that the link is gone.
  return "nothing, not even a keepalive, arrived from the peer for " + std::to_string(quiet_ns / 1'000'000) +
         " ms (link_timeout_ms " + std::to_string(silence_.count()) + ")";
}

bool SessionWriter::failed() const {
  MutexLock lock(mutex_);
  return failed_;
}

std::string SessionWriter::failure() const {
  MutexLock lock(mutex_);
  return failure_;
}

size_t SessionWriter::queuedBytes() const {
  MutexLock lock(mutex_);
  return queued_bytes_;
}

void SessionWriter::run() {
  using Clock = std::chrono::steady_clock;
  MutexLock lock(mutex_);
  const auto wait = silence_.count() > 0 ? std::min(keepalive_, silence_) : keepalive_;
  // This end's own keepalive goes a period after the last message it wrote
  // that was not an echo: echoes of the peer's keepalives, which may come
  // more often than this end's period, do not put it off (it would never go,
  // and this end never measure the round trip).
  next_keepalive_ = Clock::now() + keepalive_;
  for (;;) {
    const auto now = Clock::now();
    lock.waitUntil(cv_, std::min(next_keepalive_, now + wait), [this]() FL_REQUIRES(mutex_) {
      return closing_ || failed_ || cut_when_written_ || !queue_.empty() || echo_ns_ != 0;
    });
    if (failed_) return;
    if (std::string why = silenceFailure(); !closing_ && !why.empty()) {
      fail(std::move(why));
      lock.unlock();
      if (cut_) cut_();
      return;
    }
    const bool due = Clock::now() >= next_keepalive_;
    if (due) next_keepalive_ = Clock::now() + keepalive_;
    if (due && !closing_ && !cut_when_written_ && !last_queued_) {
      queue_.push_back(Queued{keepaliveMessage(), 0});
    }
    while (echo_ns_ != 0 || !queue_.empty()) {
      v1::PeerMessage message = takeNext();
      const bool more = echo_ns_ != 0 || !queue_.empty();
      lock.unlock();
      const bool ok = write_(message, more);
      lock.lock();
      if (failed_) return;  // given up meanwhile (the queue passed its bound)
      if (!ok) {
        fail("writing to the peer failed");
        return;
      }
    }
    if (cut_when_written_) {
      closing_ = true;  // nothing more goes on a call that is ending
      lock.unlock();
      if (cut_) cut_();
      return;
    }
    if (closing_) return;
  }
}

}  // namespace framelink
