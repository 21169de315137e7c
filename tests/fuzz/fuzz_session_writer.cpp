// libFuzzer target: the Session's writer (agent/session_writer.cpp) driven
// by a daemon that sends control messages of every kind and size while a
// hostile peer reads all, some or none of them, or makes a write fail.  Each
// input byte is one step: send a StreamClose, a Fin of up to 4 MiB, a
// keepalive echo; let the peer read n messages or everything; fail the next
// write; sendLast a Fin; close.  The writer's thread writes into a scripted
// call, and every step waits until that thread is blocked in a write or has
// nothing left to write, so a model of the queue can check it exactly.
// Invariants, checked after every step:
//   * queuedBytes() never exceeds kMaxQueuedBytes and equals the bytes of the
//     messages the model holds as queued; past the bound the writer fails
//     and cuts the call once, and drops what waits;
//   * messages are written in the order sent, each once, except keepalive
//     echoes: one waiting echo is replaced by a newer one and goes first;
//   * `more` is set exactly when another message waits;
//   * after a failed write nothing more is written;
//   * after sendLast's message nothing more is written and the call is cut
//     once that message was written;
//   * no crash, no hang (a step that does not settle within 30 s aborts).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "agent/session_writer.h"

using namespace framelink;
using namespace std::chrono_literals;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_session_writer: %s\n", what);
  std::abort();
}

// What the writer's thread did with one message.
struct Attempt {
  std::string bytes;  // the message, serialized
  bool more = false;
  enum class Outcome { kPending, kWritten, kFailed } outcome = Outcome::kPending;
};

// The peer's end of the Session call.  A write blocks until the peer reads
// (a permit), the script fails it, or the call was cut.
class ScriptedCall {
 public:
  bool write(const v1::PeerMessage& m, bool more) {
    std::unique_lock<std::mutex> lock(mu);
    attempts.push_back(Attempt{m.SerializeAsString(), more});
    in_write = true;
    cv.notify_all();
    cv.wait(lock, [this] { return permits > 0 || fail_next || cut; });
    in_write = false;
    Attempt& a = attempts.back();
    if (cut || fail_next) {
      fail_next = false;
      a.outcome = Attempt::Outcome::kFailed;
    } else {
      --permits;
      a.outcome = Attempt::Outcome::kWritten;
    }
    cv.notify_all();
    return a.outcome == Attempt::Outcome::kWritten;
  }
  void onCut() {
    std::lock_guard<std::mutex> lock(mu);
    cut = true;
    ++cuts;
    cv.notify_all();
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<Attempt> attempts;
  bool in_write = false;
  uint64_t permits = 0;
  bool fail_next = false;
  bool cut = false;
  int cuts = 0;
};

// What the writer should hold and do, from the messages sent and the
// attempts seen so far.
struct Model {
  std::deque<v1::PeerMessage> queue;
  size_t queued_bytes = 0;
  uint64_t echo_ns = 0;  // 0: none waiting
  bool failed = false;
  bool last_queued = false;    // sendLast was called
  bool last_taken = false;     // ... and its message went to the call
  size_t last_attempt = 0;     // ... as this attempt
  bool last_written = false;   // ... and was written: the writer cuts the call now
  bool cut_for_bound = false;  // a send passed kMaxQueuedBytes: the writer cut the call
  bool closed = false;
  size_t seen = 0;         // attempts checked
  size_t settled = 0;      // attempts whose outcome was applied
  std::string last_bytes;  // sendLast's message, serialized

  size_t pending() const { return failed ? 0 : queue.size() + (echo_ns != 0 ? 1 : 0); }
  bool ignoresSends() const { return failed || closed || last_queued; }
};

class Harness {
 public:
  Harness()
      : writer_([this](const v1::PeerMessage& m, bool more) { return call_.write(m, more); }, 1h,
                [this] { call_.onCut(); }) {}

  void send(v1::PeerMessage m) {
    apply(m);
    writer_.send(std::move(m));
    settle();
  }
  void sendLast(v1::PeerMessage m) {
    apply(m);
    if (!model_.ignoresSends()) {
      model_.last_queued = true;
      model_.last_bytes = m.SerializeAsString();
    }
    if (!writer_.sendLast(std::move(m))) fail("sendLast refused with a cut function");
    settle();
  }
  void peerReads(uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(call_.mu);
      call_.permits += n;
    }
    call_.cv.notify_all();
    settle();
  }
  void failNextWrite() {
    {
      std::lock_guard<std::mutex> lock(call_.mu);
      call_.fail_next = true;
    }
    call_.cv.notify_all();
    settle();
    // A failure not yet used by a write stays armed for the next one, as a
    // broken call fails every write; the model learns of it from the outcome.
  }
  void close() {
    peerReads(uint64_t{1} << 40);  // close() waits until what is queued was written
    writer_.close();
    std::lock_guard<std::mutex> lock(call_.mu);
    check();
    if (model_.pending() != 0) fail("close() returned with messages still queued");
    model_.closed = true;
  }

 private:
  // The model's side of send(): the writer takes `m` unless it stopped.
  void apply(const v1::PeerMessage& m) {
    std::lock_guard<std::mutex> lock(call_.mu);
    if (model_.ignoresSends()) return;
    if (m.has_keepalive() && m.keepalive().echo_ns() != 0) {
      model_.echo_ns = m.keepalive().echo_ns();
      return;
    }
    const size_t bytes = m.ByteSizeLong();
    if (bytes > SessionWriter::kMaxQueuedBytes - model_.queued_bytes) {
      model_.failed = true;  // the writer gives up and cuts the call
      model_.cut_for_bound = true;
      model_.queue.clear();
      model_.queued_bytes = 0;
      model_.echo_ns = 0;
      return;
    }
    model_.queued_bytes += bytes;
    model_.queue.push_back(m);
  }

