// Validation of an attach request (kept apart from the socket handling so
// that the fuzzer in tests/fuzz can drive it alone).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "attach/attach_server.h"
#include "framelink/shm_layout.h"

namespace framelink {

Status AttachServer::validateRequest(const Config& config, fl_attach_request& req, uid_t uid, gid_t gid) {
  if (req.magic != FL_ATTACH_MAGIC) {
    return makeError(FL_ERR_VERSION,
                     "not a framelink attach request (bad magic); is the client a framelink "
                     "library?");
  }
  if (req.version != FL_ATTACH_VERSION) {
    return makeError(FL_ERR_VERSION, "attach protocol version " + std::to_string(req.version) +
                                         " is not supported (daemon speaks " +
                                         std::to_string(FL_ATTACH_VERSION) +
                                         "); use a matching libframelink");
  }
  if (!config.allowed_uids.empty() || !config.allowed_gids.empty()) {
    bool allowed =
        uid == ::getuid() ||
        std::find(config.allowed_uids.begin(), config.allowed_uids.end(), uid) != config.allowed_uids.end() ||
        std::find(config.allowed_gids.begin(), config.allowed_gids.end(), gid) != config.allowed_gids.end();
    if (!allowed) {
      return makeError(FL_ERR_ATTACH_REFUSED, "uid " + std::to_string(uid) + " / gid " + std::to_string(gid) +
                                                  " is not allowed to attach; add it to allowed_uids or "
                                                  "allowed_gids in the daemon's configuration");
    }
  }
  static_assert(int{FL_ROLE_PRODUCER} == int{FL_PRODUCER} && int{FL_ROLE_CONSUMER} == int{FL_CONSUMER});
  if (req.role != FL_ROLE_PRODUCER && req.role != FL_ROLE_CONSUMER) {
    return makeError(FL_ERR_BAD_REQUEST,
                     "role " + std::to_string(req.role) + " is neither producer (1) nor consumer (2)");
  }
  if ((req.flags & ~uint32_t{FL_ATTACH_SUBSCRIBE | FL_ATTACH_PULL}) != 0 || req.reserved != 0) {
    return makeError(FL_ERR_BAD_REQUEST, "reserved attach flags are set; use a matching libframelink");
  }
  if ((req.flags & FL_ATTACH_SUBSCRIBE) != 0 && req.role != FL_ROLE_CONSUMER) {
    return makeError(FL_ERR_BAD_REQUEST,
                     "only a consumer subscribes; a producer's frames go to every subscriber");
  }
  if ((req.flags & FL_ATTACH_PULL) != 0 && req.role != FL_ROLE_CONSUMER) {
    return makeError(FL_ERR_BAD_REQUEST,
                     "only a consumer asks for pull; the consumer's host decides how its frames come");
  }
  if (!fl_stream_name_valid(req.stream, strnlen(req.stream, sizeof(req.stream)))) {
    return makeError(FL_ERR_BAD_REQUEST, "stream name must be 1-" + std::to_string(FL_STREAM_NAME_LEN_MAX) +
                                             " characters of [A-Za-z0-9._-]");
  }
  req.client_name[sizeof(req.client_name) - 1] = '\0';
  if (req.slot_count == 0) req.slot_count = config.default_slot_count;
  if (req.slot_size == 0) req.slot_size = config.default_slot_size;
  if (req.slot_count > config.max_slots) {
    return makeError(FL_ERR_LIMIT, std::to_string(req.slot_count) + " slots requested, the limit is " +
                                       std::to_string(config.max_slots) + " (max_slots)");
  }
  if (req.slot_size > config.max_slot_size) {
    return makeError(FL_ERR_LIMIT, "slot size " + std::to_string(req.slot_size) +
                                       " bytes requested, the limit is " +
                                       std::to_string(config.max_slot_size) + " (max_slot_size)");
  }
  if (req.slot_count * req.slot_size > config.max_client_bytes) {
    return makeError(FL_ERR_LIMIT, std::to_string(req.slot_count) + " slots of " +
                                       std::to_string(req.slot_size) +
                                       " bytes exceed the per-client limit of " +
                                       std::to_string(config.max_client_bytes) + " bytes (max_client_bytes)");
  }
  return {};
}

}  // namespace framelink
