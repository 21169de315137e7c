// Local delivery: producers and consumers attached to one daemon, for a
// stream with no peer route.  The consumer reads the producer's slot itself
// (a read-only mapping of the producer's segment the daemon lent it), the
// producer's completion comes when every reader released the frame, a queue
// group shares the frames while each subscriber gets all of them, and a
// reader that dies, a producer that dies or a stalled reader cost nobody
// else anything.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <framelink/attach_proto.h>
#include <framelink/shm_layout.h>
#include <framelink/framelink.hpp>

#include "cli_run.h"
#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

constexpr uint64_t kKiB = 1024;

DaemonProcess::Options localOptions(std::vector<std::string> extra = {}) {
  DaemonProcess::Options o;
  o.id = "solo";
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  o.extra_args.insert(o.extra_args.end(), extra.begin(), extra.end());
  return o;
}

// The line of /proc/self/maps that holds `p`: its permissions and inode.
struct MapInfo {
  std::string perms;
  unsigned long inode = 0;
  bool found = false;
};
MapInfo mapOf(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char perms[8] = {};
    unsigned long offset = 0, inode = 0;
    char dev[16] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %15s %lu", &lo, &hi, perms, &offset, dev, &inode) != 6) {
      continue;
    }
    if (addr >= lo && addr < hi) return MapInfo{perms, inode, true};
  }
  return {};
}

}  // namespace

TEST_CASE("local: a consumer on the producer's daemon reads the producer's slot, read-only",
          "[integration][local]") {
  DaemonProcess d(localOptions());
  Client consumer = attachWith(d, FL_CONSUMER, "cam", false);
  Client producer = attachProducer(d, "cam", 4, 256 * kKiB);

  fl_slot slot{};
  REQUIRE(fl_acquire(producer.get(), 5000, &slot) == FL_OK);
  const MapInfo producer_map = mapOf(slot.data);
  REQUIRE(producer_map.found);
  REQUIRE(fl_submit(producer.get(), slot.index, 0) == FL_OK);  // an empty frame, then a real one
  fl_frame empty = receiveFrame(consumer.get(), Millis(5000));
  CHECK(empty.length == 0);
  REQUIRE(fl_release(consumer.get(), empty.slot) == FL_OK);
  REQUIRE(collectCompletions(producer.get(), 1, Millis(5000)).size() == 1);

  const uint32_t index = submitFrame(producer.get(), 7, 200 * kKiB, true);
  fl_frame f = receiveFrame(consumer.get(), Millis(5000));
  checkSyntheticFrame(f, 7, 200 * kKiB);
  CHECK(f.flags == FL_SLOT_HAS_CRC32C);  // the daemon checked it
  CHECK(f.sequence == 2);

  // The same file as the producer's slot, mapped read-only and shared.
  const MapInfo frame_map = mapOf(f.data);
  REQUIRE(frame_map.found);
  CHECK(frame_map.inode == producer_map.inode);
  CHECK(frame_map.perms == "r--s");
  const uintptr_t page = reinterpret_cast<uintptr_t>(f.data) & ~uintptr_t{4095};
  errno = 0;
  CHECK(::mprotect(reinterpret_cast<void*>(page), 4096, PROT_READ | PROT_WRITE) != 0);
  CHECK(errno == EACCES);

  // Lent until released: the producer hears nothing before.
  CHECK(collectCompletions(producer.get(), 1, Millis(300)).empty());
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  auto done = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  CHECK(done[0].slot == index);
  CHECK(done[0].frame_id == 7);
  CHECK(d.metric("framelink_local_frames_lent_total") == 2);
  CHECK(d.metric("framelink_local_frames_copied_total") == 0);
  CHECK(d.metric("framelink_frames_delivered_total") == 2);
}

