// libframelink against an in-process fake framelinkd (client_fake_daemon.h):
// the library, attach, and the C++ wrapper.  Producer and consumer:
// test_client_producer.cpp, test_client_consumer.cpp.
#include <catch2/catch.hpp>

#include "client_fake_daemon.h"

using client_test::attach;
using client_test::contains;
using client_test::countOpenFds;
using client_test::FakeDaemon;
using client_test::Fault;

// ---------------------------------------------------------------- library

TEST_CASE("version and status strings", "[client]") {
  CHECK(std::string(fl_version()) == std::to_string(FL_VERSION_MAJOR) + "." +
                                         std::to_string(FL_VERSION_MINOR) + "." +
                                         std::to_string(FL_VERSION_PATCH));
  REQUIRE(fl_last_error() != nullptr);
  const int codes[] = {FL_OK,
                       FL_EAGAIN,
                       FL_ETIMEDOUT,
                       FL_EINVAL,
                       FL_EINTR,
                       FL_EBUSY,
                       FL_ERR_BAD_SLOT,
                       FL_ERR_SLOT_NOT_OWNED,
                       FL_ERR_TOO_LARGE,
                       FL_ERR_BAD_METADATA,
                       FL_ERR_BAD_DESCRIPTOR,
                       FL_ERR_DOUBLE_RELEASE,
                       FL_ERR_NO_CONSUMER,
                       FL_ERR_TIMEOUT,
                       FL_ERR_PEER_REJECTED,
                       FL_ERR_CRC_MISMATCH,
                       FL_ERR_NO_ROUTE,
                       FL_ERR_LINK_LOST,
                       FL_ERR_SHUTDOWN,
                       FL_ERR_DAEMON_UNREACHABLE,
                       FL_ERR_ATTACH_REFUSED,
                       FL_ERR_QUOTA,
                       FL_ERR_VERSION,
                       FL_ERR_BAD_REQUEST,
                       FL_ERR_DAEMON_GONE,
                       FL_ERR_RESOURCES,
                       FL_ERR_RING_CORRUPT,
                       FL_ERR_LIMIT,
                       FL_ERR_AUTH,
                       FL_ERR_PEER_VERSION,
                       FL_ERR_PROTOCOL,
                       FL_ERR_UNKNOWN_STREAM,
                       FL_ERR_UNKNOWN_CREDIT,
                       FL_ERR_TRANSPORT,
                       FL_ERR_DEVICE};
  for (int code : codes) {
    std::string s = fl_status_str(code);
    INFO(code << " -> " << s);
    CHECK(s.rfind("FL_", 0) == 0);
    CHECK(contains(s, ": "));
    CHECK(s.size() > 12);
  }
  CHECK(std::string(fl_status_str(FL_ERR_TOO_LARGE)) ==
        "FL_ERR_TOO_LARGE: frame length exceeds the slot size");
  CHECK(std::string(fl_status_str(9999)) == "unknown status 9999");
  CHECK(std::string(fl_status_str(-1)) == "unknown status -1");
}

TEST_CASE("status names drop fl_status_str's description; an unknown code is still one token", "[client]") {
  CHECK(framelink::statusName(FL_ERR_TOO_LARGE) == "FL_ERR_TOO_LARGE");
  CHECK(framelink::statusName(FL_OK) == "FL_OK");
  CHECK(framelink::statusName(499) == "FL_STATUS_499");
}

TEST_CASE("fl_attach to a socket nobody listens on", "[client]") {
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.stream = "cam0";
  o.socket_path = "/nonexistent/framelink/framelinkd.sock";
  fl_client* c = reinterpret_cast<fl_client*>(0x1);
  CHECK(fl_attach(&o, &c) == FL_ERR_DAEMON_UNREACHABLE);
  CHECK(c == nullptr);
  std::string msg = fl_last_error();
  CHECK(contains(msg, "/nonexistent/framelink/framelinkd.sock"));
  CHECK(contains(msg, "is framelinkd running? (systemctl status framelinkd)"));

  SECTION("$FRAMELINK_SOCKET is used when no path is given") {
    setenv("FRAMELINK_SOCKET", "/nonexistent/from-env.sock", 1);
    o.socket_path = nullptr;
    CHECK(fl_attach(&o, &c) == FL_ERR_DAEMON_UNREACHABLE);
    CHECK(contains(fl_last_error(), "/nonexistent/from-env.sock"));
    unsetenv("FRAMELINK_SOCKET");
  }
}

