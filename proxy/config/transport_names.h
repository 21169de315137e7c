// The names of the data transports framelinkd registers, in the order its
// configuration errors list them.  Kept apart from the registry itself
// (transport_registry.h, peer_transports.cpp) so that the configuration can
// be validated without linking the transports; peer_transports.cpp fails to
// compile when its table and this list differ.
#pragma once

#include <array>
#include <string_view>

namespace framelink {

inline constexpr std::array<std::string_view, 4> kTransportNames{"tcp", "grpc", "rdma", "loopback"};

}  // namespace framelink
