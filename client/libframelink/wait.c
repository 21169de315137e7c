/*
 * Blocking waits on the completion ring and daemon liveness.
 *
 * Sleep protocol (shm_layout.h): set reader_sleeping, re-check the ring, and
 * only then block on the completion doorbell (the read end of a pipe whose
 * write end the daemon holds).  The daemon rings it only while the flag is set, so neither side
 * makes a system call while frames flow.  The attach socket is in the same
 * poll set: when the daemon dies it hangs up, and a waiter returns
 * FL_ERR_DAEMON_GONE instead of sleeping forever -- or, with auto_reattach,
 * attaches again (reattach.c) and carries on, sleeping between attempts.
 * (Applications with their own event loop wait on fl_doorbell_fd, an epoll
 * set of the same two fds; the blocking calls poll the fds themselves.)
 *
 * Before it sleeps, a blocking call looks at its ring again for up to
 * wait_spin_us, yielding the CPU between looks (Aeron's backoff idle
 * strategy, without its busy phase: on a machine with fewer cores than busy
 * threads a busy spin would take the CPU from the daemon it waits for).
 * While frames flow, the next one usually comes within that time, and
 * neither the daemon's doorbell write nor this thread's wake-up happens.
 *
 * Several threads may wait at once, possibly for different things (a free
 * slot, a completion).  They must not share the doorbell: one thread's read()
 * would clear a wake-up another needed.  So one waiter at a time polls (the
 * poller) and the rest wait on a condition variable (followers), woken when
 * the poller returns and whenever a call frees a slot or queues a
 * completion; a poller is woken for those by a write to our own eventfd
 * (kick_efd), which it polls too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"

static int64_t flx_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int flx_gone_error(void) {
  return flx_error(FL_ERR_DAEMON_GONE,
                   "framelinkd dropped this attachment (daemon stopped, restarted or detached the client); "
                   "call fl_detach and attach again");
}

int flx_role_error(const char* function, const char* role) {
  return flx_error(FL_EINVAL, "%s needs a %s attachment", function, role);
}

int flx_gone_locked(fl_client* c) {
  if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE)) return 1;
  if (__atomic_load_n(&c->live_hdr->daemon_state, __ATOMIC_ACQUIRE) != FL_DAEMON_SERVING) {
    __atomic_store_n(&c->gone, 1, __ATOMIC_RELEASE);
    return 1;
  }
  return 0;
}

int flx_corrupt_locked(fl_client* c, const char* fmt, ...) {
  char detail[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
  c->corrupt = 1;
  return flx_error(FL_ERR_RING_CORRUPT, "%s; the shared memory of this attachment cannot be trusted: detach",
                   detail);
}

void flx_disarm_locked(fl_client* c) {
  if (!c->armed) return;
  c->armed = 0;
  if (!c->poller_active) fl_ring_end_sleep(c->completion);
}

static void flx_poller_done_locked(fl_client* c) {
  c->poller_active = 0;
  if (!c->armed) fl_ring_end_sleep(c->completion);
  if (c->followers > 0) pthread_cond_broadcast(&c->cv); /* one of them polls next */
}

static void flx_kick_poller(fl_client* c) {
  if (c->kick_efd < 0) return;
  uint64_t one = 1;
  ssize_t n = write(c->kick_efd, &one, sizeof(one));
  (void)n;
}

void flx_notify_locked(fl_client* c) {
  if (c->followers > 0) pthread_cond_broadcast(&c->cv);
  if (c->poller_active) flx_kick_poller(c);
}

void flx_ring_submit_doorbell(fl_client* c) {
  uint64_t one = 1;
  /* Nothing useful to do on failure: a full doorbell is already ringing, and a
   * dead daemon is reported through the socket. */
  ssize_t n = write(c->submit_bell, &one, sizeof(one));
  (void)n;
}

static void flx_clear_doorbell(fl_client* c) {
  /* The doorbell is a pipe of one page (or, from an older daemon, a datagram
   * socket: one read per ring): read until EAGAIN (O_NONBLOCK), bounded. */
  char buf[512];
  for (int i = 0; i < 64; ++i) {
    if (read(c->completion_bell, buf, sizeof(buf)) <= 0) break;
  }
}

/* A non-blocking call found nothing: from now on the daemon rings the
 * doorbell, so an asynchronous user can wait on fl_doorbell_fd.  Returns 1
 * when an entry raced in and the caller should try again. */
