// Whether an attach request is admitted: its size, the policy
// (attach_validate.cpp) and what its user already holds.  Kept apart from the
// socket handling: it grows with every limit a user is held to.
#include <chrono>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

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

namespace {

// Checked before the segments exist (they are populated as they are made),
// with the larger of the two layouts the segments may get: on hugepages the
// data segment is rounded up to whole 2 MiB pages.
uint64_t requestBytes(const Config& config, const fl_attach_request& req) {
  const bool may_use_hugepages = config.hugepages != "off";
  return segmentBytes(computeGeometry(req.slot_count, req.slot_size, may_use_hugepages));
}

}  // namespace

bool AttachServer::admitSegmentBytes(int fd, const fl_attach_request& req, const ucred& cred) {
  const uint64_t bytes = requestBytes(config_, req);
  Status fits = quota_.admit(cred.uid, bytes);
  if (fits) return true;
  if (parkForQuota(fd, req, cred)) return false;
  reject(Metrics::AttachReject::kMemoryLimit);
  log_memory_.warn("attach: pid {} uid {} refused: {}", cred.pid, cred.uid, fits.error().message);
  sendRefusal(fd, fits.error().code, fits.error().message);
  dropConnection(fd);
  return false;
}

bool AttachServer::parkForQuota(int fd, const fl_attach_request& req, const ucred& cred) {
  auto it = connections_.find(fd);
  // Once: a request whose wait is over is refused.
  if (it == connections_.end() || it->second.parked ||
      !quota_.fitsOnceDrained(cred.uid, requestBytes(config_, req))) {
    return false;
  }
  it->second.parked = req;
  it->second.parked_cred = cred;
  it->second.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kQuotaWaitMs);
  spdlog::debug("attach: pid {} uid {} waits up to {} ms for the segments of clients that detached", cred.pid,
                cred.uid, kQuotaWaitMs);
  return true;
}

int AttachServer::retryParked() {
  std::vector<int> parked;
  for (const auto& [fd, c] : connections_) {
    if (c.parked) parked.push_back(fd);
  }
  if (parked.empty()) return -1;
  const auto now = std::chrono::steady_clock::now();
  bool waiting = false;
  for (const int fd : parked) {
    Connection& c = connections_.at(fd);
    fl_attach_request req = *c.parked;
    const ucred cred = c.parked_cred;
    const uint64_t bytes = requestBytes(config_, req);
    if (!quota_.admit(cred.uid, bytes) && now < c.deadline && quota_.fitsOnceDrained(cred.uid, bytes)) {
      waiting = true;
      continue;
    }
    // It fits now, or its wait is over: admitted afresh (the per-uid client
    // limit too), or refused with what holds the memory.
    if (admitAttach(fd, req, sizeof req, cred)) {
      connections_.at(fd).parked.reset();
      attachAdmitted(fd, req, cred);
    }
  }
  return waiting ? kQuotaPollMs : -1;
}

}  // namespace framelink
