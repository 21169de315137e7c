// The data agent's detail for `framelink stats` and the metrics endpoint: a
// plain snapshot, written as JSON in one place (toJson).  DataAgent::publishStats
// fills in the clients and links from its own tables, the streams through
// OutboundStreams::collectStats and the two totals from InboundStreams.  JSON by
// nlohmann_json: names from applications and peers are escaped, and invalid
// UTF-8 in them is replaced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "agent/link_identity.h"

namespace framelink {

struct ClientStats {
  uint64_t id = 0;
  int64_t pid = 0;
  uint64_t uid = 0;
  uint64_t gid = 0;
  std::string name;  // what the application called itself (from outside: escaped)
  bool producer = false;
  bool subscriber = false;  // consumer: every frame (else a queue group member)
  bool pull = false;        // consumer: peers' frames of its stream are pulled here (pull_streams)
  std::string stream;
  size_t slots = 0;
  uint64_t slot_size = 0;
  size_t slots_busy = 0;
  size_t in_flight = 0;  // producer: submitted, not yet ended; consumer: delivered, not yet released
  // Subscriber: frames here that wait for a slot of its own (it is behind
  // by these and in_flight); 0 for the rest.
  size_t waiting = 0;
  uint64_t frames = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  // Drop streams: a subscriber's frames it was skipped for; a producer's
  // subscribers its frames skipped.
  uint64_t dropped = 0;
  bool gone = false;
};

struct LinkStats {
  uint64_t id = 0;
  LinkIdentity identity;
  bool closing = false;
  uint64_t up_since_ns = 0;  // CLOCK_REALTIME
  uint64_t rtt_ns = 0;       // 0: not measured yet
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  size_t in_flight = 0;  // this daemon's frames on the link, not yet acknowledged
  size_t pending = 0;    // this daemon's frames for the peer, waiting for a credit
  uint64_t replayed = 0;
  size_t in_streams = 0;
  size_t pulled_in = 0;   // of in_streams, those this daemon pulls (reads)
  size_t pulled_out = 0;  // streams this daemon sends on the link that the peer pulls (offered)
};

struct StreamStats {
  std::string peer;
  std::string stream;
  uint64_t id = 0;
  uint64_t next_sequence = 0;
  size_t credits = 0;
  size_t pending = 0;
  size_t unacked = 0;
};

struct AgentStats {
  std::vector<ClientStats> clients;  // by client id
  std::vector<LinkStats> links;      // by link id
  std::vector<StreamStats> streams;  // by peer name, then stream id (sorted by toJson)
  size_t credits_outstanding = 0;
  size_t frames_held_by_consumers = 0;
};

std::string toJson(AgentStats stats);

}  // namespace framelink
