// The transport registry: every data transport a peer link can run is one
// entry -- its name, whether this daemon can run it now (and why not), how it
// accepts data channels (listen) and how it opens one (dial).  peer_links.cpp
// runs the Hello/HelloAck handshake and walks this table; it names no
// transport itself.
//
// A session: the dialer offers its configured transports that it can run
// (offer(), in its preference order); the listener takes the first offered
// one it allows and can run with that peer (choose()), announces its
// listeners in the HelloAck, and waits for the data channel; the dialer opens
// it with the chosen entry's dial().
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "framelink/v1/link.pb.h"
#include "transport/transport.h"

namespace framelink {

namespace transport {
class DataCalls;
}  // namespace transport

struct Config;
class Metrics;

// How a transport's listener reaches the Session waiting for its data channel.
struct AcceptHooks {
  // Whether a Session waits for a data channel of this transport under `session_id`.
  std::function<bool(uint64_t session_id)> expected;
  // The data channel for `session_id` is up: the waiting Session takes it
  // (refused and logged when none waits).
  std::function<void(uint64_t session_id, std::shared_ptr<transport::Transport> t)> accepted;
  // The token the dialer of `session_id` proves on its data channel: the one
  // its Session proved its id with (link.token for a session nobody waits for).
  std::function<std::string(uint64_t session_id)> token;
};

struct ListenContext {
  const Config& config;
  Metrics& metrics;
  uint64_t instance = 0;  // this daemon's
  AcceptHooks hooks;
};

// What the dialer knows when it opens the data channel the listener chose.
struct DialContext {
  const Config& config;
  const std::string& peer;  // its configured name, for messages
  const std::string& host;  // the address the Session went to
  const v1::HelloAck& ack;  // the listener's answer: its ports and instance
  uint64_t session_id = 0;
  std::shared_ptr<::grpc::Channel> channel;  // the Session's channel
  int stop_fd = -1;                          // readable once the daemon stops: a dial in progress gives up
  std::string token;                         // what this daemon presents to the peer (Config::peerToken)
  // Where a call the data channel makes completes (the session queue), and
  // the calls the daemon ends before that queue shuts down.
  ::grpc::CompletionQueue* call_queue = nullptr;
  transport::DataCalls* data_calls = nullptr;
};

// One registered transport.  Called from the peer-link threads (dialers and
// gRPC handlers) at once: an entry guards whatever it changes after listen().
class TransportEntry {
 public:
  virtual ~TransportEntry() = default;

  virtual std::string_view name() const noexcept = 0;
  // Whether this daemon can run it now with the daemon whose instance is
  // `peer_instance` (0: not known yet, the dialer before the HelloAck); if
  // not, `*why` (when not null) says why, for the link's reason.
  virtual bool usable(uint64_t peer_instance, std::string* why) const = 0;
  // Starts accepting data channels; called once, when the transport is
  // configured.  An error stops the daemon; a transport that is configured
  // but cannot run here (rdma without a device) returns success and says
  // why in usable().
  virtual Status listen(const ListenContext& ctx) = 0;
  // Stops accepting: no hook runs after it returns.
  virtual void stop() noexcept {}
  // The port its listener took (0: none).
  virtual uint16_t port() const noexcept { return 0; }
  // What a Hello / HelloAck says of its listener (`chosen`: this transport
  // was taken for the session).
  virtual void announce(v1::Hello& hello) const { (void)hello; }
  virtual void announce(v1::HelloAck& ack, bool chosen) const { (void)ack, (void)chosen; }
  // Whether the listener behind `ack` could take it: a link on a later
  // transport moves back to this one only then.
  virtual bool peerListens(const v1::HelloAck& ack) const { return (void)ack, true; }

  // Opens the data channel to the listener that chose this transport.
  virtual Result<std::shared_ptr<transport::Transport>> dial(const DialContext& ctx) = 0;
  // How long the listener waits for the data channel after its HelloAck.
  virtual std::chrono::milliseconds handshakeTimeout(const Config& config) const;
  // Above zero: after its dial failed, a dialer offers the next transports
  // for this long before this one again (when something else can run), and
  // a link on a later transport is ended after it so that the next dial
  // offers this one first again.  Zero: a failure only ends the dial.
  virtual std::chrono::milliseconds fallbackFor(const Config& config) const {
    return (void)config, std::chrono::milliseconds(0);
  }

  // The Link service's Data call carries this transport's channels (grpc):
  // a call whose token checked out is admitted here by the session its first
  // message names (OK, or the status that ends it), and once admitted its
  // transport is handed over.  On the session queue's thread: neither blocks.
  virtual bool servesDataCalls() const noexcept { return false; }
  virtual ::grpc::Status admitDataCall(::grpc::ServerContext& ctx, uint64_t session_id);
  virtual void dataCallAccepted(uint64_t session_id, std::shared_ptr<transport::Transport> t);
};

class TransportRegistry {
 public:
  explicit TransportRegistry(std::vector<std::unique_ptr<TransportEntry>> entries);

  TransportEntry* find(std::string_view name) const noexcept;
  std::vector<std::string> names() const;
  const std::vector<std::unique_ptr<TransportEntry>>& entries() const noexcept { return entries_; }

  // The entries `configured` names, in that order.  An unknown name, or one
  // listed twice, is refused with a message naming the registered ones.
  Result<std::vector<TransportEntry*>> select(const std::vector<std::string>& configured) const;

  // The listener's pick: the first of `offered` that `allowed` lists and
  // that is usable with the peer; `reason` says why each one before it was
  // not taken ("not tcp: ...; not grpc: ...").  `self_id` names this daemon
  // in those reasons.
  struct Choice {
    TransportEntry* transport = nullptr;
    std::string reason;
  };
  Choice choose(const std::vector<std::string>& offered, const std::vector<std::string>& allowed,
                const std::string& self_id, uint64_t peer_instance) const;

  // The dialer's offer: `configured` in its order, without those it cannot
  // run and those `held_back` names a reason for (a recent failure) while
  // another configured one can run.  `reason` says what was left out and why.
  struct Offer {
    std::vector<TransportEntry*> transports;
    std::string reason;
  };
  using HeldBack = std::function<std::string(const TransportEntry& t)>;
  static Offer offer(const std::vector<TransportEntry*>& configured, const HeldBack& held_back);

 private:
  std::vector<std::unique_ptr<TransportEntry>> entries_;
};

// "a,b,c"; "(none)" for an empty list.
std::string joinedNames(const std::vector<std::string>& names);

}  // namespace framelink
