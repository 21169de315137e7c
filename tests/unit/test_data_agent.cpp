// The data agent's protocol state machine and credit accounting, driven the
// way the daemon drives it: real segments, a real tcp transport pair over
// loopback, peer messages in through the command queue, and the agent's
// outgoing control messages captured from its session writer.
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "attach_server.h"
#include "client_session.h"
#include "agent_clock.h"
#include "config.h"
#include "data_agent.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "metrics.h"
#include "segment.h"
#include "transport/tcp/tcp_connect.h"
#include "transport/tcp/tcp_transport.h"

using namespace framelink;
using namespace std::chrono_literals;

namespace {

constexpr auto kDeadline = 5s;

// Collects what the agent sends to its peer.
class Capture {
 public:
  bool write(const v1::PeerMessage& m) {
    std::lock_guard<std::mutex> lock(mutex_);
    messages_.push_back(m);
    cv_.notify_all();
    return true;
  }
  // Waits for the next message matching `pred` (skipping others, e.g. keepalives).
  v1::PeerMessage next(const std::function<bool(const v1::PeerMessage&)>& pred) {
    std::unique_lock<std::mutex> lock(mutex_);
    v1::PeerMessage found;
    bool ok = cv_.wait_for(lock, kDeadline, [&] {
      for (size_t i = cursor_; i < messages_.size(); ++i) {
        if (pred(messages_[i])) {
          found = messages_[i];
          cursor_ = i + 1;
          return true;
        }
      }
      return false;
    });
    if (!ok) FAIL("the agent did not send the expected peer message within 5 s");
    return found;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<v1::PeerMessage> messages_;
  size_t cursor_ = 0;
};

struct TcpPair {
  std::unique_ptr<transport::Transport> a;  // given to the agent
  std::unique_ptr<transport::Transport> b;  // played by the test as the peer
};

TcpPair makeTcpPair() {
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

TestClient makeClient(uint64_t id, uint32_t role, const std::string& stream, uint32_t slots,
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
  Doorbell submit, completion;
  REQUIRE(makeDoorbell(&submit));
  REQUIRE(makeDoorbell(&completion));
  c.session->submit_doorbell = std::move(submit.daemon_end);
  c.session->completion_doorbell = std::move(completion.daemon_end);
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
void waitUntil(const std::function<bool()>& pred, const char* what) {
  auto end = std::chrono::steady_clock::now() + kDeadline;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) FAIL(std::string("not within 5 s: ") + what);
    std::this_thread::sleep_for(1ms);
  }
}

// Polls the peer-side transport until an event of `kind` arrives.
transport::TransportEvent waitEvent(transport::Transport& t, transport::TransportEvent::Kind kind) {
  auto end = std::chrono::steady_clock::now() + kDeadline;
  transport::TransportEvent ev;
  while (std::chrono::steady_clock::now() < end) {
    if (t.poll(&ev, 1) == 1 && ev.kind == kind) return ev;
    std::this_thread::sleep_for(1ms);
  }
  FAIL("no transport event within 5 s");
  return ev;
}

// Plays the receiving daemon: exposes a fresh buffer of `bytes` under
// `credit_id` on the peer-side transport.  The transport keeps the buffer
// alive too (keepalive): a frame still landing when a test ends must not
// write into freed memory.
std::shared_ptr<std::vector<uint8_t>> exposeLanding(transport::Transport& t, uint64_t credit_id,
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

// A posted request's payload is read by the sender thread until its
// SendComplete: waits for that before the payload may go.
void sendDone(transport::Transport& t) { waitEvent(t, transport::TransportEvent::Kind::kSendComplete); }

struct AgentFixture {
  Config config;
  Metrics metrics;
  // The agent's time: deadlines fire when a test moves it, never by themselves.
  ManualClock clock;
  std::unique_ptr<DataAgent> agent;
  Capture capture;
  TcpPair pair;

  explicit AgentFixture(std::function<void(Config&)> tweak = {}) {
    config.id = "local";
    config.peers.push_back(PeerConfig{"remote", "127.0.0.1:1", {}});
    config.credit_timeout_ms = 60000;
    // The spin phase is measured on the manual clock, which stands still.
    config.idle_spin_us = 0;
    if (tweak) tweak(config);
    agent = std::make_unique<DataAgent>(config, metrics, clock);
    agent->start();
    pair = makeTcpPair();
  }
  ~AgentFixture() {
    agent->stop();
    // The agent's links own session writers whose threads write into
    // `capture`: they must be joined before `capture` goes.
    agent.reset();
  }

  void linkUp(uint64_t link_id = 1, std::unique_ptr<transport::Transport> t = nullptr) {
    CmdLinkUp up;
    up.link_id = link_id;
    up.peer = "remote";
    up.transport_name = "tcp";
    up.transport = std::shared_ptr<transport::Transport>(t ? std::move(t) : std::move(pair.a));
    auto writer =
        std::make_shared<SessionWriter>([this](const v1::PeerMessage& m, bool) { return capture.write(m); },
                                        std::chrono::milliseconds(60000));
    up.session = PeerSession{writer, [] {}};
    agent->post(std::move(up));
  }
  void peerSays(v1::PeerMessage m, uint64_t link_id = 1) {
    agent->post(CmdPeerMessage{link_id, std::make_shared<v1::PeerMessage>(std::move(m))});
  }
};

}  // namespace

TEST_CASE("consumer side: StreamOpen is answered with one credit per free slot", "[agent][credits]") {
  AgentFixture f;
  TestClient consumer = makeClient(1, FL_ROLE_CONSUMER, "cam", 4, 64 * 1024);
  f.agent->post(CmdClientAttached{consumer.session});
  f.linkUp();
  v1::PeerMessage open;
  open.mutable_stream_open()->set_stream_id(42);
  open.mutable_stream_open()->set_name("cam");
  f.peerSays(open);
  auto grant = f.capture.next([](auto& m) { return m.has_credit_grant(); });
  CHECK(grant.credit_grant().stream_id() == 42);
  REQUIRE(grant.credit_grant().credits_size() == 4);
  for (const auto& c : grant.credit_grant().credits()) CHECK(c.length() == 64 * 1024);

  SECTION("a frame into a credit is delivered, its release ACKs it and re-grants the slot") {
    std::vector<uint8_t> payload(1000);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = uint8_t(i * 7);
    transport::SendRequest req;
    req.cookie = 1;
    req.header.stream_id = 42;
    req.header.sequence = 1;
    req.header.credit_id = grant.credit_grant().credits(0).credit_id();
    req.header.frame_id = 99;
    req.header.wafer_id = 5;
    req.header.length = payload.size();
    req.header.attr_length = 3;
    std::memcpy(req.header.attrs, "abc", 3);
    req.payload = payload.data();
    req.credit.credit_id = req.header.credit_id;
    req.credit.length = 64 * 1024;
    REQUIRE(f.pair.b->post(req) == transport::PostResult::kOk);
    sendDone(*f.pair.b);
    fl_completion_desc d = consumer.pop();
    CHECK(d.status == FL_OK);
    CHECK(d.sequence == 1);
    CHECK(d.frame_id == 99);
    CHECK(d.length == 1000);
    const fl_slot_header* sh = consumer.session->segments->slotHeader(d.slot);
    CHECK(sh->wafer_id == 5);
    CHECK(sh->attr_length == 3);
    CHECK(std::memcmp(sh->attrs, "abc", 3) == 0);
    CHECK(std::memcmp(consumer.session->segments->slot(d.slot), payload.data(), payload.size()) == 0);

    consumer.push(d.slot, 0);
    auto ack = f.capture.next([](auto& m) { return m.has_ack(); });
    CHECK(ack.ack().stream_id() == 42);
    REQUIRE(ack.ack().sequences_size() == 1);
    CHECK(ack.ack().sequences(0) == 1);
    auto regrant = f.capture.next([](auto& m) { return m.has_credit_grant(); });
    CHECK(regrant.credit_grant().credits_size() == 1);

    SECTION("the same frame replayed on a new link is dropped and ACKed again, not delivered twice") {
      f.agent->post(CmdLinkDown{1, "test cut the link"});
      TcpPair second = makeTcpPair();
      auto& sender = *second.a;  // the test plays the sender on the new link
      f.linkUp(2, std::move(second.b));
      f.peerSays(open, 2);
      auto grant2 = f.capture.next([](auto& m) { return m.has_credit_grant(); });
      REQUIRE(grant2.credit_grant().credits_size() >= 1);
      req.header.credit_id = grant2.credit_grant().credits(0).credit_id();
      req.credit.credit_id = req.header.credit_id;
      REQUIRE(sender.post(req) == transport::PostResult::kOk);
      sendDone(sender);
      auto ack2 = f.capture.next([](auto& m) { return m.has_ack(); });
      REQUIRE(ack2.ack().sequences_size() == 1);
      CHECK(ack2.ack().sequences(0) == 1);
      CHECK(consumer.idleFor(100ms));  // nothing delivered a second time
      CHECK(f.metrics.counters.duplicates_dropped.load() == 1);

      req.header.sequence = 2;  // a new frame after the replay is delivered
      req.header.credit_id =
          grant2.credit_grant().credits(1 % grant2.credit_grant().credits_size()).credit_id();
      req.credit.credit_id = req.header.credit_id;
      REQUIRE(sender.post(req) == transport::PostResult::kOk);
      sendDone(sender);
      fl_completion_desc d2 = consumer.pop();
      CHECK(d2.status == FL_OK);
      CHECK(d2.sequence == 2);
    }

    SECTION("releasing it again is a double release, reported to the consumer only") {
      consumer.push(d.slot, 0);
      fl_completion_desc err = consumer.pop();
      CHECK(err.status == FL_ERR_DOUBLE_RELEASE);
      CHECK(err.slot == d.slot);
    }

    SECTION("its ACK is sent again on the next link, before any replay (the first may be lost)") {
      f.agent->post(CmdLinkDown{1, "test cut the link"});
      TcpPair second = makeTcpPair();
      f.linkUp(2, std::move(second.b));
      auto again = f.capture.next([](auto& m) { return m.has_ack(); });
      CHECK(again.ack().stream_id() == 42);
      REQUIRE(again.ack().sequences_size() == 1);
      CHECK(again.ack().sequences(0) == 1);
    }
  }

  SECTION("a stream the sender closes gives its credits back to the consumer for the next stream") {
    v1::PeerMessage close;
    close.mutable_stream_close()->set_stream_id(42);
    f.peerSays(close);
    v1::PeerMessage open2;
    open2.mutable_stream_open()->set_stream_id(43);
    open2.mutable_stream_open()->set_name("cam");
    f.peerSays(open2);
    auto grant2 = f.capture.next([](auto& m) { return m.has_credit_grant(); });
    CHECK(grant2.credit_grant().stream_id() == 43);
    CHECK(grant2.credit_grant().credits_size() == 4);  // every slot again, none left on stream 42
  }

  SECTION("a frame for a credit never granted is NACKed and the link stays usable") {
    std::vector<uint8_t> payload(10, 1);
    transport::SendRequest req;
    req.cookie = 2;
    req.header.stream_id = 42;
    req.header.sequence = 7;
    req.header.credit_id = 123456789;
    req.header.length = payload.size();
    req.payload = payload.data();
    req.credit.credit_id = req.header.credit_id;
    req.credit.length = 64 * 1024;
    REQUIRE(f.pair.b->post(req) == transport::PostResult::kOk);
    sendDone(*f.pair.b);
    auto nack = f.capture.next([](auto& m) { return m.has_nack(); });
    CHECK(nack.nack().sequence() == 7);
    CHECK(int(nack.nack().code()) == FL_ERR_UNKNOWN_CREDIT);
    CHECK(consumer.idleFor(50ms));
  }

  SECTION("a frame with a wrong CRC32C is NACKed, not delivered, and the slot is granted again") {
    std::vector<uint8_t> payload(100, 9);
    transport::SendRequest req;
    req.cookie = 3;
    req.header.stream_id = 42;
    req.header.sequence = 1;
    req.header.credit_id = grant.credit_grant().credits(1).credit_id();
    req.header.length = payload.size();
    req.header.has_crc32c = 1;
    req.header.crc32c = fl_crc32c(0, payload.data(), payload.size()) ^ 1;
    req.payload = payload.data();
    req.credit.credit_id = req.header.credit_id;
    req.credit.length = 64 * 1024;
    REQUIRE(f.pair.b->post(req) == transport::PostResult::kOk);
    sendDone(*f.pair.b);
    auto nack = f.capture.next([](auto& m) { return m.has_nack(); });
    CHECK(int(nack.nack().code()) == FL_ERR_CRC_MISMATCH);
    auto regrant = f.capture.next([](auto& m) { return m.has_credit_grant(); });
    CHECK(regrant.credit_grant().credits_size() == 1);
    CHECK(consumer.idleFor(50ms));
  }

  SECTION("a consumer that goes away revokes its credits") {
    f.agent->post(CmdClientGone{1});
    auto revoke = f.capture.next([](auto& m) { return m.has_credit_revoke(); });
    CHECK(revoke.credit_revoke().credit_ids_size() == 4);
  }
}

TEST_CASE("producer side: credits, ACK, NACK and validation", "[agent][producer]") {
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 4, 64 * 1024);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  auto open = f.capture.next([](auto& m) { return m.has_stream_open(); });
  CHECK(open.stream_open().name() == "cam");
  uint64_t stream_id = open.stream_open().stream_id();

