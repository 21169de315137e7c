// What one local user may make the daemon hold, and what it may not be
// refused: segment memory is capped for all clients together
// (limits.max_total_bytes) and per uid (limits.max_uid_bytes), each refusal
// saying which limit, the numbers and what to do, and a detach gives the
// bytes back once its segments are gone (a frame a reader holds keeps them);
// a burst of attaches from one uid (a service starting its
// workers) is served whole while it stays under limits.max_clients_per_uid.
#include <poll.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"
#include "hostile_util.h"

using namespace framelink::integ;

namespace {

// Clients of 4 slots of 256 KiB: a little over 1 MiB of segments each (slot
// headers, page rounding and the control segment come on top), so that the
// caps below fit a known number of them whatever the exact layout.
constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotSize = 256 * 1024;

DaemonProcess::Options limitedDaemon(const std::vector<std::string>& limits) {
  DaemonProcess::Options o;
  o.id = "limited";
  o.extra_args = kMetrics;
  o.extra_args.insert(o.extra_args.end(), limits.begin(), limits.end());
  return o;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Attaches `count` producers of kSlots x kSlotSize to `socket` and detaches
// them; FL_OK, or the first refusal.  No Catch macros: this runs in a forked child.
int attachSome(const std::string& socket, int count) {
  std::vector<fl_client*> clients;
  int result = FL_OK;
  for (int i = 0; i < count && result == FL_OK; ++i) {
    fl_client_options o;
    fl_client_options_init(&o);
    o.role = FL_PRODUCER;
    o.socket_path = socket.c_str();
    const std::string stream = "other-" + std::to_string(i);
    o.stream = stream.c_str();
    o.slot_count = kSlots;
    o.slot_size = kSlotSize;
    fl_client* c = nullptr;
    result = fl_attach(&o, &c);
    if (result == FL_OK) clients.push_back(c);
  }
  for (fl_client* c : clients) fl_detach(c);
  return result;
}

// Every client of the burst holds about eight descriptors in this process and
// four in the daemon: more than a default limit of 1024.
void raiseFdLimit(rlim_t wanted) {
  rlimit nofile{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &nofile) == 0);
  if (nofile.rlim_cur >= wanted) return;
  nofile.rlim_cur = wanted;
  if (nofile.rlim_max < wanted) nofile.rlim_max = wanted;  // root may raise it
  REQUIRE(::setrlimit(RLIMIT_NOFILE, &nofile) == 0);
}

}  // namespace

TEST_CASE("limits: an attach over limits.max_total_bytes is refused, saying so; a detach makes room",
          "[integration][limits]") {
  // One user here: its own cap (by default half of the total) set out of the way.
  DaemonProcess d(limitedDaemon({"--max-total-bytes", "3584KiB", "--max-uid-bytes", "16MiB"}));
  std::vector<Client> held;
  for (int i = 0; i < 3; ++i)
    held.push_back(attachProducer(d, "mem-" + std::to_string(i), kSlots, kSlotSize));

  AttachResult refused = tryAttach(d.socketPath(), FL_CONSUMER, "mem-x", kSlots, kSlotSize);
  INFO("fl_attach: " << statusName(refused.status) << ": " << refused.message);
  CHECK(refused.status == FL_ERR_QUOTA);
  CHECK(contains(refused.message, "limits.max_total_bytes = 3670016"));
  CHECK(contains(refused.message, "--max-total-bytes"));
  CHECK(contains(refused.message, "detach"));
  CHECK(d.metric("framelink_attach_rejected_total{reason=\"memory_limit\"}") == 1);
  CHECK(d.metric("framelink_attach_rejected_total{reason=\"invalid\"}") == 0);
  // The cap is on bytes, not clients: a small one still fits in what is left.
  CHECK(tryAttach(d.socketPath(), FL_PRODUCER, "small", 1, 4096).status == FL_OK);

  // A detach gives its bytes back.
  held.pop_back();
  CHECK(waitUntil(
      [&] { return tryAttach(d.socketPath(), FL_CONSUMER, "mem-x", kSlots, kSlotSize).status == FL_OK; },
      Millis(5000), Millis(50)));
  held.clear();
  requireQuickCleanStop(d);
}

