#include "consumer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli_util.h"
#include "framelink/shm_layout.h"
#include "producer.h"

namespace framelink::cli {

std::unique_ptr<Consumer> Consumer::attach(const ConsumerOptions& options, std::string& err) {
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_CONSUMER;
  o.socket_path = options.socket_path.empty() ? nullptr : options.socket_path.c_str();
  o.stream = options.stream.c_str();
  o.client_name = "framelink";
  o.slot_count = options.slot_count;
  o.slot_size = options.slot_size;
  o.subscribe = options.subscribe ? 1 : 0;
  o.pull = options.pull ? 1 : 0;
  if (!options.reattach) o.auto_reattach = 0;
  fl_client* client = nullptr;
  const int rc = fl_attach(&o, &client);
  if (rc != FL_OK) {
    err = attachError("consumer", options.socket_path.empty() ? "the default socket" : options.socket_path,
                      options.stream, rc);
    return nullptr;
  }
  std::unique_ptr<Consumer> c(new Consumer(client));
  c->auto_reattach_ = o.auto_reattach != 0;
  if (fl_client_get_info(client, &c->info_) != FL_OK) {
    err = std::string("attached, but cannot read the attachment info: ") + fl_last_error();
    return nullptr;
  }
  return c;
}

Consumer::~Consumer() { fl_detach(client_); }

std::string FrameChecker::check(const fl_frame& f) {
  std::string why;
  const std::string id = std::to_string(f.frame_id);
  // A frame the daemon may have delivered before (a restart caught it) may come again, flagged.
  const bool again = (f.flags & FL_SLOT_MAYBE_REDELIVERED) != 0;
  if (options_.expect_order) {
    if (have_prev_ && f.frame_id != prev_id_ + 1 && !(again && f.frame_id <= prev_id_)) {
      if (f.frame_id <= prev_id_) {
        why = "frame " + id + " arrived after frame " + std::to_string(prev_id_) +
              " (duplicate or out of order)";
      } else {
        why = "frame " + id + " arrived after frame " + std::to_string(prev_id_) + ": frames " +
              std::to_string(prev_id_ + 1) + ".." + std::to_string(f.frame_id - 1) + " are missing";
      }
    }
    // Keep the highest id so one gap reports once, not for every later frame.
    if (!have_prev_ || f.frame_id > prev_id_) prev_id_ = f.frame_id;
    have_prev_ = true;
  }
  if (why.empty() && !options_.expect_order && !seen_.insert(f.frame_id).second && !again) {
    why = "frame " + id + " arrived twice (duplicate)";
  }
  if (why.empty() && options_.sizes) {
    const uint64_t want = options_.sizes->sizeOf(f.frame_id);
    if (f.length != want) {
      why = "frame " + id + " has " + std::to_string(f.length) + " bytes, expected " + std::to_string(want);
    }
  }
  if (why.empty() && options_.verify) {
    const uint64_t want_wafer = pattern::waferOf(f.frame_id);
    const std::string want_attrs = pattern::makeAttrs(f.frame_id);
    const std::string got_attrs(reinterpret_cast<const char*>(f.attrs), f.attr_length);
    if (f.group_id != want_wafer) {
      why = "frame " + id + " has group_id " + std::to_string(f.group_id) + ", expected " +
            std::to_string(want_wafer);
    } else if (got_attrs != want_attrs) {
      why = "frame " + id + " has attrs \"" + jsonEscape(got_attrs) + "\", expected \"" + want_attrs + "\"";
    } else {
      const size_t off = pattern::verifyPattern(f.frame_id, f.data, f.length);
      if (off != pattern::kNpos) {
        why = "frame " + id + " (" + std::to_string(f.length) +
              " bytes) differs from its pattern at byte offset " + std::to_string(off);
      }
    }
  }
  if (!why.empty()) {
    ++bad_;
    if (first_error_.empty()) first_error_ = why;
  }
  return why;
}

static bool writeAll(int fd, const void* data, size_t len) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (len > 0) {
    const ssize_t w = ::write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    len -= static_cast<size_t>(w);
  }
  return true;
}

