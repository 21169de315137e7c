// The Session's writer: a peer that stops reading cannot make it queue
// without bound, keepalive echoes waiting for such a peer are one at most,
// and an idle writer still sends its own keepalive.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/session_writer.h"

using namespace framelink;
using namespace std::chrono_literals;

namespace {

// A Session call whose writes block until the test opens it, as on a peer
// that stopped reading once the flow-control window is full; from then on
// every write succeeds (`ok`) or fails.
class StalledCall {
 public:
  bool write(const v1::PeerMessage& m) {
    std::unique_lock<std::mutex> lock(mutex_);
    ++attempts_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
    if (ok_) written_.push_back(m);
    return ok_;
  }
  void open(bool ok) {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    ok_ = ok;
    cv_.notify_all();
  }
  // Until the writer's thread is inside a write.
  void waitForWrite() {
    std::unique_lock<std::mutex> lock(mutex_);
    REQUIRE(cv_.wait_for(lock, 5s, [this] { return attempts_ > 0; }));
  }
  std::vector<v1::PeerMessage> written() {
    std::lock_guard<std::mutex> lock(mutex_);
    return written_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int attempts_ = 0;
  bool open_ = false;
  bool ok_ = false;
  std::vector<v1::PeerMessage> written_;
};

v1::PeerMessage streamClose(uint64_t stream_id) {
  v1::PeerMessage m;
  m.mutable_stream_close()->set_stream_id(stream_id);
  return m;
}

}  // namespace

TEST_CASE("session writer: a peer that reads nothing gets its session cut once the queue passes the bound",
          "[session_writer]") {
  StalledCall call;
  int cuts = 0;  // on the test's thread: send() calls it
  SessionWriter writer([&call](const v1::PeerMessage& m, bool) { return call.write(m); }, 60000ms,
                       [&] {
                         ++cuts;
                         call.open(false);  // the call ends: the blocked write fails
                       });
  writer.send(streamClose(1));
  call.waitForWrite();  // stuck there until the call ends
  v1::PeerMessage big;
  big.mutable_fin()->set_reason(std::string(1000, 'f'));
  const size_t per_message = big.ByteSizeLong();
  size_t sent = 0;
  for (; sent < 2 * SessionWriter::kMaxQueuedBytes / per_message && !writer.failed(); ++sent) {
    writer.send(big);
    REQUIRE(writer.queuedBytes() <= SessionWriter::kMaxQueuedBytes);
  }
  CHECK(writer.failed());
  CHECK(sent > SessionWriter::kMaxQueuedBytes / per_message);  // not before the bound
  CHECK(cuts == 1);
  CHECK_THAT(writer.failure(), Catch::Contains("has not read its Session"));
  CHECK(writer.queuedBytes() == 0);  // dropped: the session is gone
  writer.send(big);                  // and nothing more is taken
  CHECK(writer.queuedBytes() == 0);
  CHECK(cuts == 1);
  writer.close();
  CHECK(call.written().empty());
}

TEST_CASE("session writer: keepalive echoes waiting for the peer are one, the newest", "[session_writer]") {
  StalledCall call;
  SessionWriter writer([&call](const v1::PeerMessage& m, bool) { return call.write(m); }, 60000ms);
  writer.send(streamClose(1));
  call.waitForWrite();
  // A peer that floods keepalives and reads nothing.
  for (uint64_t ts = 1; ts <= 100'000; ++ts) {
    v1::PeerMessage echo;
    echo.mutable_keepalive()->set_echo_ns(ts);
    writer.send(std::move(echo));
  }
  writer.send(streamClose(2));
  call.open(true);
  writer.close();
  const std::vector<v1::PeerMessage> written = call.written();
  size_t echoes = 0;
  for (const auto& m : written) {
    if (!m.has_keepalive() || m.keepalive().echo_ns() == 0) continue;
    ++echoes;
    CHECK(m.keepalive().echo_ns() == 100'000);
  }
  CHECK(echoes == 1);
  // Everything else still goes, in order.
  REQUIRE(written.size() >= 2);
  CHECK(written.front().stream_close().stream_id() == 1);
  CHECK(written.back().stream_close().stream_id() == 2);
}

TEST_CASE("session writer: an idle writer sends its own keepalive, and an echo at once", "[session_writer]") {
  StalledCall call;
  call.open(true);
  SessionWriter writer([&call](const v1::PeerMessage& m, bool) { return call.write(m); }, 5ms);
  v1::PeerMessage echo;
  echo.mutable_keepalive()->set_echo_ns(42);
  writer.send(std::move(echo));
  auto has = [&call](auto pred) {
    for (const auto& m : call.written()) {
      if (pred(m)) return true;
    }
    return false;
  };
  const auto end = std::chrono::steady_clock::now() + 5s;
  while (!has([](const v1::PeerMessage& m) { return m.keepalive().timestamp_ns() != 0; }) &&
         std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(1ms);
  }
  writer.close();
  CHECK(has([](const v1::PeerMessage& m) { return m.keepalive().echo_ns() == 42; }));
  CHECK(has([](const v1::PeerMessage& m) { return m.keepalive().timestamp_ns() != 0; }));
  CHECK_FALSE(writer.failed());
  CHECK(writer.failure().empty());
}

TEST_CASE("session writer: a peer heard from nothing for link_timeout is given up, though writes still go",
          "[session_writer]") {
  // A path that carries only our direction: every write succeeds, the
  // peer's keepalives never arrive.  The call stays open, so only the
  // writer's silence check can end the link.
  StalledCall call;
  call.open(true);
  std::atomic<int> cuts{0};
  // Taken before the writer starts its silence clock: a slow thread here cannot make it early.
  const auto start = std::chrono::steady_clock::now();
  SessionWriter writer([&call](const v1::PeerMessage& m, bool) { return call.write(m); }, 5ms, 60ms,
                       [&cuts] { cuts.fetch_add(1); });
  const auto end = start + 5s;
  while (cuts.load() == 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(cuts.load() == 1);
  CHECK(took >= 60ms);
  CHECK(writer.failed());
  INFO(writer.failure());
  CHECK(writer.failure().find("nothing, not even a keepalive, arrived from the peer") != std::string::npos);
  writer.close();
}

TEST_CASE("session writer: a peer heard from keeps its link however long it runs", "[session_writer]") {
  StalledCall call;
  call.open(true);
  std::atomic<int> cuts{0};
  SessionWriter writer([&call](const v1::PeerMessage& m, bool) { return call.write(m); }, 5ms, 60ms,
                       [&cuts] { cuts.fetch_add(1); });
  // Four times the silence limit, hearing from the peer every 10 ms.
  for (int i = 0; i < 24; ++i) {
    writer.heard();
    std::this_thread::sleep_for(10ms);
  }
  writer.close();
  CHECK(cuts.load() == 0);
  CHECK_FALSE(writer.failed());
}

TEST_CASE("session writer: nothing is written after sendLast's message, not even an echo",
          "[session_writer]") {
  StalledCall call;
  std::mutex cut_mu;
  std::condition_variable cut_cv;
  bool cut = false;
  SessionWriter writer([&call](const v1::PeerMessage& m, bool) { return call.write(m); }, 60000ms,
                       [&] {
                         std::lock_guard<std::mutex> lock(cut_mu);
                         cut = true;
                         cut_cv.notify_all();
                       });
  writer.send(streamClose(1));
  call.waitForWrite();  // the Fin waits behind it
  v1::PeerMessage fin;
  fin.mutable_fin()->set_reason("protocol error");
  REQUIRE(writer.sendLast(fin));
  v1::PeerMessage echo;
  echo.mutable_keepalive()->set_echo_ns(7);
  writer.send(std::move(echo));
  writer.send(streamClose(2));
  call.open(true);
  {
    std::unique_lock<std::mutex> lock(cut_mu);
    REQUIRE(cut_cv.wait_for(lock, 5s, [&] { return cut; }));
  }
  writer.close();
  const std::vector<v1::PeerMessage> written = call.written();
  REQUIRE(written.size() == 2);
  CHECK(written[0].stream_close().stream_id() == 1);
  CHECK(written[1].fin().reason() == "protocol error");
}

TEST_CASE(
    "session writer: its own keepalive goes every period, though the peer's keepalives wake it more often",
    "[session_writer]") {
  // The peer's keepalives come every 30 ms, each answered with an echo at once; this end's own
  // keepalive (50 ms) must not wait for a quiet period that never comes: without it this end
  // never measures the round trip.
  StalledCall call;
  call.open(true);
  SessionWriter writer([&call](const v1::PeerMessage& m, bool) { return call.write(m); }, 50ms);
  auto own = [&call] {
    int n = 0;
    for (const auto& m : call.written()) n += m.keepalive().timestamp_ns() != 0 ? 1 : 0;
    return n;
  };
  const auto start = std::chrono::steady_clock::now();
  for (int i = 1; i <= 20; ++i) {
    v1::PeerMessage echo;
    echo.mutable_keepalive()->set_echo_ns(static_cast<uint64_t>(i));
    writer.send(std::move(echo));
    std::this_thread::sleep_for(30ms);
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  writer.close();
  const int echoes = static_cast<int>(call.written().size()) - own();
  INFO("own keepalives " << own() << ", echoes " << echoes << " in "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms");
  CHECK(echoes == 20);
  // One a period (50 ms) over at least 600 ms: some 12, and at least a few under load.
  CHECK(own() >= 4);
}