TEST_CASE(
    "limits: a detached producer's segments count while a reader holds its frame; a restart at the "
    "cap is not refused for its own last run",
    "[integration][limits]") {
  // Room for two clients of this size, not three (see the first case).
  DaemonProcess d(limitedDaemon(
      {"--max-total-bytes", "2560KiB", "--max-uid-bytes", "16MiB", "--ack-timeout-ms", "60000"}));
  Client reader = attachConsumer(d, "held", kSlots, kSlotSize);

  // A producer that goes and comes back at once is attached again: its
  // segments go with the detach, and the new attach waits for that.
  for (int i = 0; i < 5; ++i) {
    Client producer = attachProducer(d, "held", kSlots, kSlotSize);
    producer.reset();
    AttachResult again = tryAttach(d.socketPath(), FL_PRODUCER, "held", kSlots, kSlotSize);
    INFO("restart " << i << ": " << statusName(again.status) << ": " << again.message);
    REQUIRE(again.status == FL_OK);
  }

  // This one's frame is lent to the reader, which holds it: the producer's
  // segment stays (mapped by the daemon and the reader) after it detached.
  Client producer = attachProducer(d, "held", kSlots, kSlotSize);
  submitFrame(producer.get(), 1, 4096);
  const fl_frame held = receiveFrame(reader.get(), Millis(5000));
  REQUIRE(held.frame_id == 1);
  producer.reset();
  AttachResult refused = tryAttach(d.socketPath(), FL_PRODUCER, "held", kSlots, kSlotSize);
  INFO("fl_attach: " << statusName(refused.status) << ": " << refused.message);
  CHECK(refused.status == FL_ERR_QUOTA);
  CHECK(contains(refused.message, "of them are of detached clients, held until their frames end"));
  CHECK(d.metric("framelink_attach_rejected_total{reason=\"memory_limit\"}") == 1);

  // The reader lets the frame go: so does the daemon the segment, and the bytes.
  REQUIRE(fl_release(reader.get(), held.slot) == FL_OK);
  AttachResult admitted = tryAttach(d.socketPath(), FL_PRODUCER, "held", kSlots, kSlotSize);
  INFO("fl_attach: " << statusName(admitted.status) << ": " << admitted.message);
  CHECK(admitted.status == FL_OK);
  admitted.client.reset();
  reader.reset();
  requireQuickCleanStop(d);
}

TEST_CASE("limits: one user's clients stop at limits.max_uid_bytes; another user still attaches",
          "[integration][limits]") {
  DaemonProcess d(
      limitedDaemon({"--max-uid-bytes", "2560KiB", "--max-total-bytes", "16MiB", "--socket-mode", "0666"}));
  const std::string& sock = d.socketPath();
  REQUIRE(::chmod(sock.substr(0, sock.rfind('/')).c_str(), 0711) == 0);  // let nobody reach the socket
  std::vector<Client> held;
  for (int i = 0; i < 2; ++i)
    held.push_back(attachProducer(d, "mine-" + std::to_string(i), kSlots, kSlotSize));

  AttachResult refused = tryAttach(sock, FL_PRODUCER, "mine-x", kSlots, kSlotSize);
  INFO("fl_attach: " << statusName(refused.status) << ": " << refused.message);
  CHECK(refused.status == FL_ERR_QUOTA);
  CHECK(contains(refused.message, "limits.max_uid_bytes = 2621440"));
  CHECK(contains(refused.message, "--max-uid-bytes"));
  CHECK(contains(refused.message, "detach"));

  // The cap is this user's: another one attaches as many bytes meanwhile.
  CHECK(runAsNobody([&] { return attachSome(sock, 2); }) == FL_OK);

  held.pop_back();
  CHECK(waitUntil([&] { return tryAttach(sock, FL_PRODUCER, "mine-x", kSlots, kSlotSize).status == FL_OK; },
                  Millis(5000), Millis(50)));
  held.clear();
  requireQuickCleanStop(d);
}

