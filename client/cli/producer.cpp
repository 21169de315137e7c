#include "producer.h"

#include <algorithm>
#include <cstring>
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
    case FL_ERR_QUOTA:
      msg += " -- ask for fewer/smaller slots (--slots, --slot-size) or raise the daemon's limits";
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

ProducerStats Producer::run(const MoreFn& more, const PrepareFn& prepare, const CompletionFn& on_completion,
                            const std::atomic<bool>* stop) {
  ProducerStats st;
  fl_completion comps[64];
  auto windowOf = [&] {
    return options_.max_in_flight != 0 ? std::min(options_.max_in_flight, info_.slot_count)
                                       : info_.slot_count;
  };
  uint32_t window = windowOf();
  uint64_t index = 0;
  bool sending = true;
  uint64_t last_progress_ns = monotonicNs();
  const uint64_t rate_period_ns = options_.rate_hz > 0 ? static_cast<uint64_t>(1e9 / options_.rate_hz) : 0;
  uint64_t next_due_ns = 0;
  std::string attrs_buf;

  auto handle = [&](size_t n) {
    const uint64_t now = monotonicNs();
    for (size_t i = 0; i < n; ++i) {
      const fl_completion& c = comps[i];
      if (c.status == FL_OK) {
        ++st.delivered;
        st.bytes_delivered += c.length;
      } else {
        ++st.failed;
        ++st.failures[c.status];
      }
      if (on_completion) on_completion(c);
    }
    if (n > 0) {
      st.last_completion_ns = now;
      last_progress_ns = now;
    }
  };
  auto inFlight = [&] { return st.submitted - st.delivered - st.failed; };
  auto fatal = [&](std::string msg) {
    if (st.error.empty()) st.error = std::move(msg);
    sending = false;
  };
  // After FL_ERR_DAEMON_GONE with options_.reattach: waits for the daemon to be back and attaches
  // again.  True: attached, retry; false: rc was something else, or the daemon stayed away.
  auto mended = [&](int rc) {
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
    window = windowOf();
    ++st.reattaches;
    last_progress_ns = monotonicNs();
    std::fprintf(stderr, "framelink: the daemon went away; attached again (generation %u, %u slots)\n",
                 info_.generation, info_.slot_count);
    return true;
  };

  while (true) {
    if (sending && ((stop != nullptr && stop->load(std::memory_order_relaxed)) || g_interrupted.load())) {
      st.interrupted = true;
      sending = false;
    }
    if (sending && !more(index)) sending = false;

    size_t n = 0;
    int rc = fl_poll_completions(client_, comps, 64, &n);
    if (rc != FL_OK && mended(rc)) continue;
    if (rc != FL_OK) {
      fatal(std::string("polling completions failed: ") + fl_last_error());
      break;
    }
    handle(n);

    if (!sending) {
      if (inFlight() == 0) break;
      if (g_interrupted.load() && monotonicNs() - last_progress_ns > 10'000'000'000ull) {
        fatal("interrupted with " + std::to_string(inFlight()) + " frames still in flight");
        break;
      }
      rc = fl_wait_completions(client_, comps, 64, &n, 200);
      if (rc == FL_OK) {
        handle(n);
      } else if (mended(rc)) {
        continue;
      } else if (rc != FL_ETIMEDOUT && rc != FL_EAGAIN && rc != FL_EINTR) {
        fatal(std::string("waiting for completions failed: ") + fl_last_error());
        break;
      }
      if (monotonicNs() - last_progress_ns > static_cast<uint64_t>(options_.stall_timeout_ms) * 1000000ull) {
        fatal("no completion for " + std::to_string(options_.stall_timeout_ms / 1000) + " s with " +
              std::to_string(inFlight()) + " frames in flight; check both daemons' logs");
        break;
      }
      continue;
    }

    if (rate_period_ns != 0) {
      const uint64_t now = monotonicNs();
      if (next_due_ns == 0) next_due_ns = now;
      if (now < next_due_ns) {
        const uint64_t wait_ms = (next_due_ns - now) / 1000000ull;
        if (wait_ms >= 1 && inFlight() > 0) {
          rc =
              fl_wait_completions(client_, comps, 64, &n, static_cast<int>(std::min<uint64_t>(wait_ms, 100)));
          if (rc == FL_OK) handle(n);
        } else {
          sleepNs(std::min<uint64_t>(next_due_ns - now, 100'000'000ull));
        }
        continue;
      }
    }

    if (inFlight() >= window) {
      rc = fl_wait_completions(client_, comps, 64, &n, 200);
      if (rc == FL_OK) {
        handle(n);
      } else if (mended(rc)) {
        continue;
      } else if (rc != FL_ETIMEDOUT && rc != FL_EAGAIN && rc != FL_EINTR) {
        fatal(std::string("waiting for completions failed: ") + fl_last_error());
      } else if (monotonicNs() - last_progress_ns >
                 static_cast<uint64_t>(options_.stall_timeout_ms) * 1000000ull) {
        fatal("no completion for " + std::to_string(options_.stall_timeout_ms / 1000) + " s with " +
              std::to_string(inFlight()) + " frames in flight; check both daemons' logs");
      }
      continue;
    }

    fl_slot slot{};
    rc = fl_acquire(client_, 0, &slot);
    if ((rc == FL_EAGAIN || rc == FL_ETIMEDOUT) && inFlight() > 0) {
      // Every slot is busy: the next free one comes back with a completion.
      rc = fl_wait_completions(client_, comps, 64, &n, 200);
      if (rc == FL_OK) {
        handle(n);
      } else if (mended(rc)) {
        continue;
      } else if (rc != FL_ETIMEDOUT && rc != FL_EAGAIN && rc != FL_EINTR) {
        fatal(std::string("waiting for completions failed: ") + fl_last_error());
      } else if (monotonicNs() - last_progress_ns >
                 static_cast<uint64_t>(options_.stall_timeout_ms) * 1000000ull) {
        fatal("no completion for " + std::to_string(options_.stall_timeout_ms / 1000) + " s with " +
              std::to_string(inFlight()) + " frames in flight; check both daemons' logs");
      }
      continue;
    }
    if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT) {
      // Nothing in flight, so no completion will free a slot: let the library block.
      rc = fl_acquire(client_, 200, &slot);
      if (rc == FL_EAGAIN || rc == FL_ETIMEDOUT || rc == FL_EINTR) {
        if (monotonicNs() - last_progress_ns >
            static_cast<uint64_t>(options_.stall_timeout_ms) * 1000000ull) {
          fatal("no free slot for " + std::to_string(options_.stall_timeout_ms / 1000) +
                " s although no frame is in flight; check the daemon's log");
        }
        continue;
      }
    }
    if (rc == FL_EINTR || (rc != FL_OK && mended(rc))) continue;
    if (rc != FL_OK) {
      fatal(std::string("acquiring a slot failed: ") + fl_last_error());
      continue;
    }

    FrameSpec spec;
    std::string err;
    if (!prepare(index, slot, spec, err)) {
      fl_abandon(client_, slot.index);
      fatal(err);
      continue;
    }
    fl_frame_meta meta{};
    meta.frame_id = spec.frame_id;
    meta.wafer_id = spec.wafer_id;
    meta.flags = options_.crc ? FL_META_CRC32C : 0;
    meta.attr_length = static_cast<uint32_t>(spec.attrs.size());
    meta.attrs = reinterpret_cast<const uint8_t*>(spec.attrs.data());
    meta.timestamp_ns = realtimeNs();
    rc = fl_set_meta(client_, slot.index, &meta);
    if (rc != FL_OK) {
      fl_abandon(client_, slot.index);
      if (mended(rc)) continue;  // the same frame again, in a slot of the new attachment
      fatal("cannot set the metadata of frame " + std::to_string(spec.frame_id) + ": " + fl_last_error());
      continue;
    }
    rc = fl_submit(client_, slot.index, spec.length);
    if (rc != FL_OK) {
      fl_abandon(client_, slot.index);
      if (mended(rc)) continue;
      fatal("cannot submit frame " + std::to_string(spec.frame_id) + " (" + std::to_string(spec.length) +
            " bytes): " + fl_last_error());
      continue;
    }
    const uint64_t now = monotonicNs();
    if (st.submitted == 0) {
      st.first_submit_ns = now;
      last_progress_ns = now;
    }
    ++st.submitted;
    st.bytes_submitted += spec.length;
    ++index;
    if (rate_period_ns != 0) next_due_ns += rate_period_ns;
  }
  if (st.last_completion_ns == 0) st.last_completion_ns = monotonicNs();
  return st;
}

}  // namespace framelink::cli
