#include "transport/loopback/loopback_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <unordered_map>

#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/transport_core.h"

namespace framelink::transport::loopback {
namespace {

// A frame or a control record on its way, in the order they were posted.
struct Outgoing {
  SendRequest request;  // a frame, unless `control` is set
  std::string control;  // a control record (never empty)
};

// One direction's state, owned by the end that posts into it.
struct EndState {
  UniqueFd event_fd;
  std::deque<Outgoing> outgoing;                      // posted, not yet delivered
  size_t frames_waiting = 0;                          // of `outgoing`, bounded by send_queue_depth
  size_t control_bytes = 0;                           // of `outgoing`, bounded by kMaxControlBacklogBytes
  std::unordered_map<uint64_t, LocalCredit> credits;  // exposed by this end
  std::deque<TransportEvent> events;                  // for this end's poll()
  bool error_reported = false;                        // this end's one LinkError is queued
};

class Shared final : public LoopbackLink {
 public:
  explicit Shared(const LoopbackOptions& options) : options_(options) {}

  // ---- LoopbackLink ----
  size_t waiting(int end) const noexcept override {
    MutexLock lock(mu_);
    return ends_[end & 1].outgoing.size();
  }
  bool peekNext(int end, FrameHeader* header) const noexcept override {
    MutexLock lock(mu_);
    const auto& outgoing = ends_[end & 1].outgoing;
    if (outgoing.empty() || !outgoing.front().control.empty()) return false;
    *header = outgoing.front().request.header;
    return true;
  }
  bool deliverOne(int end, Damage damage) noexcept override {
    MutexLock lock(mu_);
    return deliverLocked(end & 1, damage);
  }
  void breakLink(int status, const std::string& why) noexcept override {
    MutexLock lock(mu_);
    failLocked(status, why, status, why);
  }
  bool up() const noexcept override {
    MutexLock lock(mu_);
    return up_;
  }

  // ---- the ends' calls ----
  Result<RemoteCredit> exposeCredit(int end, LocalCredit credit) {
    if (credit.buffer == nullptr && credit.capacity > 0) {
      return makeError(FL_EINVAL, "exposeCredit: null buffer with non-zero capacity");
    }
    MutexLock lock(mu_);
    if (!up_) return makeError(FL_ERR_LINK_LOST, "exposeCredit: the link is down");
    RemoteCredit remote{credit.credit_id, credit.capacity, 0, 0};
    if (!ends_[end].credits.emplace(credit.credit_id, std::move(credit)).second) {
      return makeError(FL_EINVAL, "exposeCredit: credit id " + std::to_string(remote.credit_id) +
                                      " is already exposed (credit ids must be unique per link)");
    }
    return remote;
  }

  void retractCredit(int end, uint64_t credit_id) noexcept {
    MutexLock lock(mu_);
    ends_[end].credits.erase(credit_id);
  }

  PostResult post(int end, const SendRequest& request) noexcept {
    if (*validateSendRequest(request) != '\0') return PostResult::kInvalid;
    MutexLock lock(mu_);
    if (!up_) return PostResult::kNotConnected;
    EndState& self = ends_[end];
    if (self.frames_waiting >= options_.send_queue_depth) return PostResult::kBackpressure;
    self.outgoing.push_back(Outgoing{request, {}});
    ++self.frames_waiting;
    if (!options_.manual) signalLocked(end);  // come back (poll) to move it
    return PostResult::kOk;
  }

  PostResult postControl(int end, std::string record) noexcept {
    if (record.empty() || record.size() > kMaxControlBytes) return PostResult::kInvalid;
    MutexLock lock(mu_);
    if (!up_) return PostResult::kNotConnected;
    EndState& self = ends_[end];
    if (self.control_bytes + record.size() > kMaxControlBacklogBytes) return PostResult::kBackpressure;
    self.control_bytes += record.size();
    self.outgoing.push_back(Outgoing{{}, std::move(record)});
    if (!options_.manual) signalLocked(end);
    return PostResult::kOk;
  }

  void flush(int end) noexcept {
    MutexLock lock(mu_);
    if (!options_.manual) deliverSomeLocked(end);
  }

  size_t poll(int end, TransportEvent* out, size_t max) noexcept {
    MutexLock lock(mu_);
    if (!options_.manual) deliverSomeLocked(end);
    EndState& self = ends_[end];
    size_t n = 0;
    while (n < max && !self.events.empty()) {
      out[n++] = std::move(self.events.front());
      self.events.pop_front();
    }
    const bool more = !self.events.empty() || (!options_.manual && !self.outgoing.empty());
    if (!more) {
      uint64_t drained = 0;
      (void)!::read(self.event_fd.get(), &drained, sizeof drained);
    }
    return n;
  }

  bool connected() const noexcept {
    MutexLock lock(mu_);
    return up_;
  }

  int eventFd(int end) const noexcept {
    MutexLock lock(mu_);
    return ends_[end].event_fd.get();
  }

  void shutdown(int end) noexcept {
    MutexLock lock(mu_);
    if (!up_) return;
    // This end reports its own shutdown; the peer sees the link go.
    if (end == 0) {
      failLocked(FL_ERR_SHUTDOWN, "loopback link shut down locally", FL_ERR_LINK_LOST,
                 "loopback peer shut the link down");
    } else {
      failLocked(FL_ERR_LINK_LOST, "loopback peer shut the link down", FL_ERR_SHUTDOWN,
                 "loopback link shut down locally");
    }
  }

  Result<void> init() {
    MutexLock lock(mu_);
    for (auto& e : ends_) {
      int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (fd < 0) {
        return makeError(FL_ERR_RESOURCES, std::string("loopback: eventfd failed: ") + std::strerror(errno) +
                                               " (raise the fd limit?)");
      }
      e.event_fd = UniqueFd(fd);
    }
    return {};
  }