  // Checks the attempts the writer's thread made since the last call.
  void check() {
    while (model_.seen < call_.attempts.size()) {
      const Attempt& a = call_.attempts[model_.seen++];
      if (model_.failed) fail("a write after the writer failed");
      if (model_.last_taken) fail("a write after sendLast's message");
      std::string expected;
      if (model_.echo_ns != 0) {
        v1::PeerMessage echo;
        echo.mutable_keepalive()->set_echo_ns(model_.echo_ns);
        // An echo says what this end took off the data transport: nothing
        // here (the harness never calls setDataReceived).
        echo.mutable_keepalive()->set_data_received(0);
        expected = echo.SerializeAsString();
        model_.echo_ns = 0;
      } else if (!model_.queue.empty()) {
        expected = model_.queue.front().SerializeAsString();
        model_.queued_bytes -= model_.queue.front().ByteSizeLong();
        model_.queue.pop_front();
      } else {
        fail("a write with nothing queued (an idle keepalive cannot be due within the hour)");
      }
      if (a.bytes != expected) fail("a message written out of order, twice, or not as sent");
      if (a.more != (model_.pending() != 0)) fail("`more` does not say whether another message waits");
      if (model_.last_queued && model_.pending() == 0 && a.bytes == model_.last_bytes) {
        model_.last_taken = true;
        model_.last_attempt = model_.seen - 1;
      }
    }
    while (model_.settled < call_.attempts.size() &&
           call_.attempts[model_.settled].outcome != Attempt::Outcome::kPending) {
      const size_t index = model_.settled++;
      const bool written = call_.attempts[index].outcome == Attempt::Outcome::kWritten;
      if (written && model_.last_taken && index == model_.last_attempt) model_.last_written = true;
      if (!written && !model_.failed) {
        model_.failed = true;  // the writer gives up: what waits is dropped
        model_.queue.clear();
        model_.queued_bytes = 0;
        model_.echo_ns = 0;
      }
    }
  }

  // Waits until the writer's thread is blocked in a write the peer does not
  // read, or has nothing left to do; then checks the writer against the model.
  void settle() {
    std::unique_lock<std::mutex> lock(call_.mu);
    // The writer's own state changes without a notification on the call's
    // condition variable: look again every millisecond.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    auto settledNow = [this] {
      check();
      if (call_.in_write) return call_.permits == 0 && !call_.fail_next && !call_.cut;
      if (model_.settled != call_.attempts.size()) return false;
      if (model_.pending() != 0) return false;
      // A failed write: the writer's thread gives up once the write returned.
      // (Its lock is never held while it calls into the call: no deadlock.)
      if (model_.failed && !writer_.failed()) return false;
      // sendLast: the writer cuts the call right after its last write.
      return !model_.last_written || call_.cuts >= 1;
    };
    bool settled = false;
    while (!(settled = call_.cv.wait_for(lock, 1ms, settledNow)) &&
           std::chrono::steady_clock::now() < deadline) {
    }
    if (!settled) fail("the writer neither wrote nor waited for the peer within 30 s");
    lock.unlock();

    const size_t queued = writer_.queuedBytes();
    if (queued > SessionWriter::kMaxQueuedBytes) fail("queued bytes above kMaxQueuedBytes");
    lock.lock();
    if (queued != model_.queued_bytes) fail("queued bytes differ from the messages waiting");
    if (writer_.failed() != model_.failed) fail("failed() differs from the model");
    if (call_.cuts > 1) fail("the call was cut twice");
    const int expected_cuts = model_.cut_for_bound || model_.last_written ? 1 : 0;
    if (call_.cuts != expected_cuts) fail("the call was cut when it should not, or not when it should");
  }

  ScriptedCall call_;  // outlives the writer, whose thread writes into it
  Model model_;
  SessionWriter writer_;
};

v1::PeerMessage streamClose(uint64_t id) {
  v1::PeerMessage m;
  m.mutable_stream_close()->set_stream_id(id);
  return m;
}

v1::PeerMessage fin(uint64_t id, size_t reason_bytes) {
  v1::PeerMessage m;
  m.mutable_fin()->set_code(static_cast<v1::ErrorCode>(id % 4));
  std::string reason = std::to_string(id);
  reason.resize(std::max(reason.size(), reason_bytes), 'r');
  m.mutable_fin()->set_reason(std::move(reason));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness h;
  uint64_t id = 0;
  size_t i = 0;
  auto next = [&] { return i < size ? data[i++] : uint8_t{0}; };
  while (i < size) {
    const uint8_t op = next();
    ++id;
    switch (op % 8) {
      case 0:
        h.send(streamClose(id));
        break;
      case 1: {  // up to 4 MiB in 16 KiB steps, plus a few bytes
        const size_t bytes = size_t{next()} * 16384 + next();
        h.send(fin(id, bytes));
        break;
      }
      case 2: {
        v1::PeerMessage echo;
        echo.mutable_keepalive()->set_echo_ns(id);
        h.send(std::move(echo));
        break;
      }
      case 3:
        h.peerReads(op >> 3);
        break;
      case 4:
        h.failNextWrite();
        break;
      case 5:
        h.sendLast(fin(id, op >> 3));
        break;
      case 6:
        h.peerReads(uint64_t{1} << 40);
        break;
      case 7:
        h.close();
        break;
    }
  }
  h.close();
  return 0;
}
