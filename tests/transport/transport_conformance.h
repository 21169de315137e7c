// The Transport conformance suite: every test runs against every transport
// (tcp, grpc with the default 4 MiB chunk, grpc with a small chunk so that
// chunk boundaries are exercised by ordinary frame sizes, tcp wrapped in the
// `faulty` decorator with no faults on, and the in-memory loopback link).  Built a second
// time with FL_CONFORMANCE_RDMA for rdma, which needs two RDMA devices (the
// Soft-RoCE lane), so that it never runs where there are none.
//
// Memory follows the daemon's layout for every kind: a receive buffer has
// 256 bytes of slot header room before it, and payloads and receive buffers
// are registered with the pair (rdma needs that; the others ignore it).
//
// The suite is split by concern: frames (test_transport_conformance.cpp),
// refusals and failures (test_transport_conformance_errors.cpp) and control
// records (test_transport_conformance_control.cpp).  A credit retracted in
// the middle of its frame is tested apart, for tcp and grpc only
// (test_transport_retract_mid_frame.cpp): the test has to act between two
// parts of one frame, which takes a raw peer or a small read budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>

#include "transport/transport.h"
#include "transport_test_util.h"

namespace framelink::transport::testing {

#ifdef FL_CONFORMANCE_RDMA
#define FL_TRANSPORTS Rdma
#else
#define FL_TRANSPORTS Tcp, Grpc, GrpcSmallChunk, FaultyTcp, Loopback
#endif

// The receiving side of flow control as the daemon runs it: frame i lands in
// a buffer of its own, exposed under credit i + 1, and credits are granted
// `window` frames ahead of the last frame the receiver is done with.
class CreditWindow {
 public:
  CreditWindow(Transport& receiver, size_t frames, size_t window, std::function<size_t(size_t)> size_of)
      : receiver_(receiver), frames_(frames), window_(window), size_of_(std::move(size_of)) {
    for (size_t i = 0; i < window_; ++i) grant(i);
  }

  // The credit the "control link" told the sender for `frame`, or null while
  // there is none.  That link is this process: a grant is told once the
  // receiver's credits take writes (rdma: the window's bind has executed,
  // which a grant on the link itself would have waited for).
  const RemoteCredit* granted(size_t frame) const {
    if (!receiver_.creditsWritable()) return nullptr;
    auto it = granted_.find(frame + 1);
    return it == granted_.end() ? nullptr : &it->second;
  }
  // The sender used the credit of `frame`.
  void posted(size_t frame) { granted_.erase(frame + 1); }
  // Where `frame` landed.
  const Buffer& landed(size_t frame) const { return buffers_.at(frame + 1); }
  // The receiver is done with `frame`: its buffer goes, the next credit out.
  void release(size_t frame) {
    buffers_.erase(frame + 1);
    grant(frame + window_);
  }

 private:
  void grant(size_t frame) {
    if (frame >= frames_) return;
    auto [it, inserted] = buffers_.emplace(frame + 1, Buffer(size_of_(frame)));
    granted_[frame + 1] = expose(receiver_, it->second.credit(frame + 1));
  }

  Transport& receiver_;
  const size_t frames_;
  const size_t window_;
  std::function<size_t(size_t)> size_of_;
  std::map<uint64_t, Buffer> buffers_;        // credit id (= frame index + 1) -> buffer
  std::map<uint64_t, RemoteCredit> granted_;  // exposed, not yet used by the sender
};

// Where frames go to be discarded: a 1 MiB payload and a credit under an id
// the receiver never exposed, aimed at a buffer it did expose (under id 1),
// so that everything that does arrive is dropped (rdma: lands in that
// buffer through credit 1's memory window and is reported as unknown; a
// retracted credit's window is gone, and a write into it breaks the link).
struct DiscardedCredit {
  static constexpr size_t kSize = 1 << 20;
  Payload payload = pattern(1, kSize);
  Buffer sink{kSize};
  RemoteCredit credit;

  explicit DiscardedCredit(Transport& receiver) : credit(expose(receiver, sink.credit(1))) {
    credit.credit_id = 2;
  }
};

}  // namespace framelink::transport::testing
