#include "producer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "cli_util.h"

namespace framelink::cli {

std::string attachError(const char* role, const std::string& socket, const std::string& stream, int rc) {
  std::string msg =
      "cannot attach to " + socket + " as " + role + " of stream '" + stream + "': " + fl_last_error();
  switch (rc) {
    case FL_ERR_DAEMON_UNREACHABLE:
      msg += " (with this command: --socket PATH)";
      break;
    case FL_ERR_ATTACH_REFUSED:
      msg += " -- the daemon's --allow-uid/--allow-gid policy refused this user";
      break;
    case FL_ERR_LIMIT:
      msg += " -- ask for fewer/smaller slots (--slots, --slot-size) or raise the daemon's limits";
      break;
    case FL_ERR_QUOTA:
      msg +=
          " -- the daemon's memory or this user's clients are taken now: try again later, or raise "
          "the daemon's [limits]";
      break;
    case FL_ERR_VERSION:
      msg += " -- libframelink and framelinkd are from different releases; upgrade one of them";
      break;
    default:
      break;
  }
  return msg;
}

std::unique_ptr<Producer> Producer::attach(const ProducerOptions& options, std::string& err) {
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.socket_path = options.socket_path.empty() ? nullptr : options.socket_path.c_str();
  o.stream = options.stream.c_str();
  o.client_name = "framelink";
  o.slot_count = options.slot_count;
  o.slot_size = options.slot_size;
  // The producer reattaches itself (mended), so that it knows to send again what the restart caught.
  o.auto_reattach = 0;
  fl_client* client = nullptr;
  const int rc = fl_attach(&o, &client);
  if (rc != FL_OK) {
    err = attachError("producer", options.socket_path.empty() ? "the default socket" : options.socket_path,
                      options.stream, rc);
    return nullptr;
  }
  std::unique_ptr<Producer> p(new Producer(client, options));
  if (fl_client_get_info(client, &p->info_) != FL_OK) {
    err = std::string("attached, but cannot read the attachment info: ") + fl_last_error();
    return nullptr;
  }
  return p;
}

Producer::~Producer() { fl_detach(client_); }

bool Producer::prefillAllSlots(const std::function<void(fl_slot&)>& fill, std::string& err) {
  std::vector<uint32_t> held;
  bool ok = true;
  for (uint32_t i = 0; i < info_.slot_count; ++i) {
    fl_slot slot{};
    const int rc = fl_acquire(client_, 5000, &slot);
    if (rc != FL_OK) {
      err = std::string("cannot acquire slot ") + std::to_string(i) + " of " +
            std::to_string(info_.slot_count) + " to pre-fill it: " + fl_last_error();
      ok = false;
      break;
    }
    fill(slot);
    held.push_back(slot.index);
  }
  for (uint32_t s : held) fl_abandon(client_, s);
  return ok;
}

namespace {

// One Producer::run: its figures so far and the steps of its loop.  A step's Next::kAgain starts
// the loop over (after a wait, a reattach, or a failure that stops sending); kStop ends it at once.
class SendLoop {
 public:
  enum class Next { kGo, kAgain, kStop };

  SendLoop(fl_client* client, const ProducerOptions& options, fl_client_info& info,
           const Producer::MoreFn& more, const Producer::PrepareFn& prepare,
           const Producer::CompletionFn& on_completion, const std::atomic<bool>* stop)
      : client_(client),
        options_(options),
        info_(info),
        more_(more),
        prepare_(prepare),
        on_completion_(on_completion),
        stop_(stop),
        window_(windowOf()),
        last_progress_ns_(monotonicNs()),
        rate_period_ns_(options.rate_hz > 0 ? static_cast<uint64_t>(1e9 / options.rate_hz) : 0) {}

  // Sends while more() says so and nothing stops it, paced by the rate and the window, then waits
  // for the completions of everything in flight.
  ProducerStats run() {
    while (true) {
      checkStop();
      if (const Next next = poll(); next != Next::kGo) {
        if (next == Next::kStop) break;
        continue;
      }
      if (!sending_) {
        if (drain() == Next::kStop) break;
        continue;
      }
      if (waitedForRate()) continue;
      if (inFlight() >= window_) {
        awaitCompletion();
        continue;
      }
      fl_slot slot{};
      if (acquire(slot)) submit(slot);
    }
    if (st_.last_completion_ns == 0) st_.last_completion_ns = monotonicNs();
    return st_;
  }

 private:
  enum class Wait { kGot, kMended, kQuiet, kFailed };

