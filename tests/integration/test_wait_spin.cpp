// The host's wait spin: a daemon started with client_wait_spin_us publishes
// it in each client's segment header, and a client that sets no spin of its
// own waits that long; the client's option and $FRAMELINK_WAIT_SPIN_US come
// first.  (A header without the advice, from an older daemon, is the unit
// tests' fake daemon: tests/unit/test_client_options.cpp.)
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <framelink/framelink.h>

#include "client_util.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

// $FRAMELINK_WAIT_SPIN_US as given (nullptr: unset) for the life of one
// check, and unset again after it: the tests of one process share it.
class SpinEnv {
 public:
  explicit SpinEnv(const char* value) {
    if (value != nullptr) {
      ::setenv("FRAMELINK_WAIT_SPIN_US", value, 1);
    } else {
      ::unsetenv("FRAMELINK_WAIT_SPIN_US");
    }
  }
  ~SpinEnv() { ::unsetenv("FRAMELINK_WAIT_SPIN_US"); }
  SpinEnv(const SpinEnv&) = delete;
  SpinEnv& operator=(const SpinEnv&) = delete;
};

// Attaches a consumer to `d` with wait_spin_us = `option` and
// $FRAMELINK_WAIT_SPIN_US = `env`; returns the spin the library resolved.
uint32_t resolvedSpin(const DaemonProcess& d, uint32_t option, const char* env) {
  SpinEnv guard(env);
  fl_client_options o;
  fl_client_options_init(&o);
  o.role = FL_CONSUMER;
  o.socket_path = d.socketPath().c_str();
  o.stream = "spin";
  o.slot_count = 2;
  o.slot_size = 4096;
  o.auto_reattach = 0;
  o.wait_spin_us = option;
  fl_client* raw = nullptr;
  const int rc = fl_attach(&o, &raw);
  INFO(fl_last_error());
  REQUIRE(rc == FL_OK);
  Client c(raw);
  return fl_wait_spin_us(c.get());
}

}  // namespace

TEST_CASE("wait spin: a client that sets none spins as the daemon's client_wait_spin_us says",
          "[integration][local]") {
  DaemonProcess::Options o;
  o.id = "spin";
  o.extra_args = {"--client-wait-spin-us", "333"};
  DaemonProcess d(o);
  CHECK(resolvedSpin(d, 0, nullptr) == 333);
  CHECK(resolvedSpin(d, 0, "7") == 7);                 // the environment over the host's advice
  CHECK(resolvedSpin(d, 5, "7") == 5);                 // the option over both
  CHECK(resolvedSpin(d, FL_WAIT_SPIN_OFF, "7") == 0);  // and no spin when the option says so

  // A daemon configured with nothing advises the documented default.
  DaemonProcess::Options plain;
  plain.id = "plain";
  DaemonProcess defaults(plain);
  CHECK(resolvedSpin(defaults, 0, nullptr) == FL_WAIT_SPIN_DEFAULT_US);
}

TEST_CASE("wait spin: client_wait_spin_us 0 makes the host's clients sleep at once", "[integration][local]") {
  DaemonProcess::Options o;
  o.id = "nospin";
  o.extra_args = {"--client-wait-spin-us", "0"};
  DaemonProcess d(o);
  CHECK(resolvedSpin(d, 0, nullptr) == 0);
  CHECK(resolvedSpin(d, 0, "7") == 7);
}
