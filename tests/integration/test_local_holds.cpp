// Local delivery's promise that every frame ends: a reader that takes a
// frame and never releases it (or never reads at all) loses it after
// ack_timeout_ms, as a dead reader does, so the producer's slots come back;
// on a drop stream the producer and the other subscribers go on at their
// own pace.  The hoarder's lent mapping stays read-only throughout.
#include <sys/mman.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <framelink/framelink.h>

#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

constexpr uint64_t kHoldKiB = 1024;
constexpr uint32_t kHoldSlots = 8;

DaemonProcess::Options holdOptions(std::vector<std::string> extra) {
  DaemonProcess::Options o;
  o.id = "solo";
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  o.extra_args.insert(o.extra_args.end(), extra.begin(), extra.end());
  return o;
}

// A subscriber that reads and releases every frame on a thread of its own
// until it has `expected`, fails or is stopped; once finished, the ids it
// got, in order, and what failed.
class HonestReader {
 public:
  HonestReader(fl_client* c, size_t expected) : c_(c), expected_(expected), thread_([this] { run(); }) {}
  ~HonestReader() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  bool finished() const { return finished_; }
  const std::vector<uint64_t>& ids() {
    stop();
    return ids_;
  }
  const std::string& error() {
    stop();
    return error_;
  }

 private:
  void run() {
    read();
    finished_ = true;
  }
  void read() {
    while (!stop_ && ids_.size() < expected_) {
      fl_frame f{};
      const int rc = fl_receive(c_, &f, 50);
      if (rc == FL_ETIMEDOUT || rc == FL_EAGAIN) continue;
      if (rc != FL_OK) {
        error_ = "fl_receive: " + statusName(rc) + " " + fl_last_error();
        return;
      }
      ids_.push_back(f.frame_id);
      if (fl_release(c_, f.slot) != FL_OK) {
        error_ = std::string("fl_release: ") + fl_last_error();
        return;
      }
    }
  }
  fl_client* c_;
  size_t expected_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::vector<uint64_t> ids_;
  std::string error_;
  std::thread thread_;
};

// A subscriber that takes every frame it is given and releases none.
class Hoarder {
 public:
  explicit Hoarder(fl_client* c) : c_(c), thread_([this] { run(); }) {}
  ~Hoarder() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const std::vector<fl_frame>& held() const { return held_; }

 private:
  void run() {
    while (!stop_) {
      fl_frame f{};
      if (fl_receive(c_, &f, 50) == FL_OK) held_.push_back(f);
    }
  }
  fl_client* c_;
  std::atomic<bool> stop_{false};
  std::vector<fl_frame> held_;
  std::thread thread_;
};

std::vector<uint64_t> idsFrom(uint64_t first, uint64_t last) {
  std::vector<uint64_t> ids;
  for (uint64_t id = first; id <= last; ++id) ids.push_back(id);
  return ids;
}

}  // namespace