TEST_CASE("fl_attach rejects bad arguments locally", "[client]") {
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_PRODUCER;
  o.socket_path = "/nonexistent.sock";
  fl_client* c = nullptr;
  const std::string long64(64, 'a');
  const std::string ok63(63, 'a');
  for (const char* bad : {"", "cam 0", "cam/0", "cam0\n", "kamera-\xc3\xa4", "*", long64.c_str()}) {
    o.stream = bad;
    INFO("stream '" << bad << "'");
    CHECK(fl_attach(&o, &c) == FL_EINVAL);
    CHECK(contains(fl_last_error(), "[A-Za-z0-9._-]"));
  }
  o.stream = nullptr;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  for (const char* good : {"cam0", "A.b_c-9", ok63.c_str()}) {
    o.stream = good;
    CHECK(fl_attach(&o, &c) == FL_ERR_DAEMON_UNREACHABLE);  // passed validation
  }
  o.stream = "cam0";
  o.role = 3;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  o.role = FL_CONSUMER;
  o.struct_size = 8;
  CHECK(fl_attach(&o, &c) == FL_EINVAL);
  CHECK(fl_attach(nullptr, &c) == FL_EINVAL);
  CHECK(fl_attach(&o, nullptr) == FL_EINVAL);
  fl_detach(nullptr);  // allowed
}

// ---------------------------------------------------------------- attach

TEST_CASE("attach sends the request and maps the segments", "[client]") {
  FakeDaemon d;
  fl_client_options o = d.options(FL_PRODUCER, "wafer.cam-1");
  o.client_name = "unit-test";
  fl_client* c = attach(d, o);
  CHECK(d.request().magic == FL_ATTACH_MAGIC);
  CHECK(d.request().version == FL_ATTACH_VERSION);
  CHECK(d.request().role == FL_ROLE_PRODUCER);
  CHECK(d.request().slot_count == 4);
  CHECK(d.request().slot_size == 64 * 1024);
  CHECK(std::string(d.request().stream) == "wafer.cam-1");
  CHECK(std::string(d.request().client_name) == "unit-test");
  CHECK(d.request().flags == 0);

  fl_client_info info{};
  REQUIRE(fl_client_get_info(c, &info) == FL_OK);
  CHECK(info.client_id == 77);
  CHECK(info.slot_count == 4);
  CHECK(info.slot_size == 64 * 1024);
  CHECK(info.role == FL_PRODUCER);
  CHECK(info.daemon_pid == static_cast<uint64_t>(getpid()));
  CHECK(info.daemon_start_ns == 123456789);
  CHECK(fl_check_daemon(c) == FL_OK);
  int efd = fl_doorbell_fd(c);
  CHECK(efd >= 0);
  CHECK((fcntl(efd, F_GETFD) & FD_CLOEXEC) != 0);
  fl_detach(c);
}

TEST_CASE("attach failures are reported and leak nothing", "[client]") {
  struct Case {
    Fault fault;
    int status;
    const char* text;
  };
  const Case cases[] = {
      {Fault::kRefuse, FL_ERR_QUOTA, "max_client_bytes"},
      {Fault::kBadMagic, FL_ERR_VERSION, "magic"},
      {Fault::kBadLayoutVersion, FL_ERR_VERSION, "layout version"},
      {Fault::kRingOutOfBounds, FL_ERR_RING_CORRUPT, "do not fit"},
      {Fault::kSlotsOutOfBounds, FL_ERR_RING_CORRUPT, "do not fit"},
      {Fault::kThreeFds, FL_ERR_VERSION, "file descriptors"},
      {Fault::kNotServing, FL_ERR_DAEMON_GONE, "attach again"},
      {Fault::kSilentClose, FL_ERR_DAEMON_UNREACHABLE, "closed the connection"},
  };
  for (const Case& k : cases) {
    const int before = countOpenFds();
    {
      FakeDaemon d(k.fault);
      fl_client_options o = d.options(FL_PRODUCER);
      fl_client* c = nullptr;
      int rc = fl_attach(&o, &c);
      d.join();
      INFO("fault " << static_cast<int>(k.fault) << ": " << fl_last_error());
      CHECK(rc == k.status);
      CHECK(c == nullptr);
      CHECK(contains(fl_last_error(), k.text));
    }
    CHECK(countOpenFds() == before);
  }
}

