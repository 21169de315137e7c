// LocalDelivery on its own: a producer's frame lent to the readers attached
// to this same daemon without a copy, its completion once each of them
// released it, and how a frame ends for a reader that holds it past
// ack_timeout_ms, for one that goes while holding it, for a producer that
// goes while it is lent and for a drop stream's stalled subscriber.  Real
// segments, a real ClientTable and attach sockets, a manual clock; the
// test plays the inbound side's part (releases, a consumer that goes) and
// the outbound side's (the producer's slot back when its frame ends).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "agent/local_delivery.h"
#include "agent_fixture.h"

using namespace framelink;
using namespace framelink::agent_test;

namespace {

// A lend message a consumer read off its attach socket, with its fd.
struct LendMessage {
  fl_lend_message m{};
  UniqueFd fd;
};

// Every lend message waiting on `c`'s end of its attach socket.
std::vector<LendMessage> lendMessages(const TestClient& c) {
  std::vector<LendMessage> out;
  for (;;) {
    LendMessage lm;
    iovec iov{&lm.m, sizeof lm.m};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(c.peer_socket.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) break;
    REQUIRE(n == static_cast<ssize_t>(sizeof lm.m));
    REQUIRE(lm.m.magic == FL_LEND_MAGIC);
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(cm), sizeof fd);
      lm.fd = UniqueFd(fd);
    }
    out.push_back(std::move(lm));
  }
  return out;
}

// LocalDelivery with producers and consumers attached as a test needs them.
struct LocalRig {
  struct Ended {
    uint64_t producer = 0;
    uint32_t slot = 0;
    int status = FL_OK;
    std::string why;
    uint32_t readers = 0;
    uint32_t released = 0;
  };
  struct EndedLanded {
    LocalDelivery::Landed from;
    uint64_t landing = 0;
    uint32_t slot = 0;
    int status = FL_OK;
    uint32_t readers = 0;
    uint32_t released = 0;
  };

  Config config;
  Metrics metrics;
  ManualClock clock;
  NameTable names;
  ClientTable clients{metrics, names};
  std::vector<Ended> ended;
  std::vector<EndedLanded> ended_landed;
  // As OutboundStreams::endLocalFrame does for a frame no peer has: the
  // producer's slot is its own again.
  LocalDelivery local{config, metrics, clock, clients,
                      [this](AgentClient& p, uint32_t slot, int status, const std::string& why,
                             uint32_t readers, uint32_t released) {
                        ended.push_back({p.session->id, slot, status, why, readers, released});
                        p.session->slots[slot] = SlotEntry{};
                        if (p.session->in_progress > 0) --p.session->in_progress;
                      }};
  std::deque<TestClient> attached;

  LocalRig() {
    config.id = "local";
    config.credit_timeout_ms = 200;
    config.ack_timeout_ms = 1000;
    local.setEndLanded([this](const LocalDelivery::Landed& from, uint64_t landing, uint32_t slot, int status,
                              const std::string&, uint32_t readers, uint32_t released) {
      ended_landed.push_back({from, landing, slot, status, readers, released});
    });
  }

  // A producer whose segment can be lent, as the attach server hands it over.
  TestClient& producer(uint64_t id, uint32_t slots = 4) {
    attached.push_back(makeClient(id, FL_ROLE_PRODUCER, "cam", slots, 4096));
    REQUIRE(attached.back().session->segments->keepReadOnlyDataFd());
    clients.add(attached.back().session);
    return attached.back();
  }
  TestClient& consumer(uint64_t id, bool subscriber, uint32_t slots = 4) {
    attached.push_back(makeClient(id, FL_ROLE_CONSUMER, "cam", slots, 4096));
    attached.back().session->subscriber = subscriber;
    clients.add(attached.back().session);
    local.consumerAttached(*attached.back().session);
    return attached.back();
  }
  // The producer fills `slot` with `fill` and submits `length` bytes of it.
  void submit(TestClient& p, uint32_t slot, uint64_t length = 100, uint8_t fill = 0xAB) {
    std::memset(p.session->segments->slot(slot), fill, length);
    fl_slot_header h{};
    h.frame_id = 100 + slot;
    h.length = length;
    local.submit(*clients.find(p.session->id), slot, h, length);
  }
  // The completions waiting on `c`'s ring, taken off it.
  std::vector<fl_completion_desc> take(TestClient& c) {
    std::vector<fl_completion_desc> out;
    fl_completion_desc d{};
    while (fl_ring_pop(c.completion(), c.cap(), sizeof d, &d) == FL_RING_OK) out.push_back(d);
    return out;
  }
  // As InboundStreams::onRelease does for a frame of a producer here.
  void release(TestClient& c, uint32_t slot) {
    REQUIRE(c.session->slots[slot].state == SlotState::kDelivered);
    local.released(*c.session, slot);
    c.session->slots[slot] = SlotEntry{};
    local.pump();
  }
  // As InboundStreams::onConsumerGone does.
  void consumerGoes(TestClient& c) {
    ClientSession& s = *c.session;
    s.gone = true;
    for (uint32_t slot = 0; slot < s.slots.size(); ++slot) {
      if (s.slots[slot].state == SlotState::kDelivered && s.slots[slot].consumer.local_from != 0) {
        local.readerGone(s, slot);
      }
      s.slots[slot] = SlotEntry{};
    }
    local.consumerGone(s);
    local.pump();
  }
};