TEST_CASE("local: a queue group shares the frames, each subscriber gets every one", "[integration][local]") {
  DaemonProcess d(localOptions());
  std::vector<Client> members, subscribers;
  for (int i = 0; i < 2; ++i) members.push_back(attachWith(d, FL_CONSUMER, "line", false, 8));
  for (int i = 0; i < 2; ++i) subscribers.push_back(attachWith(d, FL_CONSUMER, "line", true, 8));
  Client producer = attachProducer(d, "line", 8, 256 * kKiB);
  {
    std::map<std::string, int> roles;
    waitUntil(
        [&] {  // the snapshot is published a few times a second
          roles.clear();
          for (const auto& c : cliJson("clients", {"clients", "--json", "--socket", d.socketPath()})) {
            ++roles[c.value("role", "")];
          }
          return roles.size() == 3;
        },
        Millis(5000), Millis(100));
    CHECK(roles == std::map<std::string, int>{{"consumer", 2}, {"producer", 1}, {"subscriber", 2}});
  }

  constexpr uint64_t kFrames = 40;
  std::map<size_t, std::vector<uint64_t>> by_member;
  std::vector<std::vector<uint64_t>> by_subscriber(2);
  std::vector<fl_completion> done;
  for (uint64_t id = 0; id < kFrames; ++id) {
    submitFrame(producer.get(), id, 1000 + id * 777, id % 3 == 0);
    for (size_t s = 0; s < 2; ++s) {
      fl_frame f = receiveFrame(subscribers[s].get(), Millis(5000));
      checkSyntheticFrame(f, id, 1000 + id * 777);
      by_subscriber[s].push_back(f.frame_id);
      REQUIRE(fl_release(subscribers[s].get(), f.slot) == FL_OK);
    }
    // One member got it; the other nothing.
    bool got = false;
    for (size_t m = 0; m < 2; ++m) {
      fl_frame f{};
      const int rc = fl_receive(members[m].get(), &f, got ? 0 : 50);
      if (rc == FL_OK) {
        CHECK_FALSE(got);
        got = true;
        checkSyntheticFrame(f, id, 1000 + id * 777);
        by_member[m].push_back(f.frame_id);
        REQUIRE(fl_release(members[m].get(), f.slot) == FL_OK);
      }
    }
    CHECK(got);
    auto c = collectCompletions(producer.get(), 1, Millis(5000));
    REQUIRE(c.size() == 1);
    CHECK(c[0].status == FL_OK);
    CHECK(c[0].frame_id == id);
    CHECK(c[0].readers == 3);  // both subscribers and one member
    CHECK(c[0].released == 3);
  }
  for (size_t s = 0; s < 2; ++s) CHECK(by_subscriber[s].size() == kFrames);
  CHECK(by_member[0].size() + by_member[1].size() == kFrames);
  CHECK(by_member[0].size() == kFrames / 2);  // round-robin while both have room
  CHECK(d.metric("framelink_frames_delivered_total") == int64_t{kFrames});
  CHECK(d.metric("framelink_frames_received_total") == int64_t{kFrames * 3});
}

TEST_CASE("local: a reader that dies holding a frame fails it for the producer, nobody else",
          "[integration][local]") {
  DaemonProcess d(localOptions());
  Client steady = attachWith(d, FL_CONSUMER, "feed", true);
  Client doomed = attachWith(d, FL_CONSUMER, "feed", true);
  Client producer = attachProducer(d, "feed", 4, 256 * kKiB);

  submitFrame(producer.get(), 1, 5000);
  fl_frame a = receiveFrame(steady.get(), Millis(5000));
  fl_frame b = receiveFrame(doomed.get(), Millis(5000));
  CHECK(a.frame_id == 1);
  CHECK(b.frame_id == 1);
  REQUIRE(fl_release(steady.get(), a.slot) == FL_OK);
  doomed.reset();  // dies holding it
  auto c = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(c.size() == 1);
  CHECK(c[0].status == FL_ERR_NO_CONSUMER);
  CHECK(c[0].readers == 2);
  CHECK(c[0].released == 1);

  // The survivor and the producer go on.
  submitFrame(producer.get(), 2, 6000);
  fl_frame f = receiveFrame(steady.get(), Millis(5000));
  checkSyntheticFrame(f, 2, 6000);
  REQUIRE(fl_release(steady.get(), f.slot) == FL_OK);
  c = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(c.size() == 1);
  CHECK(c[0].status == FL_OK);
}

