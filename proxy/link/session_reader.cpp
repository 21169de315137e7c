#include "link/session_reader.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <time.h>

#include "agent/data_agent.h"
#include "agent/session_writer.h"
#include "config/config.h"
#include "framelink/v1/link.grpc.pb.h"
#include "transport/faulty/faulty_transport.h"

namespace framelink {

namespace {

// The link's data transport, wrapped in the faulty decorator when the
// configuration asks for injected faults ([link] fault_inject, tests only).
std::shared_ptr<transport::Transport> withInjectedFaults(const Config& config, const LinkSessionInfo& info,
                                                         std::shared_ptr<transport::Transport> t) {
  if (config.fault_inject.empty()) return t;
  const uint64_t link_id = info.link_id;
  // Validated at start-up (parseConfig).
  auto spec = transport::parseFaultSpec(config.fault_inject);
  auto faulty = transport::FaultyTransport::wrap(t, spec.value(), link_id);
  if (faulty) {
    spdlog::warn("link {} to peer {}: injecting faults ({})", link_id, info.identity.peer_name,
                 transport::describe(spec.value()));
    return std::move(faulty).value();
  }
  spdlog::error("link {} to peer {}: cannot inject faults: {}", link_id, info.identity.peer_name,
                faulty.error().message);
  return t;
}

}  // namespace

SessionInbox::SessionInbox(DataAgent& agent, const Config& config, const LinkSessionInfo& info,
                           std::shared_ptr<transport::Transport> t, std::shared_ptr<SessionWriter> writer,
                           std::shared_ptr<CancelGuard> guard)
    : agent_(agent),
      link_id_(info.link_id),
      writer_(std::move(writer)),
      guard_(std::move(guard)),
      backlog_(std::make_shared<SessionBacklog>()),
      news_(std::make_shared<KeepaliveNews>()) {
  CmdLinkUp up;
  up.link_id = link_id_;
  up.identity = info.identity;
  up.transport = withInjectedFaults(config, info, std::move(t));
  up.session = PeerSession{writer_, [guard = guard_] { guard->fire(); }};
  agent_.post(std::move(up));
}

bool SessionInbox::take(std::shared_ptr<v1::PeerMessage>& msg) {
  writer_->heard();
  if (msg->has_keepalive()) {
    // The round trip, for framelink links: each side sends its keepalive
    // time back once (echo_ns), and measures when its own comes back.
    // Older daemons ignore the field; their links show no RTT.
    const auto& keepalive = msg->keepalive();
    if (keepalive.echo_ns() != 0) {
      timespec ts{};
      ::clock_gettime(CLOCK_REALTIME, &ts);
      const uint64_t now = uint64_t(ts.tv_sec) * 1'000'000'000ULL + uint64_t(ts.tv_nsec);
      if (now > keepalive.echo_ns() && news_->rtt(now - keepalive.echo_ns())) {
        agent_.post(CmdLinkKeepalive{link_id_, news_});
      }
    } else if (keepalive.timestamp_ns() != 0) {
      // One echo waits at most (SessionWriter::send): a peer that floods
      // keepalives and reads nothing does not grow the queue.
      v1::PeerMessage echo;
      echo.mutable_keepalive()->set_echo_ns(keepalive.timestamp_ns());
      writer_->send(std::move(echo));
    }
    // What the peer took off the data transport (its keepalives and its
    // echoes say): the agent's check that the data path still delivers.
    if (keepalive.has_data_received() && news_->dataReceived(keepalive.data_received())) {
      agent_.post(CmdLinkKeepalive{link_id_, news_});
    }
    return true;
  }
  const uint64_t bytes = msg->ByteSizeLong();
  const uint64_t waiting = backlog_->messages.load(std::memory_order_relaxed);
  if (waiting >= SessionBacklog::kMaxMessages ||
      backlog_->bytes.load(std::memory_order_relaxed) + bytes > SessionBacklog::kMaxBytes) {
    why_ = "the peer sends Session messages faster than they are handled (" + std::to_string(waiting) +
           " messages wait; at most " + std::to_string(SessionBacklog::kMaxMessages) + ")";
    return false;
  }
  backlog_->messages.fetch_add(1, std::memory_order_relaxed);
  backlog_->bytes.fetch_add(bytes, std::memory_order_relaxed);
  agent_.post(CmdPeerMessage{link_id_, std::move(msg), /*from_session=*/true, backlog_, bytes});
  msg = std::make_shared<v1::PeerMessage>();
  return true;
}

void SessionInbox::down() {
  guard_->fire();  // a Write blocked on flow control fails now
  writer_->close();
  guard_->disarm();
  std::string why = why_.empty() ? writer_->failure() : why_;
  agent_.post(CmdLinkDown{link_id_, why.empty() ? "the session ended" : std::move(why)});
}

}  // namespace framelink
