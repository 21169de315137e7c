// Two connected transports of one kind over loopback, for the conformance
// suite (and for anything else that needs a live pair: benchmarks, the
// faulty decorator's tests).  `a` is the dialing side, `b` the listening
// side.  Port 0 everywhere, so pairs can be made in parallel.
//
// rdma needs two RDMA devices whose IPs are in FRAMELINK_RDMA_A_IP and
// FRAMELINK_RDMA_B_IP (the Soft-RoCE lane's `--pair` guest: rxe_a 10.77.1.1
// and rxe_b 10.77.1.2); `a` dials from A to B's IP.  Its payloads and
// receive buffers must be registered memory: registerMemory() does that on
// both devices (a no-op for the other kinds).
#pragma once

#include <chrono>
#include <cstddef>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/result.h"
#include "transport/grpc/grpc_transport.h"
#include "transport/transport.h"

namespace framelink::transport::testing {

enum class TransportKind { kTcp, kGrpc, kRdma, kLoopback };

struct TransportPairOptions {
  size_t grpc_chunk_bytes = 0;  // 0: the grpc transport's default
  // Bytes one poll() of a tcp transport reads at most (0: the default).  A
  // small budget lets a test act between two parts of one frame.
  size_t tcp_read_budget_bytes = 0;
  std::string token = "conformance-token";
  // Both grpc transports are told their peer reads batches, as a daemon
  // tells them when both Hellos said frame_batches: small frames queued
  // together share a message.
  bool grpc_frame_batches = true;
};

class TransportPair {
 public:
  static Result<std::unique_ptr<TransportPair>> make(TransportKind kind,
                                                     const TransportPairOptions& options = {});

  virtual ~TransportPair() = default;  // shuts both transports down and stops listeners/servers

  // Registers [addr, addr + length) for sending from (receive = false) or
  // for peers to write into (receive = true) on every device of the pair;
  // the registration lasts as long as the returned handle.  Null handle and
  // ok for transports without registered memory.
  virtual Result<std::shared_ptr<void>> registerMemory(void* addr, size_t length, bool receive) {
    (void)addr, (void)length, (void)receive;
    return std::shared_ptr<void>();
  }
  // The key `sender` (a or b) sends [addr, addr + length) under
  // (SendRequest::local_key): rdma's lkey of the registration made by
  // registerMemory on the sender's device; none for the other kinds.
  virtual std::optional<uint32_t> localKey(const Transport& sender, const void* addr, size_t length) const {
    (void)sender, (void)addr, (void)length;
    return std::nullopt;
  }

  // What a test let go of while a transport may still read it: a payload
  // whose post got no SendComplete yet (a test that waits only for the
  // arrival).  Declared before a and b, so freed after both are shut down.
  std::shared_ptr<std::vector<std::shared_ptr<void>>> kept_until_shutdown =
      std::make_shared<std::vector<std::shared_ptr<void>>>();

  std::shared_ptr<Transport> a;  // dialer
  std::shared_ptr<Transport> b;  // listener
};

// An in-process gRPC server implementing only Link.Data the way the daemon
// does: its calls on one completion queue and one thread, each call checked
// (the token metadata, the session id) and its transport handed over.
class GrpcTestServer {
 public:
  static constexpr uint64_t kSessionId = 0x5e55'1011'0000'0001ull;

  // `first_message_timeout`: how long a call may take to name its session.
  static Result<std::unique_ptr<GrpcTestServer>> start(
      const std::string& token, size_t chunk_bytes,
      std::chrono::milliseconds first_message_timeout = std::chrono::seconds(10));
  // Shutdown with a 2 s grace period, then every Data call still running
  // (the dialers' too) ends before the queue does.
  ~GrpcTestServer();

  int port() const noexcept { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // The transport of the first Data call that passed the checks.
  std::future<std::shared_ptr<GrpcTransport>>& adopted() noexcept;
  // Where a dialer's call runs: the server's queue, as in the daemon.
  GrpcCallQueue queue() const noexcept;
  // Threads whose name starts with "fl-test-cq": the queue's one.
  static constexpr const char* kQueueThreadName = "fl-test-cq";

 private:
  GrpcTestServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

const char* kindName(TransportKind kind) noexcept;

}  // namespace framelink::transport::testing
