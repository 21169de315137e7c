// Where a hot restart's descriptors wait between the daemon that stops and
// the next (hand_over.h): systemd's file descriptor store (FDSTORE=1, given
// back as LISTEN_FDS by sd_listen_fds_with_names), or -- a restart in place
// (SIGUSR2), under any supervisor or none -- the daemon's own next image,
// which execve(2) hands them to the same way.  Built without libsystemd,
// nothing is handed over.
#pragma once

#include <string>
#include <vector>

#include "hand_over.h"

namespace framelink {

// The descriptors the store gave this process (LISTEN_FDS), or the image
// before this one (FRAMELINK_INHERITED_FDS, reexecWithFds), by name; those
// not named "framelink.*" are closed and removed from the store.
std::vector<NamedFd> takeStoredFds();
// Removes these names from the store (once the daemon holds what it took:
// the store must not keep a client's socket or memory alive after it).
void forgetStoredFds(const std::vector<std::string>& names);
// Whether a store may be there: the daemon runs under systemd ($NOTIFY_SOCKET).
bool fdStoreAvailable();
// Sends each descriptor to the store under its name, unpolled (FDPOLL=0: a
// client's socket it holds must stay even when the client hangs up).
// False when one was not sent.
bool storeFds(std::vector<NamedFd>& fds);

// Notes the executable this process runs (call at start): a restart in
// place runs what that path holds then -- the new binary after an upgrade.
void rememberExecutable();
// Whether a restart in place can hand anything over (built with libsystemd,
// the executable known).
bool reexecAvailable();
// Execs the executable again with `argv` and `fds`, at numbers of their own,
// which FRAMELINK_INHERITED_FDS names (FD=NAME:...) for takeStoredFds, and
// FRAMELINK_INHERITED_PID (the pid stays).  Returns only when
// the exec failed (logged): false.
bool reexecWithFds(std::vector<NamedFd>& fds, char** argv);

}  // namespace framelink
