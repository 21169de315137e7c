// Runs of the `framelink` CLI in integration tests: its exit code and
// output, and its JSON output parsed (`links --json`, ...).
#pragma once

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"

namespace framelink::integ {

struct CliRun {
  int code = -1;
  std::string output;
};

inline CliRun runCli(const std::string& label, const std::vector<std::string>& args,
                     const std::string& program = cliBinary()) {
  ChildProcess p(label, args, {}, program);
  CliRun r;
  r.code = p.wait(Millis(20000));
  r.output = p.output();
  return r;
}

// REQUIREs that it exits 0 and prints JSON.
inline nlohmann::json cliJson(const std::string& label, const std::vector<std::string>& args) {
  CliRun r = runCli(label, args);
  INFO(label << " output: " << r.output);
  REQUIRE(r.code == 0);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(r.output));
  return j;
}

}  // namespace framelink::integ
