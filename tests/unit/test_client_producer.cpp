// libframelink's producer side against the fake framelinkd (client_fake_daemon.h).
#include <catch2/catch.hpp>
#include <cstring>

#include <sys/epoll.h>

#include <memory>

#include "client_fake_daemon.h"

using client_test::attach;
using client_test::contains;
using client_test::countOpenFds;
using client_test::FakeDaemon;
using client_test::Fault;

// ---------------------------------------------------------------- producer

TEST_CASE("producer: acquire, metadata, submit, completion", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));

  fl_slot slots[4];
  for (uint32_t i = 0; i < 4; ++i) {
    REQUIRE(fl_acquire(c, 0, &slots[i]) == FL_OK);
    CHECK(slots[i].index == i);
    CHECK(slots[i].capacity == 64 * 1024);
    std::memset(slots[i].data, static_cast<int>(i + 1), slots[i].capacity);  // writable
  }
  fl_slot extra{};
  CHECK(fl_acquire(c, 0, &extra) == FL_EAGAIN);
  auto t0 = std::chrono::steady_clock::now();
  CHECK(fl_acquire(c, 50, &extra) == FL_ETIMEDOUT);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(45));
  CHECK(contains(fl_last_error(), "timed out after 50 ms"));

  // Metadata with CRC on slot 0.
  const char attrs[] = "frame=7;wafer=0";
  fl_frame_meta meta{};
  meta.frame_id = 7;
  meta.group_id = 0;
  meta.timestamp_ns = 111;
  meta.flags = FL_META_CRC32C;
  meta.attr_length = sizeof(attrs) - 1;
  meta.attrs = reinterpret_cast<const uint8_t*>(attrs);
  REQUIRE(fl_set_meta(c, 0, &meta) == FL_OK);
  REQUIRE(fl_submit(c, 0, 5000) == FL_OK);
  uint32_t n = 0;
  REQUIRE(fl_in_flight(c, &n) == FL_OK);
  CHECK(n == 1);

  fl_submit_desc sd{};
  REQUIRE(d.popSubmit(sd));
  CHECK(sd.slot == 0);
  CHECK(sd.length == 5000);
  CHECK(sd.flags == 0);
  CHECK_FALSE(d.popSubmit(sd));
  const fl_slot_header* h = d.slotHeader(0);
  CHECK(h->frame_id == 7);
  CHECK(h->timestamp_ns == 111);
  CHECK(h->attr_length == sizeof(attrs) - 1);
  CHECK(std::memcmp(h->attrs, attrs, sizeof(attrs) - 1) == 0);
  CHECK((h->flags & FL_SLOT_HAS_CRC32C) != 0);
  CHECK(h->crc32c == fl_crc32c(0, d.slotData(0), 5000));

  // No CRC requested: the flag is clear.
  REQUIRE(fl_submit(c, 1, 10) == FL_OK);
  REQUIRE(d.popSubmit(sd));
  CHECK(sd.slot == 1);
  CHECK((d.slotHeader(1)->flags & FL_SLOT_HAS_CRC32C) == 0);

  // Misuse is caught locally.
  CHECK(fl_submit(c, 0, 10) == FL_EINVAL);  // in flight
  CHECK(contains(fl_last_error(), "in flight"));
  CHECK(fl_submit(c, 2, 64 * 1024 + 1) == FL_ERR_TOO_LARGE);
  CHECK(contains(fl_last_error(), "slot size"));
  CHECK(fl_submit(c, 99, 10) == FL_EINVAL);
  meta.attr_length = FL_MAX_ATTR_BYTES + 1;
  CHECK(fl_set_meta(c, 2, &meta) == FL_EINVAL);
  meta.attr_length = 0;
  meta.flags = 0x80;
  CHECK(fl_set_meta(c, 2, &meta) == FL_EINVAL);
  CHECK(fl_set_meta(c, 1, &meta) == FL_EINVAL);  // in flight
  fl_frame f{};
  CHECK(fl_receive(c, &f, 0) == FL_EINVAL);  // consumer call

  // Abandon returns a slot; it can be acquired again.
  REQUIRE(fl_abandon(c, 3) == FL_OK);
  CHECK(fl_abandon(c, 3) == FL_EINVAL);
  REQUIRE(fl_acquire(c, 0, &extra) == FL_OK);
  CHECK(extra.index == 3);

  // Completions: nothing yet, then the daemon finishes slot 1 (failed) and 0 (delivered).
  fl_completion comps[8];
  size_t count = 99;
  REQUIRE(fl_poll_completions(c, comps, 8, &count) == FL_OK);
  CHECK(count == 0);
  d.pushCompletion(fl_completion_desc{1, FL_ERR_NO_ROUTE, 0, 10, 0});
  d.pushCompletion(fl_completion_desc{0, FL_OK, 5, 5000, 7});
  // Acquire drains them to find a free slot; they are still reported after.
  REQUIRE(fl_acquire(c, 0, &extra) == FL_OK);
  CHECK((extra.index == 0 || extra.index == 1));
  REQUIRE(fl_poll_completions(c, comps, 8, &count) == FL_OK);
  REQUIRE(count == 2);
  CHECK(comps[0].slot == 1);
  CHECK(comps[0].status == FL_ERR_NO_ROUTE);
  CHECK(comps[1].slot == 0);
  CHECK(comps[1].status == FL_OK);
  CHECK(comps[1].sequence == 5);
  CHECK(comps[1].length == 5000);
  CHECK(comps[1].frame_id == 7);
  REQUIRE(fl_in_flight(c, &n) == FL_OK);
  CHECK(n == 0);
  CHECK(fl_wait_completions(c, comps, 8, &count, 0) == FL_EAGAIN);
  CHECK(fl_wait_completions(c, comps, 8, &count, 20) == FL_ETIMEDOUT);
  fl_detach(c);
}

