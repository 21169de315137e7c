// libframelink's options structs across header versions, against the fake
// framelinkd (client_fake_daemon.h): an application built against an older,
// shorter fl_client_options is read and written only as far as its struct
// goes, and the options it cannot have are not read.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "client_fake_daemon.h"

using client_test::attach;
using client_test::contains;
using client_test::FakeDaemon;

// $FRAMELINK_AUTO_REATTACH for the life of one test (Catch runs the tests on one thread).
struct AutoReattachEnv {
  explicit AutoReattachEnv(const char* value) {
    if (value != nullptr) ::setenv("FRAMELINK_AUTO_REATTACH", value, 1);
  }
  ~AutoReattachEnv() { ::unsetenv("FRAMELINK_AUTO_REATTACH"); }
  AutoReattachEnv(const AutoReattachEnv&) = delete;
  AutoReattachEnv& operator=(const AutoReattachEnv&) = delete;
};

TEST_CASE("producer: old options structs are accepted, with auto_reattach's default", "[client]") {
  const bool env_off = GENERATE(false, true);
  INFO("FRAMELINK_AUTO_REATTACH " << (env_off ? "off" : "unset"));
  AutoReattachEnv env(env_off ? "off" : nullptr);
  FakeDaemon d;
  fl_client_options o = d.options(FL_PRODUCER);
  o.struct_size = FL_CLIENT_OPTIONS_SIZE_V1;  // an application built against the header before auto_reattach
  o.auto_reattach = 0;                        // beyond its struct: not read
  fl_client* c = attach(d, o);
  d.die();
  fl_slot s{};
  for (int i = 0; i < 4; ++i) REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  // On by default: the wait finds no slot while the daemon is away, and says why.
  const int rc = fl_acquire(c, 300, &s);
  INFO(fl_last_error());
  CHECK(rc == (env_off ? FL_ERR_DAEMON_GONE : FL_ETIMEDOUT));
  fl_detach(c);
  o.struct_size = FL_CLIENT_OPTIONS_SIZE_V1 - 8;
  fl_client* none = nullptr;
  CHECK(fl_attach(&o, &none) == FL_EINVAL);
  CHECK(contains(fl_last_error(), "fl_client_options_init"));
}

TEST_CASE("options: init writes no more than the application's struct holds", "[client]") {
  // An application built against an older header has a smaller struct: the
  // library must not write its newer fields past it.
  unsigned char buf[sizeof(fl_client_options) + 16];
  std::memset(buf, 0xAB, sizeof buf);
  auto* o = reinterpret_cast<fl_client_options*>(buf);
  fl_client_options_init_size(o, FL_CLIENT_OPTIONS_SIZE_V2);
  CHECK(o->struct_size == FL_CLIENT_OPTIONS_SIZE_V2);
  CHECK(o->role == FL_PRODUCER);
  for (size_t i = FL_CLIENT_OPTIONS_SIZE_V2; i < sizeof buf; ++i) CHECK(buf[i] == 0xAB);
  // The symbol applications built before fl_client_options_init_size call.
  std::memset(buf, 0xAB, sizeof buf);
  (fl_client_options_init)(o);
  CHECK(o->struct_size == FL_CLIENT_OPTIONS_SIZE_V3);
  for (size_t i = FL_CLIENT_OPTIONS_SIZE_V3; i < sizeof buf; ++i) CHECK(buf[i] == 0xAB);
  // A larger struct than the library knows: its own part, no more.
  std::memset(buf, 0xAB, sizeof buf);
  fl_client_options_init_size(o, sizeof buf);
  CHECK(o->struct_size == sizeof(fl_client_options));
  for (size_t i = sizeof(fl_client_options); i < sizeof buf; ++i) CHECK(buf[i] == 0xAB);
  // The macro: this header's size.
  fl_client_options here;
  fl_client_options_init(&here);
  CHECK(here.struct_size == sizeof(fl_client_options));
  CHECK(here.pull == 0);
}

TEST_CASE("options: auto_reattach is on by default; $FRAMELINK_AUTO_REATTACH turns it off", "[client]") {
  for (const char* off : {"0", "off", "No", "FALSE"}) {
    AutoReattachEnv env(off);
    fl_client_options o;
    fl_client_options_init(&o);
    CHECK(o.auto_reattach == 0);
  }
  for (const char* on : {static_cast<const char*>(nullptr), "", "1", "on", "yes", "True"}) {
    AutoReattachEnv env(on);
    fl_client_options o;
    fl_client_options_init(&o);
    CHECK(o.auto_reattach == 1);
  }
  // A value that is neither is refused at attach, naming it, before the daemon is asked.
  AutoReattachEnv env("sometimes");
  fl_client_options o;
  fl_client_options_init(&o);
  o.stream = "cam0";
  o.socket_path = "/nonexistent/framelinkd.sock";  // never reached
  fl_client* none = nullptr;
  CHECK(fl_attach(&o, &none) == FL_EINVAL);
  CHECK(contains(fl_last_error(), "FRAMELINK_AUTO_REATTACH='sometimes'"));
}

