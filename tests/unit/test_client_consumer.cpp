// libframelink's consumer side against the fake framelinkd (client_fake_daemon.h).
#include <catch2/catch.hpp>

#include <memory>

#include "client_fake_daemon.h"

using client_test::attach;
using client_test::contains;
using client_test::countOpenFds;
using client_test::FakeDaemon;
using client_test::Fault;

// ---------------------------------------------------------------- consumer

TEST_CASE("consumer: receive, read-only data, release", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_CONSUMER));
  fl_frame f{};
  CHECK(fl_receive(c, &f, 0) == FL_EAGAIN);
  fl_slot s{};
  CHECK(fl_acquire(c, 0, &s) == FL_EINVAL);  // producer call

  fl_slot_header* h = d.slotHeader(2);
  h->frame_id = 42;
  h->group_id = 1;
  h->timestamp_ns = 999;
  h->length = 3000;
  h->sequence = 17;
  h->crc32c = 0xABCD;
  h->flags = FL_SLOT_HAS_CRC32C;
  h->attr_length = 4;
  std::memcpy(h->attrs, "a=b;", 4);
  std::memset(d.slotData(2), 0x5A, 3000);
  d.pushCompletion(fl_completion_desc{2, FL_OK, 17, 3000, 42});

  REQUIRE(fl_receive(c, &f, 1000) == FL_OK);
  CHECK(f.slot == 2);
  CHECK(f.frame_id == 42);
  CHECK(f.group_id == 1);
  CHECK(f.timestamp_ns == 999);
  CHECK(f.length == 3000);
  CHECK(f.sequence == 17);
  CHECK(f.crc32c == 0xABCD);
  CHECK(f.flags == FL_SLOT_HAS_CRC32C);
  CHECK(f.attr_length == 4);
  CHECK(std::memcmp(f.attrs, "a=b;", 4) == 0);
  CHECK(f.data[0] == 0x5A);
  CHECK(f.data[2999] == 0x5A);

  // The consumer's data mapping is read-only: a write faults.
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGSEGV, SIG_DFL);
    const_cast<uint8_t*>(f.data)[0] = 1;
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));

  REQUIRE(fl_release(c, 2) == FL_OK);
  fl_submit_desc sd{};
  REQUIRE(d.popSubmit(sd));
  CHECK(sd.slot == 2);
  CHECK(fl_release(c, 2) == FL_ERR_DOUBLE_RELEASE);
  CHECK(contains(fl_last_error(), "slot 2"));
  CHECK(fl_release(c, 1000) == FL_ERR_DOUBLE_RELEASE);
  CHECK_FALSE(d.popSubmit(sd));

  // The daemon's error notice for a bad release.
  d.pushCompletion(fl_completion_desc{3, FL_ERR_DOUBLE_RELEASE, 0, 0, 0});
  CHECK(fl_receive(c, &f, 0) == FL_ERR_DOUBLE_RELEASE);
  CHECK(contains(fl_last_error(), "rejected"));
  CHECK(contains(fl_last_error(), "slot 3"));
  fl_detach(c);
}

TEST_CASE("consumer: a blocked receive wakes on delivery", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_CONSUMER));
  d.slotHeader(0)->length = 1;
  std::thread daemon([&] {
    while (__atomic_load_n(&d.completionRing()->reader_sleeping, __ATOMIC_ACQUIRE) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    fl_completion_desc cd{0, FL_OK, 1, 1, 0};
    fl_ring_push(d.completionRing(), d.completionRing()->capacity, sizeof(cd), &cd);
    d.ringIfAsleep();
  });
  fl_frame f{};
  int rc = fl_receive(c, &f, 10000);
  daemon.join();
  REQUIRE(rc == FL_OK);
  CHECK(f.slot == 0);
  CHECK(d.wakes() == 1);
  fl_detach(c);
}

