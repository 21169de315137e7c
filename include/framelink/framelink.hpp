// framelink.hpp: a thin header-only C++17 convenience layer over the C ABI
// in framelink.h.  It adds ownership (RAII, move-only handles) and turns
// failures into framelink::Error exceptions; all protocol logic stays in
// libframelink.  Expected outcomes of waits (nothing arrived in time) are
// std::nullopt, not exceptions.
//
// Lifetime: a SlotLease or Frame refers to the Producer/Consumer it came
// from and must not outlive it.
#ifndef FRAMELINK_FRAMELINK_HPP
#define FRAMELINK_FRAMELINK_HPP

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "framelink/framelink.h"
#include "framelink/shm_layout.h"
#include "framelink/status_name.hpp"

namespace framelink {

class Error : public std::runtime_error {
 public:
  Error(int status, const std::string& message) : std::runtime_error(message), status_(status) {}
  int status() const noexcept { return status_; }

 private:
  int status_;
};

namespace detail {
inline void check(int status, const char* what) {
  if (status != FL_OK) {
    std::string message = what;
    message += ": ";
    message += fl_last_error();
    throw Error(status, message);
  }
}
// Waits report "nothing yet" as an empty optional, everything else throws.
inline bool checkWait(int status, const char* what) {
  if (status == FL_EAGAIN || status == FL_ETIMEDOUT) return false;
  check(status, what);
  return true;
}
}  // namespace detail

struct Options {
  std::string stream;
  std::string socket_path;         // empty: $FRAMELINK_SOCKET, else the default socket
  std::string client_name;         // empty: the program name
  uint32_t slot_count = 0;         // 0: the daemon's default
  uint64_t slot_size = 0;          // 0: the daemon's default
  uint32_t attach_timeout_ms = 0;  // 0: 10 s (connect and the daemon's answer)
  bool auto_reattach =
      true;  // see fl_client_options.auto_reattach (on unless $FRAMELINK_AUTO_REATTACH is off)
  uint32_t reattach_interval_ms = 0;  // 0: 200 ms between automatic attempts
  bool subscribe = false;             // consumer: every frame of the stream, not a queue group's share
  // Consumer: pull this stream's frames from other hosts (fl_client_options.pull).
  bool pull = false;
  // Microseconds a blocking call looks at its ring before it sleeps (fl_client_options.wait_spin_us):
  // 0, $FRAMELINK_WAIT_SPIN_US or FL_WAIT_SPIN_DEFAULT_US; FL_WAIT_SPIN_OFF, sleep at once.
  uint32_t wait_spin_us = 0;
};

struct FrameMeta {
  uint64_t frame_id = 0;
  uint64_t group_id = 0;
  uint64_t timestamp_ns = 0;
  bool crc32c = false;     // compute the payload CRC32C at submit
  std::string_view attrs;  // at most FL_MAX_ATTR_BYTES (192) bytes
};

// An attachment to framelinkd (one fl_client).  Move-only; detaches on destruction.
class Client {
 public:
  Client() noexcept = default;
  Client(Client&& other) noexcept : client_(std::exchange(other.client_, nullptr)) {}
  Client& operator=(Client&& other) noexcept {
    if (this != &other) {
      reset();
      client_ = std::exchange(other.client_, nullptr);
    }
    return *this;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { reset(); }

  explicit operator bool() const noexcept { return client_ != nullptr; }
  fl_client* get() const noexcept { return client_; }

  fl_client_info info() const {
    fl_client_info out{};
    detail::check(fl_client_get_info(client_, &out), "fl_client_get_info");
    return out;
  }
  // False once the daemon went away (reattach then).
  bool daemonAlive() noexcept { return fl_check_daemon(client_) == FL_OK; }
  // fl_reattach: the same handle, attached to the daemon that is back.  Throws
  // while none accepts; see fl_reattach for what becomes of slots and frames.
  void reattach() { detail::check(fl_reattach(client_), "cannot reattach"); }
  int doorbellFd() const noexcept { return fl_doorbell_fd(client_); }

  void reset() noexcept {
    fl_detach(client_);
    client_ = nullptr;
  }

 protected:
  Client(uint32_t role, const Options& options) {
    fl_client_options o;
    fl_client_options_init(&o);
    o.role = role;
    o.stream = options.stream.c_str();
    o.socket_path = options.socket_path.empty() ? nullptr : options.socket_path.c_str();
    o.client_name = options.client_name.empty() ? nullptr : options.client_name.c_str();
    o.slot_count = options.slot_count;
    o.slot_size = options.slot_size;
    o.attach_timeout_ms = options.attach_timeout_ms;
    if (!options.auto_reattach)
      o.auto_reattach = 0;  // else as initialised: on unless $FRAMELINK_AUTO_REATTACH is off
    o.reattach_interval_ms = options.reattach_interval_ms;
    o.subscribe = options.subscribe ? 1 : 0;
    o.pull = options.pull ? 1 : 0;
    o.wait_spin_us = options.wait_spin_us;
    detail::check(fl_attach(&o, &client_), "fl_attach");
  }

  fl_client* client_ = nullptr;
};

// A producer slot between acquire and submit.  Abandoned (returned unsent)
// on destruction unless submitted.
class SlotLease {
 public:
  SlotLease() noexcept = default;
  SlotLease(fl_client* client, const fl_slot& slot) noexcept : client_(client), slot_(slot) {}
  SlotLease(SlotLease&& other) noexcept
      : client_(std::exchange(other.client_, nullptr)), slot_(other.slot_) {}
  SlotLease& operator=(SlotLease&& other) noexcept {
    if (this != &other) {
      abandon();
      client_ = std::exchange(other.client_, nullptr);
      slot_ = other.slot_;
    }
    return *this;
  }
  SlotLease(const SlotLease&) = delete;
  SlotLease& operator=(const SlotLease&) = delete;
  ~SlotLease() { abandon(); }

