// A reload on the data agent's thread (CmdReconfigure), and the inbound
// deadlines it recomputes.
#include <spdlog/spdlog.h>

#include <set>
#include <string>
#include <vector>

#include "agent/data_agent.h"
#include "config/config_reload.h"

namespace framelink {

namespace {

std::string listed(const std::vector<std::string>& peers) {
  std::string out;
  for (const auto& p : peers) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "nowhere" : out;
}

}  // namespace

// A sender gives up on a frame ack_timeout after sending it: what this end
// remembers to answer its replays is of no use a few of those later, and a
// recall it neither answers nor serves by then is not coming back.
InboundLimits DataAgent::inboundLimits(const Config& config) {
  const uint64_t ack_timeout_ns = uint64_t{config.ack_timeout_ms} * 1'000'000;
  InboundLimits limits;
  limits.forget_idle_ns = 4 * ack_timeout_ns;
  limits.recall_deadline_ns = ack_timeout_ns;
  limits.reads_per_link = config.pull_reads_per_link;
  // The bytes of a read come from the peer: a read that makes no progress
  // for as long as the link may stay silent is as dead as a silent link.
  limits.read_stall_ns = uint64_t{config.link_timeout_ms} * 1'000'000;
  return limits;
}

void DataAgent::reconfigure(const Config& next) {
  // Only what a reload may change: the rest stays, and with it what the
  // parts hold of it -- but for the inbound deadlines, which follow
  // ack_timeout_ms.
  copyReloadable(next, config_);
  inbound_.setLimits(inboundLimits(config_));
  // An attached producer's stream goes where the new routes send it, from
  // its next frame -- unless a frame of it is in flight, on the routes it had
  // (then it keeps them until it attaches again; named once a stream).
  std::set<std::string> named;
  for (auto& [id, c] : clients_.all()) {
    if (c.session->role != FL_ROLE_PRODUCER) continue;
    std::vector<std::string> had;
    if (c.route != kNoPeer) had.push_back(peers_[c.route].name);
    for (const auto& leg : c.more_routes) had.push_back(peers_[leg.peer].name);
    const std::string& stream = c.session->stream;
    const std::vector<std::string> now = config_.routesFor(stream);
    if (now == had) continue;
    const std::string none = now.empty() ? " (FL_ERR_NO_ROUTE unless a consumer of it is attached here: " +
                                               config_.whyNoRoute(stream) + ")"
                                         : "";
    if (outbound_.reroute(c)) {
      if (now.empty()) {
        spdlog::warn(
            "reload: stream '{}' is now routed to nowhere (was {}): producer client {}'s next frame goes "
            "there{}",
            stream, listed(had), id, none);
      } else {
        spdlog::info(
            "reload: stream '{}' is now routed to {} (was {}): producer client {}'s next frame goes there",
            stream, listed(now), listed(had), id);
      }
      continue;
    }
    if (!named.insert(stream).second) continue;
    spdlog::warn(
        "reload: stream '{}' is now routed to {}; its producer (client {}) has frames in flight and keeps "
        "sending "
        "to {} until it attaches again{}",
        stream, listed(now), id, listed(had), none);
  }
  spdlog::debug("data agent: configuration reloaded ({} peers)", config_.peers.size());
}

}  // namespace framelink