static int flx_arm_locked(fl_client* c) {
  if (c->armed) return 0;
  c->armed = 1;
  if (!c->poller_active) flx_clear_doorbell(c); /* stale wake-ups; never the poller's */
  return !fl_ring_prepare_sleep(c->completion);
}

/* Socket readiness while attached: anything but "nothing" means the daemon
 * went away (it never sends after the attach reply). */
static void flx_note_socket_locked(fl_client* c, short revents) {
  if (revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) {
    __atomic_store_n(&c->gone, 1, __ATOMIC_RELEASE);
    return;
  }
  if (revents & POLLIN) {
    char buf[64];
    ssize_t n = recv(c->sock, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      __atomic_store_n(&c->gone, 1, __ATOMIC_RELEASE);
  }
}

int flx_socket_hung_up(fl_client* c) {
  struct pollfd p = {.fd = c->sock, .events = POLLRDHUP};
  int n = poll(&p, 1, 0);
  if (n > 0) {
    pthread_mutex_lock(&c->mu);
    flx_note_socket_locked(c, p.revents);
    pthread_mutex_unlock(&c->mu);
  }
  return __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE);
}

int flx_socket_hung_up_locked(fl_client* c) {
  struct pollfd p = {.fd = c->sock, .events = POLLRDHUP};
  if (poll(&p, 1, 0) > 0) flx_note_socket_locked(c, p.revents);
  return __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE);
}

/* The error of a call that, with auto_reattach, found the daemon gone and
 * could not attach again yet. */
static int flx_awaiting_daemon_error(fl_client* c, int status, const char* head) {
  return flx_error(status,
                   "%s: framelinkd is gone and not back yet; auto_reattach tries again every %u ms (last "
                   "attempt: %s)",
                   head, c->reattach_interval_ms, c->reattach_error[0] ? c->reattach_error : "none yet");
}

/* The error of a call after auto_reattach's attempts ended at a final
 * refusal: the call that saw it gets that status, later ones
 * FL_ERR_DAEMON_GONE, both with the daemon's reason. */
static const char* flx_refusal_name(int status) {
  switch (status) {
    case FL_ERR_LIMIT:
      return "FL_ERR_LIMIT";
    case FL_ERR_ATTACH_REFUSED:
      return "FL_ERR_ATTACH_REFUSED";
    case FL_ERR_VERSION:
      return "FL_ERR_VERSION";
    default:
      return "FL_ERR_BAD_REQUEST";
  }
}

static int flx_refused_error(fl_client* c, int status) {
  if (status != FL_ERR_DAEMON_GONE)
    return flx_error(status,
                     "framelinkd is back but refuses this client for good: %s; auto_reattach stopped "
                     "(fl_reattach tries again once the daemon's configuration changed, fl_detach ends)",
                     c->reattach_error);
  return flx_error(FL_ERR_DAEMON_GONE,
                   "framelinkd dropped this attachment and refused it again for good (%s: %s); "
                   "fl_reattach tries again once the daemon's configuration changed, fl_detach ends",
                   flx_refusal_name(c->refused), c->reattach_error);
}

/* The error of a wait that ended empty-handed; says so when the cause is
 * completions the application has not read (flx_queue_backlogged_locked). */
static int flx_backlogged_error(fl_client* c, int status, const char* head) {
  if (!flx_queue_backlogged_locked(c)) return flx_error(status, "%s", head);
  return flx_error(status,
                   "%s: %llu completions wait unread, and slots come back only as they are read; call "
                   "fl_poll_completions or fl_wait_completions (from another thread, or between acquires)",
                   head, (unsigned long long)(c->queue_tail - c->queue_head));
}

/* One flx_wait call: what it waits for, and until when.  The steps below
 * each return 1 when the loop should try again, or 0 with *rc the status
 * flx_wait returns. */
struct flx_wait_call {
  fl_client* c;
  int timeout_ms;   /* 0: non-blocking, < 0: forever */
  int64_t deadline; /* CLOCK_MONOTONIC ns, when timeout_ms > 0 */
  flx_try_fn try_fn;
  void* arg;
  const char* what;
  int64_t spin_until; /* CLOCK_MONOTONIC ns: look without sleeping until then (0: not started) */
};