  auto fill = [&](uint32_t slot, uint64_t frame_id, size_t n) {
    fl_slot_header* sh = producer.session->segments->slotHeader(slot);
    std::memset(sh, 0, sizeof(*sh));
    sh->frame_id = frame_id;
    sh->wafer_id = frame_id / 25;
    std::memset(producer.session->segments->slot(slot), int(frame_id), n);
  };
  auto grantOne = [&](uint64_t credit_id, uint64_t length) {
    v1::PeerMessage g;
    g.mutable_credit_grant()->set_stream_id(stream_id);
    auto* c = g.mutable_credit_grant()->add_credits();
    c->set_credit_id(credit_id);
    c->set_length(length);
    f.peerSays(g);
  };
  // The peer side exposes a buffer under credit 500 so the frame can land.
  // Shared with the transport (keepalive): a frame still landing while a
  // section ends must not write into freed memory.
  auto landing_memory = std::make_shared<std::vector<uint8_t>>(64 * 1024);
  std::vector<uint8_t>& landing = *landing_memory;
  transport::LocalCredit lc;
  lc.keepalive = landing_memory;
  lc.credit_id = 500;
  lc.buffer = landing.data();
  lc.capacity = landing.size();
  REQUIRE(f.pair.b->exposeCredit(lc).ok());

