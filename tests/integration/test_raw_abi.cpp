// Bad input written straight into the shared-memory ABI and the attach
// socket, the way a buggy or hostile client could: each must get its
// specific error, and the daemons must keep serving everyone else.
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "client_util.h"
#include "frame_pattern.h"
#include "framelink/framelink.h"
#include "framelink/shm_ring.h"
#include "harness.h"
#include "raw_client.h"

using namespace framelink::integ;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kSlot = 256 * 1024;
constexpr auto kCompletionWait = Millis(10000);

// Expects the next completion of `raw` to carry `status` (and `slot` when >= 0); returns it.
fl_completion_desc expectCompletion(RawClient& raw, int status, int64_t slot = -1) {
  auto c = raw.waitCompletion(kCompletionWait);
  INFO("expected completion " << statusName(status));
  REQUIRE(c.has_value());
  INFO("got completion status " << statusName(c->status) << " slot " << c->slot);
  CHECK(c->status == status);
  if (slot >= 0) CHECK(c->slot == uint32_t(slot));
  return *c;
}

// One good frame from `raw` (slot `slot`) through to `consumer`, verified, DELIVERED.
void rawSendGood(RawClient& raw, fl_client* consumer, uint32_t slot, uint64_t frame_id, uint64_t length) {
  raw.writeMeta(slot, frame_id);
  framelink::pattern::fillPattern(frame_id, raw.slot(slot), length);
  raw.submit(slot, length);
  fl_frame f = receiveFrame(consumer, Millis(15000));
  checkSyntheticFrame(f, frame_id, length);
  REQUIRE(fl_release(consumer, f.slot) == FL_OK);
  auto c = raw.waitCompletion(kCompletionWait);
  REQUIRE(c.has_value());
  INFO("completion " << statusName(c->status));
  CHECK(c->status == FL_OK);
  CHECK(c->slot == slot);
  CHECK(c->frame_id == frame_id);
}

// The raw client got an error completion for one frame, not a detach.
void expectStillAttached(RawClient& raw) {
  CHECK_FALSE(raw.socketClosed());
  CHECK(__atomic_load_n(&raw.header()->daemon_state, __ATOMIC_ACQUIRE) == FL_DAEMON_SERVING);
}

}  // namespace

TEST_CASE("raw ABI: a bad producer descriptor fails that frame only", "[integration][raw]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client consumer = attachConsumer(pair.b(), "raw", 4, kSlot);
  RawClient raw(pair.a().socketPath(), FL_ROLE_PRODUCER, "raw", 4, kSlot);

  SECTION("slot index out of range -> FL_ERR_BAD_SLOT") {
    raw.writeMeta(0, 1);
    raw.submit(raw.slotCount(), 100);
    CHECK(expectCompletion(raw, FL_ERR_BAD_SLOT).frame_id == 0);  // no slot: no header to take an id from
    raw.submit(0xFFFFFFFFu, 100);
    CHECK(expectCompletion(raw, FL_ERR_BAD_SLOT).frame_id == 0);
  }
  SECTION("same slot submitted twice before its completion -> FL_ERR_SLOT_NOT_OWNED") {
    // The consumer holds the first frame, so it stays in flight while the
    // second submit of the same slot is validated.
    raw.writeMeta(0, 7);
    framelink::pattern::fillPattern(7, raw.slot(0), 5000);
    raw.submit(0, 5000);
    raw.submit(0, 5000);
    CHECK(expectCompletion(raw, FL_ERR_SLOT_NOT_OWNED, 0).frame_id == 7);
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    checkSyntheticFrame(f, 7, 5000);
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    auto c = raw.waitCompletion(kCompletionWait);
    REQUIRE(c.has_value());
    INFO("first frame's completion " << statusName(c->status));
    CHECK(c->status == FL_OK);
    CHECK(c->frame_id == 7);
    // Exactly one completion per accepted frame: nothing else arrives.
    CHECK_FALSE(raw.waitCompletion(Millis(300)).has_value());
  }
  SECTION("length > slot_size -> FL_ERR_TOO_LARGE") {
    raw.writeMeta(1, 2);
    raw.submit(1, raw.slotSize() + 1);
    CHECK(expectCompletion(raw, FL_ERR_TOO_LARGE, 1).frame_id == 2);  // echoed, as by any completion
    raw.submit(1, ~uint64_t{0});
    CHECK(expectCompletion(raw, FL_ERR_TOO_LARGE, 1).frame_id == 2);
  }
  SECTION("attr_length 9999 in the slot header -> FL_ERR_BAD_METADATA") {
    raw.writeMeta(2, 3);
    raw.slotHeader(2)->attr_length = 9999;
    raw.submit(2, 100);
    CHECK(expectCompletion(raw, FL_ERR_BAD_METADATA, 2).frame_id == 3);
  }
  SECTION("nonzero reserved descriptor flags -> FL_ERR_BAD_DESCRIPTOR") {
    raw.writeMeta(3, 4);
    raw.submit(3, 100, 0x80u);
    CHECK(expectCompletion(raw, FL_ERR_BAD_DESCRIPTOR, 3).frame_id == 4);
  }

  // The offending client keeps its attachment and can still send a good
  // frame from the same slot numbers; everybody else is served as before.
  expectStillAttached(raw);
  rawSendGood(raw, consumer.get(), 1, 42, 3000);
  REQUIRE(pair.a().alive());
  REQUIRE(pair.b().alive());
  requireServing(pair.a(), pair.b(), "after-bad-desc");
}

