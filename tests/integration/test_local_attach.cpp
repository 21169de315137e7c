// A reader whose fl_attach returned gets every frame from then on, and a
// queue member whose fl_detach returned is given none: a frame sent the next
// moment goes to the readers attached, whichever of the daemon's threads
// heard of the attach or the detach first.
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <string>

#include <framelink/framelink.h>

#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

constexpr int kRounds = 1000;

// What became of one frame: its completion, and whether `reader` got it
// (released at once).  Waits for the completion, at most 10 s.
struct Round {
  int status = -1;  // -1: no completion came
  uint32_t readers = 0;
  bool read = false;
};

Round sendAndSee(fl_client* producer, fl_client* reader, uint64_t id) {
  Round r;
  const std::string why = trySubmitFrame(producer, id, 64);
  if (!why.empty()) return r;
  const auto deadline = Clock::now() + Millis(10000);
  while (Clock::now() < deadline) {
    fl_frame f{};
    if (!r.read && fl_receive(reader, &f, 1) == FL_OK) {
      r.read = f.frame_id == id;
      if (fl_release(reader, f.slot) != FL_OK) return r;
    }
    fl_completion c{};
    size_t n = 0;
    if (fl_poll_completions(producer, &c, 1, &n) == FL_OK && n == 1) {
      r.status = c.status;
      r.readers = c.readers;
      return r;
    }
  }
  return r;
}

}  // namespace

TEST_CASE("local: a consumer whose fl_attach returned gets the frame sent the next moment",
          "[integration][local_attach]") {
  DaemonProcess::Options o;
  o.id = "solo";
  DaemonProcess d(o);
  Client producer = attachProducer(d, "cam", 4, 4 * 1024);
  std::map<int, int> statuses;
  int read = 0;
  for (int i = 0; i < kRounds; ++i) {
    // Members and subscribers alike; each leaves before the next comes.
    Client consumer = attachWith(d, FL_CONSUMER, "cam", i % 2 == 1, 2, 4 * 1024);
    const Round r = sendAndSee(producer.get(), consumer.get(), static_cast<uint64_t>(i));
    ++statuses[r.status];
    read += r.read ? 1 : 0;
  }
  std::string summary;
  for (const auto& [status, count] : statuses)
    summary += statusName(status) + ": " + std::to_string(count) + "; ";
  INFO(summary);
  CHECK(statuses[FL_ERR_NO_ROUTE] == 0);
  CHECK(statuses[FL_OK] == kRounds);
  CHECK(read == kRounds);
}

TEST_CASE("local: a frame sent right after a queue member's fl_detach goes to a member still attached",
          "[integration][local_attach]") {
  DaemonProcess::Options o;
  o.id = "solo";
  DaemonProcess d(o);
  Client staying = attachWith(d, FL_CONSUMER, "line", false, 4, 4 * 1024);
  Client producer = attachProducer(d, "line", 4, 4 * 1024);
  std::map<int, int> statuses;
  int read = 0, one_reader = 0;
  for (int i = 0; i < kRounds; ++i) {
    attachWith(d, FL_CONSUMER, "line", false, 2, 4 * 1024).reset();  // attached, and gone again
    const Round r = sendAndSee(producer.get(), staying.get(), static_cast<uint64_t>(i));
    ++statuses[r.status];
    read += r.read ? 1 : 0;
    one_reader += r.readers == 1 ? 1 : 0;
  }
  std::string summary;
  for (const auto& [status, count] : statuses)
    summary += statusName(status) + ": " + std::to_string(count) + "; ";
  INFO(summary);
  CHECK(statuses[FL_ERR_NO_CONSUMER] == 0);
  CHECK(statuses[FL_OK] == kRounds);
  CHECK(read == kRounds);
  CHECK(one_reader == kRounds);  // the member that left is not counted among its readers
}

TEST_CASE(
    "local: beside an implicit peer route, a consumer whose fl_attach returned gets the next frame here",
    "[integration][local_attach]") {
  // Every stream of A goes to B (the one peer, no routes), unless a consumer
  // of it is attached to A: the frame's destination is decided by whether
  // the consumer's attach was heard.  A frame that went to B finds no
  // consumer there and fails at A's credit_timeout_ms.
  DaemonPair::Options po;
  po.extra_args_a = {"--credit-timeout-ms", "500"};
  DaemonPair pair(po);
  Client producer = attachProducer(pair.a(), "cam", 4, 4 * 1024);
  std::map<int, int> statuses;
  int read = 0;
  for (int i = 0; i < kRounds; ++i) {
    Client consumer = attachWith(pair.a(), FL_CONSUMER, "cam", i % 2 == 1, 2, 4 * 1024);
    const Round r = sendAndSee(producer.get(), consumer.get(), static_cast<uint64_t>(i));
    ++statuses[r.status];
    read += r.read ? 1 : 0;
  }
  std::string summary;
  for (const auto& [status, count] : statuses)
    summary += statusName(status) + ": " + std::to_string(count) + "; ";
  INFO(summary);
  CHECK(statuses[FL_OK] == kRounds);
  CHECK(read == kRounds);
}

TEST_CASE("local: across a link, a consumer whose fl_attach returned gets the frame sent the next moment",
          "[integration][local_attach]") {
  DaemonPair::Options po;
  po.extra_args = {"--metrics", "127.0.0.1:0"};
  po.extra_args_a = {"--credit-timeout-ms", "2000"};
  DaemonPair pair(po);
  REQUIRE(waitUntil([&] { return pair.a().metric("framelink_links_up") == 1; }, Millis(15000), Millis(50)));
  Client producer = attachProducer(pair.a(), "cam", 4, 4 * 1024);
  std::map<int, int> statuses;
  int read = 0;
  for (int i = 0; i < kRounds; ++i) {
    Client consumer = attachWith(pair.b(), FL_CONSUMER, "cam", i % 2 == 1, 2, 4 * 1024);
    const Round r = sendAndSee(producer.get(), consumer.get(), static_cast<uint64_t>(i));
    ++statuses[r.status];
    read += r.read ? 1 : 0;
  }
  std::string summary;
  for (const auto& [status, count] : statuses)
    summary += statusName(status) + ": " + std::to_string(count) + "; ";
  INFO(summary);
  CHECK(statuses[FL_OK] == kRounds);
  CHECK(read == kRounds);
}