TEST_CASE("local: a frame nobody takes waits, then fails NO_CONSUMER; with nobody attached, NO_ROUTE",
          "[integration][local]") {
  DaemonProcess d(localOptions({"--credit-timeout-ms", "400"}));
  {
    Client producer = attachProducer(d, "nobody", 4, 64 * kKiB);
    submitFrame(producer.get(), 1, 100);
    auto c = collectCompletions(producer.get(), 1, Millis(5000));
    REQUIRE(c.size() == 1);
    CHECK(c[0].status == FL_ERR_NO_ROUTE);
  }
  Client consumer = attachWith(d, FL_CONSUMER, "full", false, 1);
  Client producer = attachProducer(d, "full", 4, 64 * kKiB);
  submitFrame(producer.get(), 1, 100);
  fl_frame held = receiveFrame(consumer.get(), Millis(5000));  // its only slot, kept
  submitFrame(producer.get(), 2, 100);
  auto c = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(c.size() == 1);
  CHECK(c[0].frame_id == 2);
  CHECK(c[0].status == FL_ERR_NO_CONSUMER);
  REQUIRE(fl_release(consumer.get(), held.slot) == FL_OK);
  c = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(c.size() == 1);
  CHECK(c[0].frame_id == 1);
  CHECK(c[0].status == FL_OK);
}

TEST_CASE("local: a producer that dies leaves its lent frames readable until released",
          "[integration][local]") {
  DaemonProcess d(localOptions());
  Client consumer = attachWith(d, FL_CONSUMER, "gone", false, 4);
  std::vector<fl_frame> held;
  {
    Client producer = attachProducer(d, "gone", 4, 128 * kKiB);
    for (uint64_t id = 0; id < 3; ++id) submitFrame(producer.get(), id, 100 * kKiB);
    for (uint64_t id = 0; id < 3; ++id) held.push_back(receiveFrame(consumer.get(), Millis(5000)));
  }  // detached with three frames lent
  REQUIRE(waitUntil([&] { return d.metric("framelink_clients_detached_total") == 1; }, Millis(5000)));
  for (uint64_t id = 0; id < 3; ++id) {
    checkSyntheticFrame(held[id], id, 100 * kKiB);
    REQUIRE(fl_release(consumer.get(), held[id].slot) == FL_OK);
  }
  // Its segment is retired with the next frame of another producer.
  Client producer = attachProducer(d, "gone", 4, 128 * kKiB);
  submitFrame(producer.get(), 9, 1000);
  fl_frame f = receiveFrame(consumer.get(), Millis(5000));
  checkSyntheticFrame(f, 9, 1000);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  REQUIRE(collectCompletions(producer.get(), 1, Millis(5000)).size() == 1);
  // Nothing of the dead producer is left once everyone has gone (idle() wants no clients: while
  // these two were attached it could only pass on a stats snapshot older than their attach).
  producer.reset();
  consumer.reset();
  REQUIRE(waitUntil([&] { return d.idle(); }, Millis(5000)));
}

TEST_CASE("local: a lent frame may be larger than the reader's own slots", "[integration][local]") {
  DaemonProcess d(localOptions());
  Client consumer = attachWith(d, FL_CONSUMER, "big", false, 2, 4 * kKiB);
  Client producer = attachProducer(d, "big", 2, 1 << 20);
  submitFrame(producer.get(), 5, 1 << 20);
  fl_frame f = receiveFrame(consumer.get(), Millis(5000));
  checkSyntheticFrame(f, 5, 1 << 20);
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  auto c = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(c.size() == 1);
  CHECK(c[0].status == FL_OK);
}

TEST_CASE("local: a producer cannot subscribe", "[integration][local]") {
  DaemonProcess d(localOptions());
  fl_client_options opt;
  fl_client_options_init(&opt);
  opt.role = FL_PRODUCER;
  opt.socket_path = d.socketPath().c_str();
  opt.stream = "x";
  opt.subscribe = 1;
  fl_client* c = nullptr;
  CHECK(fl_attach(&opt, &c) == FL_EINVAL);
  CHECK(std::string(fl_last_error()).find("subscribe is for consumers") != std::string::npos);
}