/* With mu held (dropped while it reattaches or sleeps): the daemon is gone
 * and auto_reattach is on.  Attaches again, or sleeps until the next attempt
 * is due (or another thread's attempt ended), unless the call cannot wait
 * that long. */
static int flx_wait_reattach_locked(const struct flx_wait_call* w, int* rc) {
  fl_client* c = w->c;
  int64_t retry_ms = 0;
  const int attempt = flx_auto_reattach_locked(c, &retry_ms);
  if (attempt == FL_OK) return 1; /* attached again: try there */
  if (attempt != FL_EAGAIN) {
    *rc = flx_refused_error(c, attempt);
    return 0;
  }
  char head[256];
  if (w->timeout_ms == 0) {
    snprintf(head, sizeof(head), "no %s available now (non-blocking call)", w->what);
    *rc = flx_awaiting_daemon_error(c, FL_EAGAIN, head);
    return 0;
  }
  int64_t wake_ns = retry_ms * 1000000;
  if (w->timeout_ms > 0 && w->deadline <= wake_ns) {
    if (w->deadline <= flx_now_ns()) {
      snprintf(head, sizeof(head), "timed out after %d ms waiting for a %s", w->timeout_ms, w->what);
      *rc = flx_awaiting_daemon_error(c, FL_ETIMEDOUT, head);
      return 0;
    }
    wake_ns = w->deadline;
  }
  /* Until the next attempt is due (or another thread's attempt ended). */
  c->followers++;
  struct timespec ts = {.tv_sec = (time_t)(wake_ns / 1000000000), .tv_nsec = (long)(wake_ns % 1000000000)};
  pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  c->followers--;
  return 1;
}

/* With mu held: a non-blocking call found nothing.  Arms the doorbell (and
 * tries once more if an entry raced in), looks at the attach socket at most
 * once a millisecond, and otherwise says FL_EAGAIN. */
static int flx_wait_nonblocking_locked(const struct flx_wait_call* w, int* rc) {
  fl_client* c = w->c;
  const int was_armed = c->armed;
  if (flx_arm_locked(c)) {
    *rc = w->try_fn(c, w->arg);
    if (*rc != FL_EAGAIN) return 0;
  }
  /* Nothing again, after the caller may have waited on fl_doorbell_fd,
   * which a dead daemon's socket keeps readable: was that why it woke?
   * At most once a millisecond, so that spinning on an empty ring makes
   * no system call per call. */
  if (was_armed) {
    const int64_t now = flx_now_ns();
    if (now - c->socket_checked_ns >= 1000000) {
      c->socket_checked_ns = now;
      if (flx_socket_hung_up_locked(c)) return 1;
    }
  }
  char head[256];
  snprintf(head, sizeof(head), "no %s available now (non-blocking call)", w->what);
  *rc = flx_backlogged_error(c, FL_EAGAIN, head);
  return 0;
}

/* With mu held (dropped while it sleeps): a follower sleeps on cv until the
 * poller returns, something is freed or queued, or the deadline passes. */
static void flx_follow_locked(const struct flx_wait_call* w) {
  fl_client* c = w->c;
  c->followers++;
  if (w->timeout_ms > 0) {
    struct timespec ts = {.tv_sec = (time_t)(w->deadline / 1000000000),
                          .tv_nsec = (long)(w->deadline % 1000000000)};
    pthread_cond_timedwait(&c->cv, &c->mu, &ts);
  } else {
    pthread_cond_wait(&c->cv, &c->mu);
  }
  c->followers--;
}

/* With mu held (dropped while it polls): this thread is the poller.  Sleeps
 * in poll() on the completion doorbell, the attach socket and the kick
 * eventfd for at most `wait_ms` (< 0: no limit), then clears what woke it
 * and notes a hang-up. */
