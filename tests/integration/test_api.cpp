// libframelink's API-level behaviour against real daemons (in-process client,
// daemons as child processes).
#include <poll.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "client_util.h"
#include "frame_pattern.h"
#include "framelink/framelink.h"
#include "framelink/shm_layout.h"
#include "harness.h"

using namespace framelink::integ;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kMiB = 1 << 20;

long elapsedMs(Clock::time_point since) {
  return static_cast<long>(std::chrono::duration_cast<Millis>(Clock::now() - since).count());
}

}  // namespace

TEST_CASE("api: round trip with every metadata field", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client consumer = attachConsumer(pair.b(), "meta", 4, kMiB);
  Client producer = attachProducer(pair.a(), "meta", 4, kMiB);

  fl_client_info pinfo{}, cinfo{};
  REQUIRE(fl_client_get_info(producer.get(), &pinfo) == FL_OK);
  REQUIRE(fl_client_get_info(consumer.get(), &cinfo) == FL_OK);
  CHECK(pinfo.role == FL_PRODUCER);
  CHECK(cinfo.role == FL_CONSUMER);
  CHECK(pinfo.slot_count == 4);
  CHECK(pinfo.slot_size >= kMiB);
  CHECK(pinfo.daemon_pid == uint64_t(pair.a().pid()));
  CHECK(cinfo.daemon_pid == uint64_t(pair.b().pid()));
  CHECK(fl_check_daemon(producer.get()) == FL_OK);

  struct Case {
    uint64_t length;
    bool crc;
    std::vector<uint8_t> attrs;
  };
  std::vector<uint8_t> binary_attrs(FL_MAX_ATTR_BYTES);
  for (size_t i = 0; i < binary_attrs.size(); ++i) binary_attrs[i] = uint8_t(255 - i);
  const std::vector<Case> cases = {
      {1, true, {'x'}},
      {4096, false, {}},             // no attributes at all
      {kMiB, true, binary_attrs},    // exactly slot_size, the full attribute area, any bytes
      {12345, true, {'a', 0, 'b'}},  // embedded NUL
  };

  uint64_t prev_seq = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const uint64_t frame_id = 0x1000000000ull + i * 77;
    const uint64_t group_id = 0xABCDEF00ull + i;
    const uint64_t ts = 1700000000123456789ull + i;
    INFO("case " << i << " length " << c.length);

    fl_slot slot{};
    REQUIRE(fl_acquire(producer.get(), 5000, &slot) == FL_OK);
    REQUIRE(slot.capacity == pinfo.slot_size);
    framelink::pattern::fillPattern(frame_id, slot.data, c.length);
    fl_frame_meta meta{};
    meta.frame_id = frame_id;
    meta.group_id = group_id;
    meta.timestamp_ns = ts;
    meta.flags = c.crc ? FL_META_CRC32C : 0;
    meta.attr_length = uint32_t(c.attrs.size());
    meta.attrs = c.attrs.empty() ? nullptr : c.attrs.data();
    REQUIRE(fl_set_meta(producer.get(), slot.index, &meta) == FL_OK);
    REQUIRE(fl_submit(producer.get(), slot.index, c.length) == FL_OK);

    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    CHECK(f.frame_id == frame_id);
    CHECK(f.group_id == group_id);
    CHECK(f.timestamp_ns == ts);
    CHECK(f.length == c.length);
    REQUIRE(f.attr_length == c.attrs.size());
    if (!c.attrs.empty()) CHECK(std::memcmp(f.attrs, c.attrs.data(), c.attrs.size()) == 0);
    CHECK(framelink::pattern::verifyPattern(frame_id, f.data, f.length) == framelink::pattern::kNpos);
    if (c.crc) {
      CHECK((f.flags & FL_SLOT_HAS_CRC32C) != 0);
      CHECK(f.crc32c == fl_crc32c(0, f.data, f.length));
    } else {
      CHECK((f.flags & FL_SLOT_HAS_CRC32C) == 0);
    }
    if (i > 0) CHECK(f.sequence > prev_seq);
    prev_seq = f.sequence;
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);

    auto done = collectCompletions(producer.get(), 1, Millis(15000));
    REQUIRE(done.size() == 1);
    INFO("completion " << statusName(done[0].status));
    CHECK(done[0].status == FL_OK);
    CHECK(done[0].slot == slot.index);
    CHECK(done[0].frame_id == frame_id);
    CHECK(done[0].length == c.length);
    CHECK(done[0].sequence == f.sequence);
  }
  uint32_t in_flight = 99;
  REQUIRE(fl_in_flight(producer.get(), &in_flight) == FL_OK);
  CHECK(in_flight == 0);
}

