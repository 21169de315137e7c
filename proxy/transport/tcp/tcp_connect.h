// Establishing `tcp` data connections: the dialer side (dialData) and the
// listener side (TcpDataListener).  Both do the handshake of tcp_wire.h and
// hand over a socket ready for TcpTransport::create().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <vector>

#include "common/log_limit.h"
#include "common/result.h"
#include "common/unique_fd.h"

namespace framelink::transport::tcp {

// SO_SNDBUF / SO_RCVBUF for data sockets.  0 leaves the kernel's
// autotuning alone (net.ipv4.tcp_rmem / tcp_wmem).  Measured on loopback with
// 256 KiB and 4 MiB frames: a fixed 4 MiB was no faster than autotuning
// (0.6-1.8 GB/s either way, within noise), and setting SO_RCVBUF switches
// receive autotuning off and is clamped to net.core.rmem_max, which caps the
// window on long fat links where autotuning would grow it further.
inline constexpr int kDefaultSocketBufferBytes = 0;

struct TcpSocketOptions {
  int buffer_bytes = kDefaultSocketBufferBytes;  // 0: kernel autotuning
};

// Connects to a peer's data listener, sends the handshake for `session_id`
// and waits for the reply; `timeout` bounds the whole thing.  Errors:
// A readable `wake_fd` (the daemon stopping) ends the dial at once with
// FL_ERR_TRANSPORT.
// FL_ERR_TRANSPORT (cannot connect / timed out), FL_ERR_AUTH (token
// rejected), FL_ERR_PEER_VERSION, FL_ERR_PROTOCOL.
Result<UniqueFd> dialData(const std::string& host, uint16_t port, uint64_t session_id,
                          const std::string& token, std::chrono::milliseconds timeout,
                          TcpSocketOptions options = {}, int wake_fd = -1);

// Splits "host:port", "[v6]:port" or ":port" (any address).
Result<std::pair<std::string, uint16_t>> parseHostPort(const std::string& host_port);

// What a listener counts (pointers into the daemon's metrics; null: not counted).
struct TcpListenerCounters {
  std::atomic<uint64_t>* timed_out = nullptr;      // handshakes that did not finish before their deadline
  std::atomic<uint64_t>* refused = nullptr;        // connections closed at once: too many from one address
  std::atomic<uint64_t>* auth_failures = nullptr;  // handshakes with a wrong token
};

class TcpDataListener {
 public:
  // Called on the listener's thread for every connection whose handshake
  // checked out.  The callee owns the socket; it should hand it on quickly
  // (the daemon checks that session_id belongs to a live Session and builds
  // a TcpTransport).
  using OnConnection = std::function<void(uint64_t session_id, UniqueFd fd)>;

  // The token the dialer of `session_id` must prove in its handshake.
  using TokenFor = std::function<std::string(uint64_t session_id)>;

  // Handshakes in progress at once (further connections wait in the
  // backlog), and from one address (further ones are closed at once).
  static constexpr size_t kMaxPendingHandshakes = 64;
  static constexpr size_t kMaxPendingPerHost = 16;

  // Binds `host_port` ("0.0.0.0:0" for any address, ephemeral port) and
  // starts the listener thread.  Handshakes run side by side on it, each
  // without blocking: one that does not arrive within `handshake_timeout`,
  // or has a bad magic, version or token, gets a status reply (where it
  // makes sense), is closed and logged (rate-limited) -- a peer that stalls
  // half-way holds one slot of kMaxPendingHandshakes until its deadline and
  // delays nobody else.
  static Result<std::unique_ptr<TcpDataListener>> listen(
      const std::string& host_port, TokenFor token_for, OnConnection on_connection,
      std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5), TcpSocketOptions options = {},
      TcpListenerCounters counters = {});
  // One token for every session.
  static Result<std::unique_ptr<TcpDataListener>> listen(
      const std::string& host_port, std::string token, OnConnection on_connection,
      std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5), TcpSocketOptions options = {},
      TcpListenerCounters counters = {});

  TcpDataListener(const TcpDataListener&) = delete;
  TcpDataListener& operator=(const TcpDataListener&) = delete;
  ~TcpDataListener();

  uint16_t port() const noexcept { return port_; }
  // Stops accepting and joins the accept thread (no callback runs after it
  // returns).  Connections already handed over are not affected.
  void stop() noexcept;

 private:
  struct Pending;
  TcpDataListener(UniqueFd listen_fd, UniqueFd wake_fd, uint16_t port, TokenFor token_for, OnConnection cb,
                  std::chrono::milliseconds handshake_timeout, TcpListenerCounters counters);
  void acceptLoop() noexcept;
  // Accepts what the backlog holds, up to the handshake limit; false when
  // out of descriptors (the caller pauses accepting).
  bool acceptSome(std::vector<Pending>& pending) noexcept;
  // Reads what arrived; true when the connection is finished with (handed on or dropped).
  bool advance(Pending& p) noexcept;
  void finish(Pending& p) noexcept;

  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: written by stop()
  const uint16_t port_;
  const TokenFor token_for_;
  const OnConnection on_connection_;
  const std::chrono::milliseconds handshake_timeout_;
  const TcpListenerCounters counters_;
  LogLimiter log_drop_, log_accept_;
  std::thread thread_;
};

}  // namespace framelink::transport::tcp