TEST_CASE("local: on a drop stream a reader that keeps its frames loses them; the others go on",
          "[integration][local]") {
  constexpr uint64_t kFrames = 40;
  const bool takes = GENERATE(true, false);  // takes its frames and keeps them, or never reads at all
  INFO((takes ? "the hoarder takes its frames" : "the hoarder never reads"));
  DaemonProcess d(
      holdOptions({"--drop-stream", "cam", "--ack-timeout-ms", "300", "--credit-timeout-ms", "1000"}));
  Client hoarding = attachWith(d, FL_CONSUMER, "cam", true, kHoldSlots, 64 * kHoldKiB);
  Client honest = attachWith(d, FL_CONSUMER, "cam", true, kHoldSlots, 64 * kHoldKiB);
  Client producer = attachProducer(d, "cam", kHoldSlots, 64 * kHoldKiB);
  HonestReader reader(honest.get(), kFrames);
  std::optional<Hoarder> hoarder;
  if (takes) hoarder.emplace(hoarding.get());

  // Each acquire waits at most 10 s (submitFrame): with the producer's eight
  // slots held by the hoarder for good, the ninth would never come.
  for (uint64_t id = 1; id <= kFrames; ++id) submitFrame(producer.get(), id, 1000 + id);
  auto done = collectCompletions(producer.get(), kFrames, Millis(20000));
  REQUIRE(done.size() == kFrames);
  for (const fl_completion& c : done) {
    INFO("frame " << c.frame_id << ": " << statusName(c.status));
    // The hoarder's eight end for it at ack_timeout_ms; it is skipped for the others (no free slot).
    CHECK(c.status == (c.frame_id <= kHoldSlots ? FL_ERR_TIMEOUT : FL_OK));
    CHECK(c.readers == 2);
    CHECK(c.released == 1);
  }
  CHECK(waitUntil([&] { return reader.finished(); }, Millis(10000)));
  INFO(reader.error());
  CHECK(reader.ids() == idsFrom(1, kFrames));
  CHECK(waitForMetric(d, "framelink_local_frames_taken_back_total", kHoldSlots) == kHoldSlots);
  CHECK(d.metric("framelink_frames_dropped_slow_reader_total") == int64_t{kFrames - kHoldSlots});

  if (takes) {
    hoarder->stop();
    REQUIRE(hoarder->held().size() == kHoldSlots);
    // What it still maps of the producer's slots it can read, never write.
    const fl_frame& f = hoarder->held().front();
    const uintptr_t page = reinterpret_cast<uintptr_t>(f.data) & ~uintptr_t{4095};
    errno = 0;
    CHECK(::mprotect(reinterpret_cast<void*>(page), 4096, PROT_READ | PROT_WRITE) != 0);
    CHECK(errno == EACCES);
    // Its late releases free its own slots and nothing else: it gets frames again.
    for (const fl_frame& h : hoarder->held()) REQUIRE(fl_release(hoarding.get(), h.slot) == FL_OK);
    submitFrame(producer.get(), kFrames + 1, 100);
    fl_frame next = receiveFrame(hoarding.get(), Millis(5000));
    CHECK(next.frame_id == kFrames + 1);
    REQUIRE(fl_release(hoarding.get(), next.slot) == FL_OK);
    fl_frame other = receiveFrame(honest.get(), Millis(5000));
    CHECK(other.frame_id == kFrames + 1);
    REQUIRE(fl_release(honest.get(), other.slot) == FL_OK);
    done = collectCompletions(producer.get(), 1, Millis(5000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
    CHECK(done[0].released == 2);
  }
}

TEST_CASE("local: on a block stream a hoarder's frames end at ack_timeout_ms, the next at credit_timeout_ms",
          "[integration][local]") {
  constexpr uint64_t kFrames = 2 * kHoldSlots;
  DaemonProcess d(holdOptions({"--ack-timeout-ms", "300", "--credit-timeout-ms", "300"}));
  Client hoarding = attachWith(d, FL_CONSUMER, "cam", true, kHoldSlots, 64 * kHoldKiB);  // never reads
  Client honest = attachWith(d, FL_CONSUMER, "cam", true, kHoldSlots, 64 * kHoldKiB);
  Client producer = attachProducer(d, "cam", kHoldSlots, 64 * kHoldKiB);
  HonestReader reader(honest.get(), kHoldSlots);

  // The producer gets its slots back: none waits for the hoarder for ever.
  for (uint64_t id = 1; id <= kFrames; ++id) submitFrame(producer.get(), id, 1000);
  auto done = collectCompletions(producer.get(), kFrames, Millis(20000));
  REQUIRE(done.size() == kFrames);
  for (const fl_completion& c : done) {
    INFO("frame " << c.frame_id << ": " << statusName(c.status));
    if (c.frame_id <= kHoldSlots) {
      // Given to both; the hoarder kept it past ack_timeout_ms.
      CHECK(c.status == FL_ERR_TIMEOUT);
      CHECK(c.readers == 2);
      CHECK(c.released == 1);
    } else {
      // The stream waits for the hoarder's slots (block), and fails at credit_timeout_ms.
      CHECK(c.status == FL_ERR_NO_CONSUMER);
    }
  }
  CHECK(waitUntil([&] { return reader.finished(); }, Millis(10000)));
  INFO(reader.error());
  CHECK(reader.ids() == idsFrom(1, kHoldSlots));
  CHECK(waitForMetric(d, "framelink_local_frames_taken_back_total", kHoldSlots) == kHoldSlots);
}

TEST_CASE("local: a queue member that keeps a copied frame loses it; the group goes on",
          "[integration][local]") {
  DaemonProcess d(holdOptions({"--copy-stream", "line", "--ack-timeout-ms", "300"}));
  Client keeper = attachWith(d, FL_CONSUMER, "line", false, 1, 64 * kHoldKiB);
  Client producer = attachProducer(d, "line", 2, 64 * kHoldKiB);
  submitFrame(producer.get(), 1, 500);
  fl_frame kept = receiveFrame(keeper.get(), Millis(5000));
  CHECK(kept.frame_id == 1);
  auto done = collectCompletions(producer.get(), 1, Millis(10000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_ERR_TIMEOUT);
  CHECK(done[0].readers == 1);
  CHECK(done[0].released == 0);
  // A copy is the reader's own: it stays intact after the producer's slot is reused.
  Client other = attachWith(d, FL_CONSUMER, "line", false, 4, 64 * kHoldKiB);
  submitFrame(producer.get(), 2, 500);
  fl_frame f = receiveFrame(other.get(), Millis(5000));
  checkSyntheticFrame(f, 2, 500);
  checkSyntheticFrame(kept, 1, 500);
  REQUIRE(fl_release(other.get(), f.slot) == FL_OK);
  REQUIRE(fl_release(keeper.get(), kept.slot) == FL_OK);
  done = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  CHECK(waitForMetric(d, "framelink_local_frames_taken_back_total", 1) == 1);
}