  SECTION("a frame waits for a credit, is sent into it, and completes DELIVERED on ACK") {
    fill(0, 11, 3000);
    producer.push(0, 3000);
    CHECK(producer.idleFor(50ms));  // no credit yet: nothing completes
    grantOne(500, landing.size());
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 11);
    CHECK(arrived.header.sequence == 1);
    CHECK(arrived.header.length == 3000);
    CHECK(landing[0] == 11);
    CHECK(landing[2999] == 11);
    CHECK(producer.idleFor(50ms));  // sent is not delivered
    v1::PeerMessage ack;
    ack.mutable_ack()->set_stream_id(stream_id);
    ack.mutable_ack()->add_sequences(1);
    f.peerSays(ack);
    fl_completion_desc d = producer.pop();
    CHECK(d.slot == 0);
    CHECK(d.status == FL_OK);
    CHECK(d.sequence == 1);
    CHECK(d.frame_id == 11);
  }

  SECTION("a NACK fails the frame with the peer's code") {
    fill(1, 12, 10);
    producer.push(1, 10);
    grantOne(500, landing.size());
    waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    v1::PeerMessage nack;
    nack.mutable_nack()->set_stream_id(stream_id);
    nack.mutable_nack()->set_sequence(1);
    nack.mutable_nack()->set_code(v1::ERROR_CODE_UNKNOWN_STREAM);
    f.peerSays(nack);
    fl_completion_desc d = producer.pop();
    CHECK(d.slot == 1);
    CHECK(d.status == FL_ERR_UNKNOWN_STREAM);
  }

