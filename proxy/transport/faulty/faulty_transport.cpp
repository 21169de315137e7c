#include "transport/faulty/faulty_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "common/unique_fd.h"

namespace framelink::transport {
namespace {

using Kind = TransportEvent::Kind;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t monotonicNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Error sysError(const char* what) {
  return makeError(FL_ERR_RESOURCES, std::string(what) + " failed: " + std::strerror(errno));
}

class FaultyTransportImpl final : public FaultyTransport {
 public:
  FaultyTransportImpl(std::shared_ptr<Transport> inner, const FaultSpec& spec, uint64_t stream_seed)
      : inner_(std::move(inner)), spec_(spec), rng_(splitmix64(spec.seed ^ splitmix64(stream_seed))) {}

  Result<bool> init() {
    epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
    ready_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
    if (!epoll_fd_.valid() || !ready_fd_.valid() || !timer_fd_.valid()) {
      return sysError("faulty transport: epoll/eventfd/timerfd");
    }
    for (int fd : {inner_->eventFd(), ready_fd_.get(), timer_fd_.get()}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
        return sysError("faulty transport: epoll_ctl");
      }
    }
    return true;
  }

  ~FaultyTransportImpl() override { inner_->shutdown(); }

  const char* name() const noexcept override { return inner_->name(); }
  bool connected() const noexcept override { return !broken_ && inner_->connected(); }

  Result<RemoteCredit> exposeCredit(LocalCredit credit) override {
    if (broken_) return makeError(FL_ERR_LINK_LOST, "the link is down (fault injected)");
    const uint64_t id = credit.credit_id;
    uint8_t* buffer = credit.buffer;
    const uint64_t capacity = credit.capacity;
    auto r = inner_->exposeCredit(std::move(credit));
    if (r) credits_[id] = {buffer, capacity};
    return r;
  }

  void retractCredit(uint64_t credit_id) override {
    credits_.erase(credit_id);
    inner_->retractCredit(credit_id);
  }
  bool windowOpen(uint64_t credit_id) const noexcept override { return inner_->windowOpen(credit_id); }
  bool creditsWritable() const noexcept override { return inner_->creditsWritable(); }

  // Pull passes through: reads are neither dropped nor doubled (a read
  // completes exactly once), only held back by `delay` like a send
  // completion or by `stall` until the link ends, and failed once the
  // decorator broke the link.
  bool readable() const noexcept override { return inner_->readable(); }
  Result<RemoteSource> exposeSource(LocalSource source) override {
    if (broken_) return makeError(FL_ERR_LINK_LOST, "the link is down (fault injected)");
    return inner_->exposeSource(std::move(source));
  }
  void retractSource(uint64_t source_id) override { inner_->retractSource(source_id); }
  PostResult postRead(const ReadRequest& request) noexcept override {
    if (broken_) return PostResult::kNotConnected;
    if (muted_) {
      swallow(Kind::kReadComplete, request.cookie);
      return PostResult::kOk;
    }
    return inner_->postRead(request);
  }

  PostResult post(const SendRequest& request) noexcept override {
    if (broken_) return PostResult::kNotConnected;
    mute();
    if (muted_) {
      swallow(Kind::kSendComplete, request.cookie);
      return PostResult::kOk;
    }
    if (chance(spec_.drop)) {
      ++counts_.drops;
      TransportEvent ev;
      ev.kind = Kind::kSendComplete;
      ev.cookie = request.cookie;
      ev.status = FL_ERR_LINK_LOST;
      ev.message = "transport retry count exceeded (fault injected: drop)";
      ready_.push_back(std::move(ev));
      breakLink("a frame was dropped (fault injected)");
      return PostResult::kOk;
    }
    PostResult r = inner_->post(request);
    if (r != PostResult::kOk) return r;
    if (chance(spec_.fail)) {
      ++counts_.fails;
      inner_->flush();
      breakLink("a work request failed (fault injected)");
    } else if (chance(spec_.disconnect)) {
      ++counts_.disconnects;
      inner_->flush();
      breakLink("disconnected (fault injected)");
    }
    return PostResult::kOk;
  }
  std::string_view lastRefusal() const noexcept override { return inner_->lastRefusal(); }

  PostResult postControl(std::string record) noexcept override {
    if (broken_) return PostResult::kNotConnected;
    mute();
    if (muted_) return PostResult::kOk;  // taken, never delivered
    return inner_->postControl(std::move(record));
  }

  void flush() noexcept override {
    if (!broken_) inner_->flush();
  }

  size_t poll(TransportEvent* out, size_t max) noexcept override {
    TransportEvent in[32];
    size_t n;
    while ((n = inner_->poll(in, 32)) > 0) {
      for (size_t i = 0; i < n; ++i) take(std::move(in[i]));
    }
    releaseDue(monotonicNs());
    size_t count = 0;
    while (count < max && !ready_.empty()) {
      out[count++] = std::move(ready_.front());
      ready_.pop_front();
    }
    updateFds();
    return count;
  }

