#include "transport/rdma/rdma_status.h"

namespace framelink::transport::rdma {

WcClassification classifyWcStatus(ibv_wc_status status) noexcept {
  switch (status) {
    case IBV_WC_SUCCESS:
      return {ErrorScope::kNone, FL_OK, FL_OK};
    // What the work request asked for was wrong (rkey, bounds, lkey,
    // SGE length): the frame is bad, the peer and the device are fine.
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_MW_BIND_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_RD_REQ_ERR:
    case IBV_WC_BAD_RESP_ERR:
      return {ErrorScope::kFrame, FL_ERR_TRANSPORT, FL_ERR_LINK_LOST};
    // The path or the peer: retries exhausted, the QP was flushed, the
    // remote side failed.
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_REM_OP_ERR:
    case IBV_WC_REM_ABORT_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_INV_EECN_ERR:
    case IBV_WC_INV_EEC_STATE_ERR:
      return {ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST};
    // The local adapter.
    case IBV_WC_LOC_QP_OP_ERR:
    case IBV_WC_LOC_EEC_OP_ERR:
    case IBV_WC_LOC_RDD_VIOL_ERR:
    case IBV_WC_FATAL_ERR:
    case IBV_WC_GENERAL_ERR:
      return {ErrorScope::kDevice, FL_ERR_LINK_LOST, kStatusDevice};
    default:
      // A status newer than this code: the link, to be safe.
      return {ErrorScope::kLink, FL_ERR_LINK_LOST, FL_ERR_LINK_LOST};
  }
}

ErrorScope classifyAsyncEvent(ibv_event_type type) noexcept {
  switch (type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_SRQ_ERR:
      return ErrorScope::kLink;
    case IBV_EVENT_CQ_ERR:
    case IBV_EVENT_DEVICE_FATAL:
    case IBV_EVENT_PORT_ERR:
      return ErrorScope::kDevice;
    default:
      return ErrorScope::kNone;
  }
}

const char* scopeName(ErrorScope scope) noexcept {
  switch (scope) {
    case ErrorScope::kNone:
      return "none";
    case ErrorScope::kFrame:
      return "frame";
    case ErrorScope::kLink:
      return "link";
    case ErrorScope::kDevice:
      return "device";
  }
  return "?";
}

}  // namespace framelink::transport::rdma