  SECTION("a CRC mismatch NACK sends the frame again, three times at most, then fails it") {
    fill(1, 12, 10);
    producer.push(1, 10);
    v1::PeerMessage nack;
    nack.mutable_nack()->set_stream_id(stream_id);
    nack.mutable_nack()->set_sequence(1);
    nack.mutable_nack()->set_code(v1::ERROR_CODE_CRC_MISMATCH);
    for (int attempt = 0; attempt < 4; ++attempt) {
      INFO("attempt " << attempt);
      // Each copy needs a credit of its own; the same buffer is granted again.
      if (attempt > 0) REQUIRE(f.pair.b->exposeCredit(lc).ok());
      grantOne(500, landing.size());
      auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
      CHECK(arrived.header.sequence == 1);  // the same frame, not a new one
      CHECK(arrived.header.frame_id == 12);
      if (attempt < 3) CHECK(producer.idleFor(20ms));
      f.peerSays(nack);
    }
    fl_completion_desc d = producer.pop();
    CHECK(d.slot == 1);
    CHECK(d.status == FL_ERR_CRC_MISMATCH);
    CHECK(f.metrics.counters.frames_resent_crc.load() == 3);
  }

  SECTION("a frame larger than the consumer's slot fails TOO_LARGE and the credit stays for the next") {
    fill(0, 13, 5000);
    producer.push(0, 5000);
    grantOne(500, 4096);
    fl_completion_desc d = producer.pop();
    CHECK(d.status == FL_ERR_TOO_LARGE);
    fill(1, 14, 100);
    producer.push(1, 100);
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 14);
    CHECK(arrived.header.credit_id == 500);
  }

  SECTION("bad descriptors get specific statuses and do not disturb good frames") {
    producer.push(9, 10);
    CHECK(producer.pop().status == FL_ERR_BAD_SLOT);
    producer.push(0, 64 * 1024 + 1);
    CHECK(producer.pop().status == FL_ERR_TOO_LARGE);
    producer.push(0, 10, 1);
    CHECK(producer.pop().status == FL_ERR_BAD_DESCRIPTOR);
    fill(2, 15, 10);
    producer.session->segments->slotHeader(2)->attr_length = 9999;
    producer.push(2, 10);
    CHECK(producer.pop().status == FL_ERR_BAD_METADATA);
    fill(3, 16, 10);
    producer.push(3, 10);
    producer.push(3, 10);
    fl_completion_desc twice = producer.pop();
    CHECK(twice.slot == 3);
    CHECK(twice.status == FL_ERR_SLOT_NOT_OWNED);
    grantOne(500, landing.size());
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 16);
  }

  SECTION("a link that breaks: the unacknowledged frame goes again on the next link, same sequence") {
    fill(0, 17, 10);
    producer.push(0, 10);
    grantOne(500, landing.size());
    auto first = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    f.agent->post(CmdLinkDown{1, "test cut the link"});
    TcpPair second = makeTcpPair();
    auto landing2 = exposeLanding(*second.b, 501, 64 * 1024);
    auto& peer_side = *second.b;
    f.linkUp(2, std::move(second.a));
    auto reopen = f.capture.next([](auto& m) { return m.has_stream_open(); });
    CHECK(reopen.stream_open().stream_id() == stream_id);  // the stream keeps its id and sequences
    v1::PeerMessage g;
    g.mutable_credit_grant()->set_stream_id(stream_id);
    auto* c = g.mutable_credit_grant()->add_credits();
    c->set_credit_id(501);
    c->set_length(landing2->size());
    f.peerSays(g, 2);
    auto again = waitEvent(peer_side, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(again.header.sequence == first.header.sequence);
    CHECK(again.header.frame_id == 17);
    CHECK((*landing2)[0] == 17);
    v1::PeerMessage ack;
    ack.mutable_ack()->set_stream_id(stream_id);
    ack.mutable_ack()->add_sequences(again.header.sequence);
    f.peerSays(ack, 2);
    fl_completion_desc d = producer.pop();
    CHECK(d.status == FL_OK);
    CHECK(d.sequence == first.header.sequence);
    CHECK(f.metrics.counters.frames_replayed.load() == 1);
  }

  SECTION("an ACK the receiver repeats on the next link settles a frame waiting for its replay") {
    fill(0, 18, 10);
    producer.push(0, 10);
    grantOne(500, landing.size());
    auto first = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    f.agent->post(CmdLinkDown{1, "test cut the link"});
    TcpPair second = makeTcpPair();
    f.linkUp(2, std::move(second.a));
    // No credit on the new link: the receiver's repeated ACK alone completes it.
    v1::PeerMessage ack;
    ack.mutable_ack()->set_stream_id(stream_id);
    ack.mutable_ack()->add_sequences(first.header.sequence);
    f.peerSays(ack, 2);
    fl_completion_desc d = producer.pop();
    CHECK(d.status == FL_OK);
    CHECK(d.frame_id == 18);
    CHECK(f.metrics.counters.acks_for_replays.load() == 1);
  }

  SECTION("frames a NACK and a broken link send back go again in sequence order") {
    // Four frames in four credits; the receiver refuses 1 and 2 (their credits
    // were withdrawn), then the link breaks with 3 and 4 unacknowledged.  The
    // receiver takes a sequence at or below the highest it saw for one it
    // had, so the next link must carry 1, 2, 3, 4 -- in that order.
    for (uint64_t id = 501; id <= 503; ++id) exposeLanding(*f.pair.b, id, 4096);
    for (uint32_t slot = 0; slot < 4; ++slot) {
      fill(slot, 30 + slot, 10);
      producer.push(slot, 10);
    }
    for (uint64_t id = 500; id <= 503; ++id) grantOne(id, 4096);
    for (int i = 0; i < 4; ++i) waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    for (uint64_t seq : {1, 2}) {
      v1::PeerMessage nack;
      nack.mutable_nack()->set_stream_id(stream_id);
      nack.mutable_nack()->set_sequence(seq);
      nack.mutable_nack()->set_code(v1::ERROR_CODE_UNKNOWN_CREDIT);
      f.peerSays(nack);
    }
    f.agent->post(CmdLinkDown{1, "test cut the link"});
    TcpPair second = makeTcpPair();
    for (uint64_t id = 600; id < 604; ++id) exposeLanding(*second.b, id, 4096);
    auto& peer_side = *second.b;
    f.linkUp(2, std::move(second.a));
    f.capture.next([](auto& m) { return m.has_stream_open(); });
    v1::PeerMessage g;
    g.mutable_credit_grant()->set_stream_id(stream_id);
    for (uint64_t id = 600; id < 604; ++id) {
      auto* c = g.mutable_credit_grant()->add_credits();
      c->set_credit_id(id);
      c->set_length(4096);
    }
    f.peerSays(g, 2);
    std::vector<uint64_t> order;
    for (int i = 0; i < 4; ++i) {
      order.push_back(waitEvent(peer_side, transport::TransportEvent::Kind::kFrameArrived).header.sequence);
    }
    CHECK(order == std::vector<uint64_t>{1, 2, 3, 4});
  }

  SECTION("a frame too large for one consumer's slots takes another consumer's larger credit") {
    v1::PeerMessage g;  // two consumers' credits: a small one first
    g.mutable_credit_grant()->set_stream_id(stream_id);
    auto* small_credit = g.mutable_credit_grant()->add_credits();
    small_credit->set_credit_id(501);
    small_credit->set_length(4096);
    auto* large_credit = g.mutable_credit_grant()->add_credits();
    large_credit->set_credit_id(500);
    large_credit->set_length(landing.size());
    f.peerSays(g);
    fill(0, 19, 5000);
    producer.push(0, 5000);
    auto arrived = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(arrived.header.frame_id == 19);
    CHECK(arrived.header.credit_id == 500);
    // The next large frame waits for a large credit (one exists), not TOO_LARGE;
    // a small frame behind it keeps the stream's order and waits too.
    fill(1, 20, 5000);
    producer.push(1, 5000);
    fill(2, 21, 100);
    producer.push(2, 100);
    CHECK(producer.idleFor(50ms));
    exposeLanding(*f.pair.b, 501, 4096);
    REQUIRE(f.pair.b->exposeCredit(lc).ok());
    grantOne(500, landing.size());
    auto second = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(second.header.frame_id == 20);
    CHECK(second.header.credit_id == 500);
    auto third = waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
    CHECK(third.header.frame_id == 21);
    CHECK(third.header.credit_id == 501);
  }
}

