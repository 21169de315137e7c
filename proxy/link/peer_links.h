// Peer links: the gRPC `Link` service this daemon offers (Session control
// streams, and the Data call of the `grpc` transport), the listeners of the
// configured transports, and one dialer per configured peer that keeps a
// session up with backoff.
//
// A session: the dialer opens Session with the token it shares with that peer
// in the call metadata and sends Hello (version, id, transports in preference
// order, token, a random session id); the listener checks the version and that
// the token (and, where required, the certificate) proves the id the Hello
// claims (peer_identity.h), admits the link (PeerInstances: links per id
// bounded, and an id only the shared token proves kept by the instance linked
// from it), picks the first of the dialer's transports it also allows and can
// run with that peer,
// answers HelloAck, and both sides open the data channel under that session
// id with the chosen transport's registry entry (transport_registry.h,
// peer_transports.cpp).  When the dialer's first choice was not taken, the
// HelloAck and the link's stats say why.  A transport with a fallback
// interval (rdma: rdma_retry_ms) whose dial failed is not offered for that
// long, and a link that fell back from it is ended after it (a deadline on
// the dial, no thread) so that the next dial offers it first again; nothing
// is lost, the data agent replays.  Then the data agent gets the link
// (CmdLinkUp); when the Session call ends, for any reason, it gets
// CmdLinkDown.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.h"
#include "config/config.h"
#include "config/config_reload.h"
#include "link/peer_describe.h"
#include "link/peer_transports.h"
#include "link/protocol_versions.h"

namespace framelink {

class DataAgent;
class Metrics;

class PeerLinks {
 public:
  static Result<std::unique_ptr<PeerLinks>> start(const Config& config, DataAgent& agent, Metrics& metrics,
                                                  uint64_t instance, RdmaSupport rdma = {});
  // With other transports than the daemon's (tests).
  static Result<std::unique_ptr<PeerLinks>> start(const Config& config, DataAgent& agent, Metrics& metrics,
                                                  uint64_t instance, TransportRegistry transports);
  virtual ~PeerLinks() = default;

  virtual uint16_t grpcPort() const noexcept = 0;
  // The port the listener of `transport` took (0: none, or no such transport).
  virtual uint16_t listenPort(std::string_view transport) const noexcept = 0;
  // Stops dialers, ends every session, shuts the gRPC server down.
  virtual void stop() = 0;
  // A reload: the peers, their addresses, tokens and certificate names, and
  // link.token of `next` apply from now (its other settings must be the
  // running ones).  A peer removed or moved stops being dialed and its dialed
  // links end (a moved one is dialed at its new address); a removed peer with
  // a token of its own has the links it dialed ended too, and that token is
  // refused from then on.  Every other link runs on; new sessions use the
  // new tokens.
  virtual void reconfigure(std::shared_ptr<const Config> next) = 0;
  // Where the word of a daemon that asked this one what it is goes (its id
  // proven, its streams not yet checked; peer_describe.h): a gRPC thread
  // calls `heard`, which must not block.
  using Heard = std::function<void(const Described& asker)>;
  virtual void onDescribed(Heard heard) = 0;
};

}  // namespace framelink