TEST_CASE("api: fl_acquire does not block when every slot is held", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client producer = attachProducer(pair.a(), "acq", 2, 64 * 1024);

  fl_slot s0{}, s1{}, s2{};
  REQUIRE(fl_acquire(producer.get(), 0, &s0) == FL_OK);
  REQUIRE(fl_acquire(producer.get(), 0, &s1) == FL_OK);
  CHECK(s0.index != s1.index);
  CHECK(fl_acquire(producer.get(), 0, &s2) == FL_EAGAIN);

  auto t0 = Clock::now();
  CHECK(fl_acquire(producer.get(), 150, &s2) == FL_ETIMEDOUT);
  CHECK(elapsedMs(t0) >= 140);
  CHECK(elapsedMs(t0) < 5000);

  REQUIRE(fl_abandon(producer.get(), s1.index) == FL_OK);
  REQUIRE(fl_acquire(producer.get(), 0, &s2) == FL_OK);
  CHECK(s2.index == s1.index);
}

TEST_CASE("api: fl_receive times out when nothing arrives", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client consumer = attachConsumer(pair.b(), "quiet", 2, 64 * 1024);
  fl_frame f{};
  CHECK(fl_receive(consumer.get(), &f, 0) == FL_EAGAIN);
  auto t0 = Clock::now();
  CHECK(fl_receive(consumer.get(), &f, 200) == FL_ETIMEDOUT);
  CHECK(elapsedMs(t0) >= 190);
  CHECK(elapsedMs(t0) < 5000);
}

