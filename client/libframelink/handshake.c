/*
 * The attach handshake on the daemon's Unix socket: connect before a
 * deadline, send the request, and read the reply with the descriptors it
 * passes (SCM_RIGHTS), each reply checked before any of it is used.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "framelink/attach_proto.h"

void flx_close_fds(int* fds, int n) {
  for (int i = 0; i < n; ++i) {
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  }
}

int64_t flx_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Connects before `deadline_ms` (CLOCK_MONOTONIC).  A Unix socket's connect
 * does not wait in the kernel when the daemon's backlog is full (EAGAIN on a
 * non-blocking socket): it is retried until the deadline, so a daemon that
 * does not accept never hangs the caller. */
int flx_connect(const char* path, int64_t deadline_ms, uint32_t timeout_ms, int* out_sock) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if (len == 0 || len >= sizeof(addr.sun_path))
    return flx_error(FL_EINVAL, "socket path '%s' is empty or longer than %zu bytes", path,
                     sizeof(addr.sun_path) - 1);
  memcpy(addr.sun_path, path, len + 1);

  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0) return flx_error(FL_ERR_RESOURCES, "cannot create a Unix socket: %s", strerror(errno));
  int rc;
  for (;;) {
    rc = connect(s, (const struct sockaddr*)&addr, sizeof(addr));
    if (rc == 0 || (errno != EINTR && errno != EAGAIN)) break;
    if (errno == EAGAIN) {
      if (flx_mono_ms() >= deadline_ms) {
        close(s);
        return flx_error(FL_ERR_DAEMON_UNREACHABLE,
                         "framelinkd at %s did not accept the connection within %u ms (its backlog is full: "
                         "overloaded, or out of file descriptors -- see its log); raise attach_timeout_ms "
                         "or try again",
                         path, timeout_ms);
      }
      struct timespec pause = {.tv_sec = 0, .tv_nsec = 5 * 1000 * 1000};
      nanosleep(&pause, NULL);
    }
  }
  if (rc == 0) {
    int fl = fcntl(s, F_GETFL);
    if (fl >= 0) (void)fcntl(s, F_SETFL, fl & ~O_NONBLOCK);
  }
  if (rc < 0) {
    int err = errno;
    close(s);
    if (err == EACCES || err == EPERM)
      return flx_error(FL_ERR_DAEMON_UNREACHABLE,
                       "cannot connect to framelinkd at %s: %s; is this user in the socket's group (usually "
                       "'framelink')? is framelinkd running? (systemctl status framelinkd)",
                       path, strerror(err));
    return flx_error(
        FL_ERR_DAEMON_UNREACHABLE,
        "cannot connect to framelinkd at %s: %s; is framelinkd running? (systemctl status framelinkd); "
        "set FRAMELINK_SOCKET or the socket_path option if it listens elsewhere",
        path, strerror(err));
  }
  *out_sock = s;
  return FL_OK;
}

/* Sends the request and receives the reply with its fds (all -1 on failure). */
/* Every SCM_RIGHTS descriptor in the message, at most FLX_MAX_FDS; returns how many. */
int flx_collect_fds(struct msghdr* msg, int got[FLX_MAX_FDS]) {
  int ngot = 0;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k && ngot < FLX_MAX_FDS; ++i)
      memcpy(&got[ngot++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
  }
  return ngot;
}

/* What the attach reply says: FL_OK, or the error (set) of a reply that was
 * not read, not one of ours, of another version, a refusal, or short of
 * descriptors.  `n` and `err` are recvmsg's result and errno. */
