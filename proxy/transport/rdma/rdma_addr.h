// IP address parsing shared by device selection and the rdma_cm code.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>

#include "common/result.h"

namespace framelink::transport::rdma {

// A numeric IPv4 or IPv6 address with `port` (host order).  No name lookup:
// the rdma configuration names addresses, and a resolver stall would block
// link setup.
Result<sockaddr_storage> parseIp(const std::string& ip, uint16_t port);
bool isAnyAddress(const std::string& ip);

}  // namespace framelink::transport::rdma