TEST_CASE("consumer: a blocked receive looks at its ring for wait_spin_us before it sleeps", "[client]") {
  using std::chrono::milliseconds;
  using std::chrono::steady_clock;
  FakeDaemon d;
  auto sleeping = [&] {
    return __atomic_load_n(&d.completionRing()->reader_sleeping, __ATOMIC_ACQUIRE) != 0;
  };

  // A reader blocked in fl_receive is still looking 100 ms later (without
  // the spin it would have set its sleep flag at once), so a frame pushed the
  // way the daemon pushes (ringing only a reader that sleeps) is taken
  // without a doorbell.
  auto takenWithinSpin = [&](fl_client* c) {
    d.slotHeader(0)->length = 1;
    std::atomic<bool> started{false};
    std::atomic<int> rc{-1000};
    fl_frame f{};
    std::thread reader([&] {
      started = true;
      rc = fl_receive(c, &f, 10000);
    });
    while (!started) std::this_thread::yield();
    std::this_thread::sleep_for(milliseconds(100));
    CHECK_FALSE(sleeping());
    d.pushCompletion(fl_completion_desc{0, FL_OK, 1, 1, 0});
    reader.join();
    CHECK(rc == FL_OK);
    CHECK(f.slot == 0);
    CHECK(d.wakes() == 0);
    fl_detach(c);
  };

  SECTION("a frame within the spin is taken without a doorbell") {
    fl_client_options o = d.options(FL_CONSUMER);
    o.wait_spin_us = 600000;  // 0.6 s
    takenWithinSpin(attach(d, o));
  }

  SECTION("past the spin it sleeps, and a doorbell wakes it") {
    fl_client_options o = d.options(FL_CONSUMER);
    o.wait_spin_us = 50000;  // 50 ms
    fl_client* c = attach(d, o);
    d.slotHeader(0)->length = 1;
    const auto start = steady_clock::now();
    steady_clock::time_point slept;
    std::thread daemon([&] {
      while (!sleeping()) std::this_thread::sleep_for(milliseconds(1));
      slept = steady_clock::now();
      fl_completion_desc cd{0, FL_OK, 1, 1, 0};
      fl_ring_push(d.completionRing(), d.completionRing()->capacity, sizeof(cd), &cd);
      d.ringIfAsleep();
    });
    fl_frame f{};
    const int rc = fl_receive(c, &f, 10000);
    daemon.join();
    REQUIRE(rc == FL_OK);
    CHECK(slept - start >= milliseconds(50));
    CHECK(d.wakes() == 1);
    fl_detach(c);
  }

  SECTION("$FRAMELINK_WAIT_SPIN_US is the default") {
    REQUIRE(setenv("FRAMELINK_WAIT_SPIN_US", "600000", 1) == 0);
    fl_client* c = attach(d, d.options(FL_CONSUMER));
    unsetenv("FRAMELINK_WAIT_SPIN_US");
    takenWithinSpin(c);
  }
}

TEST_CASE("consumer: wait_spin_us out of range is refused, saying what to do", "[client]") {
  FakeDaemon d;
  fl_client* c = nullptr;
  fl_client_options o = d.options(FL_CONSUMER);
  o.wait_spin_us = FL_WAIT_SPIN_MAX_US + 1;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  CHECK(c == nullptr);
  CHECK(contains(fl_last_error(), "wait_spin_us is 1000001"));
  CHECK(contains(fl_last_error(), "FL_WAIT_SPIN_OFF"));

  REQUIRE(setenv("FRAMELINK_WAIT_SPIN_US", "20us", 1) == 0);
  o.wait_spin_us = 0;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  CHECK(contains(fl_last_error(), "FRAMELINK_WAIT_SPIN_US='20us'"));
  o.wait_spin_us = FL_WAIT_SPIN_OFF;  // the option wins over the environment
  c = attach(d, o);
  unsetenv("FRAMELINK_WAIT_SPIN_US");
  fl_detach(c);
}

