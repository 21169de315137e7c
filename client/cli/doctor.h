// `framelink doctor`: preflight checks of this host for framelinkd, one line
// each (OK / WARN / FAIL) with a concrete fix for every WARN and FAIL.  The
// parsers of what the checks read (/proc, /sys) are separate so that they
// can be tested on sample text.
#ifndef FRAMELINK_CLI_DOCTOR_H
#define FRAMELINK_CLI_DOCTOR_H

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace framelink::cli {

enum class Verdict { kOk, kWarn, kFail };

struct Check {
  Verdict verdict = Verdict::kOk;
  std::string name;  // "daemon", "socket", "memlock", ...
  std::string what;  // what was found
  std::string fix;   // what to do (WARN / FAIL)
};

// "OK   memlock   unlimited" / "FAIL daemon    ... -- fix: ...": one line.
std::string formatCheck(const Check& check);
// [{"verdict": "ok"|"warn"|"fail", "name", "what", "fix"}, ...]: doctor --json.
nlohmann::json checksJson(const std::vector<Check>& checks);
// 1 when any check FAILed, else 0.
int doctorExitCode(const std::vector<Check>& checks);

struct Hugepages {
  uint64_t total = 0;
  uint64_t free = 0;
  uint64_t size_kib = 0;
};
// From /proc/meminfo's HugePages_Total, HugePages_Free and Hugepagesize.
std::optional<Hugepages> parseMeminfo(const std::string& text);
// The soft limit in bytes from /proc/<pid>/limits' "Max locked memory" line;
// UINT64_MAX for unlimited.
std::optional<uint64_t> parseMemlock(const std::string& limits_text);
// What to do about a peer's last problem, by the kind the daemon recorded
// with it ("cause" in its peer_problems, PeerProblems::causeName): a wrong
// token, TLS trust, versions, ports.
std::string fixForPeerProblem(const std::string& cause);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_DOCTOR_H
