// The hot restart's hand-over (proxy/hand_over.h): what one daemon packs for
// the next -- real segments, doorbells and a socket -- comes back as the same
// memory and the same files, and whatever does not fit is left, saying why.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attach/client_session.h"
#include "attach/segment.h"
#include "hand_over.h"

using namespace framelink;

namespace {

// An attached client as the attach server makes one: segments, doorbells,
// and the daemon's end of a connected attach socket (the test keeps the client's).
struct HandOverRig {
  std::shared_ptr<ClientSession> session = std::make_shared<ClientSession>();
  UniqueFd client_socket;

  HandOverRig(uint64_t id, uint32_t role, const std::string& stream) {
    SegmentRequest req;
    req.role = role;
    req.slot_count = 4;
    req.slot_size = 4096;
    req.client_id = id;
    req.stream = stream;
    req.hugepages = HugepageMode::kOff;
    auto seg = ClientSegments::create(req);
    REQUIRE(seg.ok());
    REQUIRE(seg.value()->keepReadOnlyDataFd());
    Doorbell submit;
    Doorbell completion;
    REQUIRE(makeSubmitDoorbell(&submit));
    REQUIRE(makeCompletionDoorbell(&completion));
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0);
    session->socket = UniqueFd(sv[0]);
    client_socket = UniqueFd(sv[1]);
    session->id = id;
    session->role = role;
    session->stream = stream;
    session->name = "rig";
    session->pid = ::getpid();
    session->uid = ::getuid();
    session->gid = ::getgid();
    session->segments = seg.value();
    session->submit_doorbell = std::move(submit.daemon_end);
    session->completion_doorbell = std::move(completion.daemon_end);
    session->completion_reader = std::move(completion.reader);
    session->ring_capacity = seg.value()->geometry().ring_capacity;
    session->slots.resize(req.slot_count);
    session->frames = 7;
  }
};

bool sameFile(int a, int b) {
  struct stat sa {};
  struct stat sb {};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int listenerFd() { return ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0); }

}  // namespace

TEST_CASE("a hand-over gives the next daemon the same segments, doorbells and sockets", "[hand_over]") {
  HandOverRig producer(3, FL_ROLE_PRODUCER, "cam");
  HandOverRig consumer(5, FL_ROLE_CONSUMER, "cam");
  UniqueFd listener(listenerFd());
  std::vector<DataAgent::HandedClient> clients{{producer.session, {}}, {consumer.session, {1, 3}}};
  auto packed = packHandOver(listener.get(), "/run/fl.sock", 9, clients);
  REQUIRE(packed.ok());
  CHECK(packed.value().size() == 2 + 2 * 6);
  CHECK(packed.value().front().name == kHandOverStateName);

  Inherited got = unpackHandOver(std::move(packed.value()), "/run/fl.sock");
  INFO((got.left.empty() ? std::string() : got.left.front()));
  REQUIRE(got.left.empty());
  REQUIRE(got.clients.size() == 2);
  CHECK(got.next_client_id == 9);
  CHECK(sameFile(got.listener.get(), listener.get()));
  const ClientSession& p = *got.clients[0].session;
  const ClientSession& c = *got.clients[1].session;
  CHECK(p.id == 3);
  CHECK(p.role == FL_ROLE_PRODUCER);
  CHECK(p.stream == "cam");
  CHECK(p.frames == 7);
  CHECK(c.role == FL_ROLE_CONSUMER);
  // The consumer's held frames: released later, to this daemon.
  CHECK(c.slots[1].state == SlotState::kDelivered);
  CHECK(c.slots[3].state == SlotState::kDelivered);
  CHECK(c.slots[0].state == SlotState::kFree);
  // The same memory: a byte written through the old mapping reads through the new one.
  producer.session->segments->slot(2)[10] = 0x5a;
  CHECK(p.segments->slot(2)[10] == 0x5a);
  CHECK(p.segments->submitRing() != producer.session->segments->submitRing());
  CHECK(sameFile(p.submit_doorbell.get(), producer.session->submit_doorbell.get()));
  CHECK(sameFile(c.completion_doorbell.get(), consumer.session->completion_doorbell.get()));
  CHECK(sameFile(got.clients[1].socket.get(), consumer.session->socket.get()));
  // The consumer's data reaches it read-only from the new daemon too.
  void* rw = ::mmap(nullptr, c.segments->dataSize(), PROT_READ | PROT_WRITE, MAP_SHARED,
                    c.segments->clientDataFd(FL_ROLE_CONSUMER), 0);
  CHECK(rw == MAP_FAILED);
}

TEST_CASE("a hand-over the next daemon cannot use leaves the clients, saying why", "[hand_over]") {
  HandOverRig producer(3, FL_ROLE_PRODUCER, "cam");
  HandOverRig other(4, FL_ROLE_PRODUCER, "cam");
  UniqueFd listener(listenerFd());
  std::vector<DataAgent::HandedClient> clients{{producer.session, {}}, {other.session, {}}};

  SECTION("another socket path: nothing is taken, the listener neither") {
    auto packed = packHandOver(listener.get(), "/run/a.sock", 5, clients);
    REQUIRE(packed.ok());
    Inherited got = unpackHandOver(std::move(packed.value()), "/run/b.sock");
    CHECK(got.clients.empty());
    CHECK_FALSE(got.listener.valid());
    REQUIRE(got.left.size() == 1);
    CHECK(got.left[0].find("/run/a.sock") != std::string::npos);
  }
  SECTION("a client's descriptor missing: that client is left, the other taken") {
    auto packed = packHandOver(listener.get(), "/run/a.sock", 5, clients);
    REQUIRE(packed.ok());
    std::vector<NamedFd> fds = std::move(packed.value());
    std::erase_if(fds, [](const NamedFd& f) { return f.name == "framelink.3.completion"; });
    Inherited got = unpackHandOver(std::move(fds), "/run/a.sock");
    REQUIRE(got.clients.size() == 1);
    CHECK(got.clients[0].session->id == 4);
    REQUIRE(got.left.size() == 1);
    CHECK(got.left[0].find("client 3") != std::string::npos);
  }
  SECTION("a segment of another size than the state says: that client is left") {
    auto packed = packHandOver(listener.get(), "/run/a.sock", 5, clients);
    REQUIRE(packed.ok());
    std::vector<NamedFd> fds = std::move(packed.value());
    for (auto& f : fds) {
      // Client 3's control memfd swapped for client 4's data: the sizes differ.
      if (f.name == "framelink.3.control") f.fd = UniqueFd(::dup(other.session->segments->dataFd()));
    }
    Inherited got = unpackHandOver(std::move(fds), "/run/a.sock");
    REQUIRE(got.clients.size() == 1);
    REQUIRE(got.left.size() == 1);
    CHECK(got.left[0].find("control memfd") != std::string::npos);
  }
  SECTION("a state that does not parse: nothing is taken") {
    auto packed = packHandOver(listener.get(), "/run/a.sock", 5, clients);
    REQUIRE(packed.ok());
    std::vector<NamedFd> fds = std::move(packed.value());
    REQUIRE(::pwrite(fds.front().fd.get(), "\xff\xff\xff", 3, 0) == 3);
    Inherited got = unpackHandOver(std::move(fds), "/run/a.sock");
    CHECK(got.clients.empty());
    REQUIRE(got.left.size() == 1);
    CHECK(got.left[0].find("cannot be read") != std::string::npos);
  }
  SECTION("no state at all: a start like any other") {
    Inherited got = unpackHandOver({}, "/run/a.sock");
    CHECK(got.clients.empty());
    CHECK(got.left.empty());
  }
}
