// ACK and credit coalescing between two real daemons over tcp: the receiving
// daemon returns ACKs and credits per (link, stream) once a quarter of the
// sender's window is waiting, after ack_delay_us, or at once when the sender
// says it is low on credits -- and a frame is still DELIVERED only after the
// remote consumer released it.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"

using namespace framelink::integ;
using namespace std::chrono_literals;

namespace {

struct StreamResult {
  uint64_t received = 0;
  uint64_t delivered = 0;  // FL_OK completions at the producer
  uint64_t failed = 0;
  std::string error;  // the first thing that went wrong, if any
  // The longest the producer waited for a free slot while it still had
  // frames to submit: a stream stalled behind the ACK timer shows here.
  Millis longest_acquire{0};
  // From the last submit to the last completion: the end of a burst, where
  // nothing more comes to fill a quarter of the window and the last
  // releases may wait for ack_delay_us (the rule promises no better).
  Millis tail{0};
};

// `frames` frames of `length` bytes from a producer on A to a consumer on B
// that releases each frame as soon as it has it; the producer submits one
// every `pace` at most (0: as fast as it can).  No Catch2 assertion runs
// on the two threads; the caller checks the result.
StreamResult runStream(DaemonPair& pair, const std::string& stream, uint32_t producer_slots,
                       uint32_t consumer_slots, uint64_t frames, uint64_t length, Millis deadline,
                       std::chrono::microseconds pace = {}) {
  Client consumer = attachConsumer(pair.b(), stream, consumer_slots, 64 * 1024);
  Client producer = attachProducer(pair.a(), stream, producer_slots, 64 * 1024);
  StreamResult r;
  const auto until = Clock::now() + deadline;
  auto left = [&] {
    return static_cast<int>(
        std::max<int64_t>(0, std::chrono::duration_cast<Millis>(until - Clock::now()).count()));
  };
  std::atomic<bool> consumer_failed{false};
  std::string consumer_error;
  std::thread receiver([&] {
    while (r.received < frames) {
      fl_frame f{};
      const int rc = fl_receive(consumer.get(), &f, std::min(left(), 1000));
      if (rc == FL_ETIMEDOUT && left() > 0) continue;
      if (rc != FL_OK || fl_release(consumer.get(), f.slot) != FL_OK) {
        consumer_error = "fl_receive/fl_release after " + std::to_string(r.received) +
                         " frames: " + statusName(rc) + " " + fl_last_error();
        consumer_failed = true;
        return;
      }
      ++r.received;
    }
  });
  uint64_t submitted = 0;
  fl_completion buf[64];
  // FL_ETIMEDOUT (the wait's own timeout) is not an error here; a frame's
  // FL_ERR_TIMEOUT arrives as a completion's status.
  auto reap = [&](int timeout_ms) {
    size_t n = 0;
    const int rc = fl_wait_completions(producer.get(), buf, 64, &n, timeout_ms);
    if (rc != FL_OK && rc != FL_ETIMEDOUT && rc != FL_EAGAIN) return false;
    for (size_t i = 0; i < n; ++i) (buf[i].status == FL_OK ? r.delivered : r.failed) += 1;
    return true;
  };
  while (submitted < frames && r.error.empty() && !consumer_failed) {
    fl_slot slot{};
    const auto asked = Clock::now();
    const int rc = fl_acquire(producer.get(), std::min(left(), 1000), &slot);
    r.longest_acquire = std::max(r.longest_acquire, std::chrono::duration_cast<Millis>(Clock::now() - asked));
    if (rc == FL_ETIMEDOUT && left() > 0) continue;
    if (rc != FL_OK) {
      r.error = "fl_acquire after " + std::to_string(submitted) + " frames: " + statusName(rc) + " " +
                fl_last_error();
      break;
    }
    if (fl_submit(producer.get(), slot.index, length) != FL_OK) {
      r.error = std::string("fl_submit: ") + fl_last_error();
      break;
    }
    ++submitted;
    reap(0);
    if (pace.count() > 0) std::this_thread::sleep_for(pace);
  }
  const auto last_submit = Clock::now();
  while (r.error.empty() && r.delivered + r.failed < submitted && left() > 0) {
    if (!reap(std::min(left(), 200))) r.error = std::string("fl_wait_completions: ") + fl_last_error();
  }
  r.tail = std::chrono::duration_cast<Millis>(Clock::now() - last_submit);
  receiver.join();
  if (r.error.empty() && consumer_failed) r.error = consumer_error;
  return r;
}

DaemonPair::Options pairWith(const std::string& ack_delay_us) {
  DaemonPair::Options o;
  o.transport = "tcp";
  o.extra_args = {"--metrics", "127.0.0.1:0", "--ack-delay-us", ack_delay_us};
  return o;
}

}  // namespace

