// Hot restart (proxy/hand_over.h): a framelinkd stopped by SIGTERM under a
// file descriptor store (FdKeeper, as systemd keeps one) hands its attach
// listener and its clients to the next framelinkd.  Applications streaming
// through the restart see a pause: no error, no frame lost, no reattach.
#include <framelink/framelink.h>
#include <framelink/shm_layout.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "fd_keeper.h"
#include "frame_pattern.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

using SteadyTime = std::chrono::steady_clock::time_point;

// What a producer thread saw: each frame's completion status.
struct HotProducerLog {
  std::map<uint64_t, int> status;  // frame id -> completion status
  std::string error;               // a call that failed (empty: none)
};

// Sends `frames` frames of `length` bytes, about `per_second` a second,
// collecting completions as it goes, then waits for the rest (bounded).
HotProducerLog produce(fl_client* producer, uint64_t frames, uint64_t length, int per_second,
                       std::atomic<uint64_t>& submitted) {
  HotProducerLog log;
  auto take = [&](int timeout_ms) {
    fl_completion done[16];
    size_t n = 0;
    const int rc = timeout_ms == 0 ? fl_poll_completions(producer, done, 16, &n)
                                   : fl_wait_completions(producer, done, 16, &n, timeout_ms);
    if (rc != FL_OK) n = 0;
    for (size_t i = 0; i < n; ++i) log.status[done[i].frame_id] = done[i].status;
    return n;
  };
  for (uint64_t id = 0; id < frames; ++id) {
    log.error = trySubmitFrame(producer, id, length);
    if (!log.error.empty()) return log;
    submitted.store(id + 1);
    take(0);
    std::this_thread::sleep_for(std::chrono::microseconds(1'000'000 / per_second));
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (log.status.size() < frames && std::chrono::steady_clock::now() < until) take(200);
  return log;
}

// What a consumer thread saw: each frame's id, flags and arrival.
struct HotArrival {
  uint64_t id = 0;
  uint32_t flags = 0;
  SteadyTime at;
  bool intact = false;
};

std::vector<HotArrival> consume(fl_client* consumer, const std::atomic<bool>& stop, std::string& error) {
  std::vector<HotArrival> got;
  while (!stop.load()) {
    fl_frame frame{};
    const int rc = fl_receive(consumer, &frame, 100);
    if (rc == FL_ETIMEDOUT || rc == FL_EAGAIN) continue;
    if (rc != FL_OK) {
      error = std::string("fl_receive: ") + fl_last_error();
      return got;
    }
    got.push_back(HotArrival{frame.frame_id, frame.flags, std::chrono::steady_clock::now(),
                             framelink::pattern::verifyPattern(frame.frame_id, frame.data, frame.length) ==
                                 framelink::pattern::kNpos});
    if (fl_release(consumer, frame.slot) != FL_OK) {
      error = std::string("fl_release: ") + fl_last_error();
      return got;
    }
  }
  return got;
}

uint32_t generation(fl_client* c) {
  fl_client_info info{};
  REQUIRE(fl_client_get_info(c, &info) == FL_OK);
  return info.generation;
}

// Streams frames from a producer on `a` to a consumer on `b` and, a third of
// the way, runs `restart` (which restarts one of them, `restarted`): every
// frame DELIVERED and received, none lost, none failed, nobody attached
// again, delivery paused for at most a second.  Prints the figures.
void streamThroughRestart(DaemonProcess& a, DaemonProcess& b, DaemonProcess& restarted,
                          const std::string& stream, const std::function<void()>& restart) {
  constexpr uint64_t kFrames = 240;
  constexpr uint64_t kLength = 1024 * 1024;
  constexpr uint64_t kRestartAfter = 80;
  Client consumer = attachConsumer(b, stream, 8, kLength);
  Client producer = attachProducer(a, stream, 8, kLength);
  std::atomic<uint64_t> submitted{0};
  std::atomic<bool> stop{false};
  std::string consume_error;
  std::vector<HotArrival> arrivals;
  std::thread reader([&] { arrivals = consume(consumer.get(), stop, consume_error); });
  HotProducerLog log;
  std::thread writer([&] { log = produce(producer.get(), kFrames, kLength, 100, submitted); });

  while (submitted.load() < kRestartAfter && log.error.empty())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto stop_started = std::chrono::steady_clock::now();
  restart();
  const auto restart_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - stop_started)
          .count();
  writer.join();
  // The last frames' arrival: the consumer gets what it was sent before it stops.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (log.status.size() == kFrames) break;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop.store(true);
  reader.join();

  INFO("restarted " << restarted.id() << " log:\n" << restarted.log());
  CHECK(restarted.waitForLog("taken over from the daemon before", std::chrono::milliseconds(2000)));
  REQUIRE(log.error.empty());
  REQUIRE(consume_error.empty());
  // No application error: every frame DELIVERED, and nobody attached again.
  size_t failed = 0;
  for (const auto& [id, status] : log.status) failed += status == FL_OK ? 0 : 1;
  CHECK(log.status.size() == kFrames);
  CHECK(failed == 0);
  CHECK(generation(producer.get()) == 0);
  CHECK(generation(consumer.get()) == 0);
  // No frame lost; a frame seen twice only flagged as a possible redelivery.
  std::map<uint64_t, int> seen;
  size_t unflagged_twice = 0;
  size_t corrupt = 0;
  double gap_ms = 0;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const HotArrival& got = arrivals[i];
    if (seen[got.id]++ != 0 && (got.flags & FL_SLOT_MAYBE_REDELIVERED) == 0) ++unflagged_twice;
    corrupt += got.intact ? 0 : 1;
    if (i != 0) {
      gap_ms =
          std::max(gap_ms, std::chrono::duration<double, std::milli>(got.at - arrivals[i - 1].at).count());
    }
  }
  size_t lost = 0;
  for (uint64_t id = 0; id < kFrames; ++id) lost += seen.count(id) == 0 ? 1 : 0;
  std::printf(
      "hot restart of %s (%s): %zu frames, %zu lost, %zu failed, %zu redelivered (flagged), longest gap in "
      "delivery %.0f ms, stop-to-ready %lld ms\n",
      restarted.id().c_str(), stream.c_str(), static_cast<size_t>(kFrames), lost, failed,
      arrivals.size() - seen.size(), gap_ms, static_cast<long long>(restart_ms));
  CHECK(lost == 0);
  CHECK(unflagged_twice == 0);
  CHECK(corrupt == 0);
  // The gap the issue allows; a sanitizer's daemon starts several times slower.
  CHECK(gap_ms <= (kSanitized ? 5000.0 : 1000.0));
}

