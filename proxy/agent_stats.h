// The data agent's detail for `framelink stats` and the metrics endpoint: a
// plain snapshot each part fills in, written as JSON in one place.  (None of
// the daemon's dependencies writes JSON; the writer is small and escapes
// what a peer or the configuration could name.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace framelink {

struct ClientStats {
  uint64_t id = 0;
  int64_t pid = 0;
  uint64_t uid = 0;
  bool producer = false;
  std::string stream;
  size_t slots = 0;
  size_t slots_busy = 0;
  uint64_t frames = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  bool gone = false;
};

struct LinkStats {
  uint64_t id = 0;
  std::string peer;
  std::string transport;
  std::string transport_reason;
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  size_t in_streams = 0;
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

// A string as the inside of a JSON string literal.
std::string jsonEscape(const std::string& in);

}  // namespace framelink