TEST_CASE("local: the C++ API subscribes", "[integration][local]") {
  DaemonProcess d(localOptions());
  framelink::Options o;
  o.stream = "cpp";
  o.socket_path = d.socketPath();
  o.subscribe = true;
  framelink::Consumer a(o), b(o);
  o.subscribe = false;
  framelink::Producer producer(o);
  auto slot = producer.acquire();
  REQUIRE(slot);
  std::memcpy(slot->data(), "hello", 5);
  slot->submit(5);
  for (framelink::Consumer* c : {&a, &b}) {
    auto frame = c->receive(5000);
    REQUIRE(frame);
    CHECK(std::string(reinterpret_cast<const char*>(frame->data()), frame->size()) == "hello");
  }  // released here
  const auto done = producer.waitCompletions(5000);
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
}

TEST_CASE("local: a stream in copy_streams is copied into the reader's own slot", "[integration][local]") {
  DaemonProcess d(localOptions({"--copy-stream", "private"}));
  Client consumer = attachWith(d, FL_CONSUMER, "private", false);
  Client producer = attachProducer(d, "private", 4, 256 * kKiB);
  fl_slot slot{};
  REQUIRE(fl_acquire(producer.get(), 5000, &slot) == FL_OK);
  const MapInfo producer_map = mapOf(slot.data);
  REQUIRE(fl_submit(producer.get(), slot.index, 0) == FL_OK);
  fl_frame first = receiveFrame(consumer.get(), Millis(5000));
  REQUIRE(fl_release(consumer.get(), first.slot) == FL_OK);
  REQUIRE(collectCompletions(producer.get(), 1, Millis(5000)).size() == 1);

  submitFrame(producer.get(), 3, 100 * kKiB);
  fl_frame f = receiveFrame(consumer.get(), Millis(5000));
  checkSyntheticFrame(f, 3, 100 * kKiB);
  const MapInfo frame_map = mapOf(f.data);
  REQUIRE(frame_map.found);
  CHECK(frame_map.inode != producer_map.inode);  // the consumer's own segment
  REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  REQUIRE(collectCompletions(producer.get(), 1, Millis(5000)).size() == 1);
  CHECK(d.metric("framelink_local_frames_copied_total") == 2);
  CHECK(d.metric("framelink_local_frames_lent_total") == 0);
}

TEST_CASE("local: a reader lent more segments than it may hold gets an idle one retired",
          "[integration][local]") {
  DaemonProcess d(localOptions());
  Client consumer = attachWith(d, FL_CONSUMER, "cam", false);
  // One producer more than a consumer may hold segments of, each alive.
  std::vector<Client> producers;
  for (uint32_t i = 0; i <= FL_LEND_MAX; ++i) {
    producers.push_back(attachProducer(d, "cam", 1, 4 * kKiB));
    submitFrame(producers.back().get(), i + 1, 1 * kKiB, true);
    fl_frame f = receiveFrame(consumer.get(), Millis(5000));
    checkSyntheticFrame(f, i + 1, 1 * kKiB);
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    REQUIRE(collectCompletions(producers.back().get(), 1, Millis(5000)).size() == 1);
  }
  // Every frame lent, none copied: the oldest idle segment made room.
  CHECK(d.metric("framelink_local_frames_lent_total") == FL_LEND_MAX + 1);
  CHECK(d.metric("framelink_local_frames_copied_total") == 0);
  CHECK(d.metric("framelink_lends_retired_for_room_total") == 1);
}

