// The `tcp` data transport over one connected, handshaken TCP socket (see
// tcp_wire.h for the bytes, tcp_connect.h for how the socket is obtained).
//
// A sender thread writes each queued frame as header + payload with one
// sendmsg() straight from the caller's payload memory; a receiver thread
// recv()s each payload straight into the credited buffer.  No user-space copy
// on either side.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "common/thread_annotations.h"
#include "common/unique_fd.h"
#include "transport/transport.h"
#include "transport/transport_core.h"

namespace framelink::transport::tcp {

struct TcpTransportOptions {
  size_t send_queue_depth = kDefaultSendQueueDepth;
  // Largest frame the receiver reads (and discards) for an unknown credit;
  // a larger announced length is a protocol violation (closes the link), so
  // a broken peer cannot make the receiver read forever.  Frames for a known
  // credit are bounded by that credit's capacity instead.
  uint64_t max_frame_bytes = uint64_t{1} << 30;
};

class TcpTransport final : public Transport {
 public:
  // Takes a connected socket on which the handshake is done (dialData() or
  // a TcpDataListener callback).  `peer_name` is used in log messages.
  static Result<std::unique_ptr<Transport>> create(UniqueFd fd, std::string peer_name,
                                                   TcpTransportOptions options = {});

  ~TcpTransport() override;

  const char* name() const noexcept override { return "tcp"; }
  bool connected() const noexcept override { return core_->connected(); }
  Result<RemoteCredit> exposeCredit(LocalCredit credit) override {
    return core_->exposeCredit(std::move(credit));
  }
  void retractCredit(uint64_t credit_id) override { core_->retractCredit(credit_id); }
  PostResult post(const SendRequest& request) noexcept override { return core_->post(request); }
  PostResult postControl(std::string record) noexcept override {
    return core_->postControl(std::move(record));
  }
  size_t poll(TransportEvent* out, size_t max) noexcept override { return core_->poll(out, max); }
  int eventFd() const noexcept override { return core_->eventFd(); }
  void shutdown() noexcept override;

  TransportCore::Counters counters() const noexcept { return core_->counters(); }

 private:
  TcpTransport(UniqueFd fd, std::string peer_name, TcpTransportOptions options,
               std::unique_ptr<TransportCore> core);
  void senderLoop() noexcept;
  // Writes every byte of iov[0..count) (adjusting it); false after failing the link.
  bool writeAll(iovec* iov, size_t count) noexcept;
  void receiverLoop() noexcept;
  void failLink(int status, const std::string& message) noexcept;
  // 1: all n bytes read; 0: orderly EOF before the first byte; -1: error or
  // EOF in the middle (errno_text_ says which).
  int readFull(void* buf, size_t n) noexcept;
  bool discard(uint64_t n) noexcept;

  // Member order is teardown order in reverse: threads are joined (in
  // shutdown()) before the core and the socket go away.
  UniqueFd fd_;
  const std::string peer_name_;
  const TcpTransportOptions options_;
  std::unique_ptr<TransportCore> core_;
  std::vector<uint8_t> scratch_;  // receiver thread only
  std::string io_error_;          // receiver thread only
  Mutex join_mu_;                 // one shutdown() joins the threads, a concurrent one waits for that
  std::thread sender_ FL_GUARDED_BY(join_mu_);
  std::thread receiver_ FL_GUARDED_BY(join_mu_);
};

}  // namespace framelink::transport::tcp