bool takenBack(const SlotEntry& e) { return e.consumer.taken_back; }

}  // namespace

TEST_CASE("local delivery: a frame is lent to every subscriber without a copy and ends once each released it",
          "[agent][local_delivery]") {
  LocalRig rig;
  TestClient& p = rig.producer(1);
  TestClient& s1 = rig.consumer(11, true);
  TestClient& s2 = rig.consumer(12, true);
  rig.submit(p, 2, 100);
  CHECK(p.session->slots[2].state == SlotState::kLent);
  CHECK(p.session->in_progress == 1);
  for (TestClient* s : {&s1, &s2}) {
    const auto got = rig.take(*s);
    REQUIRE(got.size() == 1);
    CHECK(got[0].status == FL_OK);
    CHECK(got[0].sequence == 1);
    CHECK(got[0].length == 100);
    CHECK(got[0].frame_id == 102);
    const uint32_t rs = got[0].slot;
    // The header names the producer's slot; the reader's own payload is untouched.
    const fl_slot_header* h = s->session->segments->slotHeader(rs);
    CHECK((h->flags & FL_SLOT_LENT) != 0);
    CHECK(h->reserved0 == 2);
    uint64_t lend_id = 0;
    std::memcpy(&lend_id, h->reserved1, sizeof lend_id);
    CHECK(lend_id == 1);
    CHECK(s->session->segments->slot(rs)[0] == 0);
    CHECK(s->session->slots[rs].state == SlotState::kDelivered);
    // The producer's segment went before the completion, once.
    const auto lends = lendMessages(*s);
    REQUIRE(lends.size() == 1);
    CHECK(lends[0].m.kind == FL_LEND_SEGMENT);
    CHECK(lends[0].m.lend_id == 1);
    CHECK(lends[0].m.slot_count == 4);
    CHECK(lends[0].m.slot_size == 4096);
    CHECK(lends[0].fd.valid());
  }
  CHECK(rig.metrics.counters.local_frames_lent.load() == 2);
  CHECK(rig.metrics.counters.local_frames_copied.load() == 0);

  rig.release(s1, 0);
  CHECK(rig.ended.empty());
  CHECK(p.session->slots[2].state == SlotState::kLent);
  rig.release(s2, 0);
  REQUIRE(rig.ended.size() == 1);
  CHECK(rig.ended[0].producer == 1);
  CHECK(rig.ended[0].slot == 2);
  CHECK(rig.ended[0].status == FL_OK);
  CHECK(rig.ended[0].readers == 2);
  CHECK(rig.ended[0].released == 2);
  // A second frame of the same producer needs no second lend.
  rig.submit(p, 0);
  CHECK(lendMessages(s1).empty());
  CHECK(rig.take(s1).size() == 1);
}

TEST_CASE("local delivery: the queue group gets each frame once, round-robin, beside the subscribers",
          "[agent][local_delivery]") {
  LocalRig rig;
  TestClient& p = rig.producer(1);
  TestClient& s = rig.consumer(11, true);
  TestClient& m1 = rig.consumer(12, false);
  TestClient& m2 = rig.consumer(13, false);
  for (uint32_t slot = 0; slot < 3; ++slot) rig.submit(p, slot);
  auto sequences = [&](TestClient& c) {
    std::vector<uint64_t> seqs;
    for (const auto& d : rig.take(c)) seqs.push_back(d.sequence);
    return seqs;
  };
  CHECK(sequences(s) == std::vector<uint64_t>{1, 2, 3});
  CHECK(sequences(m1) == std::vector<uint64_t>{1, 3});
  CHECK(sequences(m2) == std::vector<uint64_t>{2});
  // Frame 2 is the subscriber's (its slot 1) and m2's (its slot 0).
  rig.release(s, 1);
  CHECK(rig.ended.empty());
  rig.release(m2, 0);
  REQUIRE(rig.ended.size() == 1);
  CHECK(rig.ended[0].slot == 1);
  CHECK(rig.ended[0].status == FL_OK);
  CHECK(rig.ended[0].readers == 2);
  CHECK(rig.ended[0].released == 2);
}