TEST_CASE("api: a frame longer than the producer's slot is refused locally", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client consumer = attachConsumer(pair.b(), "big", 2, 64 * 1024);
  Client producer = attachProducer(pair.a(), "big", 2, 64 * 1024);

  fl_slot slot{};
  REQUIRE(fl_acquire(producer.get(), 5000, &slot) == FL_OK);
  fl_frame_meta meta{};
  meta.frame_id = 1;
  REQUIRE(fl_set_meta(producer.get(), slot.index, &meta) == FL_OK);
  CHECK(fl_submit(producer.get(), slot.index, slot.capacity + 1) == FL_ERR_TOO_LARGE);
  CHECK(std::string(fl_last_error()).size() > 0);
  uint32_t in_flight = 99;
  REQUIRE(fl_in_flight(producer.get(), &in_flight) == FL_OK);
  CHECK(in_flight == 0);

  // The refused submit left the slot with the application: it can be sent properly.
  framelink::pattern::fillPattern(1, slot.data, 100);
  const std::string attrs = framelink::pattern::makeAttrs(1);
  meta.group_id = framelink::pattern::waferOf(1);
  meta.attr_length = uint32_t(attrs.size());
  meta.attrs = reinterpret_cast<const uint8_t*>(attrs.data());
  REQUIRE(fl_set_meta(producer.get(), slot.index, &meta) == FL_OK);
  REQUIRE(fl_submit(producer.get(), slot.index, 100) == FL_OK);
  fl_frame f = receiveFrame(consumer.get(), Millis(15000));
  checkSyntheticFrame(f, 1, 100);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  auto done = collectCompletions(producer.get(), 1, Millis(15000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
}

TEST_CASE("api: a frame larger than the consumer's slot fails with FL_ERR_TOO_LARGE", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client consumer = attachConsumer(pair.b(), "small", 4, 64 * 1024);
  Client producer = attachProducer(pair.a(), "small", 4, kMiB);

  submitFrame(producer.get(), 1, 100 * 1024);
  auto done = collectCompletions(producer.get(), 1, Millis(15000));
  REQUIRE(done.size() == 1);
  INFO("completion " << statusName(done[0].status));
  CHECK(done[0].status == FL_ERR_TOO_LARGE);
  CHECK(done[0].frame_id == 1);

  // The stream is not wedged: the next frame that fits is delivered.
  submitFrame(producer.get(), 2, 1000);
  fl_frame f = receiveFrame(consumer.get(), Millis(15000));
  checkSyntheticFrame(f, 2, 1000);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  done = collectCompletions(producer.get(), 1, Millis(15000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  CHECK(done[0].frame_id == 2);
  // And the oversized frame never reached the consumer.
  fl_frame none{};
  CHECK(fl_receive(consumer.get(), &none, 200) == FL_ETIMEDOUT);
}

TEST_CASE("api: double release is refused locally", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client consumer = attachConsumer(pair.b(), "dbl", 4, 64 * 1024);
  Client producer = attachProducer(pair.a(), "dbl", 4, 64 * 1024);

  submitFrame(producer.get(), 3, 3333);
  fl_frame f = receiveFrame(consumer.get(), Millis(15000));
  checkSyntheticFrame(f, 3, 3333);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  CHECK(fl_release(consumer.get(), f.slot) == FL_ERR_DOUBLE_RELEASE);
  CHECK(std::string(fl_last_error()).size() > 0);
  // A slot that never held a frame.
  CHECK(fl_release(consumer.get(), (f.slot + 1) % 4) == FL_ERR_DOUBLE_RELEASE);

  auto done = collectCompletions(producer.get(), 1, Millis(15000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  // Exactly one completion for the frame, however often it was released.
  CHECK(collectCompletions(producer.get(), 1, Millis(300)).empty());
  requireServing(pair.a(), pair.b(), "after-double-release");
}

TEST_CASE("api: a stream without a consumer fails with FL_ERR_NO_CONSUMER after the credit timeout",
          "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair::Options opt;
  opt.transport = transport;
  opt.extra_args = {"--credit-timeout-ms", "1000"};
  DaemonPair pair(opt);
  Client producer = attachProducer(pair.a(), "nobody", 4, 64 * 1024);

  auto t0 = Clock::now();
  submitFrame(producer.get(), 1, 1000);
  submitFrame(producer.get(), 2, 2000);
  auto done = collectCompletions(producer.get(), 2, Millis(15000));
  REQUIRE(done.size() == 2);
  for (const auto& c : done) {
    INFO("frame " << c.frame_id << " completion " << statusName(c.status));
    CHECK(c.status == FL_ERR_NO_CONSUMER);
  }
  CHECK(elapsedMs(t0) >= 900);
  requireServing(pair.a(), pair.b(), "after-no-consumer");
}

TEST_CASE("api: a stream with no route fails with FL_ERR_NO_ROUTE", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);

  SECTION("daemon without peers") {
    DaemonProcess::Options o;
    o.id = "lonely";
    o.transports = transport;
    DaemonProcess d(o);
    Client producer = attachProducer(d, "nowhere", 2, 64 * 1024);
    submitFrame(producer.get(), 41, 100);
    auto done = collectCompletions(producer.get(), 1, Millis(10000));
    REQUIRE(done.size() == 1);
    INFO("completion " << statusName(done[0].status));
    CHECK(done[0].status == FL_ERR_NO_ROUTE);
    CHECK(done[0].frame_id == 41);  // a refusal at submit echoes the id as any completion does
    REQUIRE(d.alive());
  }
  SECTION("peer with explicit routes that do not name the stream") {
    DaemonPair::Options opt;
    opt.transport = transport;
    opt.extra_args_a = {"--route", "routed=hostB"};
    DaemonPair pair(opt);
    Client producer = attachProducer(pair.a(), "unrouted", 2, 64 * 1024);
    submitFrame(producer.get(), 42, 100);
    auto done = collectCompletions(producer.get(), 1, Millis(10000));
    REQUIRE(done.size() == 1);
    INFO("completion " << statusName(done[0].status));
    CHECK(done[0].status == FL_ERR_NO_ROUTE);
    CHECK(done[0].frame_id == 42);
    requireServing(pair.a(), pair.b(), "routed");
  }
}

TEST_CASE("api: attach refusals carry a specific status and message", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair::Options opt;
  opt.transport = transport;
  opt.extra_args_a = {"--max-slot-size", "4194304", "--max-slots", "16"};
  DaemonPair pair(opt);
  const std::string sock = pair.a().socketPath();

  for (const std::string& bad : {std::string(""), std::string("has space"), std::string("a/b"),
                                 std::string("semi;colon"), std::string(64, 'x')}) {
    INFO("stream name '" << bad << "'");
    AttachResult r = tryAttach(sock, FL_PRODUCER, bad, 2, 64 * 1024);
    CHECK(r.status == FL_EINVAL);
    CHECK_FALSE(r.message.empty());
  }
  {
    AttachResult r = tryAttach(sock, FL_PRODUCER, "q", 2, 4 * kMiB + 4096);
    INFO("slot size over --max-slot-size: " << statusName(r.status) << " '" << r.message << "'");
    CHECK(r.status == FL_ERR_LIMIT);
    CHECK_FALSE(r.message.empty());
    CHECK_THAT(r.message, Catch::Contains("slot", Catch::CaseSensitive::No));
  }
  {
    AttachResult r = tryAttach(sock, FL_PRODUCER, "q", 32, 64 * 1024);
    INFO("slot count over --max-slots: " << statusName(r.status) << " '" << r.message << "'");
    CHECK(r.status == FL_ERR_LIMIT);
    CHECK_FALSE(r.message.empty());
  }
  {
    AttachResult r = tryAttach(pair.a().socketPath() + ".missing", FL_PRODUCER, "q", 2, 64 * 1024);
    INFO("no daemon at the socket: " << statusName(r.status) << " '" << r.message << "'");
    CHECK(r.status == FL_ERR_DAEMON_UNREACHABLE);
    CHECK_FALSE(r.message.empty());
  }
  // A valid attach at the limits works.
  AttachResult ok = tryAttach(sock, FL_PRODUCER, std::string(63, 'y'), 16, 4 * kMiB);
  INFO("attach at the limits: " << statusName(ok.status) << " '" << ok.message << "'");
  CHECK(ok.status == FL_OK);
  requireServing(pair.a(), pair.b(), "after-refusals");
}

TEST_CASE("api: a client notices that its daemon is gone", "[integration][api]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  DaemonPair pair(transport);
  Client producer = attachProducer(pair.a(), "gone", 2, 64 * 1024);
  REQUIRE(fl_check_daemon(producer.get()) == FL_OK);
  pair.a().kill9();
  CHECK(waitUntil([&] { return fl_check_daemon(producer.get()) == FL_ERR_DAEMON_GONE; }, Millis(5000),
                  Millis(10)));
}

TEST_CASE("api: fl_reattach after the daemon restarts, same handle", "[integration][api][reattach]") {
  DaemonPair pair("tcp");
  Client consumer = attachConsumer(pair.b(), "reattach", 4, 64 * 1024);
  Client producer = attachProducer(pair.a(), "reattach", 4, 64 * 1024);
  fl_client* p = producer.get();
  fl_client* c = consumer.get();
  const int doorbell = fl_doorbell_fd(p);
  fl_client_info before{};
  REQUIRE(fl_client_get_info(p, &before) == FL_OK);
  CHECK(before.generation == 0);
  CHECK(fl_reattach(p) == FL_OK);  // still served: nothing changes
  fl_client_info same{};
  REQUIRE(fl_client_get_info(p, &same) == FL_OK);
  CHECK(same.generation == 0);
  CHECK(same.client_id == before.client_id);

  // Two frames reach the consumer, which holds them: in flight for the producer.
  submitFrame(p, 1, 4000);
  submitFrame(p, 2, 5000);
  fl_frame f1 = receiveFrame(c, 10s);
  fl_frame f2 = receiveFrame(c, 10s);
  checkSyntheticFrame(f1, 1, 4000);
  checkSyntheticFrame(f2, 2, 5000);
  // And one slot the application holds when the daemon dies.
  fl_slot held{};
  REQUIRE(fl_acquire(p, 1000, &held) == FL_OK);
  uint8_t* stale = held.data;

  pair.a().kill9();
  REQUIRE(waitUntil([&] { return fl_check_daemon(p) == FL_ERR_DAEMON_GONE; }, 5s, 10ms));
  {
    int rc = fl_reattach(p);
    INFO("reattach with no daemon: " << statusName(rc) << " '" << fl_last_error() << "'");
    CHECK(rc == FL_ERR_DAEMON_UNREACHABLE);
    CHECK(fl_check_daemon(p) == FL_ERR_DAEMON_GONE);  // unchanged, may try again
  }

  pair.a().restart();
  {
    int rc = fl_reattach(p);
    INFO("reattach: " << statusName(rc) << " '" << fl_last_error() << "'");
    REQUIRE(rc == FL_OK);
  }
  CHECK(fl_check_daemon(p) == FL_OK);
  CHECK(fl_doorbell_fd(p) == doorbell);
  fl_client_info after{};
  REQUIRE(fl_client_get_info(p, &after) == FL_OK);
  CHECK(after.generation == 1);
  CHECK(after.daemon_pid == static_cast<uint64_t>(pair.a().pid()));
  CHECK(after.daemon_pid != before.daemon_pid);
  uint32_t in_flight = 99;
  REQUIRE(fl_in_flight(p, &in_flight) == FL_OK);
  CHECK(in_flight == 0);

  // The two frames in flight ended as unknown, each with one completion.
  std::vector<fl_completion> ended = collectCompletions(p, 2, 2s);
  REQUIRE(ended.size() == 2);
  std::vector<uint64_t> ids;
  for (const auto& e : ended) {
    CHECK(e.status == FL_ERR_DAEMON_GONE);
    ids.push_back(e.frame_id);
  }
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<uint64_t>{1, 2});
  CHECK(collectCompletions(p, 1, 200ms).empty());

  // The slot held before is void: submitting it fails, writing through the
  // old pointer is harmless and does not reach the new slots.
  CHECK(fl_submit(p, held.index, 10) != FL_OK);
  std::memset(stale, 0xEE, 4096);
  fl_slot fresh{};
  REQUIRE(fl_acquire(p, 1000, &fresh) == FL_OK);
  CHECK(fresh.data != stale);
  CHECK(std::count(fresh.data, fresh.data + 4096, 0xEE) == 0);
  REQUIRE(fl_abandon(p, fresh.index) == FL_OK);

  // The consumer lets go of the frames of the old attachment; the restarted
  // daemon's link to B serves new frames, each delivered once.
  CHECK(fl_release(c, f1.slot) == FL_OK);
  CHECK(fl_release(c, f2.slot) == FL_OK);
  for (uint64_t id = 10; id < 13; ++id) {
    submitFrame(p, id, 3000 + id);
    fl_frame f = receiveFrame(c, 20s);
    checkSyntheticFrame(f, id, 3000 + id);
    REQUIRE(fl_release(c, f.slot) == FL_OK);
  }
  std::vector<fl_completion> done = collectCompletions(p, 3, 20s);
  REQUIRE(done.size() == 3);
  for (const auto& d : done) CHECK(d.status == FL_OK);
  fl_frame none{};
  CHECK(fl_receive(c, &none, 300) == FL_ETIMEDOUT);
}

TEST_CASE("api: a consumer reattaches to its restarted daemon", "[integration][api][reattach]") {
  DaemonPair pair("tcp");
  Client consumer = attachConsumer(pair.a(), "reattach-c", 4, 64 * 1024);
  fl_client* c = consumer.get();
  pair.a().kill9();
  fl_frame f{};
  CHECK(fl_receive(c, &f, 2000) == FL_ERR_DAEMON_GONE);
  pair.a().restart();
  REQUIRE(fl_reattach(c) == FL_OK);
  fl_client_info info{};
  REQUIRE(fl_client_get_info(c, &info) == FL_OK);
  CHECK(info.generation == 1);
  CHECK(info.role == FL_CONSUMER);
  CHECK(fl_receive(c, &f, 100) == FL_ETIMEDOUT);  // attached and waiting, not gone
  CHECK(fl_release(c, 0) != FL_OK);               // holds nothing of the new attachment
  CHECK(fl_check_daemon(c) == FL_OK);
}

TEST_CASE("api: auto_reattach and the doorbell fd carry a producer over a daemon restart",
          "[integration][api][reattach]") {
  DaemonPair pair("tcp");
  Client consumer = attachConsumer(pair.b(), "auto", 4, 64 * 1024);
  const std::string socket = pair.a().socketPath();
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.stream = "auto";
  o.socket_path = socket.c_str();
  o.slot_count = 4;
  o.slot_size = 64 * 1024;
  REQUIRE(o.auto_reattach == 1);  // on by default: the application did not ask for it
  o.reattach_interval_ms = 50;
  fl_client* raw = nullptr;
  REQUIRE(fl_attach(&o, &raw) == FL_OK);
  Client producer(raw);
  fl_client* p = producer.get();
  const int fd = fl_doorbell_fd(p);
  fl_completion comp{};
  size_t count = 0;
  REQUIRE(fl_poll_completions(p, &comp, 1, &count) == FL_OK);  // nothing: arms the doorbell
  REQUIRE(count == 0);
  pollfd pf{fd, POLLIN, 0};
  CHECK(poll(&pf, 1, 0) == 0);

  pair.a().kill9();
  CHECK(poll(&pf, 1, 5000) == 1);  // an event loop on the doorbell wakes for the loss
  REQUIRE(fl_poll_completions(p, &comp, 1, &count) == FL_OK);
  CHECK(count == 0);
  fl_slot s{};
  {
    int rc = fl_acquire(p, 300, &s);
    INFO(statusName(rc) << " '" << fl_last_error() << "'");
    CHECK(rc == FL_ETIMEDOUT);  // not back yet: nothing, not an error
    CHECK(std::string(fl_last_error()).find("framelinkd is gone and not back yet") != std::string::npos);
  }

  pair.a().restart();
  {
    int rc = fl_acquire(p, 20000, &s);  // attaches again by itself
    INFO(statusName(rc) << " '" << fl_last_error() << "'");
    REQUIRE(rc == FL_OK);
  }
  fl_client_info info{};
  REQUIRE(fl_client_get_info(p, &info) == FL_OK);
  CHECK(info.generation == 1);
  CHECK(info.daemon_pid == static_cast<uint64_t>(pair.a().pid()));
  CHECK(fl_doorbell_fd(p) == fd);
  REQUIRE(fl_abandon(p, s.index) == FL_OK);

  submitFrame(p, 7, 2000);
  fl_frame f = receiveFrame(consumer.get(), 20s);
  checkSyntheticFrame(f, 7, 2000);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  // The completion wakes the same fd, registered before the restart.
  bool delivered = false;
  for (int i = 0; i < 100 && !delivered; ++i) {
    REQUIRE(fl_poll_completions(p, &comp, 1, &count) == FL_OK);
    if (count == 1) {
      CHECK(comp.status == FL_OK);
      CHECK(comp.frame_id == 7);
      delivered = true;
      break;
    }
    REQUIRE(poll(&pf, 1, 20000) == 1);
  }
  CHECK(delivered);
}
