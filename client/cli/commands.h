// The `framelink` subcommands.  Each add*Command registers its options and stores its exit code
// in `exit_code` when it runs.
#ifndef FRAMELINK_CLI_COMMANDS_H
#define FRAMELINK_CLI_COMMANDS_H

#include <CLI/CLI.hpp>

namespace framelink::cli {

void addSendCommand(CLI::App& app, int& exit_code);
void addRecvCommand(CLI::App& app, int& exit_code);
// Operator commands: stats, clients, links (admin requests to the daemon) and doctor (preflight).
void addAdminCommands(CLI::App& app, int& exit_code);
void addDoctorCommand(CLI::App& app, int& exit_code);

}  // namespace framelink::cli

#endif  // FRAMELINK_CLI_COMMANDS_H
