// The producer side of `framelink send`, `demo` and `bench`: keeps acquire -> fill -> set_meta ->
// submit going while draining completions, then waits for every completion.
#ifndef FRAMELINK_CLI_PRODUCER_H
#define FRAMELINK_CLI_PRODUCER_H

#include <framelink/framelink.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

namespace framelink::cli {

struct FrameSpec {
  uint64_t frame_id = 0;
  uint64_t group_id = 0;
  uint64_t length = 0;
  std::string attrs;
};

// Whether a client attaches again after a daemon restart unless told: libframelink's default
// (on, unless $FRAMELINK_AUTO_REATTACH is off).
inline bool defaultReattach() {
  fl_client_options o;
  fl_client_options_init(&o);
  return o.auto_reattach != 0;
}

struct ProducerOptions {
  std::string socket_path;
  std::string stream;
  uint32_t slot_count = 0;  // 0: the daemon's [limits] default_slot_count
  uint64_t slot_size = 0;   // 0: the daemon's [limits] default_slot_size
  bool crc = false;
  double rate_hz = 0;          // 0: as fast as completions allow
  uint32_t max_in_flight = 0;  // 0: every slot; 1 = one frame at a time (latency runs)
  // With frames in flight and no completion for this long, give up (the daemon's ack and
  // credit timeouts default to 30 s, so a healthy daemon always answers before this).
  int stall_timeout_ms = 120000;
  // When the daemon goes away (FL_ERR_DAEMON_GONE), attach again with fl_reattach once it is back
  // (for up to stall_timeout_ms) and go on; frames that were in flight fail FL_ERR_DAEMON_GONE.
  bool reattach = false;
};

struct ProducerStats {
  uint64_t submitted = 0;
  uint64_t delivered = 0;
  uint64_t failed = 0;
  uint64_t bytes_submitted = 0;
  uint64_t bytes_delivered = 0;
  // The fewest and most readers (on every host) that read a delivered frame, as its completion said.
  uint32_t readers_min = 0;
  uint32_t readers_max = 0;
  uint64_t skipped = 0;              // subscribers of a drop stream skipped for delivered frames, in all
  std::map<int, uint64_t> failures;  // status -> count
  uint64_t first_submit_ns = 0;      // monotonic
  uint64_t last_completion_ns = 0;   // monotonic
  std::string error;                 // set when the run stopped early
  bool interrupted = false;
  uint32_t reattaches = 0;  // with ProducerOptions::reattach: times the daemon went away and was back

  double seconds() const {
    return last_completion_ns > first_submit_ns ? (last_completion_ns - first_submit_ns) / 1e9 : 0.0;
  }
  bool allDelivered() const { return error.empty() && !interrupted && failed == 0 && delivered == submitted; }
};

class Producer {
 public:
  // Fills `slot` for frame number `index` and describes it in `spec`; returns false and sets
  // `err` to stop the run.
  using PrepareFn = std::function<bool(uint64_t index, fl_slot& slot, FrameSpec& spec, std::string& err)>;
  using MoreFn = std::function<bool(uint64_t index)>;
  using CompletionFn = std::function<void(const fl_completion&)>;

  static std::unique_ptr<Producer> attach(const ProducerOptions& options, std::string& err);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  fl_client* handle() const { return client_; }
  const fl_client_info& info() const { return info_; }

  // Sends frames index = 0, 1, ... while more(index) is true and `stop` is not set, then waits
  // for the completions of everything submitted.
  ProducerStats run(const MoreFn& more, const PrepareFn& prepare, const CompletionFn& on_completion,
                    const std::atomic<bool>* stop);

  // Acquires every slot, lets `fill` write it once, and gives the slots back (fl_abandon), so a
  // benchmark can re-submit pre-filled slots without paying for the pattern in the timed loop.
  bool prefillAllSlots(const std::function<void(fl_slot&)>& fill, std::string& err);

 private:
  Producer(fl_client* client, ProducerOptions options) : client_(client), options_(std::move(options)) {}
  fl_client* client_;
  ProducerOptions options_;
  fl_client_info info_{};
};

std::string attachError(const char* role, const std::string& socket, const std::string& stream, int rc);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_PRODUCER_H