TEST_CASE("coalescing: a steady stream costs about one control record per quarter window",
          "[integration][coalesce]") {
  // A timer far longer than a frame's round trip: what is measured here is
  // the quarter-of-the-window rule.  The producer is paced, so that the
  // receiving daemon sees its consumer's releases one at a time (a daemon
  // that is behind handles many in one round, and coalesces them anyway).
  DaemonPair pair(pairWith("5000"));
  constexpr uint32_t kWindow = 32;
  constexpr uint64_t kFrames = 2000;
  const int64_t b_before = pair.b().metric("framelink_control_records_sent_total");
  const int64_t a_before = pair.a().metric("framelink_control_records_sent_total");
  REQUIRE(b_before >= 0);
  REQUIRE(a_before >= 0);
  const StreamResult r = runStream(pair, "steady", kWindow, kWindow, kFrames, 4096, 60s, 100us);
  INFO(r.error);
  REQUIRE(r.error.empty());
  REQUIRE(r.received == kFrames);
  REQUIRE(r.delivered == kFrames);
  const double b_per_frame =
      double(pair.b().metric("framelink_control_records_sent_total") - b_before) / double(kFrames);
  const double a_per_frame =
      double(pair.a().metric("framelink_control_records_sent_total") - a_before) / double(kFrames);
  WARN("control records per frame: receiver " << b_per_frame << ", sender " << a_per_frame);
  // 4 / W = 0.125; twice that leaves room for the timer and partial
  // quarters while the stream starts and ends.  Returning each round's
  // releases at once costs several times more.
  CHECK(b_per_frame <= 2.0 * 4 / kWindow);
  // The sender says it is low on credits at most once per window cycle.
  CHECK(a_per_frame <= 2.0 * 4 / kWindow);
}

TEST_CASE("coalescing: a single frame is DELIVERED by the timer, without a quarter of the window",
          "[integration][coalesce]") {
  // 200 ms: long enough to tell the timer from the quarter rule, short
  // enough to wait for.
  DaemonPair pair(pairWith("200000"));
  Client consumer = attachConsumer(pair.b(), "single", 32, 64 * 1024);
  Client producer = attachProducer(pair.a(), "single", 32, 64 * 1024);
  const int64_t b_before = pair.b().metric("framelink_control_records_sent_total");
  const auto submitted_at = Clock::now();
  submitFrame(producer.get(), 7, 4096);
  fl_frame f = receiveFrame(consumer.get(), 10000ms);
  checkSyntheticFrame(f, 7, 4096);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  // One release is far below a quarter of 32 credits, and nothing else
  // waits on the stream: only the timer sends the ACK.
  const std::vector<fl_completion> done = collectCompletions(producer.get(), 1, 10000ms);
  const auto took = Clock::now() - submitted_at;
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  CHECK(done[0].frame_id == 7);
  // Not before the timer: the quarter rule did not send it.
  CHECK(took >= 190ms);
  // B counts the record once it is written: A may have its ACK first.
  CHECK(waitForMetric(pair.b(), "framelink_control_records_sent_total", b_before + 1) - b_before >= 1);
}

TEST_CASE("coalescing: senders with small windows do not stall behind the timer", "[integration][coalesce]") {
  // A timer of a second: a stream that waited for it even once a window
  // would not finish in the deadline below, and a producer that waited for
  // it mid-stream would wait for a slot for about that long.
  DaemonPair pair(pairWith("1000000"));
  const uint32_t window = GENERATE(2u, 4u, 8u);
  INFO("consumer slots " << window);
  constexpr uint64_t kFrames = 400;
  const StreamResult r =
      runStream(pair, "small" + std::to_string(window), window, window, kFrames, 4096, 30s);
  INFO(r.error);
  INFO("longest wait for a slot " << r.longest_acquire.count() << " ms, tail " << r.tail.count() << " ms");
  REQUIRE(r.error.empty());
  CHECK(r.received == kFrames);
  CHECK(r.delivered == kFrames);
  CHECK(r.failed == 0);
  // While frames keep coming, a quarter of the window (or CreditLow, when
  // the sender runs short) sends the releases back: no wait for the timer.
  CHECK(r.longest_acquire < 500ms);
  // After the last submit, an odd release left below a quarter of the
  // window (8 slots: 1 of 2) waits for the timer, once: the rule bounds
  // the end of a burst by ack_delay_us, not by the next frame.
  CHECK(r.tail < 1000ms + 2000ms);
}