  // Frames allowed in flight at once: max_in_flight, but never more than the slots.
  uint32_t windowOf() const {
    return options_.max_in_flight != 0 ? std::min(options_.max_in_flight, info_.slot_count)
                                       : info_.slot_count;
  }
  uint64_t inFlight() const { return st_.submitted - st_.delivered - st_.failed; }
  // No completion (or first submit, or reattach) for stall_timeout_ms.
  bool stalled() const {
    return monotonicNs() - last_progress_ns_ > static_cast<uint64_t>(options_.stall_timeout_ms) * 1000000ull;
  }
  std::string stallMessage() const {
    return "no completion for " + std::to_string(options_.stall_timeout_ms / 1000) + " s with " +
           std::to_string(inFlight()) + " frames in flight; check both daemons' logs";
  }
  // The first fatal error is the one reported; sending stops, what is in flight is waited for.
  void fatal(std::string msg) {
    if (st_.error.empty()) st_.error = std::move(msg);
    sending_ = false;
  }

  // Counts `n` completions in comps_ and passes each on.
  void handle(size_t n) {
    const uint64_t now = monotonicNs();
    for (size_t i = 0; i < n; ++i) {
      const fl_completion& c = comps_[i];
      if (c.status == FL_OK) {
        st_.readers_min = st_.delivered == 0 ? c.released : std::min(st_.readers_min, c.released);
        st_.readers_max = std::max(st_.readers_max, c.released);
        st_.skipped += c.readers - c.released;
        ++st_.delivered;
        st_.bytes_delivered += c.length;
      } else {
        ++st_.failed;
        ++st_.failures[c.status];
      }
      if (on_completion_) on_completion_(c);
    }
    if (n > 0) {
      st_.last_completion_ns = now;
      last_progress_ns_ = now;
    }
  }

  // After FL_ERR_DAEMON_GONE with options_.reattach: waits for the daemon to be back and attaches
  // again.  True: attached, retry; false: rc was something else, or the daemon stayed away.
  bool mended(int rc) {
    if (!options_.reattach || rc != FL_ERR_DAEMON_GONE) return false;
    const uint64_t give_up_ns = monotonicNs() + static_cast<uint64_t>(options_.stall_timeout_ms) * 1000000ull;
    int r = fl_reattach(client_);
    while (r != FL_OK && monotonicNs() < give_up_ns && !g_interrupted.load()) {
      sleepNs(100'000'000ull);
      r = fl_reattach(client_);
    }
    if (r != FL_OK || fl_client_get_info(client_, &info_) != FL_OK) {
      fatal(std::string("the daemon went away and attaching again failed: ") + fl_last_error());
      return false;
    }
    window_ = windowOf();
    ++st_.reattaches;
    last_progress_ns_ = monotonicNs();
    std::fprintf(stderr, "framelink: the daemon went away; attached again (generation %u, %u slots)\n",
                 info_.generation, info_.slot_count);
    return true;
  }

  // Sending stops on request (stop flag, Ctrl-C: interrupted) or when there is nothing more to send.
  void checkStop() {
    if (sending_ && ((stop_ != nullptr && stop_->load(std::memory_order_relaxed)) || g_interrupted.load())) {
      st_.interrupted = true;
      sending_ = false;
    }
    if (sending_ && !more_(index_)) sending_ = false;
  }

  // Takes whatever completions are already there.
  Next poll() {
    size_t n = 0;
    const int rc = fl_poll_completions(client_, comps_, 64, &n);
    if (rc != FL_OK && mended(rc)) return Next::kAgain;
    if (rc != FL_OK) {
      fatal(std::string("polling completions failed: ") + fl_last_error());
      return Next::kStop;
    }
    handle(n);
    return Next::kGo;
  }

  // Waits up to 200 ms for completions and handles them.
  Wait waitCompletions() {
    size_t n = 0;
    const int rc = fl_wait_completions(client_, comps_, 64, &n, 200);
    if (rc == FL_OK) {
      handle(n);
      return Wait::kGot;
    }
    if (mended(rc)) return Wait::kMended;
    if (rc != FL_ETIMEDOUT && rc != FL_EAGAIN && rc != FL_EINTR) {
      fatal(std::string("waiting for completions failed: ") + fl_last_error());
      return Wait::kFailed;
    }
    return Wait::kQuiet;
  }

  // Sending is over: waits for the completions of what is in flight; gives up when they stall, or
  // 10 s after Ctrl-C.
  Next drain() {
    if (inFlight() == 0) return Next::kStop;
    if (g_interrupted.load() && monotonicNs() - last_progress_ns_ > 10'000'000'000ull) {
      fatal("interrupted with " + std::to_string(inFlight()) + " frames still in flight");
      return Next::kStop;
    }
    const Wait w = waitCompletions();
    if (w == Wait::kMended) return Next::kAgain;
    if (w == Wait::kFailed) return Next::kStop;
    if (stalled()) {
      fatal(stallMessage());
      return Next::kStop;
    }
    return Next::kAgain;
  }

  // Every slot of the window is in flight: a completion frees one.
  void awaitCompletion() {
    if (waitCompletions() == Wait::kQuiet && stalled()) fatal(stallMessage());
  }

