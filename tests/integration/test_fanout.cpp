// Frames from a peer for several readers on one host: the link carries each
// frame once, the receiving daemon lends the slot it landed in to every other
// reader there (each subscriber, and one member of the queue group), and the
// sender hears DELIVERED once each of them released it -- or the first
// failure when one of them died holding it.
#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <framelink/framelink.h>
#include <framelink/shm_layout.h>

#include "cli_run.h"
#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

constexpr uint64_t kFanoutFrameBytes = 64 * 1024;

DaemonPair::Options pairOptions(const std::string& transport) {
  DaemonPair::Options o;
  o.transport = transport;
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  return o;
}

// Receives what each reader has, checks it and releases it, until every
// reader got `want[i]` frames or 30 s passed; returns the frame ids each got, in order.
// The readers after the first `want.size()` are the members of one queue group:
// together they must get `group_want` frames (each frame to one of them).
std::vector<std::vector<uint64_t>> readAll(std::vector<Client*> readers, std::vector<size_t> want,
                                           size_t group_want = 0) {
  std::vector<std::vector<uint64_t>> got(readers.size());
  const auto group_got = [&] {
    size_t n = 0;
    for (size_t i = want.size(); i < readers.size(); ++i) n += got[i].size();
    return n;
  };
  const auto until = std::chrono::steady_clock::now() + Millis(30000);
  for (bool done = false; !done && std::chrono::steady_clock::now() < until;) {
    done = true;
    const bool group_done = group_got() >= group_want;
    for (size_t i = 0; i < readers.size(); ++i) {
      if (i < want.size() ? got[i].size() >= want[i] : group_done) continue;
      done = false;
      fl_frame f{};
      if (fl_receive(readers[i]->get(), &f, 5) != FL_OK) continue;
      checkSyntheticFrame(f, f.frame_id, kFanoutFrameBytes);
      got[i].push_back(f.frame_id);
      REQUIRE(fl_release(readers[i]->get(), f.slot) == FL_OK);
    }
  }
  return got;
}

}  // namespace

TEST_CASE("fanout: each subscriber on the receiving host gets every frame, the link carries it once",
          "[fanout]") {
  DaemonPair pair(pairOptions(GENERATE("tcp", "grpc")));
  requireServing(pair.a(), pair.b(), "warmup", 1);
  const int64_t sent_before = waitForMetric(pair.a(), "framelink_transport_frames_sent_total", 1);
  const int64_t lent_before = pair.b().metric("framelink_local_frames_lent_total");

  std::vector<Client> subscribers;
  for (int i = 0; i < 3; ++i) subscribers.push_back(attachWith(pair.b(), FL_CONSUMER, "cam", true));
  Client member1 = attachWith(pair.b(), FL_CONSUMER, "cam", false);
  Client member2 = attachWith(pair.b(), FL_CONSUMER, "cam", false);
  Client producer = attachProducer(pair.a(), "cam", 4, kFanoutFrameBytes);

  constexpr size_t kFrames = 12;
  std::string send_error;  // Catch is not thread-safe: the sender only records what failed
  std::thread send([&] {
    for (uint64_t id = 1; id <= kFrames && send_error.empty(); ++id) {
      send_error = trySubmitFrame(producer.get(), id, kFanoutFrameBytes, true);
    }
  });
  auto got = readAll({&subscribers[0], &subscribers[1], &subscribers[2], &member1, &member2},
                     {kFrames, kFrames, kFrames}, kFrames);
  send.join();
  CHECK(send_error.empty());
  std::vector<uint64_t> in_order;
  for (uint64_t id = 1; id <= kFrames; ++id) in_order.push_back(id);
  for (int i = 0; i < 3; ++i) {
    INFO("subscriber " << i);
    CHECK(got[i] == in_order);
  }
  // The queue group shared them: each frame to one member.
  CHECK(got[3].size() + got[4].size() == kFrames);
  CHECK_FALSE(got[3].empty());
  CHECK_FALSE(got[4].empty());
  // And no member gets a frame a second time.
  for (Client* member : {&member1, &member2}) {
    fl_frame extra{};
    CHECK(fl_receive(member->get(), &extra, 200) == FL_ETIMEDOUT);
  }

  auto done = collectCompletions(producer.get(), kFrames, Millis(20000));
  REQUIRE(done.size() == kFrames);
  for (const auto& c : done) {
    CHECK(c.status == FL_OK);
    // Three subscribers and one member of the queue group, each released it.
    CHECK(c.readers == 4);
    CHECK(c.released == 4);
  }
  // Once over the link; lent on the receiving host to the two other
  // subscribers and a member of the queue group.
  CHECK(waitForMetric(pair.a(), "framelink_transport_frames_sent_total", sent_before + kFrames) ==
        sent_before + int64_t{kFrames});
  CHECK(waitForMetric(pair.b(), "framelink_local_frames_lent_total", lent_before + 3 * kFrames) ==
        lent_before + 3 * int64_t{kFrames});
  CHECK(pair.b().metric("framelink_local_frames_copied_total") == 0);
}

