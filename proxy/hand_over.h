// Hot restart: what a stopping framelinkd hands to the next one so that its
// attached clients never notice -- the attach listener, and of every client
// its attach socket, both memfds and its doorbells' daemon ends -- and the
// state that says what they are (proto/framelink/v1/hand_over.proto), in a
// memfd of its own.  Under systemd they wait in the unit's file descriptor
// store (FDSTORE=1) and come back to the next process as its LISTEN_FDS;
// main.cpp speaks that protocol, this file only packs and unpacks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/data_agent.h"
#include "attach/client_session.h"
#include "common/result.h"
#include "common/unique_fd.h"

namespace framelink {

// One descriptor and the name it is stored under.
struct NamedFd {
  std::string name;
  UniqueFd fd;
};

// The state's name in the store; every other name starts with "framelink." too.
inline constexpr const char* kHandOverStateName = "framelink.state";
// The format this daemon writes and the newest it reads.
inline constexpr uint32_t kHandOverFormat = 1;

// What goes to the store: the state first, then the listener and each
// client's descriptors, every one a dup (the caller keeps its own).  An
// error: nothing can be handed over (out of descriptors or memory).
Result<std::vector<NamedFd>> packHandOver(int listen_fd, const std::string& socket_path,
                                          uint64_t next_client_id,
                                          const std::vector<DataAgent::HandedClient>& clients);

// A client as the daemon before this one left it, to adopt (AttachServer::adopt).
struct InheritedClient {
  UniqueFd socket;
  std::shared_ptr<ClientSession> session;
};
struct Inherited {
  UniqueFd listener;  // invalid: none handed over (or for another socket path)
  std::vector<InheritedClient> clients;
  // Why each client that is not taken over was left (they attach again).
  std::vector<std::string> left;
  uint64_t next_client_id = 1;
};
// Unpacks what the store gave back.  Descriptors it does not take are
// closed; a state it cannot read leaves every client (logged by the caller
// from `left`).
Inherited unpackHandOver(std::vector<NamedFd> fds, const std::string& socket_path);

}  // namespace framelink