  explicit operator bool() const noexcept { return client_ != nullptr; }
  uint32_t index() const noexcept { return slot_.index; }
  uint8_t* data() const noexcept { return slot_.data; }
  uint64_t capacity() const noexcept { return slot_.capacity; }

  void setMeta(const FrameMeta& meta) {
    fl_frame_meta m{};
    m.frame_id = meta.frame_id;
    m.group_id = meta.group_id;
    m.timestamp_ns = meta.timestamp_ns;
    m.flags = meta.crc32c ? static_cast<uint32_t>(FL_META_CRC32C) : 0u;
    m.attr_length = static_cast<uint32_t>(meta.attrs.size());
    m.attrs = reinterpret_cast<const uint8_t*>(meta.attrs.data());
    if (meta.attrs.size() > FL_MAX_ATTR_BYTES)
      m.attr_length = FL_MAX_ATTR_BYTES + 1;  // let the library say why
    detail::check(fl_set_meta(client_, slot_.index, &m), "fl_set_meta");
  }

  // Sends `length` bytes of the slot; the lease is spent afterwards.
  void submit(uint64_t length) {
    detail::check(fl_submit(client_, slot_.index, length), "fl_submit");
    client_ = nullptr;
  }

  void abandon() noexcept {
    if (client_ != nullptr) fl_abandon(client_, slot_.index);
    client_ = nullptr;
  }

 private:
  fl_client* client_ = nullptr;
  fl_slot slot_{};
};

class Producer : public Client {
 public:
  Producer() noexcept = default;
  explicit Producer(const Options& options) : Client(FL_PRODUCER, options) {}

  // timeout_ms: 0 = non-blocking, < 0 = forever.  nullopt when no slot freed up in time.
  std::optional<SlotLease> acquire(int timeout_ms = -1) {
    fl_slot slot{};
    if (!detail::checkWait(fl_acquire(client_, timeout_ms, &slot), "fl_acquire")) return std::nullopt;
    return SlotLease(client_, slot);
  }