  int eventFd() const noexcept override { return epoll_fd_.get(); }

  void shutdown() noexcept override { inner_->shutdown(); }
  TransportCounters counters() const noexcept override { return inner_->counters(); }

  FaultCounts counts() const override { return counts_; }

 private:
  struct Delayed {
    uint64_t due_ns;
    TransportEvent event;
  };
  struct CreditMemory {
    uint8_t* buffer;
    uint64_t capacity;
  };

  bool chance(double p) {
    if (p <= 0) return false;
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < p;
  }

  // One event from the wrapped transport: passed on, transformed, doubled or held.
  void take(TransportEvent ev) {
    if (broken_) {
      // This side already reported the link broken: nothing succeeds any
      // more and nothing arrives; the wrapped transport's own LinkError is
      // the second one and is not reported.
      if (ev.kind == Kind::kSendComplete || ev.kind == Kind::kReadComplete) {
        if (ev.status == FL_OK) {
          ev.status = FL_ERR_LINK_LOST;
          ev.message = "the link broke before the send or read was confirmed (fault injected)";
        }
        ready_.push_back(std::move(ev));
      }
      return;
    }
    if (ev.kind == Kind::kLinkError) {
      flushDelayed();
      broken_ = true;
      ready_.push_back(std::move(ev));
      return;
    }
    if (ev.kind == Kind::kReadComplete && (reads_stalled_ || (ev.status == FL_OK && chance(spec_.stall)))) {
      // Reads complete in order (one queue pair, one stream): none after a
      // stalled one completes either.  Reported when the link ends.
      if (!reads_stalled_) ++counts_.stalls;
      reads_stalled_ = true;
      stalled_.push_back(std::move(ev));
      return;
    }
    if (ev.kind == Kind::kFrameArrived && ev.status == FL_OK) {
      auto it = credits_.find(ev.header.credit_id);
      if (it != credits_.end()) {
        const CreditMemory mem = it->second;
        credits_.erase(it);
        const uint64_t length = std::min(ev.header.length, mem.capacity);
        if (ev.header.has_crc32c != 0 && length > 0 && chance(spec_.corrupt)) {
          ++counts_.corruptions;
          mem.buffer[rng_() % length] ^= 0x5A;
        }
      }
    }
    const uint64_t now = monotonicNs();
    const uint64_t hold = uint64_t{spec_.delay_ms} * 1'000'000ull;
    if (ev.kind == Kind::kFrameArrived || ev.kind == Kind::kControl) {
      // Arrivals and control records keep their order (tcp and RC queue
      // pairs deliver in order): one held back holds back those behind it.  Whatever is due
      // goes first, so that this one cannot overtake a held one now due.
      releaseDue(now);
      uint64_t due = now;
      if (chance(spec_.delay)) {
        ++counts_.delays;
        due = now + hold;
      }
      due = std::max(due, last_arrival_due_);
      last_arrival_due_ = due;
      if (due > now) {
        delayed_.push_back({due, std::move(ev)});
      } else {
        ready_.push_back(std::move(ev));
      }
      return;
    }
    // Send completions may come late, twice, and in any order; read
    // completions late and in any order.
    const bool twice = ev.kind == Kind::kSendComplete && chance(spec_.dup);
    if (twice) ++counts_.dups;
    for (int copies = twice ? 2 : 1; copies > 0; --copies) {
      if (chance(spec_.delay)) {
        ++counts_.delays;
        delayed_.push_back({now + hold, ev});
      } else {
        ready_.push_back(ev);
      }
    }
  }

