/* Status strings, the thread-local last-error message and the version. */
#include <stdarg.h>
#include <stdio.h>

#include "client_internal.h"
#include "framelink/framelink.h"

#define FLX_ERROR_MAX 512

static _Thread_local char tls_error[FLX_ERROR_MAX];
static _Thread_local char tls_unknown[48];

int flx_error(int status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_error, sizeof(tls_error), fmt, ap);
  va_end(ap);
  return status;
}

FL_API const char* fl_last_error(void) { return tls_error; }

#define FLX_STR_(x) #x
#define FLX_STR(x) FLX_STR_(x)

FL_API const char* fl_version(void) {
  return FLX_STR(FL_VERSION_MAJOR) "." FLX_STR(FL_VERSION_MINOR) "." FLX_STR(FL_VERSION_PATCH);
}

FL_API const char* fl_status_str(int status) {
  switch (status) {
    case FL_OK:
      return "FL_OK: success";
    case FL_EAGAIN:
      return "FL_EAGAIN: nothing available now (non-blocking call)";
    case FL_ETIMEDOUT:
      return "FL_ETIMEDOUT: the timeout expired";
    case FL_EINVAL:
      return "FL_EINVAL: invalid argument";
    case FL_EINTR:
      return "FL_EINTR: interrupted by a signal";
    case FL_EBUSY:
      return "FL_EBUSY: resource still in use";
    case FL_ERR_BAD_SLOT:
      return "FL_ERR_BAD_SLOT: slot index out of range";
    case FL_ERR_SLOT_NOT_OWNED:
      return "FL_ERR_SLOT_NOT_OWNED: slot is in flight or not held by this client";
    case FL_ERR_TOO_LARGE:
      return "FL_ERR_TOO_LARGE: frame length exceeds the slot size";
    case FL_ERR_BAD_METADATA:
      return "FL_ERR_BAD_METADATA: slot header is invalid (attribute length or flags)";
    case FL_ERR_BAD_DESCRIPTOR:
      return "FL_ERR_BAD_DESCRIPTOR: ring entry is invalid (reserved fields set)";
    case FL_ERR_DOUBLE_RELEASE:
      return "FL_ERR_DOUBLE_RELEASE: released a slot that is not held";
    case FL_ERR_NO_CONSUMER:
      return "FL_ERR_NO_CONSUMER: no consumer took the frame before the credit timeout";
    case FL_ERR_TIMEOUT:
      return "FL_ERR_TIMEOUT: the frame was not acknowledged in time";
    case FL_ERR_PEER_REJECTED:
      return "FL_ERR_PEER_REJECTED: the remote daemon refused the frame (see its log)";
    case FL_ERR_CRC_MISMATCH:
      return "FL_ERR_CRC_MISMATCH: payload CRC32C did not match";
    case FL_ERR_NO_ROUTE:
      return "FL_ERR_NO_ROUTE: no peer is configured for this stream";
    case FL_ERR_LINK_LOST:
      return "FL_ERR_LINK_LOST: the link to the peer broke while the frame was in flight";
    case FL_ERR_SHUTDOWN:
      return "FL_ERR_SHUTDOWN: the daemon is shutting down";
    case FL_ERR_NO_LINK:
      return "FL_ERR_NO_LINK: the stream's peer has not linked with the daemon since it started (framelink "
             "links shows its last error)";
    case FL_ERR_DAEMON_UNREACHABLE:
      return "FL_ERR_DAEMON_UNREACHABLE: cannot connect to the framelinkd socket";
    case FL_ERR_ATTACH_REFUSED:
      return "FL_ERR_ATTACH_REFUSED: the daemon's policy refused this uid/gid";
    case FL_ERR_QUOTA:
      return "FL_ERR_QUOTA: slot count, slot size or bytes over the configured quota";
    case FL_ERR_VERSION:
      return "FL_ERR_VERSION: attach protocol or shared-memory layout version mismatch";
    case FL_ERR_BAD_REQUEST:
      return "FL_ERR_BAD_REQUEST: malformed attach request (role, stream name, sizes)";
    case FL_ERR_DAEMON_GONE:
      return "FL_ERR_DAEMON_GONE: the daemon went away; detach and attach again";
    case FL_ERR_RESOURCES:
      return "FL_ERR_RESOURCES: the daemon could not allocate memory or file descriptors";
    case FL_ERR_RING_CORRUPT:
      return "FL_ERR_RING_CORRUPT: the shared rings or slot headers are corrupt; detach";
    case FL_ERR_AUTH:
      return "FL_ERR_AUTH: the peer presented a wrong or no token";
    case FL_ERR_PEER_VERSION:
      return "FL_ERR_PEER_VERSION: the peer speaks an incompatible protocol version";
    case FL_ERR_PROTOCOL:
      return "FL_ERR_PROTOCOL: the peer sent a malformed or unexpected message";
    case FL_ERR_UNKNOWN_STREAM:
      return "FL_ERR_UNKNOWN_STREAM: the peer referred to a stream that is not open";
    case FL_ERR_UNKNOWN_CREDIT:
      return "FL_ERR_UNKNOWN_CREDIT: the peer used a credit it was not granted";
    case FL_ERR_TRANSPORT:
      return "FL_ERR_TRANSPORT: the transport failed this frame (see the daemon log)";
    case FL_ERR_DEVICE:
      return "FL_ERR_DEVICE: the RDMA device failed; links on it are down until it recovers (see the daemon "
             "log)";
    default:
      break;
  }
  /* Thread-local so the returned pointer stays valid for the caller's use
   * without a lock. */
  snprintf(tls_unknown, sizeof(tls_unknown), "unknown status %d", status);
  return tls_unknown;
}
