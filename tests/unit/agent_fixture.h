// What the data agent's tests share: the agent driven the way the daemon
// drives it -- real segments, a real tcp transport pair over loopback, peer
// messages in through the command queue, the agent's outgoing control
// messages captured from its session writer and from the control records
// that reach the peer's end of the transport, and a manual clock.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent_clock.h"
#include "agent/data_agent.h"
#include "attach/client_session.h"
#include "attach/segment.h"
#include "config/config.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "metrics/metrics.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_transport.h"

using namespace std::chrono_literals;

namespace framelink {
namespace agent_test {

inline constexpr auto kDeadline = 5s;

// Collects what the agent sends to its peer: on the Session (write, from
// the session writer's thread) and in control records on the transport
// (pump, from the test's thread, which plays the peer).
class Capture {
 public:
  bool write(const v1::PeerMessage& m) {
    std::lock_guard<std::mutex> lock(mutex_);
    messages_.push_back(m);
    cv_.notify_all();
    return true;
  }
  // A peer-side transport whose control records carry the agent's
  // per-frame messages (one per link the test brings up).  Only the test's
  // thread polls them.
  void watch(transport::Transport* peer) { peers_.push_back(peer); }
  bool watching(const transport::Transport* t) const {
    return std::find(peers_.begin(), peers_.end(), t) != peers_.end();
  }
  void takeControl(const std::string& record) {
    v1::ControlBatch batch;
    REQUIRE(batch.ParseFromString(record));
    for (const auto& m : batch.messages()) write(m);
  }
  // Polls the watched transport: control records become messages, other
  // events wait for waitEvent().
  void pump() {
    transport::TransportEvent ev;
    for (transport::Transport* peer : peers_) {
      while (peer->poll(&ev, 1) == 1) {
        if (ev.kind == transport::TransportEvent::Kind::kControl) {
          takeControl(ev.control);
        } else {
          stash_.push_back(std::move(ev));
        }
      }
    }
  }
  bool popStashed(transport::TransportEvent::Kind kind, transport::TransportEvent* out) {
    for (auto it = stash_.begin(); it != stash_.end(); ++it) {
      if (it->kind == kind) {
        *out = std::move(*it);
        stash_.erase(it);
        return true;
      }
    }
    stash_.clear();  // what came before the awaited event is skipped, as waitEvent always did
    return false;
  }
  // Waits for the next message matching `pred` (skipping others, e.g. keepalives).
  v1::PeerMessage next(const std::function<bool(const v1::PeerMessage&)>& pred) {
    const auto end = std::chrono::steady_clock::now() + kDeadline;
    for (;;) {
      pump();
      {
        std::unique_lock<std::mutex> lock(mutex_);
        for (size_t i = cursor_; i < messages_.size(); ++i) {
          if (pred(messages_[i])) {
            cursor_ = i + 1;
            return messages_[i];
          }
        }
        if (std::chrono::steady_clock::now() > end) break;
        cv_.wait_for(lock, 1ms);
      }
    }
    FAIL("the agent did not send the expected peer message within 5 s");
    return {};
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<v1::PeerMessage> messages_;
  size_t cursor_ = 0;
  std::vector<transport::Transport*> peers_;     // test thread only
  std::deque<transport::TransportEvent> stash_;  // test thread only
};

// The capture of the running fixture, for waitEvent.
inline Capture* g_capture = nullptr;

struct TcpPair {
  std::unique_ptr<transport::Transport> a;  // given to the agent
  std::unique_ptr<transport::Transport> b;  // played by the test as the peer
};

inline TcpPair makeTcpPair() {
  std::promise<UniqueFd> accepted;
  auto listener = transport::tcp::TcpDataListener::listen(
      "127.0.0.1:0", "tok", [&](uint64_t, UniqueFd fd) { accepted.set_value(std::move(fd)); });
  REQUIRE(listener.ok());
  auto dialed = transport::tcp::dialData("127.0.0.1", listener.value()->port(), 7, "tok", 2000ms);
  REQUIRE(dialed.ok());
  auto fut = accepted.get_future();
  REQUIRE(fut.wait_for(kDeadline) == std::future_status::ready);
  auto a = transport::tcp::TcpTransport::create(std::move(dialed.value()), "agent-side");
  auto b = transport::tcp::TcpTransport::create(fut.get(), "peer-side");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  listener.value()->stop();
  return TcpPair{std::move(a.value()), std::move(b.value())};
}

struct TestClient {
  std::shared_ptr<ClientSession> session;
  UniqueFd peer_socket;      // the "application" end of the attach socket
  UniqueFd submit_bell;      // the application's end of the submit doorbell
  UniqueFd completion_bell;  // the application's end of the completion doorbell

