// Peer links: the gRPC `Link` service this daemon offers (Session control
// streams and the `grpc` data transport), the `tcp` data listener, and one
// dialer per configured peer that keeps a session up with backoff.
//
// A session: the dialer opens Session with the token in the call metadata and
// sends Hello (version, id, transports in preference order, token, a random
// session id); the listener checks the token and version, picks the first of
// the dialer's transports it also allows, answers HelloAck, and both sides
// open the data channel (an rdma_cm connection to the listener's rdma port, a
// tcp connection to its data port, or a gRPC Data call) under that session
// id.  When the dialer's first choice was not taken, the HelloAck and the
// link's stats say why; a dialer whose rdma connection failed offers the
// next transport, and a link that fell back from rdma is ended every
// rdma_retry_ms to try rdma again (nothing is lost: the data agent replays).  Then the data agent gets the
// link (CmdLinkUp); when the Session call ends, for any reason, it gets CmdLinkDown.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"
#include "config.h"

namespace framelink {

class DataAgent;
class Metrics;
namespace transport::rdma {
class RdmaDevice;
}

// What this daemon has for the `rdma` transport: its device (null when it
// has none) and, then, why not.
struct RdmaSupport {
  std::shared_ptr<transport::rdma::RdmaDevice> device;
  std::string unavailable;
};

inline constexpr uint32_t kProtocolVersion = 1;

class PeerLinks {
 public:
  static Result<std::unique_ptr<PeerLinks>> start(const Config& config, DataAgent& agent, Metrics& metrics,
                                                  uint64_t instance, RdmaSupport rdma = {});
  virtual ~PeerLinks() = default;

  virtual uint16_t grpcPort() const noexcept = 0;
  virtual uint16_t dataPort() const noexcept = 0;
  virtual uint16_t rdmaPort() const noexcept = 0;  // 0: no rdma listener
  // Stops dialers, ends every session, shuts the gRPC server down.
  virtual void stop() = 0;
};

}  // namespace framelink