TEST_CASE("limits: a burst of 200 attaches of one user, all at once, is served whole",
          "[integration][limits]") {
  constexpr int kBurst = 200;
  raiseFdLimit(4096);
  DaemonProcess::Options o = limitedDaemon({});
  o.max_fds = 4096;
  DaemonProcess d(o);

  std::vector<fl_client*> clients(kBurst, nullptr);
  std::vector<int> status(kBurst, -1);
  std::vector<std::string> errors(kBurst);
  std::latch start(kBurst);
  std::vector<std::thread> workers;
  workers.reserve(kBurst);
  for (int i = 0; i < kBurst; ++i) {
    workers.emplace_back([&, i] {
      fl_client_options opt;
      fl_client_options_init(&opt);
      opt.role = FL_PRODUCER;
      opt.socket_path = d.socketPath().c_str();
      const std::string stream = "worker-" + std::to_string(i);
      opt.stream = stream.c_str();
      opt.slot_count = 1;
      opt.slot_size = 4096;
      start.arrive_and_wait();  // all connect at once
      status[i] = fl_attach(&opt, &clients[i]);
      if (status[i] != FL_OK) errors[i] = fl_last_error();
    });
  }
  for (auto& w : workers) w.join();

  int attached = 0;
  for (int i = 0; i < kBurst; ++i) {
    if (status[i] == FL_OK) {
      ++attached;
    } else {
      UNSCOPED_INFO("worker " << i << ": " << statusName(status[i]) << ": " << errors[i]);
    }
  }
  CHECK(attached == kBurst);
  CHECK(d.metric("framelink_attach_rejected_total{reason=\"too_many_pending\"}") == 0);
  for (fl_client* c : clients) fl_detach(c);
  requireQuickCleanStop(d);
}

TEST_CASE(
    "limits: a daemon back with a smaller max_slot_size refuses a client once, for good, and "
    "auto_reattach stops asking",
    "[integration][limits][reattach]") {
  DaemonProcess d(limitedDaemon({}));
  fl_client_options o;
  fl_client_options_init(&o);
  REQUIRE(o.auto_reattach == 1);
  o.role = FL_PRODUCER;
  o.stream = "shrunk";
  o.socket_path = d.socketPath().c_str();
  o.slot_count = kSlots;
  o.slot_size = kSlotSize;
  o.reattach_interval_ms = 20;
  fl_client* raw = nullptr;
  REQUIRE(fl_attach(&o, &raw) == FL_OK);
  Client producer(raw);
  fl_client* p = producer.get();

  d.kill9();
  REQUIRE(waitUntil([&] { return fl_check_daemon(p) == FL_ERR_DAEMON_GONE; }, Millis(5000), Millis(10)));
  d.restart(limitedDaemon({"--max-slot-size", "65536"}));
  // The call that meets the refusal returns it, with the daemon's reason,
  // instead of waiting its timeout out as for a daemon not back yet.
  fl_slot s{};
  const auto asked = Clock::now();
  const int first = fl_acquire(p, 20000, &s);
  const std::string why = fl_last_error();
  INFO(statusName(first) << ": " << why);
  CHECK(first == FL_ERR_LIMIT);
  CHECK(contains(why, "max_slot_size"));
  CHECK(contains(why, "for good"));
  CHECK(Clock::now() - asked < Millis(10000));

  // Later calls end at once with DAEMON_GONE naming the refusal, the doorbell
  // stays readable for an event loop, and no attempt reaches the daemon again.
  for (int i = 0; i < 5; ++i) {
    const int rc = fl_acquire(p, 100, &s);
    INFO(statusName(rc) << ": " << fl_last_error());
    CHECK(rc == FL_ERR_DAEMON_GONE);
    CHECK(contains(fl_last_error(), "FL_ERR_LIMIT"));
  }
  pollfd pf{fl_doorbell_fd(p), POLLIN, 0};
  CHECK(::poll(&pf, 1, 0) == 1);
  ::usleep(200 * 1000);  // ten reattach intervals
  CHECK(d.metric("framelink_attach_rejected_total{reason=\"invalid\"}") == 1);

  // Once the daemon's limits admit it again, fl_reattach brings the same handle back.
  d.kill9();
  d.restart(limitedDaemon({}));
  REQUIRE(fl_reattach(p) == FL_OK);
  CHECK(fl_acquire(p, 5000, &s) == FL_OK);
}