// SIGTERM under the keeper, then the next daemon started with what it kept:
// a restart as systemd makes one.  `start_again` starts it.
std::function<void()> keeperRestart(DaemonProcess& d, FdKeeper& keeper, std::function<void()> start_again) {
  return [&d, &keeper, start_again = std::move(start_again)] {
    const pid_t before = d.pid();
    CHECK(d.terminate(std::chrono::milliseconds(10000)) == 0);
    keeper.settle();
    const size_t kept = keeper.size();
    start_again();
    keeper.settle();
    CHECK(d.pid() != before);
    CHECK(kept >= 8);           // the state, the listener and six a client
    CHECK(keeper.size() == 0);  // the new daemon took them, and the store let go
  };
}

DaemonProcess::Options hotOptions(const std::string& id, const std::string& transport) {
  DaemonProcess::Options o;
  o.id = id;
  o.token = "hot-restart";
  o.transports = transport;
  return o;
}

}  // namespace

TEST_CASE("hot restart: a producer streams through a restart of its own daemon",
          "[integration][hot_restart]") {
  const std::string transport = GENERATE(std::string("tcp"), std::string("grpc"));
  FdKeeper keeper;
  DaemonProcess b(hotOptions("b", transport));
  DaemonProcess::Options ao = hotOptions("a", transport);
  ao.peers = {"b=" + b.grpcAddress()};
  ao.fd_keeper = &keeper;
  DaemonProcess a(ao);
  streamThroughRestart(a, b, a, "hot-" + transport, keeperRestart(a, keeper, [&] { a.restart(); }));
}

TEST_CASE("hot restart: a consumer keeps receiving through a restart of its own daemon",
          "[integration][hot_restart]") {
  const std::string transport = GENERATE(std::string("tcp"), std::string("grpc"));
  FdKeeper keeper;
  DaemonProcess::Options bo = hotOptions("b", transport);
  bo.fd_keeper = &keeper;
  DaemonProcess b(bo);
  bo.listen = b.grpcAddress();  // the same port after the restart: a dials it
  DaemonProcess::Options ao = hotOptions("a", transport);
  ao.peers = {"b=" + b.grpcAddress()};
  DaemonProcess a(ao);
  streamThroughRestart(a, b, b, "hot-in-" + transport, keeperRestart(b, keeper, [&] { b.restart(bo); }));
}