TEST_CASE("producer: a completion for a slot not in flight is corruption", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  d.pushCompletion(fl_completion_desc{2, FL_OK, 0, 0, 0});
  fl_completion comp{};
  size_t count = 0;
  CHECK(fl_poll_completions(c, &comp, 1, &count) == FL_ERR_RING_CORRUPT);
  CHECK(contains(fl_last_error(), "slot 2"));
  fl_slot s{};
  CHECK(fl_acquire(c, 0, &s) == FL_ERR_RING_CORRUPT);  // latched
  fl_detach(c);
}

TEST_CASE("producer: a blocked acquire wakes on a completion", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_slot s{};
  for (uint32_t i = 0; i < 4; ++i) {
    REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
    REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  }
  std::atomic<bool> rang{false};
  std::thread daemon([&] {
    // Wait until the client announced it sleeps, then complete slot 2.
    while (__atomic_load_n(&d.completionRing()->reader_sleeping, __ATOMIC_ACQUIRE) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    fl_completion_desc cd{2, FL_OK, 1, 1, 0};
    fl_ring_push(d.completionRing(), d.completionRing()->capacity, sizeof(cd), &cd);
    rang = d.ringIfAsleep();
  });
  auto t0 = std::chrono::steady_clock::now();
  int rc = fl_acquire(c, 10000, &s);
  auto waited = std::chrono::steady_clock::now() - t0;
  daemon.join();
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  CHECK(s.index == 2);
  CHECK(rang.load());
  CHECK(waited < std::chrono::seconds(5));
  CHECK(d.completionRing()->reader_sleeping == 0);  // cleared after the wait
  fl_detach(c);
}

TEST_CASE("producer: the daemon is woken only while it sleeps", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_slot s{};
  uint64_t v = 0;
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  CHECK(read(d.submitDoorbell(), &v, sizeof(v)) < 0);  // awake daemon: no system call
  fl_ring_prepare_sleep(d.submitRing());
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  CHECK(read(d.submitDoorbell(), &v, sizeof(v)) == sizeof(v));
  CHECK(v == 1);
  fl_detach(c);
}

TEST_CASE("producer: the doorbell fd turns readable after an empty poll", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_slot s{};
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 1) == FL_OK);
  fl_completion comp{};
  size_t count = 0;
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  REQUIRE(count == 0);
  pollfd p{fl_doorbell_fd(c), POLLIN, 0};
  CHECK(poll(&p, 1, 0) == 0);
  d.pushCompletion(fl_completion_desc{s.index, FL_OK, 0, 1, 0});
  CHECK(d.wakes() == 1);
  CHECK(poll(&p, 1, 1000) == 1);
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  CHECK(count == 1);
  fl_detach(c);
}

