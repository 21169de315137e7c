// SIGHUP (systemctl reload) reads the configuration again: log_level takes
// effect at once, every other change is named with the restart it needs, and
// a file that does not parse is refused with the message a start would give
// while the daemon keeps serving with its running configuration.
#include <signal.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "client_util.h"
#include "framelink/framelink.h"
#include "harness.h"

using namespace framelink::integ;

namespace {

void writeConfig(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  REQUIRE(out.good());
}

}  // namespace

TEST_CASE(
    "reload: SIGHUP applies log_level, names the changes that need a restart, and refuses a bad file "
    "while the daemon keeps serving",
    "[integration][admin]") {
  TempDir dir("fl-reload");
  const std::string file = dir.file("framelinkd.toml");
  writeConfig(file, "[daemon]\nlog_level = \"info\"\n[limits]\nmax_slots = 64\n");
  DaemonProcess::Options o;
  o.id = "reloaded";
  o.log_level.clear();  // the file's
  o.extra_args = {"--config", file};
  DaemonProcess d(o);
  Client before = attachProducer(d, "kept", 2, 4096);

  // A changed level applies at once; a changed limit is named, not applied.
  writeConfig(file, "[daemon]\nlog_level = \"debug\"\n[limits]\nmax_slots = 32\n");
  REQUIRE(::kill(d.pid(), SIGHUP) == 0);
  CHECK(d.waitForLog("reload: log_level info -> debug", Millis(5000)));
  CHECK(d.waitForLog("reload: [limits] max_slots changed and take effect at the next restart", Millis(5000)));
  AttachResult r = tryAttach(d.socketPath(), FL_CONSUMER, "kept", 48, 4096);
  INFO(statusName(r.status) << ": " << r.message);
  CHECK(r.status == FL_OK);  // the running limit (64) still holds

  // A file that does not parse: refused as at start, the running configuration stays.
  writeConfig(file, "[daemon]\nlog_level = \"loud\"\n");
  REQUIRE(::kill(d.pid(), SIGHUP) == 0);
  CHECK(d.waitForLog("reload: the configuration is refused, the running one stays", Millis(5000)));
  CHECK(d.waitForLog("loud", Millis(5000)));
  REQUIRE(d.alive());
  CHECK(fl_check_daemon(before.get()) == FL_OK);
  Client after = attachProducer(d, "after-reload", 2, 4096);
  CHECK(fl_check_daemon(after.get()) == FL_OK);
}
