// The consumer side of `framelink recv`, `demo` and `bench`: attach, receive, check, release.
#ifndef FRAMELINK_CLI_CONSUMER_H
#define FRAMELINK_CLI_CONSUMER_H

#include <framelink/framelink.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>

#include "frame_pattern.h"

namespace framelink::cli {

struct ConsumerOptions {
  std::string socket_path;
  std::string stream;
  uint32_t slot_count = 0;
  uint64_t slot_size = 0;
  bool subscribe = false;  // every frame of the stream, not a queue group member's share
  bool pull = false;       // the stream's frames from other hosts are pulled to this host
  // libframelink's auto_reattach (on unless $FRAMELINK_AUTO_REATTACH is off): a daemon
  // restart is a pause, not an error.
  bool reattach = true;
};

class Consumer {
 public:
  static std::unique_ptr<Consumer> attach(const ConsumerOptions& options, std::string& err);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  fl_client* handle() const { return client_; }
  const fl_client_info& info() const { return info_; }
  // The library attaches again by itself when the daemon comes back.
  bool autoReattach() const { return auto_reattach_; }

 private:
  explicit Consumer(fl_client* client) : client_(client) {}
  fl_client* client_;
  fl_client_info info_{};
  bool auto_reattach_ = false;
};

// What `recv --verify/--expect-*` checks about each frame.
struct CheckOptions {
  bool verify = false;                         // payload pattern, attrs, group_id
  std::optional<pattern::SizeSequence> sizes;  // expected length per frame id
  bool expect_order = false;                   // frame ids first, first+1, ... exactly once
};

class FrameChecker {
 public:
  explicit FrameChecker(CheckOptions options) : options_(std::move(options)) {}
  // "" when the frame passes every enabled check, else what is wrong with it.
  std::string check(const fl_frame& frame);
  uint64_t bad() const { return bad_; }
  const std::string& firstError() const { return first_error_; }

 private:
  CheckOptions options_;
  bool have_prev_ = false;
  uint64_t prev_id_ = 0;
  std::unordered_set<uint64_t> seen_;  // without expect_order: ids seen, to catch duplicates
  uint64_t bad_ = 0;
  std::string first_error_;
};

struct ReceiveLoopOptions {
  uint64_t count = 0;       // 0: until stopped
  int idle_timeout_ms = 0;  // give up when no frame arrives for this long; 0: never
  const std::atomic<bool>* stop = nullptr;
};

struct ReceiveLoopStats {
  uint64_t received = 0;     // distinct frames: a flagged redelivery of a frame received before is not one
  uint64_t redelivered = 0;  // frames a restarted daemon delivered again (FL_SLOT_MAYBE_REDELIVERED, seen)
  uint64_t bytes = 0;
  uint64_t first_ns = 0;        // monotonic, first frame
  uint64_t last_ns = 0;         // monotonic, last frame
  uint64_t longest_gap_ns = 0;  // the longest time between two frames (a daemon restart shows here)
  bool timed_out = false;
  bool interrupted = false;
  std::string error;  // fatal: the attachment broke or a callback failed
  double seconds() const { return last_ns > first_ns ? (last_ns - first_ns) / 1e9 : 0.0; }
};

// Called for every frame before it is released, with the CLOCK_REALTIME receive time; returns
// false (and sets err) to stop the loop.
using FrameFn = std::function<bool(const fl_frame& frame, uint64_t rx_realtime_ns, std::string& err)>;

ReceiveLoopStats receiveLoop(Consumer& consumer, const ReceiveLoopOptions& options, const FrameFn& on_frame);

// Writes DIR/<frame_id>.bin and DIR/<frame_id>.json, each via a temporary file + rename so a
// reader never sees a partial file.
bool writeFrameFiles(const std::string& dir, const fl_frame& frame, std::string& err);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_CONSUMER_H
