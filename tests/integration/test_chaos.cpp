// Fault injection between two real daemons: both wrap their links in the
// `faulty` transport decorator (--fault-inject), so that frames are dropped,
// work requests fail, links disconnect, completions come twice or late and
// payloads are damaged on the way -- while a producer and a consumer keep
// streaming.  The audit at the end is the product's promise: every frame
// delivered exactly once, byte for byte, or reported failed; no daemon
// crashed; every slot and credit back where it started.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

struct Audit {
  std::map<uint64_t, int> received;                // frame id -> times the consumer got it
  std::map<uint64_t, std::vector<int>> completed;  // frame id -> completion statuses
  std::map<int, int> failures;                     // status -> frames
};

uint64_t lengthOf(uint64_t id) { return 48 * 1024 + (id * 7919) % (16 * 1024); }

}  // namespace

TEST_CASE("chaos: frames through faulty links arrive exactly once or fail, nothing leaks", "[chaos]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  constexpr uint64_t kFrames = 300;
  constexpr uint32_t kSlots = 8;

  DaemonPair::Options po;
  po.transport = transport;
  po.log_level = "debug";  // printed only when the test fails: every frame's path
  po.extra_args = {"--metrics", "127.0.0.1:0", "--ack-timeout-ms", "20000", "--credit-timeout-ms", "20000"};
  // A sends: its links lose and fail frames and disconnect; B receives: its
  // links damage payloads.  Both deliver completions late or twice.
  po.extra_args_a = {"--fault-inject",
                     "seed=101,drop=0.01,fail=0.01,disconnect=0.005,dup=0.05,delay=0.05,delay_ms=20"};
  po.extra_args_b = {"--fault-inject", "seed=202,corrupt=0.03,delay=0.05,delay_ms=20"};
  DaemonPair pair(po);
  const std::string stream = "chaos-" + transport;

  Audit audit;
  {
    Client consumer = attachConsumer(pair.b(), stream, kSlots, 64 * 1024);
    Client producer = attachProducer(pair.a(), stream, kSlots, 64 * 1024);
    uint64_t next = 0, done = 0;
    const auto deadline = Clock::now() + Millis(240000);
    while (done < kFrames && Clock::now() < deadline) {
      // Keep every producer slot busy (a slot is free again once its
      // completion has been polled).
      while (next < kFrames && next - done < kSlots) {
        submitFrame(producer.get(), next, lengthOf(next), true);
        ++next;
      }
      fl_frame f{};
      int rc = fl_receive(consumer.get(), &f, 5);
      if (rc == FL_OK) {
        ++audit.received[f.frame_id];
        checkSyntheticFrame(f, f.frame_id, lengthOf(f.frame_id));
        REQUIRE(fl_release(consumer.get(), f.slot) == FL_OK);
      } else {
        INFO("fl_receive: " << statusName(rc) << " " << fl_last_error());
        REQUIRE((rc == FL_ETIMEDOUT || rc == FL_EAGAIN));
      }
      fl_completion buf[16];
      size_t n = 0;
      REQUIRE(fl_poll_completions(producer.get(), buf, 16, &n) == FL_OK);
      for (size_t i = 0; i < n; ++i) {
        audit.completed[buf[i].frame_id].push_back(buf[i].status);
        if (buf[i].status != FL_OK) ++audit.failures[buf[i].status];
        ++done;
      }
    }
    // A second completion for any frame would show up now.
    for (const auto& c : collectCompletions(producer.get(), 1, Millis(500))) {
      audit.completed[c.frame_id].push_back(c.status);
    }
    REQUIRE(done == kFrames);
  }

  uint64_t delivered = 0, duplicates = 0;
  for (uint64_t id = 0; id < kFrames; ++id) {
    const auto& st = audit.completed[id];
    INFO("frame " << id << ": " << st.size() << " completion(s), received " << audit.received[id]
                  << " time(s)");
    REQUIRE(st.size() == 1);
    CHECK(audit.received[id] <= 1);
    if (audit.received[id] > 1) duplicates += audit.received[id] - 1;
    // DELIVERED exactly for the frames the consumer got and released.
    CHECK((st[0] == FL_OK) == (audit.received[id] == 1));
    if (st[0] == FL_OK) ++delivered;
  }
  std::string failures;
  for (auto& [status, n] : audit.failures) failures += statusName(status) + "=" + std::to_string(n) + " ";
  INFO("delivered " << delivered << " of " << kFrames << "; failed: " << failures);
  // Links only flapped and payloads were only damaged in transit: replay and
  // resend must bring every frame through.
  CHECK(delivered == kFrames);
  CHECK(duplicates == 0);

  // The faults did happen, and recovery did the work.
  const int64_t link_failures = pair.a().metric("framelink_link_failures_total");
  const int64_t replayed = pair.a().metric("framelink_frames_replayed_total");
  const int64_t resent_crc = pair.a().metric("framelink_frames_resent_crc_total");
  const int64_t dup_dropped = pair.b().metric("framelink_duplicates_dropped_total");
  INFO("link failures " << link_failures << ", replayed " << replayed << ", resent after CRC mismatch "
                        << resent_crc << ", duplicates dropped by B " << dup_dropped);
  std::printf(
      "chaos %s: %llu frames, delivered %llu, failed %llu, duplicates seen by the consumer %llu; "
      "link failures %lld, frames replayed %lld, resent after CRC mismatch %lld, duplicates dropped %lld\n",
      transport.c_str(), static_cast<unsigned long long>(kFrames), static_cast<unsigned long long>(delivered),
      static_cast<unsigned long long>(kFrames - delivered), static_cast<unsigned long long>(duplicates),
      static_cast<long long>(link_failures), static_cast<long long>(replayed),
      static_cast<long long>(resent_crc), static_cast<long long>(dup_dropped));
  CHECK(link_failures > 0);
  CHECK(replayed > 0);
  CHECK(resent_crc > 0);

  // Nothing leaked: both daemons back to idle once the clients are gone.
  CHECK(waitUntil([&] { return pair.a().idle() && pair.b().idle(); }, Millis(15000), Millis(100)));
  INFO("A /stats " << pair.a().httpGet("/stats"));
  INFO("B /stats " << pair.b().httpGet("/stats"));
  CHECK(pair.a().idle());
  CHECK(pair.b().idle());
  REQUIRE(pair.a().alive());
  REQUIRE(pair.b().alive());
}
