// `framelink-bench`: the two-daemon demo and the benchmark of framelink beside plain TCP, plain
// gRPC and UCX.  The operator's tool is `framelink` (client/cli), which links no gRPC.
#include <framelink/framelink.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "bench_commands.h"

// An exception that gets here ends the program with its message, not with a
// bare std::terminate.
int main(int argc, char** argv) try {
  CLI::App app{"framelink-bench: the two-daemon demo and the benchmark of framelinkd's transports"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("framelink-bench ") + fl_version());
  int exit_code = 0;
  framelink::cli::addDemoCommand(app, exit_code);
  framelink::cli::addBenchCommand(app, exit_code);
  framelink::cli::addBenchHelperCommands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "framelink-bench: %s\n", e.what());
  return 1;
} catch (...) {
  std::fprintf(stderr, "framelink-bench: unknown exception\n");
  return 1;
}
