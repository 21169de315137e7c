// Pull between two framelinkd processes: B lists a stream in pull_streams,
// so A offers each frame of it and B reads the frame into its consumer's
// slot (tcp and grpc here; rdma in the Soft-RoCE lane).  What a consumer and
// a producer see is the same as push: every frame, in order, intact, each
// completion DELIVERED once released.
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

DaemonPair::Options pullPair(const std::string& transport, std::vector<std::string> more_b = {}) {
  DaemonPair::Options o;
  o.transport = transport;
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  o.extra_args_b = {"--pull-stream", "pulled"};
  for (auto& arg : more_b) o.extra_args_b.push_back(std::move(arg));
  return o;
}

// Sends `frames` frames of growing sizes (CRC32C on) with up to `window`
// submitted at once, receiving and releasing them as they come: every one
// arrives in order and intact, and every completion is DELIVERED.
void moveFrames(const DaemonProcess& a, const DaemonProcess& b, const std::string& stream, int frames,
                int window) {
  Client consumer = attachConsumer(b, stream, 4, uint64_t{512} * 1024);
  Client producer = attachProducer(a, stream, 8, uint64_t{512} * 1024);
  int submitted = 0;
  int received = 0;
  size_t delivered = 0;
  auto length = [](int i) { return uint64_t(1) + (uint64_t(i) * 40'961) % (uint64_t{512} * 1024); };
  while (received < frames) {
    while (submitted < frames && submitted - received < window) {
      submitFrame(producer.get(), 5000 + uint64_t(submitted), length(submitted), true);
      ++submitted;
    }
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    checkSyntheticFrame(f, 5000 + uint64_t(received), length(received));
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    ++received;
    if (submitted - received >= window || received == frames) {
      for (const fl_completion& c : collectCompletions(producer.get(), 1, Millis(15000))) {
        INFO("completion status " << statusName(c.status));
        CHECK(c.status == FL_OK);
        ++delivered;
      }
    }
  }
  while (delivered < size_t(frames)) {
    auto done = collectCompletions(producer.get(), size_t(frames) - delivered, Millis(15000));
    REQUIRE(!done.empty());
    for (const fl_completion& c : done) CHECK(c.status == FL_OK);
    delivered += done.size();
  }
}

}  // namespace

TEST_CASE("pull: a stream the receiver pulls moves every frame intact, read by the receiver",
          "[integration][pull]") {
  DaemonPair pair(pullPair(GENERATE("tcp", "grpc")));
  constexpr int kFrames = 40;
  moveFrames(pair.a(), pair.b(), "pulled", kFrames, 4);
  // A offered each frame and B read each one: none was written into B.
  CHECK(waitForMetric(pair.a(), "framelink_frames_offered_total", kFrames) == kFrames);
  CHECK(waitForMetric(pair.b(), "framelink_frames_pulled_total", kFrames) == kFrames);
  CHECK(waitForMetric(pair.b(), "framelink_transport_reads_completed_total", kFrames) == kFrames);
  CHECK(waitForMetric(pair.a(), "framelink_transport_reads_served_total", kFrames) == kFrames);
  CHECK(pair.b().metric("framelink_transport_frames_received_total") == 0);
  CHECK(pair.b().metric("framelink_pull_reads_failed_total") == 0);

  // `framelink links` says which streams each side pulls, `clients` which consumers pull.
  {
    Client consumer = attachConsumer(pair.b(), "pulled", 4, uint64_t{64} * 1024);
    Client producer = attachProducer(pair.a(), "pulled", 4, uint64_t{64} * 1024);
    submitFrame(producer.get(), 1, 1000, true);
    fl_frame f = receiveFrame(consumer.get(), Millis(15000));
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
    // The daemons publish what they show twice a second.
    nlohmann::json links_a, links_b;
    for (int i = 0; i < 50; ++i) {
      links_a = cliJson("links-a", {"links", "--json", "--socket", pair.a().socketPath()});
      links_b = cliJson("links-b", {"links", "--json", "--socket", pair.b().socketPath()});
      if (links_a.size() == 1 && links_a[0].value("pulled_out", 0) == 1 && links_b.size() == 1 &&
          links_b[0].value("pulled_in", 0) == 1) {
        break;
      }
      std::this_thread::sleep_for(Millis(100));
    }
    INFO("links A: " << links_a.dump() << "\nlinks B: " << links_b.dump());
    REQUIRE(links_a.size() == 1);
    REQUIRE(links_b.size() == 1);
    CHECK(links_a[0].value("pulled_out", 0) == 1);
    CHECK(links_a[0].value("pulled_in", 0) == 0);
    CHECK(links_b[0].value("pulled_in", 0) == 1);
    CHECK(links_b[0].value("pulled_out", 0) == 0);
    const nlohmann::json clients_b =
        cliJson("clients-b", {"clients", "--json", "--socket", pair.b().socketPath()});
    REQUIRE(clients_b.size() == 1);
    CHECK(clients_b[0].value("delivery", "") == "pull");
    const nlohmann::json clients_a =
        cliJson("clients-a", {"clients", "--json", "--socket", pair.a().socketPath()});
    REQUIRE(clients_a.size() == 1);
    CHECK(clients_a[0].value("delivery", "") == "-");
    const CliRun table = runCli("links-table", {"links", "--socket", pair.b().socketPath()});
    CHECK_THAT(table.output, Catch::Contains("PULLED IN/OUT") && Catch::Contains("1/0"));
  }

  // A stream B does not list is still pushed on the same link.
  const int64_t pulled = pair.b().metric("framelink_frames_pulled_total");
  requireServing(pair.a(), pair.b(), "pushed", 5);
  CHECK(waitForMetric(pair.b(), "framelink_transport_frames_received_total", 5) == 5);
  CHECK(pair.b().metric("framelink_frames_pulled_total") == pulled);
}

namespace {

// What `clients` shows on `d` once every consumer's delivery is `want` (the
// daemon publishes twice a second), or what it showed last.
nlohmann::json waitForDelivery(const DaemonProcess& d, const std::string& want) {
  nlohmann::json clients;
  for (int i = 0; i < 50; ++i) {
    clients = cliJson("clients", {"clients", "--json", "--socket", d.socketPath()});
    bool all = !clients.empty();
    for (const auto& c : clients) all = all && c.value("delivery", "") == want;
    if (all) break;
    std::this_thread::sleep_for(Millis(100));
  }
  return clients;
}

// Sends frames `first` .. `first + count - 1` with up to 4 submitted at once;
// each reaches one of `consumers` (a queue group) intact and once, and every
// completion is DELIVERED.
void moveThroughGroup(fl_client* producer, const std::vector<fl_client*>& consumers, uint64_t first,
                      int count) {
  auto length = [](uint64_t id) { return 1000 + (id * 4099) % 60'000; };
  std::set<uint64_t> seen;
  int submitted = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (seen.size() < size_t(count) && std::chrono::steady_clock::now() < deadline) {
    while (submitted < count && submitted - int(seen.size()) < 4) {
      submitFrame(producer, first + uint64_t(submitted), length(first + uint64_t(submitted)), true);
      ++submitted;
    }
    for (fl_client* c : consumers) {
      fl_frame f{};
      if (fl_receive(c, &f, 20) != FL_OK) continue;
      CHECK(seen.insert(f.frame_id).second);
      CHECK(f.frame_id >= first);
      checkSyntheticFrame(f, f.frame_id, length(f.frame_id));
      REQUIRE(fl_release(c, f.slot) == FL_OK);
    }
  }
  REQUIRE(seen.size() == size_t(count));
  size_t delivered = 0;
  while (delivered < size_t(count)) {
    auto done = collectCompletions(producer, size_t(count) - delivered, Millis(15000));
    REQUIRE(!done.empty());
    for (const fl_completion& c : done) {
      INFO("frame " << c.frame_id << ": " << statusName(c.status));
      CHECK(c.status == FL_OK);
    }
    delivered += done.size();
  }
}

}  // namespace

TEST_CASE("pull: a consumer attached with the pull option has its stream pulled while it stays",
          "[integration][pull]") {
  // B's configuration pulls nothing: the consumers decide.
  DaemonPair::Options o;
  o.transport = "tcp";
  o.extra_args = {"--metrics", "127.0.0.1:0"};
  DaemonPair pair(o);
  constexpr uint64_t kSlot = uint64_t{64} * 1024;
  Client pushed = attachWith(pair.b(), FL_CONSUMER, "asked", false, 4, kSlot);
  Client producer = attachProducer(pair.a(), "asked", 8, kSlot);

  // Nobody asks: pushed.
  moveThroughGroup(producer.get(), {pushed.get()}, 1, 6);
  CHECK(waitForMetric(pair.b(), "framelink_transport_frames_received_total", 6) == 6);
  CHECK(pair.b().metric("framelink_frames_pulled_total") == 0);
  CHECK(waitForDelivery(pair.b(), "push").size() == 1);

  // A second member of the queue group asks for pull: the stream is pulled
  // for both.  The credits granted before stay push credits, and A writes
  // into them; every later grant is of pull credits.
  {
    Client asking = attachWith(pair.b(), FL_CONSUMER, "asked", false, 4, kSlot, /*pull=*/true);
    const nlohmann::json clients = waitForDelivery(pair.b(), "pull");
    INFO("clients on B: " << clients.dump());
    CHECK(clients.size() == 2);
    for (const auto& c : clients) CHECK(c.value("delivery", "") == "pull");
    moveThroughGroup(producer.get(), {pushed.get(), asking.get()}, 100, 40);
    CHECK(waitForMetric(pair.b(), "framelink_frames_pulled_total", 36) >= 36);
    CHECK(pair.b().metric("framelink_transport_frames_received_total") <= 6 + 4);
  }

  // It went: the stream is pushed again (after the pull credits granted before, at most 4).
  const nlohmann::json clients = waitForDelivery(pair.b(), "push");
  INFO("clients on B: " << clients.dump());
  REQUIRE(clients.size() == 1);
  CHECK(clients[0].value("delivery", "") == "push");
  const int64_t received = pair.b().metric("framelink_transport_frames_received_total");
  const int64_t pulled = pair.b().metric("framelink_frames_pulled_total");
  moveThroughGroup(producer.get(), {pushed.get()}, 200, 20);
  CHECK(waitForMetric(pair.b(), "framelink_transport_frames_received_total", received + 16) >= received + 16);
  CHECK(pair.b().metric("framelink_frames_pulled_total") <= pulled + 4);
  // Credits of both kinds on one stream broke nothing.
  CHECK(pair.a().metric("framelink_link_failures_total") == 0);
  CHECK(pair.b().metric("framelink_link_failures_total") == 0);
  CHECK(pair.b().metric("framelink_pull_reads_failed_total") == 0);
}

TEST_CASE("pull: with one read in flight per link, offers wait their turn and none is lost",
          "[integration][pull]") {
  DaemonPair pair(pullPair("tcp", {"--pull-reads-per-link", "1"}));
  constexpr int kFrames = 60;
  moveFrames(pair.a(), pair.b(), "pulled", kFrames, 8);
  CHECK(waitForMetric(pair.b(), "framelink_frames_pulled_total", kFrames) == kFrames);
  CHECK(pair.b().metric("framelink_pull_reads_failed_total") == 0);
}

TEST_CASE("pull: a read that never completes closes its link, and the frame is read again on the next",
          "[integration][pull]") {
  // B's transport withholds some reads' completions until the link ends,
  // as a queue pair that lost a read's responses and did not retransmit
  // them would.
  // Without the link_timeout_ms on reads, each such frame would wait for
  // its ACK deadline and fail TIMEOUT.
  auto o = pullPair("tcp", {"--fault-inject", "seed=5,stall=0.08"});
  for (const char* arg : {"--keepalive-ms", "200", "--link-timeout-ms", "1000"})
    o.extra_args.emplace_back(arg);
  DaemonPair pair(o);
  constexpr int kFrames = 50;
  moveFrames(pair.a(), pair.b(), "pulled", kFrames, 4);
  const int64_t stalled = pair.b().metric("framelink_links_stalled_total");
  INFO("links closed for a stalled read: " << stalled);
  CHECK(stalled >= 1);
  CHECK(pair.b().metric("framelink_link_failures_total") >= stalled);
  CHECK(pair.a().metric("framelink_frames_replayed_total") >= stalled);
  CHECK(pair.b().waitForLog("no read of an offered frame completed", Millis(1000)));
}

TEST_CASE("a data path that goes silent while keepalives still flow is closed, and nothing is lost",
          "[integration][pull]") {
  // A's transport takes a control record (an offer, or a credit's return)
  // and delivers neither it nor anything after it, the Session untouched:
  // B's keepalives say it took less than A handed over, and A closes the
  // link.  Without that check the frames would wait for their ACK deadline.
  const std::string stream = GENERATE("pulled", "pushed");
  INFO("stream " << stream);
  auto o = pullPair("tcp");
  o.extra_args_a = {"--fault-inject", "seed=9,mute=0.2"};
  for (const char* arg : {"--keepalive-ms", "200", "--link-timeout-ms", "1000"})
    o.extra_args.emplace_back(arg);
  DaemonPair pair(o);
  moveFrames(pair.a(), pair.b(), stream, 24, 4);
  const int64_t stalled = pair.a().metric("framelink_links_stalled_total");
  INFO("links A closed for a silent data path: " << stalled);
  CHECK(stalled >= 1);
  CHECK(pair.a().waitForLog("the data path stalled", Millis(1000)));
}

TEST_CASE("pull: a consumer that goes holding frames: they fail, the rest reach the next one, as in push",
          "[integration][pull]") {
  DaemonPair pair(pullPair("tcp"));
  const std::string stream = GENERATE("pulled", "pushed");
  INFO("stream " << stream);
  Client producer = attachProducer(pair.a(), stream, 8, uint64_t{64} * 1024);
  {
    // Its 4 slots take 4 frames, which it never releases; the 2 frames
    // past them wait at the sender for a slot.
    Client first = attachConsumer(pair.b(), stream, 4, uint64_t{64} * 1024);
    for (int i = 0; i < 6; ++i) submitFrame(producer.get(), 7000 + uint64_t(i), 30'000, true);
    for (int i = 0; i < 4; ++i) {
      fl_frame f = receiveFrame(first.get(), Millis(15000));
      checkSyntheticFrame(f, 7000 + uint64_t(i), 30'000);
    }
  }
  Client second = attachConsumer(pair.b(), stream, 4, uint64_t{64} * 1024);
  for (uint64_t id : {7004, 7005}) {
    fl_frame f = receiveFrame(second.get(), Millis(20000));
    checkSyntheticFrame(f, id, 30'000);
    REQUIRE(fl_release(second.get(), f.slot) == FL_OK);
  }
  auto done = collectCompletions(producer.get(), 6, Millis(20000));
  REQUIRE(done.size() == 6);
  for (const fl_completion& c : done) {
    INFO("frame " << c.frame_id << ": " << statusName(c.status));
    CHECK(c.status == (c.frame_id < 7004 ? FL_ERR_NO_CONSUMER : FL_OK));
  }
}

TEST_CASE("pull: incast, 4 producers on two hosts into one consumer: nothing lost, the reader's bound kept",
          "[integration][pull]") {
  const std::string delivery = GENERATE("push", "pull");
  INFO("delivery " << delivery);
  auto options = [](const std::string& id, std::vector<std::string> extra) {
    DaemonProcess::Options o;
    o.id = id;
    o.token = "integ-secret";
    o.transports = "tcp";
    o.extra_args = {"--metrics", "127.0.0.1:0"};
    for (auto& arg : extra) o.extra_args.push_back(std::move(arg));
    return o;
  };
  constexpr int kReadBound = 2;
  DaemonProcess b(options("hostB", delivery == "pull" ? std::vector<std::string>{"--pull-stream", "incast",
                                                                                 "--pull-reads-per-link",
                                                                                 std::to_string(kReadBound)}
                                                      : std::vector<std::string>{}));
  DaemonProcess::Options oa1 = options("hostA1", {});
  oa1.peers = {"hostB=" + b.grpcAddress()};
  DaemonProcess::Options oa2 = options("hostA2", {});
  oa2.peers = {"hostB=" + b.grpcAddress()};
  DaemonProcess a1(oa1);
  DaemonProcess a2(oa2);
  Client consumer = attachConsumer(b, "incast", 8, uint64_t{64} * 1024);
  constexpr int kProducers = 4;
  constexpr int kFrames = 40;
  constexpr uint64_t kLength = 50'000;
  std::vector<Client> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.push_back(attachProducer(p < 2 ? a1 : a2, "incast", 4, uint64_t{64} * 1024));
  }
  // Each producer in a thread of its own: submits its frames and collects their completions.
  std::vector<std::string> failures(kProducers);
  std::vector<size_t> delivered(kProducers, 0);
  std::vector<std::thread> threads;
  struct JoinAll {  // also when a REQUIRE below ends the test early
    std::vector<std::thread>& threads;
    ~JoinAll() {
      for (auto& t : threads) {
        if (t.joinable()) t.join();
      }
    }
  } join_all{threads};
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      fl_client* c = producers[size_t(p)].get();
      for (int i = 0; i < kFrames && failures[size_t(p)].empty(); ++i) {
        failures[size_t(p)] = trySubmitFrame(c, uint64_t(p) * 1000 + uint64_t(i), kLength, true);
        fl_completion done[8];
        size_t n = 0;
        if (fl_poll_completions(c, done, 8, &n) == FL_OK) {
          for (size_t k = 0; k < n; ++k) delivered[size_t(p)] += done[k].status == FL_OK ? 1 : 0;
        }
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (delivered[size_t(p)] < size_t(kFrames) && std::chrono::steady_clock::now() < deadline) {
        fl_completion done[8];
        size_t n = 0;
        if (fl_wait_completions(c, done, 8, &n, 100) == FL_OK) {
          for (size_t k = 0; k < n; ++k) delivered[size_t(p)] += done[k].status == FL_OK ? 1 : 0;
        }
      }
    });
  }
  // Every frame once, each producer's in its order.
  std::map<int, int> next;
  for (int n = 0; n < kProducers * kFrames; ++n) {
    fl_frame f = receiveFrame(consumer.get(), Millis(20000));
    const int p = static_cast<int>(f.frame_id / 1000);
    REQUIRE(p < kProducers);
    CHECK(static_cast<int>(f.frame_id % 1000) == next[p]);
    next[p] = static_cast<int>(f.frame_id % 1000) + 1;
    checkSyntheticFrame(f, f.frame_id, kLength);
    REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
  }
  for (auto& t : threads) t.join();
  for (int p = 0; p < kProducers; ++p) {
    INFO("producer " << p << ": " << failures[size_t(p)]);
    CHECK(failures[size_t(p)].empty());
    CHECK(delivered[size_t(p)] == size_t(kFrames));
  }
  const int64_t pulled = waitForMetric(b, "framelink_frames_pulled_total", delivery == "pull" ? 160 : 0);
  CHECK(pulled == (delivery == "pull" ? kProducers * kFrames : 0));
  // Gauges are published twice a second.
  const int64_t peak = waitForMetric(b, "framelink_pull_reads_in_flight_peak", delivery == "pull" ? 1 : 0);
  if (delivery == "pull") {
    CHECK(peak >= 1);
    CHECK(peak <= kReadBound);
  } else {
    CHECK(peak == 0);
  }
}
