// The [[peer]] tables of the file and the --peer / --route flags: which peers
// this daemon dials, which streams go to each, and how each proves its id
// when it dials in (a token of its own, its certificate's name).
#pragma once

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "common/result.h"
#include "config/config.h"

namespace framelink::config {

// Reads the [[peer]] array `node` of the config file `file` into config.peers;
// token files are read relative to the file's directory.
Status readPeers(const toml::node& node, const std::string& file, Config& config);

// --peer NAME=HOST:PORT adds a peer, or gives the file's peer of that name
// this address; --route STREAM=PEER[,PEER...] adds STREAM to each named
// peer's streams (a stream on several peers goes to each of them).
Status applyPeerFlags(const std::vector<std::string>& peer_flags, const std::vector<std::string>& route_flags,
                      Config& config);

// What spans several peers, or a peer and other settings, once the file and
// the flags are merged: each name once, each stream routed to at most
// kMaxRoutesPerStream peers, and
// certificate names only where mutual TLS makes a dialer show a certificate.
Status checkPeers(const Config& config);

// [discovery]: etcd endpoints of the form http://HOST:PORT, a prefix that
// starts with '/'.
Status checkDiscovery(const Config& config);

}  // namespace framelink::config
