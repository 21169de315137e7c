// The `framelink-bench` subcommands.  Each add*Command registers its options and stores its exit
// code in `exit_code` when it runs.
#ifndef FRAMELINK_BENCH_COMMANDS_H
#define FRAMELINK_BENCH_COMMANDS_H

#include <CLI/CLI.hpp>

namespace framelink::cli {

void addDemoCommand(CLI::App& app, int& exit_code);
void addBenchCommand(CLI::App& app, int& exit_code);
// Hidden helpers that `bench` starts as separate processes (gRPC must not be used across fork).
void addBenchHelperCommands(CLI::App& app, int& exit_code);

}  // namespace framelink::cli

#endif  // FRAMELINK_BENCH_COMMANDS_H
