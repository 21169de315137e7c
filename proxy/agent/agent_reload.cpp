// A reload on the data agent's thread (CmdReconfigure), and the inbound
// deadlines it recomputes.
#include <spdlog/spdlog.h>

#include <algorithm>
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

std::vector<std::string> sortedCopy(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  return names;
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
  // (then it keeps them until none is: retryReroutes; named once a stream).
  std::set<std::string> named;
  for (auto& [id, c] : clients_.all()) {
    if (c.session->role != FL_ROLE_PRODUCER) continue;
    outbound_.refreshRouteReaders(c);
    if (rerouteProducer(c, "reload")) continue;
    reroute_waiting_.insert(id);
    if (!named.insert(c.session->stream).second) continue;
    spdlog::warn(
        "reload: stream '{}' is now routed to {}; its producer (client {}) has frames in flight and keeps "
        "sending to {} until none is",
        c.session->stream, listed(config_.routesFor(c.session->stream)), id, listed(routesOf(c, true)));
  }
  spdlog::debug("data agent: configuration reloaded ({} peers)", config_.peers.size());
}

std::vector<std::string> DataAgent::routesOf(const AgentClient& c, bool carrying) const {
  // A route to a found daemon whose readers left carries nothing (kNone).
  std::vector<std::string> had;
  if (c.route != kNoPeer && !(carrying && c.route_readers == RouteReaders::kNone)) {
    had.push_back(peers_[c.route].name);
  }
  for (const auto& leg : c.more_routes) {
    if (!(carrying && leg.readers == RouteReaders::kNone)) had.push_back(peers_[leg.peer].name);
  }
  return had;
}

bool DataAgent::rerouteProducer(AgentClient& c, const char* why) {
  const std::vector<std::string> had = routesOf(c);
  const std::string& stream = c.session->stream;
  const std::vector<std::string> now = config_.routesFor(stream);
  // As sets: routes added while frames were in flight come after the others.
  if (sortedCopy(now) == sortedCopy(had)) return true;
  if (!outbound_.reroute(c)) {
    if (!outbound_.addRoutes(c, now)) return false;
    spdlog::info(
        "{}: stream '{}' is now routed to {} (was {}): producer client {}'s next frame goes there; its "
        "frames in "
        "flight keep the routes they had",
        why, stream, listed(now), listed(had), c.session->id);
    // A route it left (a found daemon whose readers went) carries no new
    // frame meanwhile, and closes once none is in flight.
    return std::all_of(had.begin(), had.end(), [&](const std::string& p) {
      return std::find(now.begin(), now.end(), p) != now.end();
    });
  }
  if (now.empty()) {
    spdlog::warn(
        "{}: stream '{}' is now routed to nowhere (was {}): producer client {}'s next frame goes there "
        "(FL_ERR_NO_ROUTE "
        "unless a consumer of it is attached here: {})",
        why, stream, listed(had), c.session->id, config_.whyNoRoute(stream));
  } else {
    spdlog::info("{}: stream '{}' is now routed to {} (was {}): producer client {}'s next frame goes there",
                 why, stream, listed(now), listed(had), c.session->id);
  }
  return true;
}

void DataAgent::retryReroutes() {
  for (auto it = reroute_waiting_.begin(); it != reroute_waiting_.end();) {
    AgentClient* c = clients_.find(*it);
    if (c == nullptr || c->session->gone || rerouteProducer(*c, "reload")) {
      it = reroute_waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace framelink