static bool writeAtomically(const std::string& dir, const std::string& name, const std::string& tmp_name,
                            const void* data, size_t len, std::string& err) {
  const std::string tmp = dir + "/" + tmp_name;
  const std::string dst = dir + "/" + name;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    err = "cannot create " + tmp + ": " + std::strerror(errno) + " -- does --out name a writable directory?";
    return false;
  }
  if (!writeAll(fd, data, len)) {
    err = "cannot write " + tmp + ": " + std::strerror(errno) + " -- is the disk full?";
    ::close(fd);
    ::unlink(tmp.c_str());
    return false;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), dst.c_str()) != 0) {
    err = "cannot rename " + tmp + " to " + dst + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

bool writeFrameFiles(const std::string& dir, const fl_frame& f, std::string& err) {
  const std::string id = std::to_string(f.frame_id);
  if (!writeAtomically(dir, id + ".bin", ".tmp-" + id, f.data, f.length, err)) return false;
  char crc[32] = "null";
  if ((f.flags & 1u) != 0) std::snprintf(crc, sizeof crc, "%u", f.crc32c);
  const std::string attrs(reinterpret_cast<const char*>(f.attrs), f.attr_length);
  const std::string json = "{\"frame_id\":" + id + ",\"group_id\":" + std::to_string(f.group_id) +
                           ",\"timestamp_ns\":" + std::to_string(f.timestamp_ns) +
                           ",\"length\":" + std::to_string(f.length) +
                           ",\"sequence\":" + std::to_string(f.sequence) + ",\"crc32c\":" + crc +
                           R"(,"attrs":")" + jsonEscape(attrs) + "\"}\n";
  return writeAtomically(dir, id + ".json", ".tmp-" + id + ".json", json.data(), json.size(), err);
}

ReceiveLoopStats receiveLoop(Consumer& consumer, const ReceiveLoopOptions& options, const FrameFn& on_frame) {
  ReceiveLoopStats st;
  RecentFrameIds recent;
  uint64_t last_activity = monotonicNs();
  while (options.count == 0 || st.received < options.count) {
    if ((options.stop != nullptr && options.stop->load(std::memory_order_relaxed)) || g_interrupted.load()) {
      st.interrupted = true;
      break;
    }
    fl_frame f{};
    // Short waits so a stop request or Ctrl-C is noticed promptly.
    const int rc = fl_receive(consumer.handle(), &f, 100);
    if (rc == FL_ETIMEDOUT || rc == FL_EAGAIN || rc == FL_EINTR) {
      if (options.idle_timeout_ms > 0 &&
          monotonicNs() - last_activity > static_cast<uint64_t>(options.idle_timeout_ms) * 1000000ull) {
        st.timed_out = true;
        break;
      }
      continue;
    }
    if (rc != FL_OK) {
      st.error = std::string("receiving failed: ") + fl_last_error();
      if (rc == FL_ERR_DAEMON_GONE) {
        st.error += " -- the daemon went away; check that framelinkd is still running";
      }
      break;
    }
    const uint64_t rx_real = realtimeNs();
    const uint64_t now = monotonicNs();
    last_activity = now;
    // A frame held across a daemon's restart comes again, flagged: it is not one more frame of
    // the count (the last one of the count would stay unread in its slot).
    const bool seen = recent.seenBefore(f.frame_id);
    if (seen && (f.flags & FL_SLOT_MAYBE_REDELIVERED) != 0) {
      ++st.redelivered;
    } else {
      if (st.received == 0) st.first_ns = now;
      if (st.received != 0 && now - st.last_ns > st.longest_gap_ns) st.longest_gap_ns = now - st.last_ns;
      st.last_ns = now;
      ++st.received;
      st.bytes += f.length;
    }
    std::string err;
    const bool keep_going = on_frame ? on_frame(f, rx_real, err) : true;
    const int rel = fl_release(consumer.handle(), f.slot);
    // The daemon went away while this frame was held: its slot went with it, and the next
    // receive attaches again once the daemon is back.
    if (rel == FL_ERR_DAEMON_GONE && consumer.autoReattach() && keep_going) continue;
    if (rel != FL_OK) {
      st.error = "cannot release frame " + std::to_string(f.frame_id) + " (slot " + std::to_string(f.slot) +
                 "): " + fl_last_error();
      break;
    }
    if (!keep_going) {
      st.error = err;
      break;
    }
  }
  return st;
}

}  // namespace framelink::cli
