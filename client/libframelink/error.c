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

/* Every status and what it means: fl_status_str's answers. */
static const struct {
  int status;
  const char* text;
} kStatusText[] = {
    {FL_OK, "FL_OK: success"},
    {FL_EAGAIN, "FL_EAGAIN: nothing available now (non-blocking call)"},
    {FL_ETIMEDOUT, "FL_ETIMEDOUT: the timeout expired"},
    {FL_EINVAL, "FL_EINVAL: invalid argument"},
    {FL_EINTR, "FL_EINTR: interrupted by a signal"},
    {FL_EBUSY, "FL_EBUSY: resource still in use"},
    {FL_ERR_BAD_SLOT, "FL_ERR_BAD_SLOT: slot index out of range"},
    {FL_ERR_SLOT_NOT_OWNED, "FL_ERR_SLOT_NOT_OWNED: slot is in flight or not held by this client"},
    {FL_ERR_TOO_LARGE, "FL_ERR_TOO_LARGE: frame length exceeds the slot size"},
    {FL_ERR_BAD_METADATA, "FL_ERR_BAD_METADATA: slot header is invalid (attribute length or flags)"},
    {FL_ERR_BAD_DESCRIPTOR, "FL_ERR_BAD_DESCRIPTOR: ring entry is invalid (reserved fields set)"},
    {FL_ERR_DOUBLE_RELEASE, "FL_ERR_DOUBLE_RELEASE: released a slot that is not held"},
    {FL_ERR_NO_CONSUMER, "FL_ERR_NO_CONSUMER: no consumer took the frame before the credit timeout"},
    {FL_ERR_TIMEOUT, "FL_ERR_TIMEOUT: the frame was not acknowledged in time"},
    {FL_ERR_PEER_REJECTED, "FL_ERR_PEER_REJECTED: the remote daemon refused the frame (see its log)"},
    {FL_ERR_CRC_MISMATCH, "FL_ERR_CRC_MISMATCH: payload CRC32C did not match"},
    {FL_ERR_NO_ROUTE, "FL_ERR_NO_ROUTE: no peer is configured for this stream"},
    {FL_ERR_LINK_LOST, "FL_ERR_LINK_LOST: the link to the peer broke while the frame was in flight"},
    {FL_ERR_SHUTDOWN, "FL_ERR_SHUTDOWN: the daemon is shutting down"},
    {FL_ERR_NO_LINK,
     "FL_ERR_NO_LINK: the stream's peer has not linked with the daemon since it started (framelink "
     "links shows its last error)"},
    {FL_ERR_DAEMON_UNREACHABLE, "FL_ERR_DAEMON_UNREACHABLE: cannot connect to the framelinkd socket"},
    {FL_ERR_ATTACH_REFUSED, "FL_ERR_ATTACH_REFUSED: the daemon's policy refused this uid/gid"},
    {FL_ERR_QUOTA,
     "FL_ERR_QUOTA: the daemon's memory caps or this uid's client count are taken now; may pass later"},
    {FL_ERR_VERSION, "FL_ERR_VERSION: attach protocol or shared-memory layout version mismatch"},
    {FL_ERR_BAD_REQUEST, "FL_ERR_BAD_REQUEST: malformed attach request (role, stream name, sizes)"},
    {FL_ERR_DAEMON_GONE, "FL_ERR_DAEMON_GONE: the daemon went away; detach and attach again"},
    {FL_ERR_RESOURCES, "FL_ERR_RESOURCES: the daemon could not allocate memory or file descriptors"},
    {FL_ERR_RING_CORRUPT, "FL_ERR_RING_CORRUPT: the shared rings or slot headers are corrupt; detach"},
    {FL_ERR_LIMIT,
     "FL_ERR_LIMIT: slot count, slot size or bytes over a per-client limit of the daemon's "
     "configuration; asking again gets the same answer"},
    {FL_ERR_AUTH, "FL_ERR_AUTH: the peer presented a wrong or no token"},
    {FL_ERR_PEER_VERSION, "FL_ERR_PEER_VERSION: the peer speaks an incompatible protocol version"},
    {FL_ERR_PROTOCOL, "FL_ERR_PROTOCOL: the peer sent a malformed or unexpected message"},
    {FL_ERR_UNKNOWN_STREAM, "FL_ERR_UNKNOWN_STREAM: the peer referred to a stream that is not open"},
    {FL_ERR_UNKNOWN_CREDIT, "FL_ERR_UNKNOWN_CREDIT: the peer used a credit it was not granted"},
    {FL_ERR_TRANSPORT, "FL_ERR_TRANSPORT: the transport failed this frame (see the daemon log)"},
    {FL_ERR_DEVICE,
     "FL_ERR_DEVICE: the RDMA device failed; links on it are down until it recovers (see the daemon "
     "log)"},
};

FL_API const char* fl_status_str(int status) {
  for (size_t i = 0; i < sizeof(kStatusText) / sizeof(kStatusText[0]); ++i) {
    if (kStatusText[i].status == status) return kStatusText[i].text;
  }
  /* Thread-local so the returned pointer stays valid for the caller's use
   * without a lock. */
  snprintf(tls_unknown, sizeof(tls_unknown), "unknown status %d", status);
  return tls_unknown;
}