TEST_CASE("producer: a dead daemon ends blocking waits", "[client]") {
  SECTION("socket hang-up") {
    FakeDaemon d;
    fl_client* c = attach(d, d.options(FL_PRODUCER));
    fl_slot s{};
    for (int i = 0; i < 4; ++i) REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      d.hangUp();
    });
    int rc = fl_acquire(c, -1, &s);  // would block forever without the socket in the poll set
    killer.join();
    CHECK(rc == FL_ERR_DAEMON_GONE);
    CHECK(fl_check_daemon(c) == FL_ERR_DAEMON_GONE);
    CHECK(fl_submit(c, 0, 1) == FL_ERR_DAEMON_GONE);
    fl_detach(c);
  }
  SECTION("daemon_state") {
    FakeDaemon d;
    fl_client* c = attach(d, d.options(FL_PRODUCER));
    CHECK(fl_check_daemon(c) == FL_OK);
    d.setState(FL_DAEMON_DETACHED);
    CHECK(fl_check_daemon(c) == FL_ERR_DAEMON_GONE);
    fl_completion comp{};
    size_t count = 0;
    CHECK(fl_wait_completions(c, &comp, 1, &count, 1000) == FL_ERR_DAEMON_GONE);
    fl_detach(c);
  }
  SECTION("fl_check_daemon sees the hang-up") {
    FakeDaemon d;
    fl_client* c = attach(d, d.options(FL_PRODUCER));
    d.hangUp();
    CHECK(fl_check_daemon(c) == FL_ERR_DAEMON_GONE);
    fl_detach(c);
  }
}

TEST_CASE("producer: several threads share one client", "[client]") {
  // Two application threads acquire and submit; the fake daemon completes
  // every frame, sleeping on its doorbell when idle.  A lost wake-up on
  // either side would hang (the waits have a deadline), a slot handed out
  // twice shows as a submit of a slot the daemon still has in flight.
  constexpr int kPerThread = 3000;
  constexpr int kThreads = 2;
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  std::atomic<int> daemon_errors{0};
  std::atomic<int> completed{0};
  std::thread daemon([&] {
    pollfd p{d.submitDoorbell(), POLLIN, 0};
    while (completed.load() < kThreads * kPerThread) {
      fl_submit_desc sd{};
      if (d.popSubmit(sd)) {
        if (sd.slot >= 4) daemon_errors++;
        fl_completion_desc cd{sd.slot, FL_OK, 0, sd.length, 0};
        if (fl_ring_push(d.completionRing(), d.completionRing()->capacity, sizeof(cd), &cd) != FL_RING_OK)
          daemon_errors++;
        d.ringIfAsleep();
        completed++;
        continue;
      }
      if (fl_ring_prepare_sleep(d.submitRing())) {
        if (poll(&p, 1, 2000) == 0 && fl_ring_readable(d.submitRing()) == 0) {
          daemon_errors++;  // nothing for 2 s: the client stopped submitting
          fl_ring_end_sleep(d.submitRing());
          break;
        }
        uint64_t v;
        (void)!read(d.submitDoorbell(), &v, sizeof(v));
      }
      fl_ring_end_sleep(d.submitRing());
    }
  });
  std::atomic<int> app_errors{0};
  std::vector<std::thread> apps;
  for (int t = 0; t < kThreads; ++t) {
    apps.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        fl_slot s{};
        if (fl_acquire(c, 5000, &s) != FL_OK || fl_submit(c, s.index, 16) != FL_OK) {
          app_errors++;
          return;
        }
      }
    });
  }
  // This thread collects completions meanwhile: a third kind of waiter.
  fl_completion comps[16];
  size_t total = 0;
  int wait_rc = FL_OK;
  while (total < static_cast<size_t>(kThreads * kPerThread)) {
    size_t n = 0;
    wait_rc = fl_wait_completions(c, comps, 16, &n, 5000);
    if (wait_rc != FL_OK) break;
    total += n;
  }
  for (auto& t : apps) t.join();
  daemon.join();
  INFO(fl_last_error());
  CHECK(wait_rc == FL_OK);
  CHECK(app_errors.load() == 0);
  CHECK(daemon_errors.load() == 0);
  CHECK(completed.load() == kThreads * kPerThread);
  CHECK(total == static_cast<size_t>(kThreads * kPerThread));
  uint32_t in_flight = 1;
  REQUIRE(fl_in_flight(c, &in_flight) == FL_OK);
  CHECK(in_flight == 0);
  fl_detach(c);
}

