// The transports a framelinkd registers (tcp, grpc, rdma, loopback): each is
// one entry of the transport registry (transport_registry.h), with its
// listener, its dialer and its rules, and nothing of it lives in peer_links.cpp.
#pragma once

#include <memory>
#include <string>

#include "link/transport_registry.h"

namespace framelink {

namespace transport::rdma {
class RdmaDevice;
}

// What this daemon has for the `rdma` transport: its device (null when it
// has none) and, then, why not.
struct RdmaSupport {
  std::shared_ptr<transport::rdma::RdmaDevice> device;
  std::string unavailable;
};

// Every transport, in the order of kTransportNames (transport_names.h).
std::vector<std::unique_ptr<TransportEntry>> daemonTransportEntries(RdmaSupport rdma);
TransportRegistry makeDaemonTransports(RdmaSupport rdma);

}  // namespace framelink
