// How verbs failures map to framelink statuses, by blast radius:
//   * frame  — this work request was bad (remote access / protection /
//              length / invalid request): that frame fails with
//              FL_ERR_TRANSPORT.  On RC the QP is in ERR all the same, so the
//              link is torn down and re-established by the daemon.
//   * link   — retries exhausted, flushed, peer gone: FL_ERR_LINK_LOST.
//   * device — the adapter or its port broke: FL_ERR_DEVICE; every link
//              on the device is lost, reconnecting needs the device back.
#pragma once

#include <infiniband/verbs.h>

#include "framelink/framelink.h"

namespace framelink::transport::rdma {

// The device scope's status (named here so call sites read as a scope).
inline constexpr int kStatusDevice = FL_ERR_DEVICE;

enum class ErrorScope { kNone, kFrame, kLink, kDevice };

struct WcClassification {
  ErrorScope scope = ErrorScope::kNone;
  int frame_status = FL_OK;  // the SendComplete of the work request that failed
  int link_status = FL_OK;   // the LinkError that follows (FL_OK only for success)
};

WcClassification classifyWcStatus(ibv_wc_status status) noexcept;

// For asynchronous events: kNone for the informational ones (COMM_EST,
// PORT_ACTIVE, LID_CHANGE, ...).
ErrorScope classifyAsyncEvent(ibv_event_type type) noexcept;

const char* scopeName(ErrorScope scope) noexcept;

}  // namespace framelink::transport::rdma
