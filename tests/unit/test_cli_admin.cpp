// The operator commands' pure parts: the tables and rates `framelink stats /
// clients / links` print from a daemon snapshot, and what `framelink doctor`
// reads from /proc (on sample text) and how it prints a check.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "admin.h"
#include "doctor.h"

using namespace framelink::cli;

namespace {

Json snapshot(uint64_t delivered, uint64_t bytes) {
  return Json::parse(R"({
    "daemon": {"id": "host-a", "pid": 42, "version": "0.1.0", "start_ns": 1, "socket": "/run/x.sock",
               "transports": ["tcp"]},
    "peers": [{"name": "host-b", "address": "10.0.0.2:7700"}, {"name": "host-c", "address": "10.0.0.3:7700"}],
    "metrics": {
      "counters": {"frames_delivered": )" +
                     std::to_string(delivered) + R"(, "bytes_sent": )" + std::to_string(bytes) +
                     R"json(, "links_up": 1},
      "failed_by_status": {"107": 3},
      "peer_problems": {"host-c": {"last_error": "refused the session: wrong or missing token (gRPC 16)",
                                   "last_error_ns": 1000000000, "errors": 4}},
      "detail": {
        "clients": [{"id": 7, "pid": 1234, "uid": 1000, "role": "producer", "stream": "cam0", "slots": 4,
                     "slot_size": 262144, "in_flight": 2, "frames": 10, "bytes": 1000, "errors": 0,
                     "name": "grabber", "gone": false}],
        "links": [{"id": 1, "peer": "host-b", "address": "10.0.0.2:7700", "state": "up", "transport": "tcp",
                   "transport_reason": "", "up_since_ns": 0, "rtt_ns": 250000, "frames_in": 0,
                   "frames_out": 10, "in_flight": 2, "pending": 1, "replayed": 5}]
      }
    }
  })json");
}

}  // namespace

TEST_CASE("admin: clients table has one row per client with its slot geometry") {
  const std::string t = formatClients(snapshot(0, 0));
  CHECK(t.find("PID") != std::string::npos);
  CHECK(t.find("1234") != std::string::npos);
  CHECK(t.find("producer") != std::string::npos);
  CHECK(t.find("4 x 256 KiB") != std::string::npos);
  CHECK(t.find("grabber") != std::string::npos);
  // A name with a terminal escape sequence prints without it.
  Json odd = snapshot(0, 0);
  odd["metrics"]["detail"]["clients"][0]["name"] = "cam\x1b]0;owned\x07";
  CHECK(formatClients(odd).find("cam?]0;owned?") != std::string::npos);
  CHECK(formatClients(odd).find('\x1b') == std::string::npos);
  Json empty = Json::parse(R"({"metrics": {"detail": {"clients": []}}})");
  CHECK(formatClients(empty) == "no clients attached\n");
}

TEST_CASE("admin: links show every link and every configured peer without one as down") {
  const Json rows = linkRows(snapshot(0, 0));
  REQUIRE(rows.size() == 2);
  CHECK(rows[0]["peer"] == "host-b");
  CHECK(rows[0]["state"] == "up");
  CHECK(rows[1]["peer"] == "host-c");
  CHECK(rows[1]["state"] == "down");
  // Why host-c is down, and since when; host-b never had a problem.
  CHECK(rows[1]["last_error"] == "refused the session: wrong or missing token (gRPC 16)");
  CHECK(rows[1]["last_error_ns"] == 1000000000);
  CHECK(rows[0]["last_error"] == "");
  const std::string t = formatLinks(snapshot(0, 0));
  CHECK(t.find("0.250 ms") != std::string::npos);
  CHECK(t.find("host-c") != std::string::npos);
  CHECK(t.find("down") != std::string::npos);
  CHECK(t.find("LAST ERROR") != std::string::npos);
  CHECK(t.find(" ago: refused the session: wrong or missing token (gRPC 16)") != std::string::npos);
}

