// The daemon's session timers, and the Session writer on a callback call:
// one write out at a time, started by the writer and reported done by the
// call; keepalives and the silence check on the timers' thread.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/session_timers.h"
#include "agent/session_writer.h"

using namespace framelink;
using namespace std::chrono_literals;

namespace {

using TimerClock = SessionTimers::Clock;

// Polls `pred` for up to 5 s.
template <typename Pred>
bool soon(Pred pred) {
  const auto until = TimerClock::now() + 5s;
  while (TimerClock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

// A callback call's writes as the writer starts them; the test says when each is done.
class AsyncCall {
 public:
  bool start(const v1::PeerMessage& m, bool more) {
    std::lock_guard<std::mutex> lock(mutex_);
    started_.push_back(m);
    more_.push_back(more);
    return open_;
  }
  size_t started() {
    std::lock_guard<std::mutex> lock(mutex_);
    return started_.size();
  }
  v1::PeerMessage message(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return started_.at(i);
  }
  bool more(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return more_.at(i);
  }
  void end() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
  }

 private:
  std::mutex mutex_;
  std::vector<v1::PeerMessage> started_;
  std::vector<bool> more_;
  bool open_ = true;
};

v1::PeerMessage closeOf(uint64_t stream_id) {
  v1::PeerMessage m;
  m.mutable_stream_close()->set_stream_id(stream_id);
  return m;
}

std::shared_ptr<SessionWriter> writerOn(AsyncCall& call, SessionTimers& timers,
                                        std::chrono::milliseconds keepalive,
                                        std::chrono::milliseconds silence, std::atomic<int>& cuts) {
  return SessionWriter::makeAsync(
      [&call](const v1::PeerMessage& m, bool more) { return call.start(m, more); }, keepalive, silence,
      [&cuts] { ++cuts; }, timers);
}

}  // namespace

TEST_CASE("session timers: callbacks run in time order, a cancelled one never", "[session_timers]") {
  SessionTimers timers;
  std::mutex mutex;
  std::vector<int> ran;
  auto note = [&](int n) {
    return [&, n] {
      std::lock_guard<std::mutex> lock(mutex);
      ran.push_back(n);
    };
  };
  const auto now = TimerClock::now();
  timers.at(now + 60ms, note(3));
  const SessionTimers::Id cancelled = timers.at(now + 40ms, note(99));
  timers.at(now + 20ms, note(2));  // added after a later one, runs before it
  timers.at(now - 1s, note(1));    // already due
  timers.cancel(cancelled);
  REQUIRE(soon([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return ran.size() >= 3;
  }));
  std::this_thread::sleep_for(60ms);
  std::lock_guard<std::mutex> lock(mutex);
  CHECK(ran == std::vector<int>{1, 2, 3});
  CHECK(timers.waiting() == 0);
}

TEST_CASE("session timers: cancel waits for a callback that runs, and may be called from it",
          "[session_timers]") {
  SessionTimers timers;
  std::atomic<bool> inside{false};
  std::atomic<bool> finished{false};
  const SessionTimers::Id id = timers.at(TimerClock::now(), [&] {
    inside = true;
    std::this_thread::sleep_for(100ms);
    finished = true;
  });
  REQUIRE(soon([&] { return inside.load(); }));
  timers.cancel(id);
  CHECK(finished.load());  // not before the callback returned

  std::atomic<bool> self_cancelled{false};
  SessionTimers::Id self = 0;
  std::mutex mutex;
  {
    std::lock_guard<std::mutex> lock(mutex);
    self = timers.at(TimerClock::now(), [&] {
      std::lock_guard<std::mutex> inner(mutex);
      timers.cancel(self);  // would wait for itself forever
      self_cancelled = true;
    });
  }
  CHECK(soon([&] { return self_cancelled.load(); }));
}

TEST_CASE("session writer on a callback call: one write out at a time, in order, coalescing hinted",
          "[session_writer]") {
  SessionTimers timers;
  AsyncCall call;
  std::atomic<int> cuts{0};
  auto writer = writerOn(call, timers, 60000ms, 0ms, cuts);
  writer->send(closeOf(1));
  writer->send(closeOf(2));
  writer->send(closeOf(3));
  REQUIRE(call.started() == 1);  // the next waits for the first to be done
  CHECK(call.message(0).stream_close().stream_id() == 1);
  CHECK_FALSE(call.more(0));  // it was alone when it went
  writer->writeDone(true);
  REQUIRE(call.started() == 2);
  CHECK(call.message(1).stream_close().stream_id() == 2);
  CHECK(call.more(1));  // one more waits: the call may hold it back
  writer->writeDone(true);
  REQUIRE(call.started() == 3);
  CHECK(call.message(2).stream_close().stream_id() == 3);
  CHECK_FALSE(call.more(2));  // the last of the queue goes out now
  writer->writeDone(true);
  CHECK(writer->queuedBytes() == 0);
  CHECK_FALSE(writer->failed());
  writer->close();
  writer->send(closeOf(4));
  CHECK(call.started() == 3);  // nothing starts on a closed writer
  CHECK(cuts == 0);
}

TEST_CASE("session writer on a callback call: keepalives and the silence check run on the timers",
          "[session_writer]") {
  SessionTimers timers;
  AsyncCall call;
  std::atomic<int> cuts{0};
  auto writer = writerOn(call, timers, 10ms, 0ms, cuts);
  // No thread of the writer's own: the timers start its keepalive, and the next once this one is done.
  REQUIRE(soon([&] { return call.started() >= 1; }));
  CHECK(call.message(0).keepalive().timestamp_ns() != 0);
  writer->writeDone(true);
  REQUIRE(soon([&] { return call.started() >= 2; }));
  CHECK(call.message(1).has_keepalive());
  writer->writeDone(true);
  writer->close();
  CHECK(cuts == 0);

  // A peer that says nothing for link_timeout is given up: the call is cut, once.
  AsyncCall quiet;
  auto silent = writerOn(quiet, timers, 10ms, 80ms, cuts);
  const auto until = TimerClock::now() + 5s;
  for (size_t done = 0; !silent->failed() && TimerClock::now() < until; std::this_thread::sleep_for(1ms)) {
    if (quiet.started() > done) {
      ++done;
      silent->writeDone(true);  // its keepalives go: only the peer's silence counts
    }
  }
  REQUIRE(silent->failed());
  CHECK(silent->failure().find("link_timeout_ms 80") != std::string::npos);
  CHECK(soon([&] { return cuts == 1; }));
  std::this_thread::sleep_for(50ms);
  CHECK(cuts == 1);
}

TEST_CASE(
    "session writer on a callback call: sendLast cuts once its message is written; a failed write ends it",
    "[session_writer]") {
  SessionTimers timers;
  AsyncCall call;
  std::atomic<int> cuts{0};
  auto writer = writerOn(call, timers, 60000ms, 0ms, cuts);
  writer->send(closeOf(1));
  v1::PeerMessage fin;
  fin.mutable_fin()->set_reason("bye");
  CHECK(writer->sendLast(fin));
  writer->send(closeOf(2));  // after the last: dropped
  REQUIRE(call.started() == 1);
  CHECK(cuts == 0);
  writer->writeDone(true);
  REQUIRE(call.started() == 2);
  CHECK(call.message(1).has_fin());
  CHECK(cuts == 0);  // not before the Fin is written
  writer->writeDone(true);
  CHECK(cuts == 1);
  CHECK(call.started() == 2);

  AsyncCall broken;
  auto failing = writerOn(broken, timers, 60000ms, 0ms, cuts);
  failing->send(closeOf(1));
  failing->send(closeOf(2));
  failing->writeDone(false);
  CHECK(failing->failed());
  CHECK(failing->failure() == "writing to the peer failed");
  CHECK(broken.started() == 1);

  // A call that ended before the write could start: the writer gives up.
  AsyncCall ended;
  ended.end();
  auto late = writerOn(ended, timers, 60000ms, 0ms, cuts);
  late->send(closeOf(1));
  CHECK(late->failed());
}
