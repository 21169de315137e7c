// libFuzzer target: an attach request as a local client sends it (any 160
// bytes, any peer credentials) through the daemon's validation.  Invariants:
// no crash or UB (ASan/UBSan); an accepted request has a role, a valid
// NUL-terminated stream name, a NUL-terminated client name, and slot count,
// slot size and their product within the configured limits; an uid/gid not on
// the allow-list is never accepted.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "attach/attach_server.h"
#include "config/config.h"
#include "framelink/attach_proto.h"

using namespace framelink;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < sizeof(fl_attach_request) + 8) return 0;
  fl_attach_request req;
  std::memcpy(&req, data, sizeof req);
  uint32_t uid, gid;
  std::memcpy(&uid, data + sizeof req, 4);
  std::memcpy(&gid, data + sizeof req + 4, 4);

  static const Config config = [] {
    Config c;
    c.max_slots = 64;
    c.max_slot_size = 8u << 20;
    c.max_client_bytes = 64u << 20;
    c.allowed_uids = {1000};
    c.allowed_gids = {2000};
    return c;
  }();
  const Status st = AttachServer::validateRequest(config, req, uid, gid);
  if (!st) {
    if (st.error().message.empty()) std::abort();  // every refusal says why
    return 0;
  }
  const bool allowed = uid == ::getuid() || uid == 1000 || gid == 2000;
  if (!allowed) std::abort();
  if (req.role != FL_ROLE_PRODUCER && req.role != FL_ROLE_CONSUMER) std::abort();
  const size_t len = strnlen(req.stream, sizeof req.stream);
  if (len == 0 || len == sizeof req.stream) std::abort();
  if (req.client_name[sizeof req.client_name - 1] != '\0') std::abort();
  if (req.slot_count == 0 || req.slot_count > config.max_slots) std::abort();
  if (req.slot_size == 0 || req.slot_size > config.max_slot_size) std::abort();
  if (uint64_t{req.slot_count} * req.slot_size > config.max_client_bytes) std::abort();
  return 0;
}
