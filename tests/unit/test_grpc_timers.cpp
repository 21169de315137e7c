// gRPC's own timers with its timer thread asleep until the next is due
// (proxy/link/grpc_timers.h): alarms armed while the thread sleeps for good
// run on time and in order, cancelled ones are told so, a call's deadline
// still ends it, and an idle timer thread does not wake.  gRPC's own timing,
// measured the same way, wakes every second (the baseline, --grpc-own-timers).
//
// The table goes in before gRPC starts, so this test has a main of its own.
#define CATCH_CONFIG_RUNNER
#include <grpcpp/alarm.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "link/grpc_timers.h"
#include "thread_census.h"

using namespace std::chrono_literals;
using Clock = std::chrono::system_clock;

namespace {

bool g_quiet = false;  // the daemon's timing, not gRPC's own

uint64_t timerThreadRuns() { return framelink::test::ownThreadsNamed("grpc_global_tim").runs; }

long long msSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// A started gRPC with nothing due, its timer thread left to settle into its sleep.
std::unique_ptr<grpc::CompletionQueue> settledQueue() {
  auto cq = std::make_unique<grpc::CompletionQueue>();
  std::this_thread::sleep_for(1500ms);
  return cq;
}

struct Fired {
  intptr_t tag = -1;
  bool ok = false;
  long long at_ms = -1;
};

// The next alarm to come out of `cq`, or tag -1 after 5 s (a timer the thread slept through).
Fired nextFired(grpc::CompletionQueue& cq, Clock::time_point start) {
  void* tag = nullptr;
  bool ok = false;
  if (cq.AsyncNext(&tag, &ok, Clock::now() + 5s) != grpc::CompletionQueue::GOT_EVENT) return {};
  return {reinterpret_cast<intptr_t>(tag), ok, msSince(start)};
}

}  // namespace

TEST_CASE("grpc timers: alarms armed while the timer thread sleeps run on time, in order", "[grpc_timers]") {
  auto cq = settledQueue();
  const auto start = Clock::now();
  const std::vector<int> after_ms = {400, 50, 200, 120};
  std::vector<std::unique_ptr<grpc::Alarm>> alarms;
  for (int ms : after_ms) {
    alarms.push_back(std::make_unique<grpc::Alarm>());
    alarms.back()->Set(cq.get(), start + std::chrono::milliseconds(ms),
                       reinterpret_cast<void*>(intptr_t{ms}));
  }
  std::vector<int> order;
  for (size_t i = 0; i < after_ms.size(); ++i) {
    const Fired fired = nextFired(*cq, start);
    INFO("alarm " << fired.tag << " ran " << fired.at_ms << " ms after the start");
    REQUIRE(fired.tag > 0);  // -1: none within 5 s
    CHECK(fired.ok);
    CHECK(fired.at_ms >= fired.tag);        // never early
    CHECK(fired.at_ms < fired.tag + 2000);  // and not a sleep late
    order.push_back(static_cast<int>(fired.tag));
  }
  CHECK(order == std::vector<int>{50, 120, 200, 400});
}

TEST_CASE("grpc timers: cancelled alarms are told so, and the rest still run", "[grpc_timers]") {
  auto cq = settledQueue();
  const auto start = Clock::now();
  std::mt19937 random(7);
  std::uniform_int_distribution<int> after(10, 600);
  constexpr int kAlarms = 60;
  std::vector<std::unique_ptr<grpc::Alarm>> alarms;
  for (int i = 1; i <= kAlarms; ++i) {
    alarms.push_back(std::make_unique<grpc::Alarm>());
    alarms.back()->Set(cq.get(), start + std::chrono::milliseconds(after(random)),
                       reinterpret_cast<void*>(intptr_t{i}));
  }
  for (int i = 0; i < kAlarms; i += 3) alarms[i]->Cancel();
  int ran = 0, cancelled = 0;
  for (int i = 0; i < kAlarms; ++i) {
    const Fired fired = nextFired(*cq, start);
    REQUIRE(fired.tag > 0);
    const bool should_run = (fired.tag - 1) % 3 != 0;
    CHECK(fired.ok == should_run);
    (fired.ok ? ran : cancelled) += 1;
  }
  CHECK(ran == kAlarms - kAlarms / 3);
  CHECK(cancelled == kAlarms / 3);
}