TEST_CASE("raw ABI: consumer release of a slot it does not hold", "[integration][raw]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  RawClient raw(pair.b().socketPath(), FL_ROLE_CONSUMER, "rawc", 4, kSlot);
  Client producer = attachProducer(pair.a(), "rawc", 4, kSlot);

  SECTION("never delivered -> FL_ERR_DOUBLE_RELEASE") {
    raw.submit(1, 0);
    expectCompletion(raw, FL_ERR_DOUBLE_RELEASE, 1);
  }
  SECTION("released twice -> FL_ERR_DOUBLE_RELEASE") {
    submitFrame(producer.get(), 5, 777);
    auto d = raw.waitCompletion(Millis(15000));
    REQUIRE(d.has_value());
    REQUIRE(d->status == FL_OK);
    CHECK(d->frame_id == 5);
    CHECK(d->length == 777);
    CHECK(framelink::pattern::verifyPattern(5, raw.slot(d->slot), 777) == framelink::pattern::kNpos);
    raw.submit(d->slot, 0);
    raw.submit(d->slot, 0);
    expectCompletion(raw, FL_ERR_DOUBLE_RELEASE, d->slot);
    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
  }
  SECTION("slot index out of range -> FL_ERR_BAD_SLOT") {
    raw.submit(raw.slotCount() + 10, 0);
    expectCompletion(raw, FL_ERR_BAD_SLOT);
  }

  expectStillAttached(raw);
  // The raw consumer still receives.
  submitFrame(producer.get(), 9, 1234);
  auto d = raw.waitCompletion(Millis(15000));
  REQUIRE(d.has_value());
  CHECK(d->status == FL_OK);
  CHECK(d->frame_id == 9);
  raw.submit(d->slot, 0);
  REQUIRE(pair.b().alive());
  requireServing(pair.a(), pair.b(), "after-bad-release");
}