TEST_CASE("producer: an application that reads completions never loses one", "[client]") {
  // A reader that falls behind by the whole local queue (a GC pause, a slow
  // collector thread) holds acquirers back instead of losing completions.
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  fl_completion comps[64];
  size_t count = 0;
  REQUIRE(fl_poll_completions(c, comps, 64, &count) == FL_OK);  // reads completions from now on
  REQUIRE(count == 0);
  uint64_t sequence = 0;
  fl_slot s{};
  int rc = FL_OK;
  while ((rc = fl_acquire(c, 0, &s)) == FL_OK) {
    REQUIRE(fl_submit(c, s.index, 8) == FL_OK);
    fl_submit_desc sd{};
    REQUIRE(d.popSubmit(sd));
    d.pushCompletion(fl_completion_desc{sd.slot, FL_OK, ++sequence, sd.length, 0});
    REQUIRE(sequence < 100000);  // the queue is bounded: acquiring must stop
  }
  CHECK(rc == FL_EAGAIN);
  CHECK(contains(fl_last_error(), "completions wait unread"));
  CHECK(contains(fl_last_error(), "fl_poll_completions"));
  // A blocking acquire waits for the reader, not for the daemon.
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    size_t n = 0;
    fl_completion one{};
    (void)fl_poll_completions(c, &one, 1, &n);
  });
  CHECK(fl_acquire(c, 5000, &s) == FL_OK);
  reader.join();
  CHECK(fl_abandon(c, s.index) == FL_OK);
  // Every completion comes out, in order, none dropped.
  uint64_t expect = 2;  // the reader took the first
  for (;;) {
    REQUIRE(fl_poll_completions(c, comps, 64, &count) == FL_OK);
    if (count == 0) break;
    for (size_t i = 0; i < count; ++i) {
      REQUIRE(comps[i].sequence == expect);
      ++expect;
    }
  }
  CHECK(expect == sequence + 1);
  uint32_t in_flight = 1;
  REQUIRE(fl_in_flight(c, &in_flight) == FL_OK);
  CHECK(in_flight == 0);
  fl_detach(c);
}

TEST_CASE("producer: an application that never reads completions keeps acquiring", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  constexpr uint64_t kFrames = 10000;  // more than the local queue holds
  for (uint64_t i = 1; i <= kFrames; ++i) {
    fl_slot s{};
    REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
    REQUIRE(fl_submit(c, s.index, 8) == FL_OK);
    fl_submit_desc sd{};
    REQUIRE(d.popSubmit(sd));
    d.pushCompletion(fl_completion_desc{sd.slot, FL_OK, i, sd.length, 0});
  }
  // The newest are kept: the last one read is the last one completed.
  fl_completion comps[64];
  size_t count = 0;
  uint64_t last = 0;
  size_t total = 0;
  do {
    REQUIRE(fl_poll_completions(c, comps, 64, &count) == FL_OK);
    for (size_t i = 0; i < count; ++i) {
      CHECK(comps[i].sequence > last);
      last = comps[i].sequence;
    }
    total += count;
  } while (count > 0);
  CHECK(last == kFrames);
  CHECK(total < kFrames);
  fl_detach(c);
}

