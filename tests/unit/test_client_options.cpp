// libframelink's options structs across header versions, against the fake
// framelinkd (client_fake_daemon.h): an application built against an older,
// shorter fl_client_options is read and written only as far as its struct
// goes, and the options it cannot have are not read.
#include <catch2/catch.hpp>
#include <cstring>

#include "client_fake_daemon.h"

using client_test::attach;
using client_test::contains;
using client_test::FakeDaemon;

TEST_CASE("producer: old options structs are accepted, without auto_reattach", "[client]") {
  FakeDaemon d;
  fl_client_options o = d.options(FL_PRODUCER);
  o.struct_size = FL_CLIENT_OPTIONS_SIZE_V1;  // an application built against the header before auto_reattach
  o.auto_reattach = 1;                        // beyond its struct: not read
  fl_client* c = attach(d, o);
  d.die();
  fl_slot s{};
  for (int i = 0; i < 4; ++i) REQUIRE(fl_acquire(c, 0, &s) == FL_OK);
  CHECK(fl_acquire(c, 1000, &s) == FL_ERR_DAEMON_GONE);
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
