// The engine the daemon gives gRPC for its timers and callbacks: timers in
// time order, a cancelled one never runs, a callback that blocks holds up no
// other, the engine may be let go of from its own callback, and an idle
// engine does not wake (gRPC's own, measured the same way, wakes every second).
#include <grpc/grpc.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "captured_log.h"
#include "link/grpc_engine.h"
#include "thread_census.h"

using namespace framelink;
using namespace std::chrono_literals;
using grpc_event_engine::experimental::EventEngine;

namespace {

// Every thread of this process named `name`: how often each has been put on a CPU, summed.
uint64_t timesRun(const std::string& name) { return test::ownThreadsNamed(name).runs; }

int threadsNamed(const std::string& name) { return test::ownThreadsNamed(name).threads; }

}  // namespace

TEST_CASE("grpc engine: timers run in time order, and a cancelled one never runs", "[grpc_engine]") {
  auto engine = makeQuietEventEngine();
  std::mutex mutex;
  std::vector<int> order;
  std::promise<void> last;
  auto record = [&](int n) {
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(n);
  };
  engine->RunAfter(60ms, [&] { record(3); });
  const auto cancelled = engine->RunAfter(40ms, [&] { record(99); });
  engine->RunAfter(20ms, [&] { record(1); });
  engine->RunAfter(40ms, [&] { record(2); });
  engine->RunAfter(80ms, [&] {
    record(4);
    last.set_value();
  });
  CHECK(engine->Cancel(cancelled));
  CHECK_FALSE(engine->Cancel(cancelled));  // once only
  REQUIRE(last.get_future().wait_for(5s) == std::future_status::ready);
  std::lock_guard<std::mutex> lock(mutex);
  CHECK(order == std::vector<int>{1, 2, 3, 4});
}

TEST_CASE("grpc engine: a timer that ran cannot be cancelled, and a handle of another engine is refused",
          "[grpc_engine]") {
  auto engine = makeQuietEventEngine();
  auto other = makeQuietEventEngine();
  std::promise<void> ran;
  const auto handle = engine->RunAfter(1ms, [&] { ran.set_value(); });
  REQUIRE(ran.get_future().wait_for(5s) == std::future_status::ready);
  CHECK_FALSE(engine->Cancel(handle));
  const auto pending = engine->RunAfter(1h, [] { FAIL("a cancelled timer ran"); });
  CHECK_FALSE(other->Cancel(pending));
  CHECK(engine->Cancel(pending));
}

TEST_CASE("grpc engine: callbacks run on the engine's threads, and one that blocks holds up no other",
          "[grpc_engine]") {
  auto engine = makeQuietEventEngine();
  CHECK_FALSE(engine->IsWorkerThread());
  std::promise<bool> on_worker;
  engine->Run([&] { on_worker.set_value(engine->IsWorkerThread()); });
  CHECK(on_worker.get_future().get());

  std::mutex mutex;
  std::condition_variable cv;
  bool release = false;
  std::promise<void> blocked;
  engine->Run([&] {
    blocked.set_value();
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return release; });
  });
  blocked.get_future().wait();
  std::promise<void> other;
  engine->Run([&] { other.set_value(); });  // a thread more, since the one it has is busy
  CHECK(other.get_future().wait_for(5s) == std::future_status::ready);
  std::promise<void> timer;
  engine->RunAfter(5ms, [&] { timer.set_value(); });
  CHECK(timer.get_future().wait_for(5s) == std::future_status::ready);
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  cv.notify_all();
  engine.reset();  // joins its threads: the blocked callback is out before what it waits on goes
}

TEST_CASE("grpc engine: an engine let go of by its own callback ends cleanly", "[grpc_engine]") {
  std::shared_ptr<EventEngine> engine(makeQuietEventEngine());
  EventEngine* raw = engine.get();
  std::promise<void> done;
  raw->Run([held = std::move(engine), &done]() mutable {
    held.reset();  // the last reference: the engine goes on its own thread
    done.set_value();
  });
  REQUIRE(done.get_future().wait_for(5s) == std::future_status::ready);
  // Its thread ends once the callback returns.
  const auto until = std::chrono::steady_clock::now() + 5s;
  while (threadsNamed("fl-grpc-engine") > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(5ms);
  }
  CHECK(threadsNamed("fl-grpc-engine") == 0);
}

// The baseline: gRPC's own engine, measured the same way as ours below.  [grpc]: Debian's gRPC is not
// built with ThreadSanitizer, whose build leaves these out.
TEST_CASE("grpc engine: gRPC's own engine wakes every second while idle (the baseline)",
          "[grpc_engine][grpc]") {
  grpc_init();  // gRPC's engine needs gRPC started
  std::unique_ptr<EventEngine> grpc_own = grpc_event_engine::experimental::CreateEventEngine();
  const auto pending = grpc_own->RunAfter(1h, [] {});
  const uint64_t before = timesRun("timer_manager");
  std::this_thread::sleep_for(3s);
  const uint64_t theirs = timesRun("timer_manager") - before;
  INFO("in 3 s gRPC's own timer thread woke " << theirs << " times");
  CHECK(theirs >= 2);
  grpc_own->Cancel(pending);
  grpc_own.reset();
  grpc_shutdown();
}

TEST_CASE("grpc engine: an idle engine does not wake", "[grpc_engine]") {
  auto engine = makeQuietEventEngine();
  const auto handle = engine->RunAfter(1h, [] {});
  std::promise<void> started;
  engine->Run([&] { started.set_value(); });  // its first thread is up
  started.get_future().wait();
  std::this_thread::sleep_for(50ms);
  const uint64_t before = timesRun("fl-grpc-engine");
  std::this_thread::sleep_for(3s);
  const uint64_t ours = timesRun("fl-grpc-engine") - before;
  INFO("in 3 s the engine's thread woke " << ours << " times");
  CHECK(ours == 0);
  CHECK(engine->Cancel(handle));
}

TEST_CASE("grpc engine: what it does not do it refuses with a status that says why, and logs once",
          "[grpc_engine]") {
  const test::CapturedLog log;  // the only refusals of this process are this test's
  auto engine = makeQuietEventEngine();
  auto resolver = engine->GetDNSResolver({});
  for (int attempt = 0; attempt < 2; ++attempt) {
    // What the status said, read on the engine's thread (no absl::Status crosses threads: Debian's
    // absl is not built with ThreadSanitizer, which would not see its reference count).
    std::promise<std::pair<bool, std::string>> looked_up;
    resolver->LookupHostname(
        [&](absl::StatusOr<std::vector<EventEngine::ResolvedAddress>> result) {
          looked_up.set_value(
              {absl::IsUnimplemented(result.status()), std::string(result.status().message())});
        },
        "localhost", "80", 1s);
    const auto [unimplemented, message] = looked_up.get_future().get();
    CHECK(unimplemented);
    CHECK(message.find("GRPC_EXPERIMENTS") != std::string::npos);
  }
  resolver.reset();
  engine.reset();  // its threads joined: nothing more is logged
  CHECK(log.count("gRPC asked for") == 1);
}