  void releaseDue(uint64_t now) {
    for (auto it = delayed_.begin(); it != delayed_.end();) {
      if (it->due_ns <= now) {
        ready_.push_back(std::move(it->event));
        it = delayed_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void flushDelayed() {
    for (auto& d : delayed_) ready_.push_back(std::move(d.event));
    delayed_.clear();
    // A stalled read, or anything posted once muted, ends with its link.
    for (auto& ev : stalled_) {
      ev.status = FL_ERR_LINK_LOST;
      ev.message = "the link ended while it was withheld (fault injected: stall or mute)";
      ready_.push_back(std::move(ev));
    }
    stalled_.clear();
  }

  // Whether this post silences the data path (spec_.mute).
  void mute() {
    if (!muted_ && chance(spec_.mute)) {
      ++counts_.mutes;
      muted_ = true;
    }
  }
  // Muted: a send or read taken that completes, failed, when the link ends.
  void swallow(Kind kind, uint64_t cookie) {
    TransportEvent ev;
    ev.kind = kind;
    ev.cookie = cookie;
    stalled_.push_back(std::move(ev));
  }

  void breakLink(const std::string& why) {
    if (broken_) return;
    flushDelayed();
    broken_ = true;
    TransportEvent ev;
    ev.kind = Kind::kLinkError;
    ev.status = FL_ERR_LINK_LOST;
    ev.message = why;
    ready_.push_back(std::move(ev));
    inner_->shutdown();
    updateFds();
  }

  // ready_fd_ is readable exactly while events wait; the timer fires when
  // the earliest held event is due.
  void updateFds() {
    uint64_t v;
    if (ready_.empty()) {
      while (::read(ready_fd_.get(), &v, sizeof v) > 0) {
      }
    } else {
      v = 1;
      (void)!::write(ready_fd_.get(), &v, sizeof v);
    }
    while (::read(timer_fd_.get(), &v, sizeof v) > 0) {
    }
    itimerspec spec{};
    if (!delayed_.empty()) {
      uint64_t due = delayed_.front().due_ns;
      for (const auto& d : delayed_) due = std::min(due, d.due_ns);
      const uint64_t now = monotonicNs();
      const uint64_t wait = due > now ? due - now : 1;
      spec.it_value.tv_sec = static_cast<time_t>(wait / 1'000'000'000ull);
      spec.it_value.tv_nsec = static_cast<long>(wait % 1'000'000'000ull);
    }
    ::timerfd_settime(timer_fd_.get(), 0, &spec, nullptr);
  }

  std::shared_ptr<Transport> inner_;
  FaultSpec spec_;
  std::mt19937_64 rng_;
  UniqueFd epoll_fd_, ready_fd_, timer_fd_;
  std::deque<TransportEvent> ready_;
  std::deque<Delayed> delayed_;
  std::unordered_map<uint64_t, CreditMemory> credits_;
  uint64_t last_arrival_due_ = 0;
  bool broken_ = false;
  FaultCounts counts_;
  std::vector<TransportEvent> stalled_;  // completions withheld (stall, mute) until the link ends
  bool reads_stalled_ = false;
  bool muted_ = false;
};

}  // namespace

Result<std::shared_ptr<FaultyTransport>> FaultyTransport::wrap(std::shared_ptr<Transport> inner,
                                                               const FaultSpec& spec, uint64_t stream_seed) {
  auto t = std::make_shared<FaultyTransportImpl>(std::move(inner), spec, stream_seed);
  auto r = t->init();
  if (!r) return std::move(r).error();
  return std::shared_ptr<FaultyTransport>(std::move(t));
}

Result<FaultSpec> parseFaultSpec(const std::string& text) {
  FaultSpec spec;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string key = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto bad = [&](const std::string& what) {
      return makeError(FL_EINVAL, "fault spec '" + text + "': " + key + "=" + value + ": " + what +
                                      " (form: seed=N,drop=P,fail=P,disconnect=P,dup=P,delay=P,delay_ms=N,"
                                      "corrupt=P,stall=P,mute=P with probabilities P in [0, 1])");
    };
    if (eq == std::string::npos || value.empty()) return bad("needs a value");
    try {
      size_t used = 0;
      if (key == "seed" || key == "delay_ms") {
        const unsigned long long v = std::stoull(value, &used);
        if (used != value.size()) return bad("not a whole number");
        if (key == "seed") spec.seed = v;
        if (key == "delay_ms") {
          if (v > 60000) return bad("more than 60000 ms");
          spec.delay_ms = static_cast<uint32_t>(v);
        }
        continue;
      }
      double* p = key == "drop"         ? &spec.drop
                  : key == "fail"       ? &spec.fail
                  : key == "disconnect" ? &spec.disconnect
                  : key == "dup"        ? &spec.dup
                  : key == "delay"      ? &spec.delay
                  : key == "corrupt"    ? &spec.corrupt
                  : key == "stall"      ? &spec.stall
                  : key == "mute"       ? &spec.mute
                                        : nullptr;
      if (p == nullptr) return bad("unknown key");
      const double v = std::stod(value, &used);
      if (used != value.size() || !(v >= 0 && v <= 1)) return bad("not a probability");
      *p = v;
    } catch (const std::exception&) {
      return bad("not a number");
    }
  }
  return spec;
}

std::string describe(const FaultSpec& s) {
  std::ostringstream o;
  o << "seed=" << s.seed << ",drop=" << s.drop << ",fail=" << s.fail << ",disconnect=" << s.disconnect
    << ",dup=" << s.dup << ",delay=" << s.delay << ",delay_ms=" << s.delay_ms << ",corrupt=" << s.corrupt
    << ",stall=" << s.stall << ",mute=" << s.mute;
  return o.str();
}

}  // namespace framelink::transport