TEST_CASE("raw ABI: a corrupt submit ring detaches only that client", "[integration][raw]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  // A bystander on the same daemon, attached before and after the corruption.
  Client bystander_consumer = attachConsumer(pair.b(), "bystander", 4, kSlot);
  Client bystander = attachProducer(pair.a(), "bystander", 4, kSlot);

  const uint32_t role = GENERATE(as<uint32_t>{}, FL_ROLE_PRODUCER, FL_ROLE_CONSUMER);
  INFO("corrupt client role " << role);
  DaemonProcess& d = role == FL_ROLE_PRODUCER ? pair.a() : pair.b();
  RawClient raw(d.socketPath(), role, "corrupt", 4, kSlot);
  fl_ring_header* ring = raw.submitRing();
  const uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
  __atomic_store_n(&ring->tail, head + uint64_t(raw.ringCapacity()) * 1000 + 3, __ATOMIC_RELEASE);
  raw.doorbell();

  INFO("the daemon must drop the client with the corrupt ring (close its socket or mark it detached)");
  CHECK(raw.waitDetached(Millis(10000)));
  REQUIRE(d.alive());

  // The bystander's existing attachment still works, and new ones too.
  submitFrame(bystander.get(), 11, 4096);
  fl_frame f = receiveFrame(bystander_consumer.get(), Millis(15000));
  checkSyntheticFrame(f, 11, 4096);
  REQUIRE(fl_release(bystander_consumer.get(), f.slot) == FL_OK);
  auto done = collectCompletions(bystander.get(), 1, Millis(15000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  requireServing(pair.a(), pair.b(), "after-corrupt");
}

TEST_CASE("raw attach: bad requests get a specific refusal", "[integration][raw]") {
  // Attach handling is local to one daemon; the pair is here for requireServing.
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  const std::string sock = pair.a().socketPath();

  auto expectRefused = [&](const RawReply& r, int status) {
    INFO("reply: closed=" << r.closed << " timed_out=" << r.timed_out << " bytes=" << r.bytes
                          << " status=" << r.reply.status << " message='" << r.reply.message << "'");
    REQUIRE_FALSE(r.timed_out);
    REQUIRE(r.bytes == sizeof(fl_attach_reply));
    CHECK(r.reply.magic == FL_ATTACH_MAGIC);
    CHECK(r.reply.status == status);
    CHECK(r.reply.fd_count == 0);
    CHECK(r.fds.empty());
    CHECK(std::strlen(r.reply.message) > 0);
    for (int fd : r.fds) ::close(fd);
  };

  SECTION("wrong magic -> FL_ERR_VERSION") {
    fl_attach_request req = makeAttachRequest(FL_ROLE_PRODUCER, "s", 4, kSlot);
    req.magic = 0xDEADBEEF;
    expectRefused(rawExchange(sock, &req, sizeof req, Millis(5000)), FL_ERR_VERSION);
  }
  SECTION("wrong version -> FL_ERR_VERSION") {
    fl_attach_request req = makeAttachRequest(FL_ROLE_PRODUCER, "s", 4, kSlot);
    req.version = FL_ATTACH_VERSION + 1;
    expectRefused(rawExchange(sock, &req, sizeof req, Millis(5000)), FL_ERR_VERSION);
  }
  SECTION("bad role -> FL_ERR_BAD_REQUEST") {
    fl_attach_request req = makeAttachRequest(7, "s", 4, kSlot);
    expectRefused(rawExchange(sock, &req, sizeof req, Millis(5000)), FL_ERR_BAD_REQUEST);
  }
  SECTION("bad stream name -> FL_ERR_BAD_REQUEST") {
    fl_attach_request req = makeAttachRequest(FL_ROLE_PRODUCER, "no/slashes here", 4, kSlot);
    expectRefused(rawExchange(sock, &req, sizeof req, Millis(5000)), FL_ERR_BAD_REQUEST);
    // Not NUL-terminated within the field.
    std::memset(req.stream, 'a', sizeof req.stream);
    expectRefused(rawExchange(sock, &req, sizeof req, Millis(5000)), FL_ERR_BAD_REQUEST);
  }
  SECTION("a producer asking for pull or subscribe, or an unknown flag -> FL_ERR_BAD_REQUEST") {
    fl_attach_request req = makeAttachRequest(FL_ROLE_PRODUCER, "s", 4, kSlot);
    req.flags = FL_ATTACH_PULL;
    RawReply r = rawExchange(sock, &req, sizeof req, Millis(5000));
    expectRefused(r, FL_ERR_BAD_REQUEST);
    CHECK(std::string(r.reply.message).find("only a consumer asks for pull") != std::string::npos);
    req.flags = FL_ATTACH_SUBSCRIBE;
    expectRefused(rawExchange(sock, &req, sizeof req, Millis(5000)), FL_ERR_BAD_REQUEST);
    req = makeAttachRequest(FL_ROLE_CONSUMER, "s", 4, kSlot);
    req.flags = 1u << 2;
    r = rawExchange(sock, &req, sizeof req, Millis(5000));
    expectRefused(r, FL_ERR_BAD_REQUEST);
    CHECK(std::string(r.reply.message).find("reserved attach flags") != std::string::npos);
  }
  SECTION("garbage-sized messages are rejected without crashing") {
    const std::vector<size_t> sizes = {1, 7, sizeof(fl_attach_request) - 1, sizeof(fl_attach_request) + 1,
                                       4000};
    for (size_t n : sizes) {
      INFO("message of " << n << " bytes");
      std::vector<uint8_t> junk(n, 0xA5);
      if (n >= sizeof(fl_attach_request)) {
        fl_attach_request req = makeAttachRequest(FL_ROLE_PRODUCER, "s", 4, kSlot);
        std::memcpy(junk.data(), &req, sizeof req);  // valid prefix, wrong size
      }
      RawReply r = rawExchange(sock, junk.data(), junk.size(), Millis(5000));
      for (int fd : r.fds) ::close(fd);
      INFO("reply: closed=" << r.closed << " bytes=" << r.bytes << " status=" << r.reply.status
                            << " message='" << r.reply.message << "'");
      CHECK_FALSE(r.timed_out);
      // Either an explicit refusal or a closed connection; never an attachment.
      CHECK(r.fds.empty());
      if (!r.closed) {
        CHECK(r.bytes == sizeof(fl_attach_reply));
        CHECK(r.reply.status != FL_OK);
      }
      REQUIRE(pair.a().alive());
    }
  }
  SECTION("an empty message is not an attach") {
    RawReply r = rawExchange(sock, "", 0, Millis(2000));
    for (int fd : r.fds) ::close(fd);
    CHECK(r.fds.empty());
    if (r.bytes > 0) CHECK(r.reply.status != FL_OK);
  }

  REQUIRE(pair.a().alive());
  requireServing(pair.a(), pair.b(), "after-bad-attach");
}
