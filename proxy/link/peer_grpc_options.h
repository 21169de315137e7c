// How the peer-link gRPC server and channels are set up from the
// configuration: keepalive, reconnect backoff, message limits, TLS.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

namespace framelink {

struct Config;

::grpc::ChannelArguments peerChannelArguments(const Config& config);
std::shared_ptr<::grpc::ChannelCredentials> peerChannelCredentials(const Config& config);
std::shared_ptr<::grpc::ServerCredentials> peerServerCredentials(const Config& config);
// Limits and keepalive rules for the server's connections.
void configurePeerServer(::grpc::ServerBuilder& builder, const Config& config);

}  // namespace framelink