  // Completions available now (possibly none).
  std::vector<fl_completion> pollCompletions(std::size_t max = 64) {
    std::vector<fl_completion> out(max);
    std::size_t n = 0;
    detail::check(fl_poll_completions(client_, out.data(), out.size(), &n), "fl_poll_completions");
    out.resize(n);
    return out;
  }

  // At least one completion, or empty when the timeout expired.
  std::vector<fl_completion> waitCompletions(int timeout_ms = -1, std::size_t max = 64) {
    std::vector<fl_completion> out(max == 0 ? 1 : max);
    std::size_t n = 0;
    if (!detail::checkWait(fl_wait_completions(client_, out.data(), out.size(), &n, timeout_ms),
                           "fl_wait_completions"))
      n = 0;
    out.resize(n);
    return out;
  }

  uint32_t inFlight() const {
    uint32_t n = 0;
    detail::check(fl_in_flight(client_, &n), "fl_in_flight");
    return n;
  }
};

// A delivered frame, readable until destruction (or release()), which gives
// the slot back to the daemon.
class Frame {
 public:
  Frame() noexcept = default;
  Frame(fl_client* client, const fl_frame& frame) noexcept : client_(client), frame_(frame) {}
  Frame(Frame&& other) noexcept : client_(std::exchange(other.client_, nullptr)), frame_(other.frame_) {}
  Frame& operator=(Frame&& other) noexcept {
    if (this != &other) {
      releaseQuietly();
      client_ = std::exchange(other.client_, nullptr);
      frame_ = other.frame_;
    }
    return *this;
  }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;
  ~Frame() { releaseQuietly(); }

  explicit operator bool() const noexcept { return client_ != nullptr; }
  const fl_frame& raw() const noexcept { return frame_; }
  uint32_t slot() const noexcept { return frame_.slot; }
  const uint8_t* data() const noexcept { return frame_.data; }
  uint64_t size() const noexcept { return frame_.length; }
  uint64_t frameId() const noexcept { return frame_.frame_id; }
  uint64_t groupId() const noexcept { return frame_.group_id; }
  uint64_t timestampNs() const noexcept { return frame_.timestamp_ns; }
  uint64_t sequence() const noexcept { return frame_.sequence; }
  bool crcChecked() const noexcept { return (frame_.flags & FL_SLOT_HAS_CRC32C) != 0; }
  // Sent again after the receiving daemon restarted: may have been seen before.
  bool maybeRedelivered() const noexcept { return (frame_.flags & FL_SLOT_MAYBE_REDELIVERED) != 0; }
  // A subscriber of a drop stream: the frames it missed just before this one.
  uint32_t gap() const noexcept {
    return client_ != nullptr && (frame_.flags & FL_SLOT_GAP) != 0 ? fl_frame_gap(client_, frame_.slot) : 0;
  }
  std::string_view attrs() const noexcept {
    return {reinterpret_cast<const char*>(frame_.attrs), frame_.attr_length};
  }

  // Release now, reporting failure (the destructor releases quietly).
  void release() {
    fl_client* c = std::exchange(client_, nullptr);
    if (c != nullptr) detail::check(fl_release(c, frame_.slot), "fl_release");
  }

 private:
  void releaseQuietly() noexcept {
    if (client_ != nullptr) fl_release(client_, frame_.slot);
    client_ = nullptr;
  }

  fl_client* client_ = nullptr;
  fl_frame frame_{};
};

class Consumer : public Client {
 public:
  Consumer() noexcept = default;
  explicit Consumer(const Options& options) : Client(FL_CONSUMER, options) {}

  // timeout_ms: 0 = non-blocking, < 0 = forever.  nullopt when no frame arrived in time.
  std::optional<Frame> receive(int timeout_ms = -1) {
    fl_frame frame{};
    if (!detail::checkWait(fl_receive(client_, &frame, timeout_ms), "fl_receive")) return std::nullopt;
    return Frame(client_, frame);
  }
};

}  // namespace framelink

#endif  // FRAMELINK_FRAMELINK_HPP