TEST_CASE(
    "local delivery: a frame waits in order for a reader's free slot, and fails after credit_timeout_ms",
    "[agent][local_delivery]") {
  LocalRig rig;
  TestClient& p = rig.producer(1);
  TestClient& fast = rig.consumer(11, true);
  TestClient& slow = rig.consumer(12, true, 1);
  rig.submit(p, 0);
  rig.submit(p, 1);
  // Frame 2 goes to nobody until each of its readers has a free slot.
  CHECK(rig.take(fast).size() == 1);
  CHECK(rig.take(slow).size() == 1);
  CHECK(rig.local.waitingFrames() == 1);
  CHECK(rig.local.waitingFor(*slow.session) == 1);
  CHECK(p.session->slots[1].state == SlotState::kLent);

  SECTION("a slot set free lets it go to both") {
    rig.release(slow, 0);
    CHECK(rig.local.waitingFrames() == 0);
    const auto f = rig.take(fast);
    const auto s = rig.take(slow);
    REQUIRE(f.size() == 1);
    REQUIRE(s.size() == 1);
    CHECK(f[0].sequence == 2);
    CHECK(s[0].sequence == 2);
  }
  SECTION("no free slot within credit_timeout_ms fails it, delivered to none") {
    rig.clock.advanceMs(199);
    rig.local.checkDeadlines();
    CHECK(rig.ended.empty());
    rig.clock.advanceMs(1);
    rig.local.checkDeadlines();
    REQUIRE(rig.ended.size() == 1);
    CHECK(rig.ended[0].slot == 1);
    CHECK(rig.ended[0].status == FL_ERR_NO_CONSUMER);
    CHECK(rig.ended[0].readers == 0);
    CHECK(rig.ended[0].released == 0);
    CHECK(rig.local.waitingFrames() == 0);
    CHECK(rig.take(fast).empty());
  }
}

TEST_CASE("local delivery: a reader that holds a frame past ack_timeout_ms loses it, and keeps its slot",
          "[agent][local_delivery]") {
  LocalRig rig;
  TestClient& p = rig.producer(1);
  TestClient& s1 = rig.consumer(11, true);
  TestClient& s2 = rig.consumer(12, true, 1);
  rig.submit(p, 0);
  rig.release(s1, 0);
  rig.clock.advanceMs(999);
  rig.local.checkDeadlines();
  CHECK(rig.ended.empty());
  rig.clock.advanceMs(1);
  rig.local.checkDeadlines();
  // The producer is told its frame may have been read: one reader, of two, released it.
  REQUIRE(rig.ended.size() == 1);
  CHECK(rig.ended[0].status == FL_ERR_TIMEOUT);
  CHECK_THAT(rig.ended[0].why, Catch::Matchers::Contains("ack_timeout_ms"));
  CHECK(rig.ended[0].readers == 2);
  CHECK(rig.ended[0].released == 1);
  CHECK(rig.metrics.counters.local_frames_taken_back.load() == 1);
  CHECK(s2.session->slots[0].state == SlotState::kDelivered);
  CHECK(takenBack(s2.session->slots[0]));

  // The producer's slot is free again; its next frame waits for s2's only slot.
  rig.submit(p, 0);
  CHECK(rig.local.waitingFrames() == 1);
  rig.release(s2, 0);  // the late release frees the slot, and nothing else
  CHECK(rig.ended.size() == 1);
  CHECK(rig.local.waitingFrames() == 0);
  rig.release(s1, 0);
  CHECK(rig.ended.size() == 1);
  rig.release(s2, 0);
  REQUIRE(rig.ended.size() == 2);
  CHECK(rig.ended[1].status == FL_OK);
  CHECK(rig.ended[1].readers == 2);
  CHECK(rig.ended[1].released == 2);
}

