// `framelink-bench run` as an operator runs it: its own daemons (three with --hosts 2), the tables it
// prints.  Short cases; what is checked is the shape and the byte counts, not the speed (the machine
// running the tests may be busy).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"

using namespace framelink::integ;

namespace {

// The cells of the table row whose first cell is `name`, trimmed; empty when there is none.
std::vector<std::string> tableRow(const std::string& output, const std::string& name) {
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| " + name + " |", 0) != 0) continue;
    std::vector<std::string> cells;
    for (size_t pos = 1, bar = 0; (bar = line.find('|', pos)) != std::string::npos; pos = bar + 1) {
      const std::string cell = line.substr(pos, bar - pos);
      const size_t first = cell.find_first_not_of(' ');
      const size_t last = cell.find_last_not_of(' ');
      cells.push_back(first == std::string::npos ? std::string() : cell.substr(first, last - first + 1));
    }
    return cells;
  }
  return {};
}

// The number a cell starts with ("1.00 x frame (1048576 B)": 1.0); nullopt when it starts with none.
std::optional<double> leadingNumber(const std::string& cell) {
  char* end = nullptr;
  const double v = std::strtod(cell.c_str(), &end);
  if (end == cell.c_str()) return std::nullopt;
  return v;
}

// A "daemon CPU per frame A / B" cell, "120.5 / 98.0 us (user 20.1 / 31.0 us)": checks that both
// daemons used CPU and that the part in their own code (utime) is some of it, never more.
void checkCpuPerFrame(const std::string& cell) {
  INFO("CPU per frame: " << cell);
  double all_a = -1, all_b = -1, user_a = -1, user_b = -1;
  REQUIRE(std::sscanf(cell.c_str(), "%lf / %lf us (user %lf / %lf us)", &all_a, &all_b, &user_a, &user_b) ==
          4);
  CHECK(all_a > 0);
  CHECK(all_b > 0);
  CHECK(user_a >= 0);
  CHECK(user_b >= 0);
  CHECK(user_a <= all_a + 0.1);  // + the cell's rounding
  CHECK(user_b <= all_b + 0.1);
}

}  // namespace

TEST_CASE("bench: run --subscribers: every subscriber on daemon B gets each frame, the link carries it once",
          "[integration][cli][bench]") {
  const std::string transport = GENERATE(as<std::string>{}, "tcp", "grpc");
  INFO("transport " << transport);
  ChildProcess bench("bench-" + transport,
                     {"run", "--framelinkd", daemonBinary(), "--transports", transport, "--sizes", "4K",
                      "--seconds", "0.5", "--subscribers", "3", "--no-baselines", "--pairs", "0",
                      "--latency-samples", "0", "--idle-seconds", "0"},
                     {}, benchBinary());
  const int code = bench.wait(Millis(60000));
  const std::string out = bench.output();
  INFO(out);
  REQUIRE(code == 0);

  const std::string what = transport + " 1 MiB, ";  // the subscribers' frame size
  CHECK(out.find("| case | 1 subscriber | 3 subscribers | ratio 3 / 1 |") != std::string::npos);
  for (const char* figure : {"frames/s delivered, all readers", "GB/s delivered, all readers"}) {
    INFO(figure);
    const auto row = tableRow(out, what + figure);
    REQUIRE(row.size() == 4);
    CHECK(leadingNumber(row[1]).value_or(0) > 0);
    CHECK(leadingNumber(row[2]).value_or(0) > 0);
    CHECK(leadingNumber(row[3]).value_or(0) > 0);
  }
  // With one subscriber and with three, the link carried each frame once: 1.00 x its size.
  const auto link = tableRow(out, what + "link bytes per frame");
  REQUIRE(link.size() == 4);
  CHECK(leadingNumber(link[1]).value_or(0) == Approx(1.0).epsilon(0.02));
  CHECK(leadingNumber(link[2]).value_or(0) == Approx(1.0).epsilon(0.02));
  CHECK(leadingNumber(link[3]).value_or(0) == Approx(1.0).epsilon(0.02));
  const auto cpu = tableRow(out, what + "daemon CPU per frame A / B");
  REQUIRE(cpu.size() == 4);
  checkCpuPerFrame(cpu[1]);
  checkCpuPerFrame(cpu[2]);
}

TEST_CASE(
    "bench: run --hosts 2: one stream to hostB and hostC, each host gets every frame, the link carries "
    "it once per host",
    "[integration][cli][bench]") {
  ChildProcess bench("bench-hosts",
                     {"run",
                      "--framelinkd",
                      daemonBinary(),
                      "--transports",
                      "tcp",
                      "--sizes",
                      "4K",
                      "--seconds",
                      "0.5",
                      "--hosts",
                      "2",
                      "--subscribers",
                      "0",
                      "--no-baselines",
                      "--pairs",
                      "0",
                      "--latency-samples",
                      "0",
                      "--idle-seconds",
                      "0"},
                     {}, benchBinary());
  const int code = bench.wait(Millis(60000));
  const std::string out = bench.output();
  INFO(out);
  REQUIRE(code == 0);

  const std::string what = "tcp 1 MiB, ";  // the two-hosts case's frame size
  CHECK(out.find("| case | hostB alone | hostB and hostC, each | ratio each / alone |") != std::string::npos);
  for (const char* figure : {"frames/s delivered per host", "GB/s delivered per host"}) {
    INFO(figure);
    const auto row = tableRow(out, what + figure);
    REQUIRE(row.size() == 4);
    const double alone = leadingNumber(row[1]).value_or(0);
    const double each = leadingNumber(row[2]).value_or(0);
    CHECK(alone > 0);
    CHECK(each > 0);
    // The ratio is the two cells' (to their rounding: the ratio has two decimals).
    CHECK(leadingNumber(row[3]).value_or(0) ==
          Approx(each / std::max(alone, 1e-9)).epsilon(0.02).margin(0.01));
  }
  // Routed to hostB alone the link carried each frame once; to hostB and hostC, once per host.
  const auto link = tableRow(out, what + "link bytes per frame");
  REQUIRE(link.size() == 4);
  CHECK(leadingNumber(link[1]).value_or(0) == Approx(1.0).epsilon(0.02));
  CHECK(leadingNumber(link[2]).value_or(0) == Approx(2.0).epsilon(0.02));
  CHECK(leadingNumber(link[3]).value_or(0) == Approx(2.0).epsilon(0.02));
}