static int flx_poll_locked(const struct flx_wait_call* w, int wait_ms, int* rc) {
  fl_client* c = w->c;
  if (c->kick_efd < 0) c->kick_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); /* -1: no kicks, polls */
  const int kick = c->kick_efd;
  if (kick < 0 && (wait_ms < 0 || wait_ms > 10)) wait_ms = 10; /* no kicks: poll in slices */
  c->poller_active = 1;
  if (!fl_ring_prepare_sleep(c->completion)) {
    flx_poller_done_locked(c);
    return 1; /* an entry raced in: go and take it */
  }
  pthread_mutex_unlock(&c->mu);

  struct pollfd p[3] = {{.fd = c->completion_bell, .events = POLLIN},
                        {.fd = c->sock, .events = POLLRDHUP},
                        {.fd = kick, .events = POLLIN}};
  int n = poll(p, kick >= 0 ? 3 : 2, wait_ms);
  int err = errno;
  if (n > 0 && (p[0].revents & POLLIN)) flx_clear_doorbell(c);
  if (n > 0 && kick >= 0 && (p[2].revents & POLLIN)) {
    uint64_t v;
    ssize_t r = read(kick, &v, sizeof(v));
    (void)r;
  }

  pthread_mutex_lock(&c->mu);
  flx_poller_done_locked(c);
  if (n < 0) {
    if (err == EINTR) {
      *rc = flx_error(FL_EINTR, "interrupted by a signal while waiting for a %s", w->what);
      return 0;
    }
    *rc = flx_error(FL_EINVAL, "poll() on the framelink doorbell failed: %s", strerror(err));
    return 0;
  }
  if (n > 0 && p[1].revents)
    flx_note_socket_locked(c, p[1].revents); /* followers already woken: they see it */
  /* Loop: take what arrived; a hang-up is reported once the ring is empty. */
  return 1;
}

/* With mu held (dropped while it yields): a blocking call that would poll
 * looks again after a sched_yield, until wait_spin_ns after it first found
 * nothing.  Returns 1 to try again, 0 when the time is up. */
static int flx_spin_locked(struct flx_wait_call* w) {
  fl_client* c = w->c;
  const int64_t spin_ns = __atomic_load_n(&c->wait_spin_ns, __ATOMIC_RELAXED);
  if (spin_ns <= 0) return 0;
  const int64_t now = flx_now_ns();
  if (w->spin_until == 0) w->spin_until = now + spin_ns;
  if (now >= w->spin_until) return 0;
  pthread_mutex_unlock(&c->mu);
  sched_yield();
  pthread_mutex_lock(&c->mu);
  return 1;
}

/* With mu held: a blocking call found nothing.  Times out at the deadline,
 * or looks again for a while (flx_spin_locked), or sleeps as a follower or
 * as the poller. */
static int flx_wait_blocking_locked(struct flx_wait_call* w, int* rc) {
  fl_client* c = w->c;
  int wait_ms = -1;
  if (w->timeout_ms > 0) {
    int64_t left = w->deadline - flx_now_ns();
    if (left <= 0) {
      char head[256];
      snprintf(head, sizeof(head), "timed out after %d ms waiting for a %s", w->timeout_ms, w->what);
      *rc = flx_backlogged_error(c, FL_ETIMEDOUT, head);
      return 0;
    }
    wait_ms = (int)((left + 999999) / 1000000);
  }
  /* Behind the poller, or behind the application itself: a backlogged
   * queue frees slots only when a completion is read, which notifies. */
  if (c->poller_active || flx_queue_backlogged_locked(c)) {
    flx_follow_locked(w);
    return 1;
  }
  if (flx_spin_locked(w)) return 1;
  return flx_poll_locked(w, wait_ms, rc);
}

/* Each round tries once; when that finds nothing, one step: reattach (the
 * daemon is gone), answer now (non-blocking) or sleep (blocking). */
int flx_wait(fl_client* c, int timeout_ms, flx_try_fn try_fn, void* arg, const char* what) {
  struct flx_wait_call w = {
      .c = c,
      .timeout_ms = timeout_ms,
      .deadline = timeout_ms > 0 ? flx_now_ns() + (int64_t)timeout_ms * 1000000 : 0,
      .try_fn = try_fn,
      .arg = arg,
      .what = what,
  };
  int rc;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    rc = try_fn(c, arg);
    const int gone = rc == FL_EAGAIN || rc == FL_ERR_DAEMON_GONE ? flx_gone_locked(c) : 0;
    if (rc != FL_EAGAIN && !(gone && c->auto_reattach)) break;
    if (gone && !c->auto_reattach) {
      rc = flx_gone_error();
      break;
    }
    if (gone && c->refused) {
      rc = flx_refused_error(c, FL_ERR_DAEMON_GONE);
      break;
    }
    int again;
    if (gone)
      again = flx_wait_reattach_locked(&w, &rc);
    else if (timeout_ms == 0)
      again = flx_wait_nonblocking_locked(&w, &rc);
    else
      again = flx_wait_blocking_locked(&w, &rc);
    if (!again) break;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}