// ---------------------------------------------------------------- C++ wrapper

TEST_CASE("C++ wrapper: RAII leases and frames", "[client]") {
  SECTION("errors throw with the status") {
    framelink::Options o;
    o.stream = "cam0";
    o.socket_path = "/nonexistent.sock";
    try {
      framelink::Producer p(o);
      FAIL("no exception");
    } catch (const framelink::Error& e) {
      CHECK(e.status() == FL_ERR_DAEMON_UNREACHABLE);
      CHECK(contains(e.what(), "/nonexistent.sock"));
    }
  }
  SECTION("every option reaches fl_client_options: pull and wait_spin_us too") {
    framelink::Options o;
    o.stream = "cam0";
    o.wait_spin_us = FL_WAIT_SPIN_MAX_US + 1;  // refused by fl_attach before it connects
    o.socket_path = "/nonexistent.sock";
    try {
      framelink::Consumer c(o);
      FAIL("no exception");
    } catch (const framelink::Error& e) {
      CHECK(e.status() == FL_EINVAL);
      CHECK(contains(e.what(), "wait_spin_us"));
    }
    FakeDaemon d;
    o.socket_path = d.path();
    o.wait_spin_us = FL_WAIT_SPIN_OFF;
    o.pull = true;
    framelink::Consumer c(o);
    d.join();
    CHECK((d.request().flags & FL_ATTACH_PULL) != 0);
  }
  SECTION("producer") {
    FakeDaemon d;
    framelink::Options o;
    o.stream = "cam0";
    o.socket_path = d.path();
    o.slot_count = 2;
    framelink::Producer p(o);
    d.join();
    CHECK(p.info().slot_count == 2);
    {
      auto lease = p.acquire(0);
      REQUIRE(lease);
      CHECK(lease->index() == 0);
      // dropped without submit: abandoned
    }
    auto a = p.acquire(0);
    REQUIRE(a);
    CHECK(a->index() == 0);
    a->setMeta({5, 0, 1, true, "x=1"});
    std::memset(a->data(), 7, 100);
    a->submit(100);
    CHECK(p.inFlight() == 1);
    auto b = p.acquire(0);
    REQUIRE(b);
    CHECK_FALSE(p.acquire(0).has_value());
    CHECK_THROWS_AS(b->submit(b->capacity() + 1), framelink::Error);
    d.pushCompletion(fl_completion_desc{0, FL_OK, 0, 100, 5});
    auto done = p.waitCompletions(1000);
    REQUIRE(done.size() == 1);
    CHECK(done[0].frame_id == 5);
  }
  SECTION("consumer") {
    FakeDaemon d;
    framelink::Options o;
    o.stream = "cam0";
    o.socket_path = d.path();
    framelink::Consumer cons(o);
    d.join();
    CHECK_FALSE(cons.receive(0).has_value());
    d.slotHeader(1)->length = 8;
    d.pushCompletion(fl_completion_desc{1, FL_OK, 0, 8, 0});
    {
      auto f = cons.receive(1000);
      REQUIRE(f);
      CHECK(f->slot() == 1);
      CHECK(f->size() == 8);
    }  // released here
    fl_submit_desc sd{};
    REQUIRE(d.popSubmit(sd));
    CHECK(sd.slot == 1);
    framelink::Consumer moved = std::move(cons);
    CHECK(moved);
    CHECK_FALSE(cons);
  }
}
