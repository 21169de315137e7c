// What one peer may cost the data agent, and the bounds that keep it from
// stalling the other links: what a transport queues for the agent, a
// CreditLow that starts no grant round when nothing could be granted, a
// huge control record handled over several rounds while the other links
// get theirs, a peer whose records keep the agent busy cut, and the answers
// repeated on a new link sent a bounded part per round.
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent_link_rig.h"
#include "inbound_fixture.h"
#include "transport/locked_link_bookkeeping.h"

using namespace framelink;
using namespace framelink::agent_test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kStreams = peer::kMaxStreamsPerLink;

// A link with every stream it may have open, each of its own name.
AgentLink& linkWithAllStreams(InboundRig& rig) {
  AgentLink& l = rig.linkUp(1, "flooder");
  for (uint64_t sid = 1; sid <= kStreams; ++sid) REQUIRE(rig.open(l, sid, "s" + std::to_string(sid)).empty());
  rig.inbound.flushControl();
  return l;
}

uint64_t grantRoundsAfterCreditLows(InboundRig& rig, AgentLink& l) {
  const uint64_t before = rig.inbound.grantRoundsForTest();
  for (uint64_t sid = 1; sid <= kStreams; ++sid) rig.inbound.onCreditLow(l, peer::CreditLow{sid});
  rig.inbound.flushControl();
  return rig.inbound.grantRoundsForTest() - before;
}

}  // namespace

TEST_CASE("agent work: a CreditLow starts no grant round when there is nothing to grant",
          "[agent][inbound][security]") {
  InboundRig rig;
  SECTION("no consumer of any of the streams") {
    AgentLink& l = linkWithAllStreams(rig);
    CHECK(grantRoundsAfterCreditLows(rig, l) == 0);
  }
  SECTION("a consumer whose every slot is granted already") {
    rig.consumer(1, "s1");
    AgentLink& l = linkWithAllStreams(rig);
    REQUIRE(rig.credited(0) == 4);
    CHECK(grantRoundsAfterCreditLows(rig, l) == 0);
    CHECK(rig.credited(0) == 4);
  }
}

namespace {

constexpr size_t kHugeRecord = 40000;

}  // namespace

TEST_CASE("agent work: one link's huge control record waits for later rounds, another link's goes now",
          "[agent][security]") {
  AgentLinkRig rig;
  rig.linkUp(1, "flooder");
  rig.linkUp(2, "honest");
  rig.peerSends(1, creditLows(kHugeRecord));
  // Link 2's record holds a Session message, which a control record must
  // not carry: the agent answers it with a Fin at once, which shows when
  // link 2's record was handled.
  v1::ControlBatch misplaced;
  misplaced.add_messages()->mutable_keepalive()->set_timestamp_ns(1);
  rig.peerSends(2, misplaced);
  CHECK_FALSE(rig.agent->runUntilIdle(1));  // one round, with work left
  INFO("messages handled in the first round: " << rig.messagesHandled());
  CHECK(rig.finSentOn(2));
  CHECK(rig.messagesHandled() < kHugeRecord);
  CHECK_FALSE(rig.finSentOn(1));
  // The rest of link 1's record, in the rounds that follow.
  CHECK(rig.agent->runUntilIdle(1000));
  CHECK(rig.messagesHandled() == kHugeRecord);
  CHECK_FALSE(rig.finSentOn(1));
  // A burst over within kThrottleAfterNs (here: no time passes on the agent's clock) is not held.
  CHECK(rig.metrics.counters.links_throttled.load() == 0);
}

TEST_CASE("agent work: a peer whose records keep the agent busy for link_timeout_ms is cut, and says why",
          "[agent][security]") {
  AgentLinkRig rig(1000);
  rig.linkUp(1, "flooder");
  rig.linkUp(2, "honest");
  // Huge records back to back, for twice link_timeout_ms on the agent's clock.
  for (int step = 0; step < 40 && !rig.finSentOn(1); ++step) {
    rig.peerSends(1, creditLows(kHugeRecord));
    rig.agent->runUntilIdle(4);
    rig.clock.advanceMs(50);
    rig.agent->runUntilIdle(1);
  }
  REQUIRE(rig.finSentOn(1));
  CHECK(rig.metrics.counters.links_cut_busy.load() == 1);
  // Before the cut, its turns were spaced out: its records had filled them for more than 2 ms.
  CHECK(rig.metrics.counters.links_throttled.load() >= 1);
  CHECK_FALSE(rig.finSentOn(2));
}

