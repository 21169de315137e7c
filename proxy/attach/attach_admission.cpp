// Whether an attach request is admitted: its size, the policy
// (attach_validate.cpp) and what its user already holds.  Kept apart from the
// socket handling: it grows with every limit a user is held to.
#include <string>

#include "attach/attach_server.h"

namespace framelink {

bool AttachServer::admitAttach(int fd, fl_attach_request& req, ssize_t size, const ucred& cred) {
  if (static_cast<size_t>(size) != sizeof(req)) {
    reject(Metrics::AttachReject::kInvalid);
    log_refused_.warn("attach: pid {} uid {} sent a {}-byte request (expected {}): refused", cred.pid,
                      cred.uid, size, sizeof(req));
    sendRefusal(fd, FL_ERR_BAD_REQUEST,
                "attach request of " + std::to_string(size) + " bytes, expected " +
                    std::to_string(sizeof(req)) + "; use a matching libframelink");
    dropConnection(fd);
    return false;
  }
  Status valid = validateRequest(config_, req, cred.uid, cred.gid);
  if (!valid) {
    reject(Metrics::AttachReject::kInvalid);
    log_refused_.warn("attach: pid {} uid {} refused: {}", cred.pid, cred.uid, valid.error().message);
    sendRefusal(fd, valid.error().code, valid.error().message);
    dropConnection(fd);
    return false;
  }
  if (auto a = attached_by_uid_.find(cred.uid);
      a != attached_by_uid_.end() && a->second >= config_.max_clients_per_uid) {
    reject(Metrics::AttachReject::kTooManyClients);
    log_clients_.warn("attach: pid {} uid {} refused: {} clients of this uid are attached already", cred.pid,
                      cred.uid, a->second);
    sendRefusal(fd, FL_ERR_QUOTA,
                "this user has " + std::to_string(a->second) +
                    " clients attached already, the limit limits.max_clients_per_uid = " +
                    std::to_string(config_.max_clients_per_uid) +
                    " (--max-clients-per-uid): detach one, or ask the operator to raise it");
    dropConnection(fd);
    return false;
  }
  return admitSegmentBytes(fd, req, cred);
}

bool AttachServer::admitSegmentBytes(int fd, const fl_attach_request& req, const ucred& cred) {
  // Checked before the segments exist (they are populated as they are
  // made), with the larger of the two layouts the segments may get: on
  // hugepages the data segment is rounded up to whole 2 MiB pages.
  const bool may_use_hugepages = config_.hugepages != "off";
  const uint64_t bytes = segmentBytes(computeGeometry(req.slot_count, req.slot_size, may_use_hugepages));
  Status fits = quota_.admit(cred.uid, bytes);
  if (fits) return true;
  reject(Metrics::AttachReject::kMemoryLimit);
  log_memory_.warn("attach: pid {} uid {} refused: {}", cred.pid, cred.uid, fits.error().message);
  sendRefusal(fd, fits.error().code, fits.error().message);
  dropConnection(fd);
  return false;
}

}  // namespace framelink