TEST_CASE("producer: the doorbell fd turns readable when the daemon hangs up", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_PRODUCER));
  const int fd = fl_doorbell_fd(c);
  REQUIRE(fd >= 0);
  fl_completion comp{};
  size_t count = 0;
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);  // arms the doorbell
  REQUIRE(count == 0);
  // An application's own event loop holds the fd in its epoll set.
  const int loop = epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(loop >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(epoll_ctl(loop, EPOLL_CTL_ADD, fd, &ev) == 0);
  CHECK(epoll_wait(loop, &ev, 1, 0) == 0);  // nothing to do, daemon alive
  d.hangUp();                               // no completion, no doorbell: only the socket says it
  CHECK(epoll_wait(loop, &ev, 1, 2000) == 1);
  // The call the wake-up leads to says why, and the fd keeps saying it.
  CHECK(fl_poll_completions(c, &comp, 1, &count) == FL_ERR_DAEMON_GONE);
  CHECK(contains(fl_last_error(), "dropped this attachment"));
  pollfd p{fd, POLLIN, 0};
  CHECK(poll(&p, 1, 0) == 1);
  close(loop);
  fl_detach(c);
}

TEST_CASE(
    "producer: a completion says how many readers it reached and released it; an older "
    "application's completions are filled no further than its own struct",
    "[client]") {
  FakeDaemon d;
  fl_client_options o = d.options(FL_PRODUCER);
  CHECK(o.completion_size == sizeof(fl_completion));  // the header's fl_client_options_init sets it
  fl_client* c = attach(d, o);
  fl_slot s{};
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 10) == FL_OK);
  d.pushCompletion(fl_completion_desc{s.index, FL_ERR_NO_CONSUMER, 3, 10, 9, 4, 3});
  fl_completion comp{};
  size_t count = 0;
  REQUIRE(fl_wait_completions(c, &comp, 1, &count, 2000) == FL_OK);
  REQUIRE(count == 1);
  CHECK(comp.readers == 4);
  CHECK(comp.released == 3);
  fl_detach(c);

  // Built before readers: two 32-byte completions, and the bytes after them untouched.
  FakeDaemon old_daemon;
  o = old_daemon.options(FL_PRODUCER);
  o.completion_size = 0;
  c = attach(old_daemon, o);
  for (int i = 0; i < 2; ++i) {
    REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
    REQUIRE(fl_submit(c, s.index, 10) == FL_OK);
    old_daemon.pushCompletion(fl_completion_desc{s.index, FL_OK, uint64_t(i + 1), 10, uint64_t(i + 1), 2, 2});
  }
  unsigned char buf[3 * FL_COMPLETION_SIZE_V1];
  std::memset(buf, 0xAB, sizeof buf);
  count = 0;
  for (int tries = 0; tries < 50 && count < 2; ++tries) {
    size_t got = 0;
    REQUIRE(fl_wait_completions(c, reinterpret_cast<fl_completion*>(buf + count * FL_COMPLETION_SIZE_V1),
                                2 - count, &got, 100) != FL_ERR_RING_CORRUPT);
    count += got;
  }
  REQUIRE(count == 2);
  fl_completion second{};
  std::memcpy(&second, buf + FL_COMPLETION_SIZE_V1, FL_COMPLETION_SIZE_V1);
  CHECK(second.frame_id == 2);
  for (size_t i = 2 * FL_COMPLETION_SIZE_V1; i < sizeof buf; ++i) CHECK(buf[i] == 0xAB);
  fl_detach(c);

  o.completion_size = FL_COMPLETION_SIZE_V1 + 4;  // neither size: refused
  fl_client* odd = nullptr;
  CHECK(fl_attach(&o, &odd) == FL_EINVAL);
  CHECK(contains(fl_last_error(), "completion_size"));
}