TEST_CASE("local delivery: a frame from a peer held past ack_timeout_ms ends for the reader, not the lander",
          "[agent][local_delivery]") {
  // The lander's own deadline is the sender's: the frame ends once it
  // released it, and a taken-back reader's release counts for nothing.
  LocalRig rig;
  TestClient& lander = rig.consumer(11, true);
  TestClient& other = rig.consumer(12, true);
  REQUIRE(rig.local.lands(*lander.session));
  REQUIRE(rig.local.othersRead(*lander.session));
  fl_slot_header h{};
  h.frame_id = 77;
  h.length = 10;
  lander.session->slots[0].state = SlotState::kDelivered;
  lander.session->slots[0].consumer.shared = true;
  rig.local.shareLanded(*lander.session, 0, h, LocalDelivery::Landed{1, 42, 5, 9});
  const auto got = rig.take(other);
  REQUIRE(got.size() == 1);
  CHECK(got[0].frame_id == 77);

  rig.clock.advanceMs(1000);
  rig.local.checkDeadlines();
  CHECK(takenBack(other.session->slots[got[0].slot]));
  CHECK(rig.ended_landed.empty());
  rig.release(other, got[0].slot);
  CHECK(rig.ended_landed.empty());
  rig.local.landedReleased(*lander.session, 0);
  REQUIRE(rig.ended_landed.size() == 1);
  CHECK(rig.ended_landed[0].from.sequence == 9);
  CHECK(rig.ended_landed[0].landing == 11);
  CHECK(rig.ended_landed[0].status == FL_ERR_TIMEOUT);
  CHECK(rig.ended_landed[0].readers == 2);
  CHECK(rig.ended_landed[0].released == 1);
}

TEST_CASE("local delivery: a subscriber that goes holding a frame", "[agent][local_delivery]") {
  LocalRig rig;
  TestClient& p = rig.producer(1);
  TestClient& s1 = rig.consumer(11, true);
  TestClient& s2 = rig.consumer(12, true);
  rig.submit(p, 0);
  REQUIRE(rig.take(s2).size() == 1);

  SECTION("it took the frame's completion: the frame failed for it") {
    REQUIRE(rig.take(s1).size() == 1);
    rig.consumerGoes(s1);
    CHECK(rig.ended.empty());
    rig.release(s2, 0);
    REQUIRE(rig.ended.size() == 1);
    CHECK(rig.ended[0].status == FL_ERR_NO_CONSUMER);
    CHECK(rig.ended[0].readers == 2);
    CHECK(rig.ended[0].released == 1);
  }
  SECTION("it never took the completion: it is not one of the frame's readers") {
    rig.consumerGoes(s1);
    CHECK(rig.ended.empty());
    rig.release(s2, 0);
    REQUIRE(rig.ended.size() == 1);
    CHECK(rig.ended[0].status == FL_OK);
    CHECK(rig.ended[0].readers == 1);
    CHECK(rig.ended[0].released == 1);
  }
  // Its hold ends with it: no second end when the deadline passes.
  rig.clock.advanceMs(5000);
  rig.local.checkDeadlines();
  CHECK(rig.ended.size() == 1);
}

TEST_CASE("local delivery: a member that goes before taking its frame hands it to another member",
          "[agent][local_delivery]") {
  LocalRig rig;
  TestClient& p = rig.producer(1);
  TestClient& s = rig.consumer(11, true);
  TestClient& m1 = rig.consumer(12, false);
  TestClient& m2 = rig.consumer(13, false);
  rig.submit(p, 0);
  REQUIRE(m1.session->slots[0].state == SlotState::kDelivered);
  CHECK(m2.session->slots[0].state == SlotState::kFree);
  rig.consumerGoes(m1);
  CHECK(rig.metrics.counters.local_frames_handed_on.load() == 1);
  // The other member gets it; the subscriber, who has it, not again.
  const auto got = rig.take(m2);
  REQUIRE(got.size() == 1);
  CHECK(got[0].sequence == 1);
  CHECK(rig.take(s).size() == 1);
  rig.release(s, 0);
  CHECK(rig.ended.empty());
  rig.release(m2, 0);
  REQUIRE(rig.ended.size() == 1);
  CHECK(rig.ended[0].status == FL_OK);
  CHECK(rig.ended[0].readers == 2);
  CHECK(rig.ended[0].released == 2);
}

