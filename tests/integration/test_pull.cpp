// Pull between two framelinkd processes: B lists a stream in pull_streams,
// so A offers each frame of it and B reads the frame into its consumer's
// slot (tcp and grpc here; rdma in the Soft-RoCE lane).  What a consumer and
// a producer see is the same as push: every frame, in order, intact, each
// completion DELIVERED once released.
#include <catch2/catch.hpp>

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

TEST_CASE("pull: with one read in flight per link, offers wait their turn and none is lost",
          "[integration][pull]") {
  DaemonPair pair(pullPair("tcp", {"--pull-reads-per-link", "1"}));
  constexpr int kFrames = 60;
  moveFrames(pair.a(), pair.b(), "pulled", kFrames, 8);
  CHECK(waitForMetric(pair.b(), "framelink_frames_pulled_total", kFrames) == kFrames);
  CHECK(pair.b().metric("framelink_pull_reads_failed_total") == 0);
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
