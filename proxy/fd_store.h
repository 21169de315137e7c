// systemd's file descriptor store (FDSTORE=1, sd_listen_fds_with_names), the
// keeper of a hot restart's descriptors between the daemon that stops and
// the one systemd starts next (hand_over.h).  Without systemd (or built
// without libsystemd) nothing is stored and nothing comes back.
#pragma once

#include <string>
#include <vector>

#include "hand_over.h"

namespace framelink {

// The descriptors the store gave this process (LISTEN_FDS), by name; those
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

}  // namespace framelink