 private:
  void signalLocked(int end) noexcept FL_REQUIRES(mu_) {
    const uint64_t one = 1;
    (void)!::write(ends_[end].event_fd.get(), &one, sizeof one);
  }

  void pushLocked(int end, TransportEvent event) noexcept FL_REQUIRES(mu_) {
    ends_[end].events.push_back(std::move(event));
    signalLocked(end);
  }

  void deliverSomeLocked(int end) noexcept FL_REQUIRES(mu_) {
    for (size_t i = 0; i < options_.deliveries_per_call && deliverLocked(end, Damage::kNone); ++i) {
    }
  }

  // Lands the oldest frame `end` posted in the peer's credited buffer (or
  // hands the peer the oldest control record).
  bool deliverLocked(int end, Damage damage) noexcept FL_REQUIRES(mu_) {
    if (!up_) return false;
    EndState& self = ends_[end];
    if (self.outgoing.empty()) return false;
    const int peer = end ^ 1;
    if (!self.outgoing.front().control.empty()) {
      TransportEvent control;
      control.kind = TransportEvent::Kind::kControl;
      control.control = std::move(self.outgoing.front().control);
      self.control_bytes -= control.control.size();
      self.outgoing.pop_front();
      pushLocked(peer, std::move(control));
      return true;
    }
    SendRequest request = self.outgoing.front().request;
    self.outgoing.pop_front();
    --self.frames_waiting;
    TransportEvent arrived;
    arrived.kind = TransportEvent::Kind::kFrameArrived;
    arrived.header = request.header;
    auto it = ends_[peer].credits.find(request.header.credit_id);
    if (it == ends_[peer].credits.end()) {
      arrived.status = FL_ERR_UNKNOWN_CREDIT;
      arrived.message = "frame for credit " + std::to_string(request.header.credit_id) +
                        " which is not exposed (retracted or already used)";
    } else {
      LocalCredit credit = std::move(it->second);
      ends_[peer].credits.erase(it);  // a credit is consumed by its frame
      if (request.header.length > 0) {
        std::memcpy(credit.buffer, request.payload, request.header.length);
        if (damage == Damage::kFlipPayloadByte) credit.buffer[request.header.length / 2] ^= 0x5a;
      }
    }
    pushLocked(peer, std::move(arrived));
    pushLocked(end, TransportEvent::sendComplete(request.cookie, FL_OK));
    return true;
  }

  // Both ends fail once: waiting frames complete FL_ERR_LINK_LOST, then each
  // end gets its LinkError.
  void failLocked(int status_a, const std::string& why_a, int status_b, const std::string& why_b) noexcept
      FL_REQUIRES(mu_) {
    if (!up_) return;
    up_ = false;
    const int statuses[2] = {status_a, status_b};
    const std::string* whys[2] = {&why_a, &why_b};
    for (int end = 0; end < 2; ++end) {
      EndState& self = ends_[end];
      for (; !self.outgoing.empty(); self.outgoing.pop_front()) {
        if (!self.outgoing.front().control.empty()) continue;  // lost with the link
        pushLocked(
            end, TransportEvent::sendComplete(self.outgoing.front().request.cookie, FL_ERR_LINK_LOST,
                                              "the loopback link went down before the frame was delivered"));
      }
      self.frames_waiting = 0;
      self.control_bytes = 0;
      self.credits.clear();
      TransportEvent error;
      error.kind = TransportEvent::Kind::kLinkError;
      error.status = statuses[end];
      error.message = *whys[end];
      pushLocked(end, std::move(error));
      self.error_reported = true;
    }
  }

  const LoopbackOptions options_;
  mutable Mutex mu_;
  bool up_ FL_GUARDED_BY(mu_) = true;
  EndState ends_[2] FL_GUARDED_BY(mu_);
};

class LoopbackEnd final : public Transport {
 public:
  LoopbackEnd(std::shared_ptr<Shared> shared, int end) : shared_(std::move(shared)), end_(end) {}
  ~LoopbackEnd() override { shared_->shutdown(end_); }

  const char* name() const noexcept override { return "loopback"; }
  bool connected() const noexcept override { return shared_->connected(); }
  Result<RemoteCredit> exposeCredit(LocalCredit credit) override {
    return shared_->exposeCredit(end_, std::move(credit));
  }
  void retractCredit(uint64_t credit_id) override { shared_->retractCredit(end_, credit_id); }
  PostResult post(const SendRequest& request) noexcept override { return shared_->post(end_, request); }
  PostResult postControl(std::string record) noexcept override {
    return shared_->postControl(end_, std::move(record));
  }
  void flush() noexcept override { shared_->flush(end_); }
  size_t poll(TransportEvent* out, size_t max) noexcept override { return shared_->poll(end_, out, max); }
  int eventFd() const noexcept override { return shared_->eventFd(end_); }
  void shutdown() noexcept override { shared_->shutdown(end_); }

 private:
  std::shared_ptr<Shared> shared_;
  int end_;
};

}  // namespace

Result<LoopbackPair> makePair(const LoopbackOptions& options) {
  if (options.send_queue_depth == 0) {
    return makeError(FL_EINVAL, "loopback: send_queue_depth must be at least 1");
  }
  auto shared = std::make_shared<Shared>(options);
  if (auto r = shared->init(); !r) return std::move(r).error();
  LoopbackPair pair;
  pair.a = std::make_shared<LoopbackEnd>(shared, 0);
  pair.b = std::make_shared<LoopbackEnd>(shared, 1);
  pair.link = shared;
  return pair;
}

}  // namespace framelink::transport::loopback
