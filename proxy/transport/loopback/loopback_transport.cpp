#include "transport/loopback/loopback_transport.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/link_bookkeeping.h"

namespace framelink::transport::loopback {
namespace {

// A frame, a control record or a read on its way, in the order they were posted.
struct Outgoing {
  SendRequest request;  // a frame, unless `control` or `read_tag` is set
  std::string control;  // a control record (never empty)
  std::shared_ptr<std::vector<uint8_t>>
      kept;               // the payload (or a read's source) when keepPayloads (keepReads) took it
  uint64_t read_tag = 0;  // a read (book.reads()), when not 0
  bool again = false;     // a read's answer sent again (answerAgain)

  bool isFrame() const noexcept { return control.empty() && read_tag == 0; }
};

// One direction's state, owned by the end that posts into it.
struct EndState {
  UniqueFd event_fd;
  bool signalled = false;         // event_fd written and not read since: one write, one read a wakeup
  std::deque<Outgoing> outgoing;  // posted, not yet delivered
  size_t frames_waiting = 0;      // of `outgoing`, bounded by send_queue_depth (reads: by book.reads())
  size_t control_bytes = 0;       // of `outgoing`, bounded by kMaxControlBacklogBytes
  // The credits this end exposed, the events for its poll(), its admission
  // rules, failing once and its counters.  Its send ring is unused: frames
  // and records wait in `outgoing`, in the order they were posted.
  LinkBookkeeping book{0};
  uint64_t last_answered = 0;  // the read of this end answered last
  std::deque<Outgoing> late;   // reads answered late (keepReads), each with its source's copy
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
    if (outgoing.empty() || !outgoing.front().isFrame()) return false;
    *header = outgoing.front().request.header;
    return true;
  }
  bool peekControl(int end, std::string* record) const override {
    MutexLock lock(mu_);
    const auto& outgoing = ends_[end & 1].outgoing;
    if (outgoing.empty() || outgoing.front().control.empty()) return false;
    *record = outgoing.front().control;
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
  void keepPayloads(int end) override {
    MutexLock lock(mu_);
    for (Outgoing& o : ends_[end & 1].outgoing) {
      if (!o.isFrame() || o.kept || o.request.header.length == 0) continue;
      o.kept = std::make_shared<std::vector<uint8_t>>(o.request.payload,
                                                      o.request.payload + o.request.header.length);
      o.request.payload = o.kept->data();
    }
  }
  size_t keepReads(int end, bool late) override {
    MutexLock lock(mu_);
    EndState& self = ends_[end & 1];
    LinkBookkeeping& from = ends_[(end & 1) ^ 1].book;
    size_t kept = 0;
    for (auto it = self.outgoing.begin(); it != self.outgoing.end();) {
      const ReadRequest* read =
          it->read_tag != 0 && !it->again ? self.book.reads().lookup(it->read_tag) : nullptr;
      const LocalSource* source = read != nullptr ? from.sources().lookup(read->source.source_id) : nullptr;
      if (source == nullptr || source->length != read->source.length) {
        ++it;
        continue;
      }
      it->kept = std::make_shared<std::vector<uint8_t>>(source->payload, source->payload + source->length);
      ++kept;
      if (!late) {
        ++it;
        continue;
      }
      self.late.push_back(std::move(*it));
      it = self.outgoing.erase(it);
    }
    return kept;
  }
  bool deliverLate(int end) noexcept override {
    MutexLock lock(mu_);
    EndState& self = ends_[end & 1];
    if (!upLocked() || self.late.empty()) return false;
    const Outgoing read = std::move(self.late.front());
    self.late.pop_front();
    readLocked(end & 1, read.read_tag, Damage::kNone, read.kept.get());
    return true;
  }
  size_t lateWaiting(int end) const noexcept override {
    MutexLock lock(mu_);
    return ends_[end & 1].late.size();
  }
  bool answerAgain(int end) override {
    MutexLock lock(mu_);
    EndState& self = ends_[end & 1];
    if (!upLocked() || self.last_answered == 0) return false;
    Outgoing o;
    o.read_tag = self.last_answered;
    o.again = true;
    self.outgoing.push_back(std::move(o));
    return true;
  }
  bool up() const noexcept override {
    MutexLock lock(mu_);
    return upLocked();
  }

  // ---- the ends' calls ----
  Result<RemoteCredit> exposeCredit(int end, LocalCredit credit) {
    MutexLock lock(mu_);
    return ends_[end].book.exposeCredit(std::move(credit));
  }

  void retractCredit(int end, uint64_t credit_id) noexcept {
    MutexLock lock(mu_);
    ends_[end].book.retractCredit(credit_id);
  }

  PostResult post(int end, const SendRequest& request) noexcept {
    MutexLock lock(mu_);
    EndState& self = ends_[end];
    const PostResult admitted = self.book.admitFrame(request, self.frames_waiting, options_.send_queue_depth);
    if (admitted != PostResult::kOk) return admitted;
    self.outgoing.push_back(Outgoing{request, {}, {}});
    ++self.frames_waiting;
    if (!options_.manual) signalLocked(end);  // come back (poll) to move it
    return PostResult::kOk;
  }

  Result<RemoteSource> exposeSource(int end, LocalSource source) {
    MutexLock lock(mu_);
    return ends_[end].book.exposeSource(std::move(source));
  }

  void retractSource(int end, uint64_t source_id) noexcept {
    MutexLock lock(mu_);
    ends_[end].book.retractSource(source_id);
  }

  PostResult postRead(int end, const ReadRequest& request) noexcept {
    MutexLock lock(mu_);
    EndState& self = ends_[end];
    uint64_t tag = 0;
    const PostResult admitted = self.book.postRead(request, &tag);
    if (admitted != PostResult::kOk) return admitted;
    try {
      Outgoing o;
      o.read_tag = tag;
      self.outgoing.push_back(std::move(o));
    } catch (...) {
      self.book.reads().take(tag);
      return PostResult::kBackpressure;
    }
    if (!options_.manual) signalLocked(end);
    return PostResult::kOk;
  }

  PostResult postControl(int end, std::string record) noexcept {
    MutexLock lock(mu_);
    EndState& self = ends_[end];
    const PostResult admitted = self.book.admitControl(record, self.control_bytes);
    if (admitted != PostResult::kOk) return admitted;
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
    const size_t n = self.book.events().take(out, max);
    const bool more = !self.book.events().empty() || (!options_.manual && !self.outgoing.empty());
    if (!more && self.signalled) {
      self.signalled = false;
      uint64_t drained = 0;
      (void)!::read(self.event_fd.get(), &drained, sizeof drained);
    }
    return n;
  }

  bool connected() const noexcept {
    MutexLock lock(mu_);
    return upLocked();
  }

  std::string_view lastRefusal(int end) const noexcept {
    MutexLock lock(mu_);
    return ends_[end].book.lastRefusal();  // a string literal: outlives the lock
  }

  TransportCounters counters(int end) const noexcept {
    MutexLock lock(mu_);
    return ends_[end].book.counters();
  }

  int eventFd(int end) const noexcept {
    MutexLock lock(mu_);
    return ends_[end].event_fd.get();
  }

  void shutdown(int end) noexcept {
    MutexLock lock(mu_);
    if (!upLocked()) return;
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
  // Both ends fail together.
  bool upLocked() const noexcept FL_REQUIRES(mu_) { return !ends_[0].book.failed(); }

  void signalLocked(int end) noexcept FL_REQUIRES(mu_) {
    if (ends_[end].signalled) return;
    ends_[end].signalled = true;
    const uint64_t one = 1;
    (void)!::write(ends_[end].event_fd.get(), &one, sizeof one);
  }

  void pushLocked(int end, TransportEvent event) noexcept FL_REQUIRES(mu_) {
    ends_[end].book.events().push(std::move(event));
    signalLocked(end);
  }

  void deliverSomeLocked(int end) noexcept FL_REQUIRES(mu_) {
    for (size_t i = 0; i < options_.deliveries_per_call && deliverLocked(end, Damage::kNone); ++i) {
    }
  }

  // Lands the oldest frame `end` posted in the peer's credited buffer (or
  // hands the peer the oldest control record).
  bool deliverLocked(int end, Damage damage) noexcept FL_REQUIRES(mu_) {
    if (!upLocked()) return false;
    EndState& self = ends_[end];
    if (self.outgoing.empty()) return false;
    const int peer = end ^ 1;
    LinkBookkeeping& to = ends_[peer].book;
    if (std::string& record = self.outgoing.front().control; !record.empty()) {
      self.control_bytes -= record.size();
      self.book.countControlSent(1);
      to.controlArrived(record);
      self.outgoing.pop_front();
      signalLocked(peer);
      return true;
    }
    if (const uint64_t tag = self.outgoing.front().read_tag; tag != 0) {
      const Outgoing read = std::move(self.outgoing.front());
      self.outgoing.pop_front();
      if (read.again) {
        const std::string why =
            "an answer came for read " + std::to_string(tag) + ", which is not outstanding";
        const std::string lost = "the loopback peer failed the link: " + why;
        failLocked(end == 0 ? FL_ERR_PROTOCOL : FL_ERR_LINK_LOST, end == 0 ? why : lost,
                   end == 0 ? FL_ERR_LINK_LOST : FL_ERR_PROTOCOL, end == 0 ? lost : why);
        return true;
      }
      readLocked(end, tag, damage, read.kept.get());
      return true;
    }
    SendRequest request = self.outgoing.front().request;
    const auto kept = std::move(self.outgoing.front().kept);  // request.payload may point into it
    self.outgoing.pop_front();
    --self.frames_waiting;
    // A credit is consumed by its frame.
    if (const LocalCredit* credit = to.credits().beginLanding(request.header.credit_id)) {
      if (request.header.length > 0) {
        std::memcpy(credit->buffer, request.payload, request.header.length);
        if (damage == Damage::kFlipPayloadByte) credit->buffer[request.header.length / 2] ^= 0x5a;
      }
      to.credits().endLanding();
      to.frameArrived(request.header, FL_OK);
    } else {
      to.frameArrived(request.header, FL_ERR_UNKNOWN_CREDIT,
                      "frame for credit " + std::to_string(request.header.credit_id) +
                          " which is not exposed (retracted or already used)");
    }
    signalLocked(peer);
    self.book.sendDone(request.cookie, FL_OK, request.header.length);
    signalLocked(end);
    return true;
  }

  // `end`'s read `tag` is served by the peer, as its adapter would answer an
  // RDMA READ: from the source's memory straight into the reader's buffer
  // (from `kept`, a copy of it keepReads took, when given).
  void readLocked(int end, uint64_t tag, Damage damage, const std::vector<uint8_t>* kept) noexcept
      FL_REQUIRES(mu_) {
    EndState& self = ends_[end];
    LinkBookkeeping& from = ends_[end ^ 1].book;
    const ReadRequest* read = self.book.reads().lookup(tag);
    if (read == nullptr) return;
    self.last_answered = tag;
    if (kept != nullptr) {
      if (!kept->empty()) std::memcpy(read->buffer, kept->data(), kept->size());
      from.countReadServed(true);
      self.book.readDone(tag, FL_OK, kept->size());
      signalLocked(end);
      return;
    }
    const LocalSource* source = from.sources().lookup(read->source.source_id);
    if (source == nullptr || source->length != read->source.length) {
      from.countReadServed(false);
      self.book.readDone(
          tag, FL_ERR_UNKNOWN_CREDIT, 0,
          "read of source " + std::to_string(read->source.source_id) +
              (source == nullptr ? ", which the peer does not expose (retracted or never offered)"
                                 : ", which holds another length than the offer said"));
    } else {
      if (source->length > 0) {
        std::memcpy(read->buffer, source->payload, source->length);
        if (damage == Damage::kFlipPayloadByte) read->buffer[source->length / 2] ^= 0x5a;
      }
      from.countReadServed(true);
      self.book.readDone(tag, FL_OK, source->length);
    }
    signalLocked(end);
  }

  // Both ends fail once: waiting frames complete FL_ERR_LINK_LOST, then each
  // end gets its LinkError (with its outstanding reads).
  void failLocked(int status_a, const std::string& why_a, int status_b, const std::string& why_b) noexcept
      FL_REQUIRES(mu_) {
    if (!upLocked()) return;
    const int statuses[2] = {status_a, status_b};
    const std::string* whys[2] = {&why_a, &why_b};
    for (int end = 0; end < 2; ++end) {
      EndState& self = ends_[end];
      for (; !self.outgoing.empty(); self.outgoing.pop_front()) {
        // Control records are lost with the link; reads complete in book.fail.
        if (!self.outgoing.front().isFrame()) continue;
        pushLocked(
            end, TransportEvent::sendComplete(self.outgoing.front().request.cookie, FL_ERR_LINK_LOST,
                                              "the loopback link went down before the frame was delivered"));
      }
      self.late.clear();  // those reads complete in book.fail too
      self.frames_waiting = 0;
      self.control_bytes = 0;
      self.book.fail(statuses[end], *whys[end]);
      self.book.credits().clear();
      signalLocked(end);
    }
  }

  const LoopbackOptions options_;
  mutable Mutex mu_;
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
  bool readable() const noexcept override { return true; }
  Result<RemoteSource> exposeSource(LocalSource source) override {
    return shared_->exposeSource(end_, std::move(source));
  }
  void retractSource(uint64_t source_id) override { shared_->retractSource(end_, source_id); }
  PostResult postRead(const ReadRequest& request) noexcept override {
    return shared_->postRead(end_, request);
  }
  PostResult post(const SendRequest& request) noexcept override { return shared_->post(end_, request); }
  std::string_view lastRefusal() const noexcept override { return shared_->lastRefusal(end_); }
  PostResult postControl(std::string record) noexcept override {
    return shared_->postControl(end_, std::move(record));
  }
  void flush() noexcept override { shared_->flush(end_); }
  size_t poll(TransportEvent* out, size_t max) noexcept override { return shared_->poll(end_, out, max); }
  int eventFd() const noexcept override { return shared_->eventFd(end_); }
  void shutdown() noexcept override { shared_->shutdown(end_); }
  TransportCounters counters() const noexcept override { return shared_->counters(end_); }

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