TEST_CASE("producer: auto_reattach carries a producer over a daemon restart", "[client]") {
  auto first = std::make_unique<FakeDaemon>();
  const std::string path = first->path();
  fl_client_options o = first->options(FL_PRODUCER);
  o.auto_reattach = 1;
  o.reattach_interval_ms = 100;
  fl_client* c = attach(*first, o);
  const int fd = fl_doorbell_fd(c);
  const int loop = epoll_create1(EPOLL_CLOEXEC);
  REQUIRE(loop >= 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  REQUIRE(epoll_ctl(loop, EPOLL_CTL_ADD, fd, &ev) == 0);  // registered once, for the client's life

  // One frame in flight when the daemon dies.
  fl_slot s{};
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  fl_frame_meta meta{};
  meta.frame_id = 41;
  REQUIRE(fl_set_meta(c, s.index, &meta) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 100) == FL_OK);
  fl_completion comp{};
  size_t count = 0;
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  REQUIRE(count == 0);

  first->die();
  CHECK(epoll_wait(loop, &ev, 1, 2000) == 1);  // the loss wakes the loop
  // Not back yet: "nothing now", not an error, and the fd is quiet until the next attempt is due.
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  CHECK(count == 0);
  CHECK(fl_acquire(c, 0, &s) == FL_EAGAIN);
  CHECK(contains(fl_last_error(), "framelinkd is gone and not back yet"));
  CHECK(contains(fl_last_error(), "every 100 ms"));
  CHECK(epoll_wait(loop, &ev, 1, 0) == 0);
  const auto parked = std::chrono::steady_clock::now();
  CHECK(epoll_wait(loop, &ev, 1, 2000) == 1);  // the attempt is due
  CHECK(std::chrono::steady_clock::now() - parked >= std::chrono::milliseconds(50));
  CHECK(fl_wait_completions(c, &comp, 1, &count, 150) == FL_ETIMEDOUT);  // still no daemon
  CHECK(contains(fl_last_error(), "last attempt: "));
  CHECK(contains(fl_last_error(), "cannot connect"));

  FakeDaemon second(Fault::kNone, path);
  // The frame in flight ends as unknown, once; the client is attached again.
  REQUIRE(fl_wait_completions(c, &comp, 1, &count, 5000) == FL_OK);
  second.join();
  REQUIRE(count == 1);
  CHECK(comp.status == FL_ERR_DAEMON_GONE);
  CHECK(comp.frame_id == 41);
  fl_client_info info{};
  REQUIRE(fl_client_get_info(c, &info) == FL_OK);
  CHECK(info.generation == 1);
  CHECK(fl_doorbell_fd(c) == fd);

  // New frames flow through the new daemon, and the old registration of the fd wakes for them.
  REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  REQUIRE(fl_submit(c, s.index, 7) == FL_OK);
  fl_submit_desc sd{};
  REQUIRE(second.popSubmit(sd));
  CHECK(sd.slot == s.index);
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  REQUIRE(count == 0);
  CHECK(epoll_wait(loop, &ev, 1, 0) == 0);  // no retry timer, no dead socket left in the set
  second.pushCompletion(fl_completion_desc{s.index, FL_OK, 1, 7, 0});
  CHECK(epoll_wait(loop, &ev, 1, 2000) == 1);
  REQUIRE(fl_poll_completions(c, &comp, 1, &count) == FL_OK);
  REQUIRE(count == 1);
  CHECK(comp.status == FL_OK);
  CHECK(fl_check_daemon(c) == FL_OK);
  close(loop);
  fl_detach(c);
}