  fl_ring_header* submit() const { return session->segments->submitRing(); }
  fl_ring_header* completion() const { return session->segments->completionRing(); }
  uint32_t cap() const { return session->ring_capacity; }

  void push(uint32_t slot, uint64_t length, uint32_t flags = 0) {
    fl_submit_desc d{slot, flags, length};
    REQUIRE(fl_ring_push(submit(), cap(), sizeof(d), &d) == FL_RING_OK);
    uint64_t one = 1;
    REQUIRE(::write(submit_bell.get(), &one, sizeof(one)) == sizeof(one));
  }
  fl_completion_desc pop() {
    fl_completion_desc c{};
    auto end = std::chrono::steady_clock::now() + kDeadline;
    while (fl_ring_pop(completion(), cap(), sizeof(c), &c) != FL_RING_OK) {
      if (std::chrono::steady_clock::now() > end) FAIL("no completion within 5 s");
      std::this_thread::sleep_for(1ms);
    }
    return c;
  }
  bool idleFor(std::chrono::milliseconds d) {
    std::this_thread::sleep_for(d);
    return fl_ring_readable(completion()) == 0;
  }
};

inline TestClient makeClient(uint64_t id, uint32_t role, const std::string& stream, uint32_t slots,
                             uint64_t slot_size) {
  SegmentRequest req;
  req.role = role;
  req.slot_count = slots;
  req.slot_size = slot_size;
  req.client_id = id;
  req.stream = stream;
  req.hugepages = HugepageMode::kOff;
  auto seg = ClientSegments::create(req);
  REQUIRE(seg.ok());
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
  TestClient c;
  c.session = std::make_shared<ClientSession>();
  c.session->id = id;
  c.session->role = role;
  c.session->stream = stream;
  c.session->segments = seg.value();
  c.session->replied = true;  // as the attach server hands it over, its reply sent
  Doorbell submit, completion;
  REQUIRE(makeSubmitDoorbell(&submit));
  REQUIRE(makeCompletionDoorbell(&completion));
  c.session->submit_doorbell = std::move(submit.daemon_end);
  c.session->completion_doorbell = std::move(completion.daemon_end);
  c.session->completion_reader = std::move(completion.reader);
  c.submit_bell = std::move(submit.client_end);
  c.completion_bell = std::move(completion.client_end);
  c.session->socket = UniqueFd(sv[0]);
  c.session->ring_capacity = seg.value()->geometry().ring_capacity;
  c.session->slots.resize(slots);
  c.peer_socket = UniqueFd(sv[1]);
  return c;
}

// Waits (real time) until `pred` holds: how a test knows the agent thread
// has got as far as a counter shows, before it moves the manual clock.
inline void waitUntil(const std::function<bool()>& pred, const char* what) {
  auto end = std::chrono::steady_clock::now() + kDeadline;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) FAIL(std::string("not within 5 s: ") + what);
    std::this_thread::sleep_for(1ms);
  }
}

// Polls the peer-side transport until an event of `kind` arrives.
// Control records on the way go to the fixture's capture.
inline transport::TransportEvent waitEvent(transport::Transport& t, transport::TransportEvent::Kind kind) {
  auto end = std::chrono::steady_clock::now() + kDeadline;
  transport::TransportEvent ev;
  while (std::chrono::steady_clock::now() < end) {
    if (g_capture != nullptr && g_capture->watching(&t)) {
      g_capture->pump();
      if (g_capture->popStashed(kind, &ev)) return ev;
    } else if (t.poll(&ev, 1) == 1) {
      if (ev.kind == kind) return ev;
      if (ev.kind == transport::TransportEvent::Kind::kControl && g_capture != nullptr) {
        g_capture->takeControl(ev.control);
      }
      continue;
    }
    std::this_thread::sleep_for(1ms);
  }
  FAIL("no transport event within 5 s");
  return ev;
}

// Plays the receiving daemon: exposes a fresh buffer of `bytes` under
// `credit_id` on the peer-side transport.  The transport keeps the buffer
// alive too (keepalive): a frame still landing when a test ends must not
// write into freed memory.
inline std::shared_ptr<std::vector<uint8_t>> exposeLanding(transport::Transport& t, uint64_t credit_id,
                                                           size_t bytes) {
  auto memory = std::make_shared<std::vector<uint8_t>>(bytes);
  transport::LocalCredit credit;
  credit.keepalive = memory;
  credit.credit_id = credit_id;
  credit.buffer = memory->data();
  credit.capacity = memory->size();
  REQUIRE(t.exposeCredit(credit).ok());
  return memory;
}

// A posted request's payload is read until its SendComplete (tcp: what the
// socket did not take at once is written by later poll() calls, here on
// the test's thread): waits for that before the payload may go.
inline void sendDone(transport::Transport& t) {
  waitEvent(t, transport::TransportEvent::Kind::kSendComplete);
}

struct AgentFixture {
  Config config;
  Metrics metrics;
  // The agent's time: deadlines fire when a test moves it, never by themselves.
  ManualClock clock;
  std::unique_ptr<DataAgent> agent;
  Capture capture;
  TcpPair pair;
  // The links whose Session the agent ended (a Fin, a protocol error).
  std::atomic<int> sessions_cancelled{0};