TEST_CASE(
    "agent work: a transport's reader stops reading while the agent is behind, and is woken once it polled",
    "[agent][security]") {
  auto made = transport::LockedLinkBookkeeping::create();
  REQUIRE(made.ok());
  transport::LockedLinkBookkeeping& book = *made.value();
  std::atomic<int> wakes{0};
  book.setWake([&] { ++wakes; });
  // The reader reads while there is room: up to the bound.
  size_t arrived = 0;
  while (book.roomForEvents()) {
    book.controlArrived("record");
    REQUIRE(++arrived <= transport::kMaxQueuedEvents);
  }
  CHECK(arrived == transport::kMaxQueuedEvents);
  CHECK(wakes.load() == 0);
  // The agent takes one: the reader that waits is woken, once.
  std::vector<transport::TransportEvent> out(2);
  CHECK(book.poll(out.data(), 1) == 1);
  CHECK(wakes.load() == 1);
  CHECK(book.roomForEvents());
  CHECK(book.poll(out.data(), 1) == 1);
  CHECK(wakes.load() == 1);  // nobody waited
  // A link that fails lets a waiting reader go (and read to its end).
  while (book.roomForEvents()) book.controlArrived("record");
  CHECK(book.fail(FL_ERR_LINK_LOST, "gone"));
  CHECK(wakes.load() == 2);
  CHECK(book.roomForEvents());
}

static bool bookEventFdReadable(int fd);

TEST_CASE("agent work: a listener's bookkeeping holds no descriptor until its call is admitted", "[agent]") {
  auto made = transport::LockedLinkBookkeeping::createWithoutEventFd();
  REQUIRE(made.ok());
  transport::LockedLinkBookkeeping& book = *made.value();
  CHECK(book.eventFd() < 0);
  // A refused call fails its bookkeeping: nothing is signalled, nothing breaks.
  book.controlArrived("early");
  REQUIRE(book.openEventFd().ok());
  const int fd = book.eventFd();
  CHECK(fd >= 0);
  REQUIRE(book.openEventFd().ok());  // once
  CHECK(book.eventFd() == fd);
  book.controlArrived("record");
  CHECK(bookEventFdReadable(fd));
  std::vector<transport::TransportEvent> out(4);
  CHECK(book.poll(out.data(), out.size()) == 2);
}

TEST_CASE("agent work: a transport's sender is woken once something is queued, and not again until it waits",
          "[agent]") {
  auto made = transport::LockedLinkBookkeeping::create();
  REQUIRE(made.ok());
  transport::LockedLinkBookkeeping& book = *made.value();
  std::atomic<int> wakes{0};
  book.setWake([&] { ++wakes; });
  using Take = transport::LockedLinkBookkeeping::Take;
  transport::LockedLinkBookkeeping::Outgoing out;
  CHECK(book.takeSend(&out) == Take::kNothing);
  CHECK(wakes.load() == 0);
  CHECK(book.postControl("a") == transport::PostResult::kOk);
  CHECK(wakes.load() == 1);
  CHECK(book.postControl("b") == transport::PostResult::kOk);
  CHECK(wakes.load() == 1);  // the sender was woken already and has not taken anything since
  REQUIRE(book.takeSend(&out) == Take::kTaken);
  CHECK(out.control.size() == 2);
  CHECK(book.takeSend(&out) == Take::kNothing);
  book.stopSending();
  CHECK(wakes.load() == 2);
  CHECK(book.takeSend(&out) == Take::kStopped);
}

static bool bookEventFdReadable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

TEST_CASE("agent work: a transport's eventfd is readable while it has events, and a quiet poll reads nothing",
          "[agent]") {
  auto made = transport::LockedLinkBookkeeping::create();
  REQUIRE(made.ok());
  transport::LockedLinkBookkeeping& book = *made.value();
  std::vector<transport::TransportEvent> out(4);
  CHECK_FALSE(bookEventFdReadable(book.eventFd()));
  CHECK(book.poll(out.data(), out.size()) == 0);
  for (int i = 0; i < 6; ++i) book.controlArrived("record");
  CHECK(bookEventFdReadable(book.eventFd()));
  CHECK(book.poll(out.data(), out.size()) == 4);
  CHECK(bookEventFdReadable(book.eventFd()));  // two still wait: level-triggered
  CHECK(book.poll(out.data(), out.size()) == 2);
  CHECK(book.poll(out.data(), out.size()) == 0);
  CHECK_FALSE(bookEventFdReadable(book.eventFd()));
}

