// `framelink`: the command-line tool (send, recv, demo, bench, stats, clients, links, doctor).
#include <framelink/framelink.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"framelink: move frames between hosts through framelinkd"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("framelink ") + fl_version());
  int exit_code = 0;
  framelink::cli::addSendCommand(app, exit_code);
  framelink::cli::addRecvCommand(app, exit_code);
  framelink::cli::addDemoCommand(app, exit_code);
  framelink::cli::addBenchCommand(app, exit_code);
  framelink::cli::addBenchHelperCommands(app, exit_code);
  framelink::cli::addAdminCommands(app, exit_code);
  framelink::cli::addDoctorCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