TEST_CASE("admin: rates are the counter's growth over the interval; a restarted daemon counts from 0") {
  const Json before = snapshot(10, 1000);
  const Json now = snapshot(30, 5000);
  const Json s = statsJson(now, &before, 2.0);
  CHECK(s["rates_per_s"]["frames_delivered"].get<double>() == Approx(10.0));
  CHECK(s["rates_per_s"]["bytes_sent"].get<double>() == Approx(2000.0));
  CHECK_FALSE(s["rates_per_s"].contains("links_up"));  // a gauge, not a counter
  const Json restarted = statsJson(before, &now, 2.0);
  CHECK(restarted["rates_per_s"]["frames_delivered"].get<double>() == 0.0);
  CHECK(statsJson(now, nullptr, 0)["rates_per_s"].empty());
  const std::string text = formatStats(now, &before, 2.0);
  CHECK(text.find("framelinkd 'host-a' pid 42") != std::string::npos);
  CHECK(text.find("10.0") != std::string::npos);
  CHECK(text.find("1.95 KiB/s") != std::string::npos);
  CHECK(text.find("FL_ERR_TIMEOUT: 3") != std::string::npos);
}

TEST_CASE("admin: durations and round trips") {
  CHECK(formatDuration(3723) == "1h02m03s");
  CHECK(formatDuration(75) == "1m15s");
  CHECK(formatDuration(4.25) == "4.2s");
  CHECK(formatRtt(0) == "-");
  CHECK(formatRtt(123456) == "0.123 ms");
  CHECK(formatByteRate(1024, 0) == "-");
}

TEST_CASE("doctor: hugepages from /proc/meminfo") {
  auto h = parseMeminfo(
      "MemTotal:       16318196 kB\nHugePages_Total:     512\nHugePages_Free:      500\n"
      "HugePages_Rsvd:        0\nHugepagesize:       2048 kB\n");
  REQUIRE(h);
  CHECK(h->total == 512);
  CHECK(h->free == 500);
  CHECK(h->size_kib == 2048);
  CHECK_FALSE(parseMeminfo("MemTotal: 1 kB\n"));
}

TEST_CASE("doctor: the memlock soft limit from /proc/<pid>/limits") {
  const std::string limited =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max open files            1024                 524288               files     \n"
      "Max locked memory         8388608              8388608              bytes     \n";
  CHECK(parseMemlock(limited) == uint64_t{8388608});
  CHECK(parseMemlock("Max locked memory         unlimited            unlimited            bytes\n") ==
        UINT64_MAX);
  CHECK_FALSE(parseMemlock("Max open files 1024 1024 files\n"));
}

TEST_CASE("doctor: one line per check, a fix on every WARN and FAIL, exit 1 on a FAIL") {
  Check ok{Verdict::kOk, "clock", "synchronised", "never shown"};
  Check warn{Verdict::kWarn, "hugepages", "none reserved", "sysctl -w vm.nr_hugepages=512"};
  Check fail{Verdict::kFail, "daemon", "not running", "systemctl start framelinkd"};
  CHECK(formatCheck(ok) == "OK   clock      synchronised");
  CHECK(formatCheck(warn) == "WARN hugepages  none reserved -- fix: sysctl -w vm.nr_hugepages=512");
  CHECK(formatCheck(fail) == "FAIL daemon     not running -- fix: systemctl start framelinkd");
  CHECK(doctorExitCode({ok, warn}) == 0);
  CHECK(doctorExitCode({ok, warn, fail}) == 1);
}

TEST_CASE("doctor: a peer's last problem gets the fix for the cause the daemon recorded with it") {
  CHECK_THAT(fixForPeerProblem("token"), Catch::Contains("same token on both daemons"));
  CHECK_THAT(fixForPeerProblem("token"), !Catch::Contains("peers.pem"));
  // With TLS on, a refusal can be the token's or the certificate's.
  CHECK_THAT(fixForPeerProblem("credentials"), Catch::Contains("same token on both daemons"));
  CHECK_THAT(fixForPeerProblem("credentials"), Catch::Contains("peers.pem"));
  CHECK_THAT(fixForPeerProblem("unreachable_or_tls"), Catch::Contains("peers.pem"));
  CHECK_THAT(fixForPeerProblem("version"), Catch::Contains("same framelink version"));
  CHECK_THAT(fixForPeerProblem("data_channel"), Catch::Contains("7701"));
  CHECK_THAT(fixForPeerProblem("unreachable"), Catch::Contains("firewalls"));
  CHECK_THAT(fixForPeerProblem("refused"), Catch::Contains("journalctl"));
  CHECK_THAT(fixForPeerProblem("link_down"), Catch::Contains("journalctl"));
  CHECK_THAT(fixForPeerProblem(""), Catch::Contains("journalctl"));  // a daemon from before causes
}
