#include "link/peer_grpc_options.h"

#include "config/config.h"
#include "transport/grpc/grpc_limits.h"

namespace framelink {

::grpc::ChannelArguments peerChannelArguments(const Config& config) {
  ::grpc::ChannelArguments args = transport::channelArguments(config.grpc_chunk_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(config.reconnect_min_ms));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(config.reconnect_max_ms));
  // One channel per dial attempt: never share a subchannel with an earlier one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (config.tlsEnabled() && !config.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(config.tls_server_name);
  }
  return args;
}

std::shared_ptr<::grpc::ServerCredentials> peerServerCredentials(const Config& config) {
  if (!config.tlsEnabled()) return ::grpc::InsecureServerCredentials();
  ::grpc::SslServerCredentialsOptions options(config.tls_client_auth
                                                  ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                                  : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  options.pem_root_certs = config.tls_ca_pem;
  options.pem_key_cert_pairs.push_back({config.tls_key_pem, config.tls_cert_pem});
  return ::grpc::SslServerCredentials(options);
}

std::shared_ptr<::grpc::ChannelCredentials> peerChannelCredentials(const Config& config) {
  if (!config.tlsEnabled()) return ::grpc::InsecureChannelCredentials();
  ::grpc::SslCredentialsOptions options;
  options.pem_root_certs = config.tls_ca_pem;  // empty: the system's CA store
  options.pem_private_key = config.tls_key_pem;
  options.pem_cert_chain = config.tls_cert_pem;
  return ::grpc::SslCredentials(options);
}

void configurePeerServer(::grpc::ServerBuilder& builder, const Config& config) {
  transport::configureServerBuilder(builder, config.grpc_chunk_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // What a stranger's connection may hold: one that does not finish its
  // (TLS and HTTP/2) handshake within the dialer's connect timeout is closed
  // (the default was two minutes), one without calls after a minute, and
  // a peer needs two concurrent calls (Session, Data) per connection.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(config.connect_timeout_ms));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 60000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 8);
}

}  // namespace framelink