  // With --rate: true while the next frame is not due yet, after waiting (for completions, when
  // frames are in flight) for up to 100 ms of that time.
  bool waitedForRate() {
    if (rate_period_ns_ == 0) return false;
    const uint64_t now = monotonicNs();
    if (next_due_ns_ == 0) next_due_ns_ = now;
    if (now >= next_due_ns_) return false;
    const uint64_t wait_ms = (next_due_ns_ - now) / 1000000ull;
    if (wait_ms >= 1 && inFlight() > 0) {
      size_t n = 0;
      const int rc =
          fl_wait_completions(client_, comps_, 64, &n, static_cast<int>(std::min<uint64_t>(wait_ms, 100)));
      if (rc == FL_OK) handle(n);
    } else {
      sleepNs(std::min<uint64_t>(next_due_ns_ - now, 100'000'000ull));
    }
    return true;
  }

  // A free slot into `slot`; false when there is none yet (after waiting a little) or acquiring
  // failed.
  bool acquire(fl_slot& slot) {
    int rc = fl_acquire(client_, 0, &slot);
    if ((rc == FL_EAGAIN || rc == FL_ETIMEDOUT) && inFlight() > 0) {
      // Every slot is busy: the next free one comes back with a completion.
      awaitCompletion();
      return false;
    }
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
      // Nothing in flight, so no completion will free a slot: let the library block.
      rc = fl_acquire(client_, 200, &slot);
      if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT || rc == FL_EINTR) {
        if (stalled()) {
          fatal("no free slot for " + std::to_string(options_.stall_timeout_ms / 1000) +
                " s although no frame is in flight; check the daemon's log");
        }
        return false;
      }
    }
    if (rc == FL_EINTR || (rc != FL_OK && mended(rc))) return false;
    if (rc != FL_OK) {
      fatal(std::string("acquiring a slot failed: ") + fl_last_error());
      return false;
    }
    return true;
  }

  // Fills the slot (prepare), sets the frame's metadata and submits it; a slot that cannot go is
  // given back.  After a reattach the same frame goes again, in a slot of the new attachment.
  void submit(fl_slot& slot) {
    FrameSpec spec;
    std::string err;
    if (!prepare_(index_, slot, spec, err)) {
      fl_abandon(client_, slot.index);
      fatal(err);
      return;
    }
    fl_frame_meta meta{};
    meta.frame_id = spec.frame_id;
    meta.group_id = spec.group_id;
    meta.flags = options_.crc ? FL_META_CRC32C : 0;
    meta.attr_length = static_cast<uint32_t>(spec.attrs.size());
    meta.attrs = reinterpret_cast<const uint8_t*>(spec.attrs.data());
    meta.timestamp_ns = realtimeNs();
    int rc = fl_set_meta(client_, slot.index, &meta);
    if (rc != FL_OK) {
      fl_abandon(client_, slot.index);
      if (!mended(rc)) {
        fatal("cannot set the metadata of frame " + std::to_string(spec.frame_id) + ": " + fl_last_error());
      }
      return;
    }
    rc = fl_submit(client_, slot.index, spec.length);
    if (rc != FL_OK) {
      fl_abandon(client_, slot.index);
      if (!mended(rc)) {
        fatal("cannot submit frame " + std::to_string(spec.frame_id) + " (" + std::to_string(spec.length) +
              " bytes): " + fl_last_error());
      }
      return;
    }
    submitted(spec.length);
  }

  // Counts a submitted frame; the first one starts the clock.
  void submitted(uint64_t length) {
    const uint64_t now = monotonicNs();
    if (st_.submitted == 0) {
      st_.first_submit_ns = now;
      last_progress_ns_ = now;
    }
    ++st_.submitted;
    st_.bytes_submitted += length;
    ++index_;
    if (rate_period_ns_ != 0) next_due_ns_ += rate_period_ns_;
  }

  fl_client* client_;
  const ProducerOptions& options_;
  fl_client_info& info_;  // the Producer's: a reattach refreshes it
  const Producer::MoreFn& more_;
  const Producer::PrepareFn& prepare_;
  const Producer::CompletionFn& on_completion_;
  const std::atomic<bool>* stop_;
  ProducerStats st_;
  fl_completion comps_[64]{};
  uint32_t window_;
  uint64_t index_ = 0;
  bool sending_ = true;
  uint64_t last_progress_ns_;
  const uint64_t rate_period_ns_;
  uint64_t next_due_ns_ = 0;
};

}  // namespace

ProducerStats Producer::run(const MoreFn& more, const PrepareFn& prepare, const CompletionFn& on_completion,
                            const std::atomic<bool>* stop) {
  return SendLoop(client_, options_, info_, more, prepare, on_completion, stop).run();
}

}  // namespace framelink::cli