TEST_CASE("agent work: events from a transport's thread all reach an agent sleeping on its eventfd",
          "[agent]") {
  auto made = transport::LockedLinkBookkeeping::create();
  REQUIRE(made.ok());
  transport::LockedLinkBookkeeping& book = *made.value();
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(ep >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(::epoll_ctl(ep, EPOLL_CTL_ADD, book.eventFd(), &ev) == 0);
  constexpr size_t kRecords = 20000;
  std::thread reader([&] {
    for (size_t i = 0; i < kRecords; ++i) book.controlArrived("record");
  });
  std::vector<transport::TransportEvent> out(16);
  size_t got = 0;
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (got < kRecords && std::chrono::steady_clock::now() < give_up) {
    epoll_event fired{};
    if (::epoll_wait(ep, &fired, 1, 1000) <= 0) break;  // a lost wakeup: no wait lasts a second
    got += book.poll(out.data(), out.size());
  }
  reader.join();
  ::close(ep);
  CHECK(got == kRecords);
  CHECK(book.poll(out.data(), out.size()) == 0);
  CHECK_FALSE(bookEventFdReadable(book.eventFd()));
}

namespace {

// Refuses `n` frames of stream `sid` on `l` for good: each lands in a slot
// credited to it with a length no slot has (a PROTOCOL NACK, remembered).
void refuseFrames(InboundRig& rig, AgentLink& l, uint64_t sid, uint64_t n) {
  for (uint64_t seq = 1; seq <= n; ++seq) {
    bool landed = false;
    for (const TestClient& c : rig.consumers) {
      for (const SlotEntry& e : c.session->slots) {
        if (landed || e.state != SlotState::kCredited || e.link_id != l.id || e.stream_id != sid) continue;
        transport::TransportEvent ev;
        ev.kind = transport::TransportEvent::Kind::kFrameArrived;
        ev.header.stream_id = sid;
        ev.header.sequence = seq;
        ev.header.credit_id = e.consumer.credit_id;
        ev.header.length = c.session->segments->slotSize() + 1;
        rig.inbound.onFrameArrived(l, ev);
        landed = true;
      }
    }
    REQUIRE(landed);
  }
}

size_t nacksQueued(const AgentLink& l) {
  size_t n = 0;
  for (const auto& m : l.control.messages()) n += m.has_nack() ? 1 : 0;
  for (const std::string& record : l.controlQueued()) {
    v1::ControlBatch batch;
    REQUIRE(batch.ParseFromString(record));
    for (const auto& m : batch.messages()) n += m.has_nack() ? 1 : 0;
  }
  return n;
}

}  // namespace

TEST_CASE("agent work: the refusals sent again on a new link go a bounded part per round",
          "[agent][inbound][security]") {
  InboundRig rig;
  constexpr uint64_t kPerStream = 3000;
  constexpr uint64_t kStreamsRefused = 3;
  AgentLink& first = rig.linkUp(1, "sender", 9);
  for (uint64_t sid = 1; sid <= kStreamsRefused; ++sid) {
    rig.consumer(sid, "r" + std::to_string(sid));
    REQUIRE(rig.open(first, sid, "r" + std::to_string(sid)).empty());
    refuseFrames(rig, first, sid, kPerStream);
  }
  rig.linkDown(1);
  AgentLink& again = rig.linkUp(2, "sender", 9);
  const size_t at_link_up = nacksQueued(again);
  INFO("NACKs sent again at link-up: " << at_link_up);
  CHECK(at_link_up > 0);
  CHECK(at_link_up <= InboundStreams::kAnswersAgainPerRound + 2 * InboundStreams::kMaxRemembered);
  CHECK(at_link_up < kPerStream * kStreamsRefused);
  // The rest in the rounds that follow, each NACK once.
  for (int round = 0; round < 10; ++round) rig.inbound.flushControl();
  CHECK(nacksQueued(again) == kPerStream * kStreamsRefused);
}

TEST_CASE(
    "agent reload: the inbound deadlines follow a new ack_timeout_ms; link_timeout_ms waits for a restart",
    "[agent][reload]") {
  AgentLinkRig rig;
  const InboundLimits before = rig.agent->inboundLimitsForTest();
  REQUIRE(before.recall_deadline_ns == uint64_t{rig.config.ack_timeout_ms} * 1'000'000);
  REQUIRE(rig.config.ack_timeout_ms != 2000);
  auto next = std::make_shared<Config>(rig.config);
  next->ack_timeout_ms = 2000;
  next->link_timeout_ms = rig.config.link_timeout_ms + 5000;
  rig.agent->post(CmdReconfigure{next});
  REQUIRE(rig.agent->runUntilIdle(10));
  const InboundLimits& after = rig.agent->inboundLimitsForTest();
  CHECK(after.recall_deadline_ns == 2'000'000'000);
  CHECK(after.forget_idle_ns == 8'000'000'000);
  CHECK(after.read_stall_ns == before.read_stall_ns);
  CHECK(after.reads_per_link == before.reads_per_link);
}