  explicit AgentFixture(std::function<void(Config&)> tweak = {}) {
    config.id = "local";
    config.peers.push_back(PeerConfig{"remote", "127.0.0.1:1", {}});
    config.credit_timeout_ms = 60000;
    // The spin phase is measured on the manual clock, which stands still.
    config.idle_spin_us = 0;
    // Every release is ACKed at the end of its round unless a test says otherwise.
    config.ack_delay_us = 0;
    if (tweak) tweak(config);
    agent = std::make_unique<DataAgent>(config, metrics, clock);
    agent->start();
    pair = makeTcpPair();
    capture.watch(pair.b.get());
    g_capture = &capture;
  }
  ~AgentFixture() {
    g_capture = nullptr;
    agent->stop();
    // The agent's links own session writers whose threads write into
    // `capture`: they must be joined before `capture` goes.
    agent.reset();
  }

  void linkUp(uint64_t link_id = 1, std::unique_ptr<transport::Transport> t = nullptr) {
    CmdLinkUp up;
    up.link_id = link_id;
    up.identity.peer_name = "remote";
    up.identity.transport_name = "tcp";
    up.transport = std::shared_ptr<transport::Transport>(t ? std::move(t) : std::move(pair.a));
    auto writer =
        std::make_shared<SessionWriter>([this](const v1::PeerMessage& m, bool) { return capture.write(m); },
                                        std::chrono::milliseconds(60000));
    up.session = PeerSession{writer, [this] { ++sessions_cancelled; }};
    agent->post(std::move(up));
  }
  void peerSays(v1::PeerMessage m, uint64_t link_id = 1) {
    agent->post(CmdPeerMessage{link_id, std::make_shared<v1::PeerMessage>(std::move(m))});
  }
};

}  // namespace agent_test
}  // namespace framelink