TEST_CASE("local: `framelink clients` shows a slow subscriber's lag", "[integration][local]") {
  DaemonProcess d(localOptions());
  Client slow = attachWith(d, FL_CONSUMER, "cam", true, 2);
  Client producer = attachProducer(d, "cam", 6, 64 * kKiB);
  // It holds both of its slots: the next frames wait for one.
  for (uint64_t id = 1; id <= 5; ++id) submitFrame(producer.get(), id, 1000);
  receiveFrame(slow.get(), Millis(5000));
  receiveFrame(slow.get(), Millis(5000));
  nlohmann::json clients;
  const nlohmann::json* reader = nullptr;
  REQUIRE(waitUntil(
      [&] {
        clients = cliJson("clients", {"clients", "--json", "--socket", d.socketPath()});
        reader = nullptr;
        for (const auto& c : clients) {
          if (c.value("role", "") == "subscriber") reader = &c;
        }
        return reader != nullptr && reader->value("waiting", 0) == 3;
      },
      Millis(10000), Millis(200)));
  INFO(clients.dump());
  CHECK(reader->value("in_flight", 0) == 2);
  CliRun table = runCli("clients-table", {"clients", "--socket", d.socketPath()});
  REQUIRE(table.code == 0);
  INFO(table.output);
  CHECK(table.output.find("LAG") != std::string::npos);
  // IN FLIGHT 2, LAG 5: what it holds and what waits for it.
  std::istringstream lines(table.output);
  std::string line;
  bool seen = false;
  while (std::getline(lines, line)) {
    if (line.find("subscriber") == std::string::npos) continue;
    std::istringstream cols(line);
    std::vector<std::string> f{std::istream_iterator<std::string>(cols),
                               std::istream_iterator<std::string>()};
    auto role = std::find(f.begin(), f.end(), "subscriber");
    REQUIRE(std::distance(role, f.end()) > 7);
    CHECK(*(role + 6) == "2");  // IN FLIGHT, after STREAM and "2 x 256 KiB"
    CHECK(*(role + 7) == "5");  // LAG
    seen = true;
  }
  CHECK(seen);
}

namespace {

// A fast and a stalled subscriber of "cam" (the stalled one takes two
// frames and keeps them), a producer sending `frames` frames and the fast
// one reading each frame as it comes.  Returns the frame ids the fast one got.
struct SlowReaderRun {
  Client slow, fast, producer;
  std::vector<uint64_t> fast_ids;
  std::vector<fl_frame> held;  // the stalled one's
};

SlowReaderRun runWithStalledSubscriber(const DaemonProcess& d, uint64_t frames, uint64_t lag) {
  SlowReaderRun run{attachWith(d, FL_CONSUMER, "cam", true, 2), attachWith(d, FL_CONSUMER, "cam", true, 8),
                    attachProducer(d, "cam", 8, 64 * kKiB)};
  for (uint64_t id = 1; id <= frames; ++id) {
    submitFrame(run.producer.get(), id, 1000);
    if (id <= 2) run.held.push_back(receiveFrame(run.slow.get(), Millis(5000)));
    // Once the stalled one is full, a frame goes on when more than `lag` wait.
    const uint64_t expected = id <= 2 ? id : id > lag + 2 ? id - lag : 0;
    if (expected == 0) continue;
    fl_frame f{};
    if (fl_receive(run.fast.get(), &f, 2000) != FL_OK) return run;
    run.fast_ids.push_back(f.frame_id);
    CHECK(fl_frame_gap(run.fast.get(), f.slot) == 0);
    REQUIRE(fl_release(run.fast.get(), f.slot) == FL_OK);
  }
  return run;
}

}  // namespace

