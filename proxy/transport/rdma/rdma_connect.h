// Establishing `rdma` data connections with rdma_cm: the dialer side
// (dialRdma) and the listener side (RdmaListener).  The connect request's
// private data names the session (RdmaConnectData); the listener asks the
// daemon whether it knows that session before accepting, and a refusal is
// an rdma_cm reject whose private data says why (RdmaRejectData).
//
// Each connection gets its own rdma_cm event channel (the listener migrates
// accepted ids to one), which its RdmaTransport then watches for
// DISCONNECTED from poll(): no thread per connection.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/result.h"
#include "common/unique_fd.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/transport.h"

namespace framelink::transport::rdma {

class RdmaListener {
 public:
  using Authorize = std::function<bool(uint64_t session_id)>;
  using OnConnected = std::function<void(uint64_t session_id, std::unique_ptr<Transport> transport)>;

  // rdma_cm listener on host:port (port 0: ephemeral; host "0.0.0.0" only
  // when the device was chosen by name).  on_connected runs on the
  // listener's thread for each connection whose private data names a session
  // that authorize() accepts; others are rejected with a logged reason.
  // Connections that do not reach ESTABLISHED within handshake_timeout are
  // dropped.
  static Result<std::unique_ptr<RdmaListener>> listen(
      std::shared_ptr<RdmaDevice> device, const std::string& host, uint16_t port, Authorize authorize,
      OnConnected on_connected, RdmaTransportOptions options = {},
      std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5));

  RdmaListener(const RdmaListener&) = delete;
  RdmaListener& operator=(const RdmaListener&) = delete;
  // Stops the thread (no callback runs after it returns) and destroys the
  // listening id; a connection half-way through setup is rejected.
  ~RdmaListener();

  uint16_t port() const noexcept { return port_; }

 private:
  RdmaListener(std::shared_ptr<RdmaDevice> device, CmId listen_id, UniqueFd wake_fd, uint16_t port,
               Authorize authorize, OnConnected on_connected, RdmaTransportOptions options,
               std::chrono::milliseconds handshake_timeout);
  void loop() noexcept;
  void onConnectRequest(rdma_cm_id* id, const std::string& peer, const void* private_data,
                        uint8_t private_data_len) noexcept;
  void reject(rdma_cm_id* id, int status, const std::string& peer, const std::string& why) noexcept;

  const std::shared_ptr<RdmaDevice> device_;
  CmId listen_id_;
  UniqueFd wake_fd_;  // eventfd: written by the destructor
  const uint16_t port_;
  const Authorize authorize_;
  const OnConnected on_connected_;
  const RdmaTransportOptions options_;
  const std::chrono::milliseconds handshake_timeout_;
  std::thread thread_;
};

// Connects to an RdmaListener: rdma_resolve_addr (from the device's bind IP,
// so the connection leaves through that device) / rdma_resolve_route /
// rdma_connect with private data {magic, version, session id}; `timeout`
// bounds the whole thing.  Errors: FL_ERR_TRANSPORT (unreachable, no
// listener, timed out, wrong device), FL_ERR_AUTH (session refused),
// FL_ERR_PEER_VERSION.
Result<std::unique_ptr<Transport>> dialRdma(std::shared_ptr<RdmaDevice> device, const std::string& host,
                                            uint16_t port, uint64_t session_id,
                                            std::chrono::milliseconds timeout,
                                            RdmaTransportOptions options = {}, int wake_fd = -1);

}  // namespace framelink::transport::rdma
