// A reload on the data agent's thread (CmdReconfigure).
#include <spdlog/spdlog.h>

#include <set>
#include <string>
#include <vector>

#include "agent/data_agent.h"

namespace framelink {

namespace {

std::string listed(const std::vector<std::string>& peers) {
  std::string out;
  for (const auto& p : peers) out += (out.empty() ? "" : ", ") + p;
  return out.empty() ? "nowhere" : out;
}

}  // namespace

void DataAgent::reconfigure(const Config& next) {
  // Only what a reload may change (planReload): the rest stays, and with it
  // what the parts hold of it.
  config_.log_level = next.log_level;
  config_.peers = next.peers;
  config_.token = next.token;
  config_.token_file = next.token_file;
  config_.ack_timeout_ms = next.ack_timeout_ms;
  config_.credit_timeout_ms = next.credit_timeout_ms;
  // A producer keeps the routes it attached with (its frames in flight are
  // on them); one whose stream now goes elsewhere is named, once a stream.
  std::set<std::string> named;
  for (const auto& [id, c] : clients_.all()) {
    if (c.session->role != FL_ROLE_PRODUCER || named.count(c.session->stream) != 0) continue;
    std::vector<std::string> had;
    if (c.route != kNoPeer) had.push_back(peers_[c.route].name);
    for (const auto& leg : c.more_routes) had.push_back(peers_[leg.peer].name);
    const std::vector<std::string> now = config_.routesFor(c.session->stream);
    if (now == had) continue;
    named.insert(c.session->stream);
    spdlog::warn(
        "reload: stream '{}' is now routed to {}; its producer (client {}) attached before and keeps sending "
        "to "
        "{} until it attaches again{}",
        c.session->stream, listed(now), id, listed(had),
        now.empty()
            ? " (a producer that attaches now gets FL_ERR_NO_ROUTE unless a consumer is attached here: " +
                  config_.whyNoRoute(c.session->stream) + ")"
            : "");
  }
  spdlog::debug("data agent: configuration reloaded ({} peers)", config_.peers.size());
}

}  // namespace framelink