TEST_CASE("producer side: a stream is closed on the link when its last producer leaves",
          "[agent][producer][streams]") {
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam-1", 2, 4096);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  auto open = f.capture.next([](auto& m) { return m.has_stream_open(); });
  CHECK(open.stream_open().name() == "cam-1");
  f.agent->post(CmdClientGone{1});
  auto close = f.capture.next([](auto& m) { return m.has_stream_close(); });
  CHECK(close.stream_close().stream_id() == open.stream_open().stream_id());
  CHECK(f.metrics.counters.streams_forgotten.load() == 1);
  // Not announced again on the next link.
  f.agent->post(CmdLinkDown{1, "test cut the link"});
  TcpPair second = makeTcpPair();
  TestClient other = makeClient(2, FL_ROLE_PRODUCER, "cam-2", 2, 4096);
  f.agent->post(CmdClientAttached{other.session});
  f.linkUp(2, std::move(second.a));
  auto reopen = f.capture.next([](auto& m) { return m.has_stream_open(); });
  CHECK(reopen.stream_open().name() == "cam-2");
}

TEST_CASE("producer side: a broken link that does not come back fails the frame LINK_LOST",
          "[agent][timeout]") {
  AgentFixture f([](Config& c) { c.credit_timeout_ms = 300; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  auto open = f.capture.next([](auto& m) { return m.has_stream_open(); });
  exposeLanding(*f.pair.b, 7, 4096);
  v1::PeerMessage g;
  g.mutable_credit_grant()->set_stream_id(open.stream_open().stream_id());
  g.mutable_credit_grant()->add_credits()->set_credit_id(7);
  g.mutable_credit_grant()->mutable_credits(0)->set_length(4096);
  f.peerSays(g);
  producer.push(0, 10);
  waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
  f.agent->post(CmdLinkDown{1, "test cut the link"});
  // The frame waits for the next link from the moment the link went down.
  waitUntil([&] { return f.metrics.counters.frames_replayed.load() == 1; }, "the frame is queued for replay");
  f.clock.advanceMs(299);
  CHECK(producer.idleFor(100ms));  // a millisecond short of the credit timeout: still waiting
  f.clock.advanceMs(11);  // past it, and past the agent's 10 ms deadline tick
  fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_ERR_LINK_LOST);
}

TEST_CASE("producer side: no credit within the credit timeout fails NO_CONSUMER", "[agent][timeout]") {
  AgentFixture f([](Config& c) { c.credit_timeout_ms = 200; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  f.capture.next([](auto& m) { return m.has_stream_open(); });
  producer.push(0, 10);
  waitUntil([&] { return f.metrics.counters.frames_submitted.load() == 1; }, "the agent takes the frame");
  f.clock.advanceMs(199);
  CHECK(producer.idleFor(100ms));  // before the credit timeout: still waiting for a credit
  f.clock.advanceMs(11);  // past it, and past the agent's 10 ms deadline tick
  fl_completion_desc d = producer.pop();
  CHECK(d.status == FL_ERR_NO_CONSUMER);
}

TEST_CASE("producer side: a frame sent and never acknowledged fails TIMEOUT after the ACK timeout",
          "[agent][timeout]") {
  AgentFixture f([](Config& c) { c.ack_timeout_ms = 1000; });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  auto open = f.capture.next([](auto& m) { return m.has_stream_open(); });
  exposeLanding(*f.pair.b, 7, 4096);
  v1::PeerMessage g;
  g.mutable_credit_grant()->set_stream_id(open.stream_open().stream_id());
  g.mutable_credit_grant()->add_credits()->set_credit_id(7);
  g.mutable_credit_grant()->mutable_credits(0)->set_length(4096);
  f.peerSays(g);
  producer.push(0, 10);
  waitEvent(*f.pair.b, transport::TransportEvent::Kind::kFrameArrived);
  CHECK(producer.idleFor(50ms));  // sent, not acknowledged, and no time has passed
  // The ACK deadline starts when the agent sees its send complete, which it
  // learns from the transport's own thread: move the clock a timeout at a
  // time until the frame fails.  Whatever comes first must be the timeout.
  fl_completion_desc d{};
  auto end = std::chrono::steady_clock::now() + kDeadline;
  while (fl_ring_pop(producer.completion(), producer.cap(), sizeof(d), &d) != FL_RING_OK) {
    if (std::chrono::steady_clock::now() > end) FAIL("no completion within 5 s");
    f.clock.advanceMs(1001);
    std::this_thread::sleep_for(20ms);
  }
  CHECK(d.slot == 0);
  CHECK(d.status == FL_ERR_TIMEOUT);
  CHECK(f.metrics.counters.frames_failed.load() == 1);
}

TEST_CASE("producer side: a stream with no route fails NO_ROUTE", "[agent][route]") {
  AgentFixture f([](Config& c) { c.peers.clear(); });
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{producer.session});
  producer.push(0, 10);
  CHECK(producer.pop().status == FL_ERR_NO_ROUTE);
}

TEST_CASE("out-of-bounds peer messages close that link with a PROTOCOL fin", "[agent][security]") {
  // Each message is one a well-behaved peer never sends; every size a peer
  // controls is bounded before anything is allocated for it.
  const int which = GENERATE(0, 1, 2, 3);
  AgentFixture f;
  TestClient producer = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 64 * 1024);
  f.agent->post(CmdClientAttached{producer.session});
  f.linkUp();
  producer.push(0, 10);  // opens the stream towards the peer
  auto open = f.capture.next([](auto& m) { return m.has_stream_open(); });
  const uint64_t stream_id = open.stream_open().stream_id();
  v1::PeerMessage bad;
  std::string expect;
  switch (which) {
    case 0: {  // more credits than any consumer could have
      auto* g = bad.mutable_credit_grant();
      g->set_stream_id(stream_id);
      for (int i = 0; i < 65537; ++i) {
        auto* c = g->add_credits();
        c->set_credit_id(uint64_t(i) + 1);
        c->set_length(4096);
      }
      expect = "credits";
      break;
    }
    case 1: {  // a credit of zero bytes
      auto* c = bad.mutable_credit_grant()->add_credits();
      bad.mutable_credit_grant()->set_stream_id(stream_id);
      c->set_credit_id(1);
      c->set_length(0);
      expect = "zero length";
      break;
    }
    case 2: {  // an ACK of more frames than may be in flight
      bad.mutable_ack()->set_stream_id(stream_id);
      for (int i = 0; i < 5000; ++i) bad.mutable_ack()->add_sequences(uint64_t(i) + 1);
      expect = "ACK";
      break;
    }
    case 3: {  // a stream name that is not one
      bad.mutable_stream_open()->set_stream_id(9);
      bad.mutable_stream_open()->set_name(std::string(300, 'x'));
      expect = "stream";
      break;
    }
  }
  INFO("case " << which);
  f.peerSays(bad);
  auto fin = f.capture.next([](auto& m) { return m.has_fin(); });
  CHECK(int(fin.fin().code()) == FL_ERR_PROTOCOL);
  CHECK_THAT(fin.fin().reason(), Catch::Contains(expect, Catch::CaseSensitive::No));
  // The producer's frame is not failed by it: it waits for the next link.
  CHECK(producer.idleFor(50ms));
}

TEST_CASE("a corrupt submit ring detaches only that client", "[agent][corrupt]") {
  AgentFixture f;
  TestClient bad = makeClient(1, FL_ROLE_PRODUCER, "cam", 2, 4096);
  TestClient good = makeClient(2, FL_ROLE_PRODUCER, "cam", 2, 4096);
  f.agent->post(CmdClientAttached{bad.session});
  f.agent->post(CmdClientAttached{good.session});
  f.linkUp();
  __atomic_store_n(&bad.submit()->tail, uint64_t{1000}, __ATOMIC_RELEASE);
  uint64_t one = 1;
  REQUIRE(::write(bad.submit_bell.get(), &one, sizeof(one)) == sizeof(one));
  // The agent shuts the attach socket down: the application end sees EOF.
  char byte;
  auto end = std::chrono::steady_clock::now() + kDeadline;
  ssize_t n = -1;
  while (std::chrono::steady_clock::now() < end) {
    n = ::recv(bad.peer_socket.get(), &byte, 1, MSG_DONTWAIT);
    if (n == 0) break;
    std::this_thread::sleep_for(1ms);
  }
  CHECK(n == 0);
  CHECK(__atomic_load_n(&bad.session->segments->header()->daemon_state, __ATOMIC_ACQUIRE) ==
        FL_DAEMON_DETACHED);
  good.push(0, 10);
  good.push(7, 10);
  CHECK(good.pop().status == FL_ERR_BAD_SLOT);  // the good client is still served (in order)
}

TEST_CASE("segment geometry keeps every region inside its segment", "[segment]") {
  for (uint32_t slots : {1u, 2u, 3u, 8u, 100u}) {
    for (uint64_t size : {uint64_t{1}, uint64_t{4096}, uint64_t{65537}, uint64_t{4} << 20}) {
      for (bool huge : {false, true}) {
        SegmentGeometry g = computeGeometry(slots, size, huge);
        CHECK(g.ring_capacity >= slots);
        CHECK((g.ring_capacity & (g.ring_capacity - 1)) == 0);
        CHECK(g.submit_ring_offset >= sizeof(fl_segment_header));
        CHECK(g.completion_ring_offset >= g.submit_ring_offset + fl_ring_bytes(g.ring_capacity, 16));
        CHECK(g.control_size >= g.completion_ring_offset + fl_ring_bytes(g.ring_capacity, 32));
        CHECK(g.slot_stride >= size + sizeof(fl_slot_header));
        CHECK(g.slot_stride % FL_PAGE_SIZE == 0);
        CHECK(g.slots_offset % FL_PAGE_SIZE == 0);
        // Each header immediately before its payload (one RDMA write lands
        // both), never overlapping the previous slot's payload.
        CHECK(g.slot_header_stride == g.slot_stride);
        CHECK(g.slot_headers_offset + sizeof(fl_slot_header) == g.slots_offset);
        CHECK(g.slot_stride - size >= sizeof(fl_slot_header));
        CHECK(g.data_size >= g.slots_offset + g.slot_stride * slots);
        if (huge) CHECK(g.data_size % FL_HUGE_PAGE_SIZE == 0);
      }
    }
  }
}

TEST_CASE("a consumer's data segment cannot be mapped writable by the client", "[segment][security]") {
  SegmentRequest req;
  req.role = FL_ROLE_CONSUMER;
  req.slot_count = 2;
  req.slot_size = 4096;
  req.client_id = 1;
  req.stream = "s";
  req.hugepages = HugepageMode::kOff;
  auto seg = ClientSegments::create(req);
  REQUIRE(seg.ok());
  int fd = seg.value()->dataFd();
  void* rw = ::mmap(nullptr, seg.value()->geometry().data_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  CHECK(rw == MAP_FAILED);
  void* ro = ::mmap(nullptr, seg.value()->geometry().data_size, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(ro != MAP_FAILED);
  ::munmap(ro, seg.value()->geometry().data_size);
  CHECK(::ftruncate(fd, 0) != 0);  // sealed: no SIGBUS for the daemon
}

TEST_CASE("attach request validation", "[attach]") {
  Config config;
  config.max_slots = 16;
  config.max_slot_size = 1 << 20;
  config.max_client_bytes = 8 << 20;
  auto request = [] {
    fl_attach_request r{};
    r.magic = FL_ATTACH_MAGIC;
    r.version = FL_ATTACH_VERSION;
    r.role = FL_ROLE_PRODUCER;
    r.slot_count = 4;
    r.slot_size = 4096;
    std::strcpy(r.stream, "cam-0.raw_1");
    return r;
  };
  auto check = [&](fl_attach_request r, int expected, uid_t uid = 0, gid_t gid = 0) {
    Status s = AttachServer::validateRequest(config, r, uid, gid);
    if (expected == FL_OK) {
      CHECK(s.ok());
    } else {
      REQUIRE_FALSE(s.ok());
      CHECK(s.error().code == expected);
      CHECK_FALSE(s.error().message.empty());
    }
  };
  check(request(), FL_OK);
  auto r = request();
  r.magic = 1;
  check(r, FL_ERR_VERSION);
  r = request();
  r.version = FL_ATTACH_VERSION + 1;
  check(r, FL_ERR_VERSION);
  r = request();
  r.role = 3;
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  r.flags = 1;
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  std::strcpy(r.stream, "bad name");
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  std::memset(r.stream, 'a', sizeof(r.stream));  // not terminated
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  r.stream[0] = '\0';
  check(r, FL_ERR_BAD_REQUEST);
  r = request();
  r.slot_count = 17;
  check(r, FL_ERR_QUOTA);
  r = request();
  r.slot_size = (1 << 20) + 1;
  check(r, FL_ERR_QUOTA);
  r = request();
  r.slot_count = 16;
  r.slot_size = 1 << 20;
  check(r, FL_ERR_QUOTA);  // 16 MiB > max_client_bytes
  r = request();
  r.slot_count = 0;
  r.slot_size = 0;
  config.default_slot_count = 3;
  config.default_slot_size = 8192;
  Status s = AttachServer::validateRequest(config, r, 0, 0);
  CHECK(s.ok());
  CHECK(r.slot_count == 3);
  CHECK(r.slot_size == 8192);

  config.allowed_uids = {4242};
  config.allowed_gids = {4343};
  check(request(), FL_ERR_ATTACH_REFUSED, 1000, 1000);
  check(request(), FL_OK, 4242, 1000);
  check(request(), FL_OK, 1000, 4343);
}