TEST_CASE("consumer: the pull option goes in the attach request, from a struct that has it", "[client]") {
  {
    FakeDaemon d;
    fl_client_options o = d.options(FL_CONSUMER);
    o.pull = 1;
    fl_client* c = attach(d, o);
    CHECK((d.request().flags & FL_ATTACH_PULL) != 0);
    fl_detach(c);
    // Refused before the daemon is asked (this one serves one attach).
    fl_client_options p = d.options(FL_PRODUCER);
    p.pull = 1;
    fl_client* none = nullptr;
    CHECK(fl_attach(&p, &none) == FL_EINVAL);
    CHECK(contains(fl_last_error(), "pull is for consumers"));
  }
  FakeDaemon d;
  fl_client_options o = d.options(FL_CONSUMER);
  o.struct_size = FL_CLIENT_OPTIONS_SIZE_V3;  // built against the header before pull
  o.pull = 1;                                 // beyond its struct: not read
  fl_client* c = attach(d, o);
  CHECK((d.request().flags & FL_ATTACH_PULL) == 0);
  fl_detach(c);
}

// $FRAMELINK_WAIT_SPIN_US for the life of one test.
struct WaitSpinEnv {
  explicit WaitSpinEnv(const char* value) {
    if (value != nullptr) ::setenv("FRAMELINK_WAIT_SPIN_US", value, 1);
  }
  ~WaitSpinEnv() { ::unsetenv("FRAMELINK_WAIT_SPIN_US"); }
  WaitSpinEnv(const WaitSpinEnv&) = delete;
  WaitSpinEnv& operator=(const WaitSpinEnv&) = delete;
};

// The spin fl_attach resolves against a fake daemon that advises `advice`
// (-1: advises nothing, a daemon from before the advice).
static uint32_t resolvedSpin(int64_t advice, uint32_t option, const char* env_value) {
  WaitSpinEnv env(env_value);
  FakeDaemon d;
  if (advice >= 0) d.adviseWaitSpin(static_cast<uint32_t>(advice));
  fl_client_options o = d.options(FL_CONSUMER);
  o.wait_spin_us = option;
  fl_client* c = attach(d, o);
  const uint32_t spin = fl_wait_spin_us(c);
  fl_detach(c);
  return spin;
}

TEST_CASE("wait spin: the option, then the environment, then the daemon's advice, then 20 us", "[client]") {
  CHECK(resolvedSpin(333, 0, nullptr) == 333);
  CHECK(resolvedSpin(0, 0, nullptr) == 0);  // the host says: do not spin
  CHECK(resolvedSpin(333, 0, "7") == 7);
  CHECK(resolvedSpin(333, 0, "0") == 0);
  CHECK(resolvedSpin(333, 5, "7") == 5);
  CHECK(resolvedSpin(333, FL_WAIT_SPIN_OFF, nullptr) == 0);
  // Zero advice flags: a daemon too old to advise; the built-in default.
  CHECK(resolvedSpin(-1, 0, nullptr) == FL_WAIT_SPIN_DEFAULT_US);
  CHECK(resolvedSpin(-1, 0, "7") == 7);
  // More than a client may ask for is capped, not trusted.
  CHECK(resolvedSpin(FL_WAIT_SPIN_MAX_US + 1, 0, nullptr) == FL_WAIT_SPIN_MAX_US);
  CHECK(fl_wait_spin_us(nullptr) == 0);
}

TEST_CASE("wait spin: a reattach takes the new daemon's advice", "[client]") {
  auto first = std::make_unique<FakeDaemon>();
  first->adviseWaitSpin(333);
  fl_client* c = attach(*first, first->options(FL_CONSUMER));
  REQUIRE(fl_wait_spin_us(c) == 333);
  const std::string path = first->path();
  first->die();
  FakeDaemon second(client_test::Fault::kNone, path);
  second.adviseWaitSpin(44);
  const int rc = fl_reattach(c);
  second.join();
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  CHECK(fl_wait_spin_us(c) == 44);
  fl_detach(c);
}