TEST_CASE("hot restart: without a store a SIGTERM stops the daemon as before", "[integration][hot_restart]") {
  DaemonProcess a(hotOptions("a", "tcp"));
  Client producer = attachProducer(a, "cold", 4, 64 * 1024);
  REQUIRE(a.terminate() == 0);
  // Nobody keeps its socket: the producer sees its daemon go.
  CHECK(fl_check_daemon(producer.get()) == FL_ERR_DAEMON_GONE);
  CHECK_FALSE(a.waitForLog("hot restart", std::chrono::milliseconds(100)));
}

TEST_CASE("hot restart: a producer and a consumer of one daemon stream through its restart, zero-copy",
          "[integration][hot_restart]") {
  FdKeeper keeper;
  DaemonProcess::Options o = hotOptions("a", "tcp");
  o.fd_keeper = &keeper;
  DaemonProcess a(o);
  // Frames lent to the consumer: its daemon after the restart lends the producer's segment again.
  streamThroughRestart(a, a, a, "hot-local", keeperRestart(a, keeper, [&] { a.restart(); }));
}

TEST_CASE("hot restart in place: SIGUSR2 execs the daemon again, which takes its clients over",
          "[integration][hot_restart]") {
  const std::string transport = GENERATE(std::string("tcp"), std::string("grpc"));
  DaemonProcess b(hotOptions("b", transport));
  DaemonProcess::Options ao = hotOptions("a", transport);
  ao.peers = {"b=" + b.grpcAddress()};
  DaemonProcess a(ao);  // no keeper: no systemd at all
  const pid_t pid = a.pid();
  streamThroughRestart(a, b, a, "in-place-" + transport, [&] { a.restartInPlace(); });
  CHECK(a.pid() == pid);
  CHECK(a.waitForLog("restart in place:", std::chrono::milliseconds(100)));
}

TEST_CASE("hot restart: a frame the consumer holds across its daemon's restart is released to the next one",
          "[integration][hot_restart]") {
  FdKeeper keeper;
  DaemonProcess::Options bo = hotOptions("b", "tcp");
  bo.fd_keeper = &keeper;
  DaemonProcess b(bo);
  bo.listen = b.grpcAddress();
  DaemonProcess::Options ao = hotOptions("a", "tcp");
  ao.peers = {"b=" + b.grpcAddress()};
  DaemonProcess a(ao);
  constexpr uint64_t kLen = 64 * 1024;
  Client consumer = attachConsumer(b, "held", 4, kLen);
  Client producer = attachProducer(a, "held", 4, kLen);
  submitFrame(producer.get(), 1, kLen);
  const fl_frame held = receiveFrame(consumer.get(), std::chrono::milliseconds(10000));
  REQUIRE(held.frame_id == 1);
  keeperRestart(b, keeper, [&] { b.restart(bo); })();
  INFO("b's log:\n" << b.log());
  // Unacknowledged, the frame is sent again to the next daemon, flagged, into another slot.
  const fl_frame again = receiveFrame(consumer.get(), std::chrono::milliseconds(10000));
  CHECK(again.frame_id == 1);
  CHECK((again.flags & FL_SLOT_MAYBE_REDELIVERED) != 0);
  CHECK(again.slot != held.slot);
  CHECK(fl_release(consumer.get(), held.slot) == FL_OK);
  CHECK(fl_release(consumer.get(), again.slot) == FL_OK);
  const auto done = collectCompletions(producer.get(), 1, std::chrono::milliseconds(10000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  CHECK(generation(consumer.get()) == 0);
  // Every slot serves again, the one held across the restart too.
  std::vector<uint32_t> slots;
  for (uint64_t id = 2; id < 6; ++id) {
    submitFrame(producer.get(), id, kLen);
    slots.push_back(receiveFrame(consumer.get(), std::chrono::milliseconds(10000)).slot);
  }
  CHECK(std::find(slots.begin(), slots.end(), held.slot) != slots.end());
}