TEST_CASE("local: on a drop stream a stalled subscriber is skipped, told the gap, and counted",
          "[integration][local]") {
  constexpr uint64_t kFrames = 20, kLag = 2;
  DaemonProcess d(localOptions({"--drop-stream", "cam", "--drop-lag", std::to_string(kLag)}));
  SlowReaderRun run = runWithStalledSubscriber(d, kFrames, kLag);
  // The producer and the fast subscriber kept going: frames 1 .. 18, the
  // last two wait for the stalled one (no more than kLag wait).
  std::vector<uint64_t> expected;
  for (uint64_t id = 1; id <= kFrames - kLag; ++id) expected.push_back(id);
  CHECK(run.fast_ids == expected);
  const uint64_t skipped = kFrames - kLag - 2;  // frames 3 .. 18
  CHECK(d.metric("framelink_frames_dropped_slow_reader_total") == skipped);

  // It resumes: the next frame it gets says what it missed.
  for (const fl_frame& f : run.held) REQUIRE(fl_release(run.slow.get(), f.slot) == FL_OK);
  fl_frame next = receiveFrame(run.slow.get(), Millis(5000));
  CHECK(next.frame_id == kFrames - kLag + 1);
  CHECK((next.flags & FL_SLOT_GAP) != 0);
  CHECK(fl_frame_gap(run.slow.get(), next.slot) == skipped);
  fl_frame last = receiveFrame(run.slow.get(), Millis(5000));
  CHECK(last.frame_id == kFrames);
  CHECK((last.flags & FL_SLOT_GAP) == 0);
  CHECK(fl_frame_gap(run.slow.get(), last.slot) == 0);
  for (int i = 0; i < 2; ++i) {
    fl_frame f = receiveFrame(run.fast.get(), Millis(5000));
    CHECK(f.frame_id == kFrames - kLag + 1 + static_cast<uint64_t>(i));
    REQUIRE(fl_release(run.fast.get(), f.slot) == FL_OK);
  }
  REQUIRE(fl_release(run.slow.get(), next.slot) == FL_OK);
  REQUIRE(fl_release(run.slow.get(), last.slot) == FL_OK);

  // Every frame DELIVERED, meant for both readers; a skipped one says so:
  // released by one of them.
  auto done = collectCompletions(run.producer.get(), kFrames, Millis(5000));
  REQUIRE(done.size() == kFrames);
  uint64_t skips_told = 0;
  for (const fl_completion& c : done) {
    INFO("frame " << c.frame_id);
    CHECK(c.status == FL_OK);
    CHECK(c.readers == 2);
    CHECK(c.released == (c.frame_id > 2 && c.frame_id <= kFrames - kLag ? 1u : 2u));
    skips_told += c.readers - c.released;
  }
  CHECK(skips_told == skipped);

  const nlohmann::json clients = cliJson("clients", {"clients", "--json", "--socket", d.socketPath()});
  INFO(clients.dump());
  for (const auto& c : clients) {
    if (c.value("role", "") == "producer") CHECK(c.value("dropped", uint64_t{0}) == skipped);
    if (c.value("role", "") == "subscriber") {
      CHECK(c.value("dropped", uint64_t{0}) == (c.value("slots", 0) == 2 ? skipped : 0));
    }
  }
}

TEST_CASE("local: without drop_streams the stalled subscriber holds the stream", "[integration][local]") {
  DaemonProcess d(localOptions({"--drop-lag", "2"}));
  SlowReaderRun run = runWithStalledSubscriber(d, 6, 2);
  CHECK(run.fast_ids == std::vector<uint64_t>{1, 2});
  CHECK(d.metric("framelink_frames_dropped_slow_reader_total") == 0);
  for (const fl_frame& f : run.held) REQUIRE(fl_release(run.slow.get(), f.slot) == FL_OK);
  fl_frame next = receiveFrame(run.slow.get(), Millis(5000));
  CHECK(next.frame_id == 3);
  CHECK((next.flags & FL_SLOT_GAP) == 0);
}

TEST_CASE("local: a drop stream's frame due to fail goes on without the stalled subscriber",
          "[integration][local]") {
  DaemonProcess d(localOptions({"--drop-stream", "cam", "--credit-timeout-ms", "500"}));
  Client slow = attachWith(d, FL_CONSUMER, "cam", true, 1);
  Client fast = attachWith(d, FL_CONSUMER, "cam", true, 4);
  Client producer = attachProducer(d, "cam", 4, 64 * kKiB);
  submitFrame(producer.get(), 1, 100);
  fl_frame held = receiveFrame(slow.get(), Millis(5000));
  fl_frame f = receiveFrame(fast.get(), Millis(5000));
  REQUIRE(fl_release(fast.get(), f.slot) == FL_OK);
  // One frame waits, fewer than drop_lag: it goes on at its deadline.
  submitFrame(producer.get(), 2, 100);
  f = receiveFrame(fast.get(), Millis(5000));
  CHECK(f.frame_id == 2);
  REQUIRE(fl_release(fast.get(), f.slot) == FL_OK);
  auto done = collectCompletions(producer.get(), 1, Millis(5000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].frame_id == 2);
  CHECK(done[0].status == FL_OK);
  CHECK(done[0].readers == 2);  // meant for both, released by one: the stalled one was skipped
  CHECK(done[0].released == 1);

  REQUIRE(fl_release(slow.get(), held.slot) == FL_OK);
  submitFrame(producer.get(), 3, 100);
  fl_frame next = receiveFrame(slow.get(), Millis(5000));
  CHECK(next.frame_id == 3);
  CHECK(fl_frame_gap(slow.get(), next.slot) == 1);
  // The C++ view says the same.
  CHECK(framelink::Frame(slow.get(), next).gap() == 1);
}