TEST_CASE("local delivery: a producer that goes while its frame is lent", "[agent][local_delivery]") {
  // Its segment is retired with each reader once that reader holds nothing
  // of it -- never under a frame a reader still reads.
  LocalRig rig;
  TestClient& p1 = rig.producer(1);
  TestClient& p2 = rig.producer(2);
  TestClient& a = rig.consumer(11, true);
  TestClient& b = rig.consumer(12, true);
  rig.submit(p1, 0);
  CHECK(lendMessages(a).size() == 1);
  CHECK(lendMessages(b).size() == 1);
  rig.release(a, 0);
  p1.session->gone = true;
  rig.local.producerGone(*p1.session);
  // Retirements go before the reader's next lend.
  rig.submit(p2, 0);
  const auto to_a = lendMessages(a);
  REQUIRE(to_a.size() == 2);
  CHECK(to_a[0].m.kind == FL_LEND_RETIRE);
  CHECK(to_a[0].m.lend_id == 1);
  CHECK_FALSE(to_a[0].fd.valid());
  CHECK(to_a[1].m.kind == FL_LEND_SEGMENT);
  CHECK(to_a[1].m.lend_id == 2);
  const auto to_b = lendMessages(b);
  REQUIRE(to_b.size() == 1);
  CHECK(to_b[0].m.kind == FL_LEND_SEGMENT);
  CHECK(to_b[0].m.lend_id == 2);

  // b's release still ends p1's frame, counting both readers.
  rig.release(b, 0);
  REQUIRE(rig.ended.size() == 1);
  CHECK(rig.ended[0].producer == 1);
  CHECK(rig.ended[0].status == FL_OK);
  CHECK(rig.ended[0].readers == 2);
  CHECK(rig.ended[0].released == 2);
  rig.submit(p2, 1);
  const auto later = lendMessages(b);
  REQUIRE(later.size() == 1);
  CHECK(later[0].m.kind == FL_LEND_RETIRE);
  CHECK(later[0].m.lend_id == 1);
  CHECK(lendMessages(a).empty());
}

TEST_CASE("local delivery: a drop stream's subscriber with no free slot is skipped",
          "[agent][local_delivery]") {
  LocalRig rig;
  rig.config.drop_streams = {"cam"};
  rig.config.drop_lag = 1;
  TestClient& p = rig.producer(1);
  TestClient& fast = rig.consumer(11, true);
  TestClient& slow = rig.consumer(12, true, 1);
  rig.submit(p, 0);
  rig.submit(p, 1);  // waits for slow: one frame waits, not more than drop_lag
  CHECK(rig.local.waitingFrames() == 1);
  rig.submit(p, 2);  // two wait: frame 2 goes on without slow
  CHECK(rig.local.waitingFrames() == 1);
  CHECK(slow.session->dropped == 1);
  CHECK(p.session->dropped == 1);
  CHECK(rig.metrics.counters.frames_dropped_slow_reader.load() == 1);
  REQUIRE(rig.take(fast).size() == 2);
  REQUIRE(rig.take(slow).size() == 1);

  // Meant for slow, never released by it: counted among the readers, not the releases.
  rig.release(fast, 1);
  REQUIRE(rig.ended.size() == 1);
  CHECK(rig.ended[0].slot == 1);
  CHECK(rig.ended[0].status == FL_OK);
  CHECK(rig.ended[0].readers == 2);
  CHECK(rig.ended[0].released == 1);
  // slow's next frame says what it missed.
  rig.release(slow, 0);
  const auto next = rig.take(slow);
  REQUIRE(next.size() == 1);
  CHECK(next[0].sequence == 3);
  CHECK(next[0].readers == 1);
  CHECK((slow.session->segments->slotHeader(next[0].slot)->flags & FL_SLOT_GAP) != 0);
  CHECK(slow.session->gap == 0);
}

TEST_CASE("local delivery: a reader cannot write the segment it is lent, whatever its uid",
          "[agent][local_delivery][security]") {
  // LocalDelivery lends every reader of the stream, of any uid, the same
  // read-only file of the producer's data (it checks no uid): what keeps a
  // reader from writing the producer's frames is that neither that file nor
  // a mapping of it can be made writable, by whoever holds it.
  LocalRig rig;
  TestClient& p = rig.producer(1);
  TestClient& r = rig.consumer(11, true);
  r.session->uid = 65534;
  rig.submit(p, 1, 100, 0xAB);
  const auto lends = lendMessages(r);
  REQUIRE(lends.size() == 1);
  const fl_lend_message& m = lends[0].m;
  const int fd = lends[0].fd.get();
  REQUIRE(fd >= 0);
  CHECK((::fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY);
  errno = 0;
  CHECK(::mmap(nullptr, m.data_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
  CHECK(errno == EACCES);

  // Mapped read-only it is the producer's slot itself, not a copy.
  void* map = ::mmap(nullptr, m.data_size, PROT_READ, MAP_SHARED, fd, 0);
  REQUIRE(map != MAP_FAILED);
  const auto* payload = static_cast<const uint8_t*>(map) + m.slots_offset + m.slot_stride * 1;
  CHECK(payload[0] == 0xAB);
  p.session->segments->slot(1)[0] = 0xCD;
  CHECK(payload[0] == 0xCD);
  CHECK(::mprotect(map, m.data_size, PROT_READ | PROT_WRITE) != 0);
  ::munmap(map, m.data_size);
}