static int flx_reply_status(const char* path, uint32_t timeout_ms, ssize_t n, int err, fl_attach_reply* reply,
                            int ngot, int truncated) {
  if (n < 0) {
    return (err == EAGAIN || err == EWOULDBLOCK)
               ? flx_error(FL_ERR_DAEMON_UNREACHABLE,
                           "framelinkd at %s accepted the connection but did not answer the attach request "
                           "within %u ms (overloaded? see its log); raise attach_timeout_ms or try again",
                           path, timeout_ms)
               : flx_error(FL_ERR_DAEMON_UNREACHABLE,
                           "cannot read the attach reply from framelinkd at %s: %s", path, strerror(err));
  }
  if (n == 0) {
    return flx_error(FL_ERR_DAEMON_UNREACHABLE,
                     "framelinkd at %s closed the connection without answering the attach (see its log)",
                     path);
  }
  if ((size_t)n < 8 || reply->magic != FL_ATTACH_MAGIC) {
    return flx_error(FL_ERR_VERSION,
                     "%s did not answer with a framelink attach reply: is it really framelinkd?", path);
  }
  if (reply->version != FL_ATTACH_VERSION || (size_t)n != sizeof(fl_attach_reply)) {
    return flx_error(
        FL_ERR_VERSION,
        "framelinkd at %s speaks attach protocol version %u (%zd-byte reply), this libframelink %s "
        "speaks %u: install matching versions",
        path, reply->version, n, fl_version(), FL_ATTACH_VERSION);
  }
  if (reply->status != FL_OK) {
    reply->message[FL_ATTACH_MESSAGE_MAX - 1] = '\0';
    return reply->message[0] != '\0'
               ? flx_error(reply->status, "%s", reply->message)
               : flx_error(reply->status, "framelinkd refused the attach: %s", fl_status_str(reply->status));
  }
  if (reply->fd_count != FL_ATTACH_FD_COUNT || ngot != (int)FL_ATTACH_FD_COUNT || truncated) {
    return flx_error(FL_ERR_VERSION,
                     "framelinkd sent %d file descriptors (reply says %u), expected %u: version skew?", ngot,
                     reply->fd_count, FL_ATTACH_FD_COUNT);
  }
  return FL_OK;
}

int flx_handshake(int s, const char* path, const fl_attach_request* req, int64_t deadline_ms,
                  uint32_t timeout_ms, fl_attach_reply* reply, int fds[FL_ATTACH_FD_COUNT]) {
  for (unsigned i = 0; i < FL_ATTACH_FD_COUNT; ++i) fds[i] = -1;
  ssize_t n;
  do {
    n = send(s, req, sizeof(*req), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  /* A daemon that refuses before reading (out of descriptors, too many
   * connections) has closed already: its refusal may still be queued. */
  const int send_failed = n != (ssize_t)sizeof(*req);
  const int send_errno = errno;

  int64_t left_ms = deadline_ms - flx_mono_ms();
  if (left_ms < 1) left_ms = 1;
  struct timeval tv = {.tv_sec = (time_t)(left_ms / 1000), .tv_usec = (suseconds_t)(left_ms % 1000) * 1000};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

  /* One byte more than a reply, so a longer (other-version) message shows as a size mismatch. */
  union {
    fl_attach_reply reply;
    char bytes[sizeof(fl_attach_reply) + 1];
  } buf;
  union {
    struct cmsghdr align;
    char bytes[CMSG_SPACE(sizeof(int) * FLX_MAX_FDS)];
  } control;
  memset(&buf, 0, sizeof(buf));
  memset(&control, 0, sizeof(control));
  struct iovec iov = {.iov_base = &buf, .iov_len = sizeof(buf)};
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.bytes;
  msg.msg_controllen = sizeof(control.bytes);
  do {
    n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC | (send_failed ? MSG_DONTWAIT : 0));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == ECONNRESET) {
    /* The daemon answered and closed before reading our request (a refusal):
     * the reset is reported first, its answer may still be queued. */
    msg.msg_controllen = sizeof(control.bytes);
    n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) errno = ECONNRESET;
  }
  if (send_failed && n <= 0)
    return flx_error(FL_ERR_DAEMON_UNREACHABLE, "cannot send the attach request to framelinkd at %s: %s",
                     path, send_errno != 0 ? strerror(send_errno) : "short write");
  int err = errno;

  /* Collect every fd that arrived, so none leaks whatever happens next. */
  int got[FLX_MAX_FDS];
  const int ngot = n >= 0 ? flx_collect_fds(&msg, got) : 0;
  const int rc =
      flx_reply_status(path, timeout_ms, n, err, &buf.reply, ngot, (msg.msg_flags & MSG_CTRUNC) != 0);
  if (rc != FL_OK) {
    flx_close_fds(got, ngot);
    return rc;
  }
  for (unsigned i = 0; i < FL_ATTACH_FD_COUNT; ++i) fds[i] = got[i];
  *reply = buf.reply;
  return FL_OK;
}
