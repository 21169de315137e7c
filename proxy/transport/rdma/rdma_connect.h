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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/log_limit.h"
#include "common/result.h"
#include "common/unique_fd.h"
#include "transport/rdma/rdma_device.h"
#include "transport/rdma/rdma_transport.h"
#include "transport/transport.h"

namespace framelink::transport::rdma {

// What a listener counts (pointers into the daemon's metrics; null: not counted).
struct RdmaListenerCounters {
  std::atomic<uint64_t>* timed_out = nullptr;  // accepted requests not ESTABLISHED before their deadline
  std::atomic<uint64_t>* refused = nullptr;    // requests rejected: too many handshakes at once
  std::atomic<uint64_t>* auth_failures =
      nullptr;  // requests for a session not known here, or its token not proven
};

class RdmaListener {
 public:
  using Authorize = std::function<bool(uint64_t session_id)>;
  // The token the dialer of `session_id` must prove (empty: no token).
  using TokenFor = std::function<std::string(uint64_t session_id)>;
  using OnConnected = std::function<void(uint64_t session_id, std::unique_ptr<Transport> transport)>;

  // Handshakes in progress at once, and from one address: requests beyond
  // either are rejected at once (FL_ERR_RESOURCES in the reject data), so
  // that the kernel's backlog never fills with them either.
  static constexpr size_t kMaxPendingHandshakes = 64;
  static constexpr size_t kMaxPendingPerHost = 16;

  // rdma_cm listener on host:port (port 0: ephemeral; host "0.0.0.0" only
  // when the device was chosen by name).  on_connected runs on the
  // listener's thread for each connection whose private data names a session
  // that authorize() accepts; others are rejected with a logged reason.
  //
  // The listener's thread never waits for a peer: a request that checks out
  // is accepted and kept in a table (its id on a channel of its own, watched
  // by the same poll()) until ESTABLISHED, a failure or `handshake_timeout`
  // -- then it is destroyed (which rejects it), counted and logged
  // (rate-limited).  A peer that stalls half-way holds one table slot and
  // delays nobody else.
  static Result<std::unique_ptr<RdmaListener>> listen(
      std::shared_ptr<RdmaDevice> device, const std::string& host, uint16_t port, Authorize authorize,
      OnConnected on_connected, RdmaTransportOptions options = {},
      std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5),
      RdmaListenerCounters counters = {}, TokenFor token_for = {});

  RdmaListener(const RdmaListener&) = delete;
  RdmaListener& operator=(const RdmaListener&) = delete;
  // Stops the thread (no callback runs after it returns) and destroys the
  // listening id; connections half-way through setup are rejected.
  ~RdmaListener();

  uint16_t port() const noexcept { return port_; }

 private:
  struct Pending;
  RdmaListener(std::shared_ptr<RdmaDevice> device, CmId listen_id, UniqueFd wake_fd, uint16_t port,
               Authorize authorize, OnConnected on_connected, RdmaTransportOptions options,
               std::chrono::milliseconds handshake_timeout, RdmaListenerCounters counters,
               TokenFor token_for);
  void loop() noexcept;
  // Drains the listening channel; false when the listener cannot go on.
  bool drainListenChannel(std::vector<Pending>& pending) noexcept;
  void onConnectRequest(rdma_cm_id* id, const std::string& peer, const std::vector<uint8_t>& private_data,
                        std::vector<Pending>& pending) noexcept;
  // The steps of onConnectRequest, in order; a step that refuses the request
  // rejects it (which destroys `id`).  First: the session id, when the
  // connect data (magic, version), the device and the session check out.
  std::optional<uint64_t> checkRequest(rdma_cm_id* id, const std::string& peer,
                                       const std::vector<uint8_t>& private_data) noexcept;
  // False when the table has no room for another handshake (from `host`).
  bool roomFor(rdma_cm_id* id, const std::string& peer, const std::string& host,
               const std::vector<Pending>& pending) noexcept;
  // `id` migrated to a new non-blocking channel of its own; null when that fails.
  rdma_event_channel* ownChannel(rdma_cm_id* id, const std::string& peer) noexcept;
  // rdma_accept on the transport's id; the handshake then waits in `pending`
  // until ESTABLISHED or its deadline (dropped when rdma_accept fails).
  void acceptRequest(std::unique_ptr<RdmaTransport> transport, const std::string& peer,
                     const std::string& host, uint64_t session_id, std::vector<Pending>& pending) noexcept;
  // Reads what arrived on a pending connection's channel; true when it is
  // finished with (handed on or dropped).
  bool advance(Pending& p) noexcept;
  void reject(rdma_cm_id* id, int status, const std::string& peer, const std::string& why,
              LogLimiter& log) noexcept;

  const std::shared_ptr<RdmaDevice> device_;
  CmId listen_id_;
  UniqueFd wake_fd_;  // eventfd: written by the destructor
  const uint16_t port_;
  const Authorize authorize_;
  const OnConnected on_connected_;
  const RdmaTransportOptions options_;
  const std::chrono::milliseconds handshake_timeout_;
  const RdmaListenerCounters counters_;
  const TokenFor token_for_;
  LogLimiter log_refused_, log_busy_, log_failed_;
  std::thread thread_;
};

// Connects to an RdmaListener: rdma_resolve_addr (from the device's bind IP,
// so the connection leaves through that device) / rdma_resolve_route /
// rdma_connect with private data {magic, version, session id, proof of
// `token`}; `timeout` bounds the whole thing.  Errors: FL_ERR_TRANSPORT (unreachable, no
// listener, timed out, wrong device), FL_ERR_AUTH (session refused),
// FL_ERR_PEER_VERSION.
Result<std::unique_ptr<Transport>> dialRdma(std::shared_ptr<RdmaDevice> device, const std::string& host,
                                            uint16_t port, uint64_t session_id,
                                            std::chrono::milliseconds timeout,
                                            RdmaTransportOptions options = {}, int wake_fd = -1,
                                            const std::string& token = {});

}  // namespace framelink::transport::rdma