TEST_CASE("fanout: the sender hears DELIVERED only when the last reader released the frame", "[fanout]") {
  DaemonPair pair(pairOptions("tcp"));
  Client first = attachWith(pair.b(), FL_CONSUMER, "cam", true);
  Client second = attachWith(pair.b(), FL_CONSUMER, "cam", true);
  Client producer = attachProducer(pair.a(), "cam", 4, kFanoutFrameBytes);
  submitFrame(producer.get(), 1, kFanoutFrameBytes, true);
  fl_frame a = receiveFrame(first.get(), Millis(10000));
  fl_frame b = receiveFrame(second.get(), Millis(10000));
  checkSyntheticFrame(a, 1, kFanoutFrameBytes);
  checkSyntheticFrame(b, 1, kFanoutFrameBytes);
  // The frame landed in one of them; the other reads that same memory.
  CHECK(a.data != b.data);
  REQUIRE(fl_release(first.get(), a.slot) == FL_OK);
  CHECK(collectCompletions(producer.get(), 1, Millis(500)).empty());
  REQUIRE(fl_release(second.get(), b.slot) == FL_OK);
  auto done = collectCompletions(producer.get(), 1, Millis(10000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  CHECK(done[0].readers == 2);
  CHECK(done[0].released == 2);
}

TEST_CASE("fanout: a reader that dies holding a frame fails it for the sender, the others read on",
          "[fanout]") {
  DaemonPair pair(pairOptions("tcp"));
  // The first subscriber is the one frames land in: its death hands that to the second.
  Client lander = attachWith(pair.b(), FL_CONSUMER, "cam", true);
  Client other = attachWith(pair.b(), FL_CONSUMER, "cam", true);
  Client producer = attachProducer(pair.a(), "cam", 4, kFanoutFrameBytes);
  submitFrame(producer.get(), 1, kFanoutFrameBytes, true);
  receiveFrame(lander.get(), Millis(10000));
  fl_frame f = receiveFrame(other.get(), Millis(10000));
  checkSyntheticFrame(f, 1, kFanoutFrameBytes);
  lander = Client();  // detaches holding frame 1
  // What the other reader holds stays readable: it is mapped in its own process.
  checkSyntheticFrame(f, 1, kFanoutFrameBytes);
  REQUIRE(fl_release(other.get(), f.slot) == FL_OK);
  auto failed = collectCompletions(producer.get(), 1, Millis(10000));
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].status == FL_ERR_NO_CONSUMER);
  CHECK(failed[0].readers == 2);  // the one that died, and the one that released it
  CHECK(failed[0].released == 1);

  for (uint64_t id = 2; id <= 5; ++id) {
    submitFrame(producer.get(), id, kFanoutFrameBytes, true);
    fl_frame g = receiveFrame(other.get(), Millis(10000));
    checkSyntheticFrame(g, id, kFanoutFrameBytes);
    REQUIRE(fl_release(other.get(), g.slot) == FL_OK);
    auto done = collectCompletions(producer.get(), 1, Millis(10000));
    REQUIRE(done.size() == 1);
    CHECK(done[0].status == FL_OK);
    CHECK(done[0].readers == 1);
  }
  // Nothing is left behind on the receiving host: no credit, no frame held.
  other = Client();
  producer = Client();
  const auto until = std::chrono::steady_clock::now() + Millis(5000);
  while (!pair.b().idle() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(Millis(50));
  CHECK(pair.b().idle());
}

TEST_CASE("fanout: a stream routed to a peer is read by the readers on the producer's host too", "[fanout]") {
  DaemonPair::Options o = pairOptions("tcp");
  o.extra_args_a = {"--route", "cam=hostB", "--route", "warmup=hostB"};
  DaemonPair pair(o);
  Client remote = attachWith(pair.b(), FL_CONSUMER, "cam", false);
  Client viewer = attachWith(pair.a(), FL_CONSUMER, "cam", true);  // beside the producer
  Client producer = attachProducer(pair.a(), "cam", 4, kFanoutFrameBytes);
  requireServing(pair.a(), pair.b(), "warmup", 1);
  const int64_t sent_before = waitForMetric(pair.a(), "framelink_transport_frames_sent_total", 1);

  // The local reader holds frame 1: the producer hears nothing until it lets go.
  submitFrame(producer.get(), 1, kFanoutFrameBytes, true);
  fl_frame here = receiveFrame(viewer.get(), Millis(10000));
  fl_frame there = receiveFrame(remote.get(), Millis(10000));
  checkSyntheticFrame(here, 1, kFanoutFrameBytes);
  checkSyntheticFrame(there, 1, kFanoutFrameBytes);
  REQUIRE(fl_release(remote.get(), there.slot) == FL_OK);
  CHECK(collectCompletions(producer.get(), 1, Millis(500)).empty());
  REQUIRE(fl_release(viewer.get(), here.slot) == FL_OK);
  auto done = collectCompletions(producer.get(), 1, Millis(10000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_OK);
  CHECK(done[0].readers == 2);
  CHECK(done[0].released == 2);

  constexpr size_t kMore = 8;
  std::string send_error;  // Catch is not thread-safe: the sender only records what failed
  std::thread send([&] {
    for (uint64_t id = 2; id < 2 + kMore && send_error.empty(); ++id) {
      send_error = trySubmitFrame(producer.get(), id, kFanoutFrameBytes, true);
    }
  });
  auto got = readAll({&viewer, &remote}, {kMore, kMore});
  send.join();
  CHECK(send_error.empty());
  CHECK(got[0].size() == kMore);
  CHECK(got[1].size() == kMore);
  done = collectCompletions(producer.get(), kMore, Millis(10000));
  REQUIRE(done.size() == kMore);
  for (const auto& c : done) {
    CHECK(c.status == FL_OK);
    CHECK(c.readers == 2);
  }
  // The link carried each frame once; the reader here read the producer's own slot.
  CHECK(waitForMetric(pair.a(), "framelink_transport_frames_sent_total", sent_before + 1 + kMore) ==
        sent_before + 1 + int64_t{kMore});
  CHECK(waitForMetric(pair.a(), "framelink_local_frames_lent_total", 1 + kMore) == 1 + int64_t{kMore});
  CHECK(pair.a().metric("framelink_local_frames_copied_total") == 0);
}

TEST_CASE("fanout: the demo shows a viewer beside the producer and the consumer on the other host",
          "[fanout]") {
  CliRun demo = runCli("demo", {"demo", "--frames", "60", "--size", "64K"}, benchBinary());
  INFO(demo.output);
  REQUIRE(demo.code == 0);
  CHECK(demo.output.find("delivered  60 / 60") != std::string::npos);
  CHECK(demo.output.find("viewer     60 received on hostA beside the producer, verified 60") !=
        std::string::npos);
  CHECK(demo.output.find("2 of 2 readers released the frame") != std::string::npos);
  CHECK(demo.output.find("result     OK") != std::string::npos);
}

namespace {

// hostB and hostC listen; hostA dials both and routes `cam` to each.
struct ThreeHosts {
  explicit ThreeHosts(const std::string& transport, std::vector<std::string> a_args = {},
                      const std::vector<std::string>& receiver_args = {}) {
    DaemonProcess::Options o;
    o.token = "integ-secret";
    o.transports = transport;
    o.extra_args = {"--metrics", "127.0.0.1:0"};
    o.extra_args.insert(o.extra_args.end(), receiver_args.begin(), receiver_args.end());
    o.id = "hostB";
    b = std::make_unique<DaemonProcess>(o);
    o.id = "hostC";
    c = std::make_unique<DaemonProcess>(o);
    o.extra_args = {"--metrics", "127.0.0.1:0"};
    o.id = "hostA";
    o.peers = {"hostB=" + b->grpcAddress(), "hostC=" + c->grpcAddress()};
    o.extra_args.insert(o.extra_args.end(),
                        {"--route", "cam=hostB,hostC", "--route", "warmb=hostB", "--route", "warmc=hostC"});
    o.extra_args.insert(o.extra_args.end(), a_args.begin(), a_args.end());
    a = std::make_unique<DaemonProcess>(o);
  }
  // The receivers go last: A fails what it still has with SHUTDOWN instead of chasing them.
  std::unique_ptr<DaemonProcess> b, c, a;
};

// Frames 1..frames from `producer` (a thread of its own), every one read by
// each of `readers` in order; then every completion is DELIVERED, counting
// `readers_each` readers, all of which released it.
void sendToEveryReader(Client& producer, std::vector<Client*> readers, size_t frames, uint32_t readers_each) {
  std::string send_error;  // Catch is not thread-safe: the sender only records what failed
  std::thread send([&] {
    for (uint64_t id = 1; id <= frames && send_error.empty(); ++id) {
      send_error = trySubmitFrame(producer.get(), id, kFanoutFrameBytes, true);
    }
  });
  auto got = readAll(readers, std::vector<size_t>(readers.size(), frames));
  send.join();
  CHECK(send_error.empty());
  std::vector<uint64_t> in_order;
  for (uint64_t id = 1; id <= frames; ++id) in_order.push_back(id);
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("reader " << i);
    CHECK(got[i] == in_order);
  }
  auto done = collectCompletions(producer.get(), frames, Millis(20000));
  REQUIRE(done.size() == frames);
  for (const auto& c : done) {
    CHECK(c.status == FL_OK);
    CHECK(c.readers == readers_each);
    CHECK(c.released == readers_each);
  }
}

}  // namespace

TEST_CASE(
    "fanout: a stream routed to two peers reaches every reader on both hosts; one completion counts all",
    "[fanout]") {
  ThreeHosts hosts(GENERATE("tcp", "grpc"));
  requireServing(*hosts.a, *hosts.b, "warmb", 1);
  requireServing(*hosts.a, *hosts.c, "warmc", 1);
  const int64_t sent_before = waitForMetric(*hosts.a, "framelink_transport_frames_sent_total", 2);

  Client sub1 = attachWith(*hosts.b, FL_CONSUMER, "cam", true);
  Client sub2 = attachWith(*hosts.b, FL_CONSUMER, "cam", true);
  Client member = attachWith(*hosts.c, FL_CONSUMER, "cam", false);
  Client viewer = attachWith(*hosts.a, FL_CONSUMER, "cam", true);  // beside the producer
  Client producer = attachProducer(*hosts.a, "cam", 4, kFanoutFrameBytes);

  constexpr size_t kFrames = 10;
  // Two readers on hostB, one on hostC, the viewer here.
  sendToEveryReader(producer, {&sub1, &sub2, &member, &viewer}, kFrames, 4);
  // Once to each host, from the same producer slot.
  CHECK(waitForMetric(*hosts.a, "framelink_transport_frames_sent_total", sent_before + 2 * kFrames) ==
        sent_before + 2 * int64_t{kFrames});
  CHECK(waitForMetric(*hosts.b, "framelink_transport_frames_received_total", 1 + kFrames) ==
        1 + int64_t{kFrames});
  CHECK(waitForMetric(*hosts.c, "framelink_transport_frames_received_total", 1 + kFrames) ==
        1 + int64_t{kFrames});
}

TEST_CASE(
    "fanout: both hosts pull the stream: each reads the same producer slot, every reader gets every frame",
    "[fanout][pull]") {
  ThreeHosts hosts("tcp", {}, {"--pull-stream", "cam"});
  requireServing(*hosts.a, *hosts.b, "warmb", 1);
  requireServing(*hosts.a, *hosts.c, "warmc", 1);
  Client sub1 = attachWith(*hosts.b, FL_CONSUMER, "cam", true);
  Client sub2 = attachWith(*hosts.b, FL_CONSUMER, "cam", true);
  Client member = attachWith(*hosts.c, FL_CONSUMER, "cam", false);
  Client producer = attachProducer(*hosts.a, "cam", 4, kFanoutFrameBytes);
  constexpr size_t kFrames = 10;
  // The slot comes back once both hosts released the frame.
  sendToEveryReader(producer, {&sub1, &sub2, &member}, kFrames, 3);
  // Offered to each host, read once by each, written into neither.
  CHECK(waitForMetric(*hosts.a, "framelink_frames_offered_total", 2 * kFrames) == 2 * int64_t{kFrames});
  CHECK(waitForMetric(*hosts.b, "framelink_frames_pulled_total", kFrames) == int64_t{kFrames});
  CHECK(waitForMetric(*hosts.c, "framelink_frames_pulled_total", kFrames) == int64_t{kFrames});
  CHECK(waitForMetric(*hosts.b, "framelink_transport_frames_received_total", 1) == 1);  // warmb, pushed
  CHECK(waitForMetric(*hosts.c, "framelink_transport_frames_received_total", 1) == 1);
}

TEST_CASE("fanout: one route without a reader fails the frame with its reason; the other host still gets it",
          "[fanout]") {
  ThreeHosts hosts("tcp", {"--credit-timeout-ms", "1500"});
  requireServing(*hosts.a, *hosts.c, "warmc", 1);
  Client reader = attachWith(*hosts.b, FL_CONSUMER, "cam", false);  // nobody reads cam on hostC
  Client producer = attachProducer(*hosts.a, "cam", 4, kFanoutFrameBytes);
  submitFrame(producer.get(), 1, kFanoutFrameBytes, true);
  fl_frame f = receiveFrame(reader.get(), Millis(10000));
  checkSyntheticFrame(f, 1, kFanoutFrameBytes);
  REQUIRE(fl_release(reader.get(), f.slot) == FL_OK);
  // hostB's side is done; hostC's waits for a consumer until its credit deadline.
  CHECK(collectCompletions(producer.get(), 1, Millis(500)).empty());
  auto done = collectCompletions(producer.get(), 1, Millis(10000));
  REQUIRE(done.size() == 1);
  CHECK(done[0].status == FL_ERR_NO_CONSUMER);
  CHECK(done[0].readers == 1);
  CHECK(done[0].released == 1);

  // A consumer on hostC comes: the next frames reach both.
  Client late = attachWith(*hosts.c, FL_CONSUMER, "cam", false);
  for (uint64_t id = 2; id <= 4; ++id) {
    submitFrame(producer.get(), id, kFanoutFrameBytes, true);
    for (Client* r : {&reader, &late}) {
      fl_frame g = receiveFrame(r->get(), Millis(10000));
      checkSyntheticFrame(g, id, kFanoutFrameBytes);
      REQUIRE(fl_release(r->get(), g.slot) == FL_OK);
    }
    auto ok = collectCompletions(producer.get(), 1, Millis(10000));
    REQUIRE(ok.size() == 1);
    CHECK(ok[0].status == FL_OK);
    CHECK(ok[0].readers == 2);
  }
  producer = Client();
  const auto until = std::chrono::steady_clock::now() + Millis(5000);
  while (!hosts.a->idle() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(Millis(50));
  CHECK(hosts.a->idle());
}

TEST_CASE("fanout: framelink send says how many readers on every host each frame had", "[fanout][cli]") {
  ThreeHosts hosts("tcp");
  std::vector<std::unique_ptr<ChildProcess>> readers;
  for (const DaemonProcess* d : {hosts.b.get(), hosts.c.get()}) {
    readers.push_back(std::make_unique<ChildProcess>(
        "recv-" + d->id(),
        std::vector<std::string>{"recv", "--socket", d->socketPath(), "--stream", "cam", "--count", "5"}));
  }
  auto sent = cliJson("send", {"send", "--socket", hosts.a->socketPath(), "--stream", "cam", "--count", "5",
                               "--size", "4096", "--json"});
  CHECK(sent["delivered"] == 5);
  CHECK(sent["readers_min"] == 2);
  CHECK(sent["readers_max"] == 2);
  CHECK(sent["skipped"] == 0);
  for (auto& r : readers) CHECK(r->wait(Millis(10000)) == 0);
}

TEST_CASE("fanout: on a drop stream a stalled subscriber is skipped for frames that landed beside it",
          "[fanout]") {
  DaemonPair::Options o = pairOptions("tcp");
  o.extra_args.insert(o.extra_args.end(), {"--drop-stream", "cam", "--drop-lag", "1"});
  DaemonPair pair(o);
  // The lander has the larger slots; the stalled one takes two frames and keeps them.
  Client lander = attachWith(pair.b(), FL_CONSUMER, "cam", true, 8, 256 * 1024);
  Client stalled = attachWith(pair.b(), FL_CONSUMER, "cam", true, 2, 128 * 1024);
  Client producer = attachProducer(pair.a(), "cam", 4, kFanoutFrameBytes);

  constexpr uint64_t kFrames = 10;
  std::string send_error;  // Catch is not thread-safe: the sender only records what failed
  std::thread send([&] {
    for (uint64_t id = 1; id <= kFrames && send_error.empty(); ++id) {
      send_error = trySubmitFrame(producer.get(), id, kFanoutFrameBytes);
    }
  });
  auto got = readAll({&lander}, {kFrames});
  send.join();
  CHECK(send_error.empty());
  std::vector<uint64_t> in_order;
  for (uint64_t id = 1; id <= kFrames; ++id) in_order.push_back(id);
  CHECK(got[0] == in_order);
  // Frames 3 .. 9 went on without it; the last one waits for it (one waiting is not more than drop_lag).
  const uint64_t skipped = kFrames - 3;
  CHECK(waitForMetric(pair.b(), "framelink_frames_dropped_slow_reader_total", skipped) == int64_t{skipped});

  for (uint64_t id = 1; id <= 2; ++id) {
    fl_frame f = receiveFrame(stalled.get(), Millis(5000));
    CHECK(f.frame_id == id);
    CHECK(fl_frame_gap(stalled.get(), f.slot) == 0);
    REQUIRE(fl_release(stalled.get(), f.slot) == FL_OK);
  }
  fl_frame last = receiveFrame(stalled.get(), Millis(5000));
  CHECK(last.frame_id == kFrames);
  CHECK((last.flags & FL_SLOT_GAP) != 0);
  CHECK(fl_frame_gap(stalled.get(), last.slot) == skipped);
  REQUIRE(fl_release(stalled.get(), last.slot) == FL_OK);

  // DELIVERED, each meant for both readers on host B; host B's ACK says
  // which skipped the stalled one (released by one reader).
  auto done = collectCompletions(producer.get(), kFrames, Millis(20000));
  REQUIRE(done.size() == kFrames);
  uint64_t skips_told = 0;
  for (const auto& c : done) {
    INFO("frame " << c.frame_id);
    CHECK(c.status == FL_OK);
    CHECK(c.readers == 2);
    CHECK(c.released == (c.frame_id > 2 && c.frame_id < kFrames ? 1u : 2u));
    skips_told += c.readers - c.released;
  }
  CHECK(skips_told == skipped);
}