TEST_CASE("consumer: invalid deliveries are corruption", "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_CONSUMER));
  fl_frame f{};
  SECTION("length beyond the slot") {
    d.slotHeader(1)->length = 64 * 1024 + 1;
    d.pushCompletion(fl_completion_desc{1, FL_OK, 0, 0, 0});
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  SECTION("attribute length") {
    d.slotHeader(1)->attr_length = FL_MAX_ATTR_BYTES + 1;
    d.pushCompletion(fl_completion_desc{1, FL_OK, 0, 0, 0});
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  SECTION("slot out of range") {
    d.pushCompletion(fl_completion_desc{4, FL_OK, 0, 0, 0});
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  SECTION("ring indices") {
    d.completionRing()->tail = 1000;
    CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);
  }
  CHECK(fl_receive(c, &f, 0) == FL_ERR_RING_CORRUPT);  // latched
  fl_detach(c);
}

TEST_CASE("consumer: a lent segment that arrives with extra fds maps the first and closes the others",
          "[client]") {
  FakeDaemon d;
  fl_client* c = attach(d, d.options(FL_CONSUMER));

  // The segment: one slot of one page, a pattern in its first bytes.
  const int segment = memfd_create("framelink-test-lent", MFD_CLOEXEC);
  REQUIRE(segment >= 0);
  REQUIRE(ftruncate(segment, FL_PAGE_SIZE) == 0);
  REQUIRE(pwrite(segment, "lent", 4, 0) == 4);
  // The extra fd is the write end of a pipe: once every copy of it is
  // closed, the read end sees end-of-file, so the test can tell whether the
  // client's copy was closed without guessing its number.
  int pipe_fds[2];
  REQUIRE(pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) == 0);

  fl_lend_message m{};
  m.magic = FL_LEND_MAGIC;
  m.kind = FL_LEND_SEGMENT;
  m.lend_id = 5;
  m.data_size = FL_PAGE_SIZE;
  m.slots_offset = 0;
  m.slot_stride = FL_PAGE_SIZE;
  m.slot_size = FL_PAGE_SIZE;
  m.slot_count = 1;
  d.sendLend(m, {segment, pipe_fds[1]});
  close(segment);
  close(pipe_fds[1]);

  fl_slot_header* h = d.slotHeader(1);
  h->flags = FL_SLOT_LENT;
  h->length = 4;
  h->reserved0 = 0;
  std::memcpy(h->reserved1, &m.lend_id, sizeof(m.lend_id));
  d.pushCompletion(fl_completion_desc{1, FL_OK, 1, 4, 9});

  fl_frame f{};
  const int rc = fl_receive(c, &f, 1000);
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  CHECK(std::memcmp(f.data, "lent", 4) == 0);
  char byte = 0;
  CHECK(read(pipe_fds[0], &byte, 1) == 0);  // -1 (EAGAIN): the client still holds the extra fd
  CHECK(fl_release(c, f.slot) == FL_OK);
  close(pipe_fds[0]);
  fl_detach(c);
}

TEST_CASE("consumer: auto_reattach carries a blocked receive over a daemon restart", "[client]") {
  auto first = std::make_unique<FakeDaemon>();
  const std::string path = first->path();
  fl_client_options o = first->options(FL_CONSUMER);
  o.auto_reattach = 1;
  o.reattach_interval_ms = 20;
  fl_client* c = attach(*first, o);
  std::unique_ptr<FakeDaemon> second;
  std::thread daemon([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    first->die();  // the receive below is asleep by now, and keeps waiting
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    second = std::make_unique<FakeDaemon>(Fault::kNone, path);
    second->join();  // the client attached again
    while (__atomic_load_n(&second->completionRing()->reader_sleeping, __ATOMIC_ACQUIRE) == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    second->slotHeader(1)->length = 3;
    fl_completion_desc cd{1, FL_OK, 1, 3, 9};
    fl_ring_push(second->completionRing(), second->completionRing()->capacity, sizeof(cd), &cd);
    second->ringIfAsleep();
  });
  fl_frame f{};
  int rc = fl_receive(c, &f, 10000);
  daemon.join();
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  CHECK(f.slot == 1);
  CHECK(f.length == 3);
  fl_client_info info{};
  REQUIRE(fl_client_get_info(c, &info) == FL_OK);
  CHECK(info.generation == 1);
  CHECK(fl_release(c, f.slot) == FL_OK);
  fl_submit_desc released{};
  REQUIRE(second->popSubmit(released));
  CHECK(released.slot == 1);
  fl_detach(c);
  second.reset();
}