TEST_CASE("grpc timers: alarms armed and cancelled from many threads at once all end, none a sleep late",
          "[grpc_timers]") {
  auto settle = settledQueue();
  constexpr int kThreads = 4;
  constexpr int kAlarms = 150;
  std::vector<int> ran(kThreads), cancelled(kThreads), late(kThreads), lost(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      grpc::CompletionQueue cq;
      std::mt19937 random(100 + t);
      std::uniform_int_distribution<int> after(0, 300);
      std::vector<std::unique_ptr<grpc::Alarm>> alarms;
      std::vector<Clock::time_point> due;
      for (int i = 0; i < kAlarms; ++i) {
        due.push_back(Clock::now() + std::chrono::milliseconds(after(random)));
        alarms.push_back(std::make_unique<grpc::Alarm>());
        alarms.back()->Set(&cq, due.back(), reinterpret_cast<void*>(intptr_t{i}));
        if (i % 3 == 2) alarms[i - 1]->Cancel();  // one armed just before, perhaps already run
        if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(after(random) / 10));
      }
      for (int i = 0; i < kAlarms; ++i) {
        void* tag = nullptr;
        bool ok = false;
        if (cq.AsyncNext(&tag, &ok, Clock::now() + 5s) != grpc::CompletionQueue::GOT_EVENT) {
          lost[t] = kAlarms - i;
          break;
        }
        if (!ok) {
          ++cancelled[t];
          continue;
        }
        ++ran[t];
        const auto index = static_cast<size_t>(reinterpret_cast<intptr_t>(tag));
        if (Clock::now() > due[index] + 1500ms) ++late[t];
      }
      cq.Shutdown();
      void* tag = nullptr;
      bool ok = false;
      while (cq.Next(&tag, &ok)) {
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << ran[t] << " ran, " << cancelled[t] << " cancelled, " << late[t]
                   << " late");
    CHECK(lost[t] == 0);
    CHECK(ran[t] + cancelled[t] == kAlarms);
    CHECK(ran[t] >= kAlarms - kAlarms / 3);  // a cancel may come after its alarm ran
    CHECK(late[t] == 0);
  }
}

TEST_CASE("grpc timers: a call's deadline ends it while the timer thread sleeps", "[grpc_timers]") {
  // A listener that takes connections and never says a word: only the deadline ends the call.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  REQUIRE(::listen(listener, 8) == 0);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  auto cq = settledQueue();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  const auto start = Clock::now();
  context.set_deadline(start + 300ms);
  grpc::Slice word("?");
  grpc::ByteBuffer request(&word, 1), response;
  grpc::Status status;
  bool done = false;
  std::mutex mutex;
  std::condition_variable cv;
  stub.UnaryCall(&context, "/framelink.test/Silent", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mutex);
                   status = std::move(s);
                   done = true;
                   cv.notify_all();
                 });
  std::unique_lock<std::mutex> lock(mutex);
  REQUIRE(cv.wait_for(lock, 5s, [&] { return done; }));
  const long long took = msSince(start);
  INFO("the call ended after " << took << " ms: " << status.error_message());
  CHECK(status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
  CHECK(took >= 300);
  CHECK(took < 2300);
  ::close(listener);
}

TEST_CASE("grpc timers: an idle timer thread does not wake", "[grpc_timers]") {
  REQUIRE(g_quiet);
  auto cq = settledQueue();
  REQUIRE(framelink::test::ownThreadsNamed("grpc_global_tim").threads >= 1);
  const uint64_t before = timerThreadRuns();
  std::this_thread::sleep_for(3s);
  const uint64_t woke = timerThreadRuns() - before;
  INFO("in 3 s gRPC's timer thread woke " << woke << " times");
  CHECK(woke <= 1);
}

// Run with --grpc-own-timers: gRPC's own timing, measured as above.
TEST_CASE("grpc timers: gRPC's own timer thread wakes every second while idle (the baseline)", "[baseline]") {
  REQUIRE_FALSE(g_quiet);
  auto cq = settledQueue();
  const uint64_t before = timerThreadRuns();
  std::this_thread::sleep_for(3s);
  const uint64_t woke = timerThreadRuns() - before;
  INFO("in 3 s gRPC's own timer thread woke " << woke << " times");
  CHECK(woke >= 2);
}

int main(int argc, char** argv) {
  std::vector<char*> args;
  bool own = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--grpc-own-timers") == 0) {
      own = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (!own) {
    const std::string why = framelink::installQuietGrpcTimers();
    if (!why.empty()) {
      std::fprintf(stderr, "the daemon's gRPC timing did not go in: %s\n", why.c_str());
      return 1;
    }
    g_quiet = true;
  }
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
