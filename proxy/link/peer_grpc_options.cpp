#include "link/peer_grpc_options.h"

#include <unistd.h>

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <map>
#include <mutex>
#include <string>

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

namespace {

// The TLS files, watched: gRPC's provider reads them now and again every
// kTlsFilesRefreshSeconds, and each handshake from then on uses what it read
// last -- a peer's certificate appended to tls_ca_file, a host certificate
// renewed in place -- while the connections up run on.  One provider per set
// of files, shared by the listener and every dial (each holds a thread).
std::shared_ptr<::grpc::experimental::FileWatcherCertificateProvider> watchedTlsFiles(const Config& config) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<::grpc::experimental::FileWatcherCertificateProvider>>
      providers;
  // A tls_ca_file missing at start gives no roots -- no peer is trusted --
  // and is not read again (gRPC would log its absence every refresh): main.cpp
  // says to create it and restart.  One that holds no certificate yet is read.
  const std::string roots = ::access(config.tls_ca_file.c_str(), F_OK) == 0 ? config.tls_ca_file : "";
  const std::string key = config.tls_key_file + '\n' + config.tls_cert_file + '\n' + roots;
  const std::lock_guard<std::mutex> lock(mu);
  auto& provider = providers[key];
  if (!provider) {
    provider = std::make_shared<::grpc::experimental::FileWatcherCertificateProvider>(
        config.tls_key_file, config.tls_cert_file, roots, kTlsFilesRefreshSeconds);
  }
  return provider;
}

}  // namespace

std::shared_ptr<::grpc::ServerCredentials> peerServerCredentials(const Config& config) {
  if (!config.tlsEnabled()) return ::grpc::InsecureServerCredentials();
  ::grpc::experimental::TlsServerCredentialsOptions options(watchedTlsFiles(config));
  options.watch_identity_key_cert_pairs();
  if (config.tls_client_auth) {
    // parseConfig refuses tls_client_auth without tls_ca_file.
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return ::grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<::grpc::ChannelCredentials> peerChannelCredentials(const Config& config) {
  if (!config.tlsEnabled()) return ::grpc::InsecureChannelCredentials();
  ::grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(watchedTlsFiles(config));
  options.watch_identity_key_cert_pairs();
  if (!config.tls_ca_file.empty()) options.watch_root_certs();  // else the system's CA store
  options.set_verify_server_certs(true);
  // The peer's certificate must name the host dialed (or tls_server_name).
  options.set_certificate_verifier(std::make_shared<::grpc::experimental::HostNameCertificateVerifier>());
  return ::grpc::experimental::TlsCredentials(options);
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
  // The threads that wait for the synchronous calls (Describe; Session and
  // Data are on the session queue) looked up every 10 s by default, to
  // retire the second one; an idle daemon then woke for nothing.  Shutdown
  // wakes them all the same.
  builder.SetSyncServerOption(::grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 3600 * 1000);
}

}  // namespace framelink
