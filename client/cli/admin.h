// The admin side of the attach socket (framelink stats / clients / links /
// doctor): one FL_ADMIN_SNAPSHOT request, the JSON the daemon hands back in
// a sealed memfd, and the tables the commands print from it.  The formatting
// functions are pure so they can be tested without a daemon.
#ifndef FRAMELINK_CLI_ADMIN_H
#define FRAMELINK_CLI_ADMIN_H

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace framelink::cli {

using Json = nlohmann::json;

// --socket, else $FRAMELINK_SOCKET, else /run/framelink/framelinkd.sock.
std::string resolveSocket(const std::string& flag);

// nlohmann::json may allocate: a reply that cannot be built ends the command.
struct AdminReply {   // NOLINT(bugprone-exception-escape)
  int status = 0;     // FL_OK, or the fl_status of the failure
  std::string error;  // what went wrong, when status != FL_OK
  std::string hint;   // what to do about it (may be empty)
  std::string message() const { return hint.empty() ? error : error + "; " + hint; }
  Json snapshot;
};

// Connects to `socket`, sends `command` (FL_ADMIN_SNAPSHOT: the counters,
// clients and links; FL_ADMIN_RELOAD: reload, the outcome) and waits at most
// `timeout_ms` for the JSON.
AdminReply fetchSnapshot(const std::string& socket, int timeout_ms = 5000, uint32_t command = 1);

// "1h02m03s", "45.2s".
std::string formatDuration(double seconds);
// "1.50 MiB/s"; "-" when `seconds` <= 0.
std::string formatByteRate(double bytes, double seconds);
// "0.123 ms"; "-" for 0 (not measured).
std::string formatRtt(uint64_t rtt_ns);

// The `stats` screen: counters with their rate over the `seconds` between
// `before` and `now` (rates "-" when `before` is null).
std::string formatStats(const Json& now, const Json* before, double seconds);
// The `stats --json` line: the snapshot's counters and their rates per second.
Json statsJson(const Json& now, const Json* before, double seconds);
// The `clients` table (one row per attached application).
std::string formatClients(const Json& snapshot);
// The `links` rows: every link up, and configured peers without one (state
// "down").  `links` prints them; --json prints this array.
Json linkRows(const Json& snapshot);
std::string formatLinks(const Json& snapshot);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_ADMIN_H
