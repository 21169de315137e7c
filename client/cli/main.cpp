// `framelink`: the operator's command-line tool (send, recv, stats, clients, links, reload, doctor).
// The demo and the benchmark are `framelink-bench` (client/bench).
#include <framelink/framelink.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "commands.h"

// An exception that gets here ends the tool with its message, not with a
// bare std::terminate.
int main(int argc, char** argv) try {
  CLI::App app{"framelink: move frames between hosts through framelinkd"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("framelink ") + fl_version());
  int exit_code = 0;
  framelink::cli::addSendCommand(app, exit_code);
  framelink::cli::addRecvCommand(app, exit_code);
  framelink::cli::addAdminCommands(app, exit_code);
  framelink::cli::addDoctorCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
} catch (const std::exception& e) {
  std::fprintf(stderr, "framelink: %s\n", e.what());
  return 1;
} catch (...) {
  std::fprintf(stderr, "framelink: unknown exception\n");
  return 1;
}
