// DNS SRV lookups ([discovery] dns_srv): the daemons of a fleet as the records
// of one name, _framelink._tcp.DOMAIN -- a Kubernetes headless service's, or
// any DNS server's (dnsmasq --srv-host, BIND, Consul's DNS interface).  Each
// record gives a host and the port of its gRPC listener; the host's address
// comes from the answer's additional records, else from a query of its own.
// Through the system's resolver (resolv.conf), or one server named in the
// configuration (dns_server); libresolv, no DNS code of our own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace framelink {

struct SrvTarget {
  std::string host;  // the record's target, without the final dot
  uint16_t port = 0;
  std::string address;  // IP:PORT ([IPv6]:PORT) to dial; HOST:PORT when the host has no address record
  bool operator==(const SrvTarget&) const = default;
};

// The records of `name` in the order of their priority, then weight (the
// heavier first), then host; none when the name has none (NXDOMAIN or no
// SRV record: a fleet of no daemon yet).  An error when no server answered.
// `server`: IP or IP:PORT (port 53 by default) of the server to ask; empty: resolv.conf's.
Result<std::vector<SrvTarget>> resolveSrv(const std::string& name, const std::string& server);

}  // namespace framelink
