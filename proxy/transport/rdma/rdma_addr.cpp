#include "transport/rdma/rdma_addr.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace framelink::transport::rdma {

Result<sockaddr_storage> parseIp(const std::string& ip, uint16_t port) {
  sockaddr_storage ss{};
  std::string host = ip;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&ss);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    return ss;
  }
  ss = {};
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
  if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    return ss;
  }
  return makeError(FL_EINVAL, "'" + ip + "' is not a numeric IPv4 or IPv6 address");
}

bool isAnyAddress(const std::string& ip) {
  auto a = parseIp(ip, 0);
  if (!a) return false;
  if (a->ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&a.value())->sin_addr.s_addr == htonl(INADDR_ANY);
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a.value());
  return IN6_IS_ADDR_UNSPECIFIED(&v6->sin6_addr);
}

}  // namespace framelink::transport::rdma
