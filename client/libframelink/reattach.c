/*
 * Reattach: the same handle, a new attachment to a restarted daemon, and the
 * one fd an event loop waits on (fl_doorbell_fd) kept current across it.
 *
 * fl_doorbell_fd is an epoll fd made once per client.  It holds the
 * completion doorbell (readable when the daemon rang) and the attach socket
 * (hang-up when the daemon dies), so an application waiting on it learns of
 * both.  A reattach moves the new attachment's fds onto the old numbers
 * (dup3), which drops the old files from the set; they are taken out first
 * and the new ones put in, so the epoll fd -- the number and the file -- never
 * changes and event-loop registrations of it stay valid.
 *
 * With auto_reattach a call that finds the daemon gone attempts the reattach
 * itself, at most once per reattach_interval_ms.  Between attempts the dead
 * socket (readable for ever) leaves the set and a timerfd in it is set for
 * the next attempt, so an event loop wakes when an attempt is due instead of
 * spinning.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "client_internal.h"

static int flx_epoll_add(int epoll_fd, int fd, uint32_t events) {
  struct epoll_event ev;
  memset(&ev, 0, sizeof(ev));
  ev.events = events;
  ev.data.fd = fd;
  return epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
}

int flx_watch_init(fl_client* c) {
  c->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (c->epoll_fd < 0)
    return flx_error(FL_ERR_RESOURCES, "cannot create the doorbell's epoll fd: %s", strerror(errno));
  /* The socket: the daemon never sends after its reply, so only a hang-up
   * (EPOLLRDHUP, and EPOLLHUP/EPOLLERR which epoll always reports) counts. */
  if (flx_epoll_add(c->epoll_fd, c->completion_bell, EPOLLIN) != 0 ||
      flx_epoll_add(c->epoll_fd, c->sock, EPOLLRDHUP) != 0)
    return flx_error(FL_ERR_RESOURCES, "cannot watch the doorbell and the attach socket: %s",
                     strerror(errno));
  c->socket_watched = 1;
  if (!c->auto_reattach) return FL_OK;
  c->retry_tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (c->retry_tfd < 0 || flx_epoll_add(c->epoll_fd, c->retry_tfd, EPOLLIN) != 0)
    return flx_error(FL_ERR_RESOURCES, "cannot make the auto_reattach timer: %s", strerror(errno));
  return FL_OK;
}

/* Sets the retry timer to `at_ms` (CLOCK_MONOTONIC; 0 disarms) and clears an
 * expiry not read yet. */
static void flx_set_retry_timer(fl_client* c, int64_t at_ms) {
  if (c->retry_tfd < 0) return;
  uint64_t expirations;
  ssize_t n = read(c->retry_tfd, &expirations, sizeof(expirations));
  (void)n;
  struct itimerspec its;
  memset(&its, 0, sizeof(its));
  if (at_ms > 0) {
    its.it_value.tv_sec = (time_t)(at_ms / 1000);
    its.it_value.tv_nsec = (long)(at_ms % 1000) * 1000000;
  }
  (void)timerfd_settime(c->retry_tfd, at_ms > 0 ? TFD_TIMER_ABSTIME : 0, &its, NULL);
}

/* Daemon gone, not attached again yet (mu held): the dead socket leaves the
 * set (it would keep the fd readable), the timer says when to look again. */
static void flx_park_locked(fl_client* c, int64_t at_ms) {
  if (c->socket_watched) {
    (void)epoll_ctl(c->epoll_fd, EPOLL_CTL_DEL, c->sock, NULL);
    c->socket_watched = 0;
  }
  flx_set_retry_timer(c, at_ms);
}

/* Refused for good (mu held): no more attempts; the dead socket goes back
 * into the set, so fl_doorbell_fd stays readable and an event loop learns of
 * the end from its next call. */
static void flx_unpark_locked(fl_client* c) {
  flx_set_retry_timer(c, 0);
  if (!c->socket_watched && flx_epoll_add(c->epoll_fd, c->sock, EPOLLRDHUP) == 0) c->socket_watched = 1;
}

int flx_refusal_is_final(int status) {
  return status == FL_ERR_LIMIT || status == FL_ERR_ATTACH_REFUSED || status == FL_ERR_VERSION ||
         status == FL_ERR_BAD_REQUEST;
}

/*
 * A segment of an earlier attachment: replaced in place by private anonymous
 * memory, so that the daemon's memfd (maybe hugepages) is freed while a
 * pointer the application kept into it stays harmless until fl_detach.
 */
void flx_retire_locked(fl_client* c, uint8_t* addr, size_t len) {
  if (!addr) return;
  struct flx_region* grown =
      (struct flx_region*)realloc(c->retired, (c->retired_count + 1) * sizeof(struct flx_region));
  void* p = grown ? mmap(addr, len, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0)
                  : MAP_FAILED;
  if (grown) c->retired = grown;
  if (p == MAP_FAILED) {
    munmap(addr, len);
    return;
  }
  c->retired[c->retired_count++] = (struct flx_region){addr, len};
}

/* The new attachment's fd takes the number of the old one (closing the old
 * file), so that nobody holding the number is left with a closed fd. */
static void flx_adopt_fd(int* old_fd, int new_fd) {
  if (*old_fd >= 0 && dup3(new_fd, *old_fd, O_CLOEXEC) >= 0) {
    close(new_fd);
    return;
  }
  if (*old_fd >= 0) close(*old_fd);
  *old_fd = new_fd;
}

/* The old attachment's segments are retired (see flx_retire_locked) and c
 * points into n's segments instead: the mappings, the geometry and the rings
 * and slots within them. */
static void flx_adopt_segments_locked(fl_client* c, const fl_client* n) {
  flx_retire_locked(c, c->data, c->data_len);
  flx_retire_locked(c, c->control, c->control_len);
  flx_lent_retire_all_locked(c);
  c->control = n->control;
  c->control_len = n->control_len;
  c->data = n->data;
  c->data_len = n->data_len;
  c->geo = n->geo;
  c->live_hdr = n->live_hdr;
  c->submit = n->submit;
  c->completion = n->completion;
  c->ring_cap = n->ring_cap;
  c->slot_count = n->slot_count;
  c->slot_size = n->slot_size;
  c->slot_stride = n->slot_stride;
  c->slot_headers = n->slot_headers;
  c->slot_header_stride = n->slot_header_stride;
  c->slots = n->slots;
}

/* c takes n's per-slot bookkeeping, freeing its own; n is left without it. */
static void flx_adopt_slot_state_locked(fl_client* c, fl_client* n) {
  free(c->slot_state);
  free(c->slot_want_crc);
  free(c->slot_lent);
  free(c->slot_gap);
  free(c->free_list);
  c->slot_state = n->slot_state;
  c->slot_want_crc = n->slot_want_crc;
  c->slot_lent = n->slot_lent;
  c->slot_gap = n->slot_gap;
  c->free_list = n->free_list;
  c->free_count = n->free_count;
  n->slot_state = NULL;
  n->slot_want_crc = NULL;
  n->slot_lent = NULL;
  n->slot_gap = NULL;
  n->free_list = NULL;
}

/* fl_reattach with reattach_mu held. */
static int flx_reattach_serialized(fl_client* c) {
  pthread_mutex_lock(&c->mu);
  int stale = flx_gone_locked(c) || c->corrupt;
  pthread_mutex_unlock(&c->mu);
  if (!stale && !flx_socket_hung_up(c)) return FL_OK; /* still served: nothing to do */

  fl_client* n = NULL;
  int rc = flx_attach_at(c->socket_path, &c->request, c->attach_timeout_ms, &n);
  if (rc != FL_OK) return rc;

  pthread_mutex_lock(&c->mu);
  if (c->role == FL_PRODUCER) {
    /* Outcomes the old daemon wrote before it went are still in its ring;
     * whatever is in flight after that ends as unknown. */
    if (!c->corrupt) (void)flx_drain_completions_locked(c, 1);
    flx_fail_orphans_locked(c, FL_ERR_DAEMON_GONE);
  }
  /* Out of the set while the numbers still name the old files (epoll knows
   * a file by its number and the file together). */
  if (c->socket_watched) (void)epoll_ctl(c->epoll_fd, EPOLL_CTL_DEL, c->sock, NULL);
  (void)epoll_ctl(c->epoll_fd, EPOLL_CTL_DEL, c->completion_bell, NULL);
  flx_adopt_fd(&c->sock, n->sock);
  flx_adopt_fd(&c->control_fd, n->control_fd);
  flx_adopt_fd(&c->data_fd, n->data_fd);
  flx_adopt_fd(&c->submit_bell, n->submit_bell);
  flx_adopt_fd(&c->completion_bell, n->completion_bell);
  const int watch_err = flx_epoll_add(c->epoll_fd, c->completion_bell, EPOLLIN) != 0 ||
                                flx_epoll_add(c->epoll_fd, c->sock, EPOLLRDHUP) != 0
                            ? errno
                            : 0;
  c->socket_watched = watch_err == 0;
  c->next_reattach_ms = 0;
  c->reattach_error[0] = '\0';
  c->refused = 0;
  flx_set_retry_timer(c, 0);
  flx_adopt_segments_locked(c, n);
  flx_adopt_slot_state_locked(c, n);
  flx_resolve_wait_spin(c);
  __atomic_store_n(&c->in_flight, 0, __ATOMIC_RELAXED);
  c->armed = 0; /* the new doorbell is rung once a call finds nothing again */
  c->corrupt = 0;
  __atomic_store_n(&c->generation, c->generation + 1, __ATOMIC_RELAXED);
  __atomic_store_n(&c->gone, 0, __ATOMIC_RELEASE);
  flx_notify_locked(c); /* waiters look again, at the new attachment */
  pthread_mutex_unlock(&c->mu);

  /* The new attachment's parts now belong to c; n keeps only its shell. */
  flx_free_shell(n);
  if (watch_err != 0)
    return flx_error(FL_ERR_RESOURCES,
                     "attached again, but fl_doorbell_fd cannot watch the new attachment (%s): the "
                     "blocking calls work, an event loop on the doorbell would not wake; detach",
                     strerror(watch_err));
  return FL_OK;
}

FL_API int fl_reattach(fl_client* c) {
  if (!c) return flx_error(FL_EINVAL, "fl_reattach: client is NULL");
  pthread_mutex_lock(&c->reattach_mu);
  int rc = flx_reattach_serialized(c);
  pthread_mutex_unlock(&c->reattach_mu);
  return rc;
}

int flx_auto_reattach_locked(fl_client* c, int64_t* retry_ms) {
  const int64_t now = flx_mono_ms();
  if (c->reattaching || now < c->next_reattach_ms) {
    /* The last try was too recent, or another thread is trying (that may
     * take longer than the interval: look again an interval from now, or
     * when it is done -- it wakes the waiters). */
    *retry_ms = c->reattaching ? now + c->reattach_interval_ms : c->next_reattach_ms;
    flx_park_locked(c, *retry_ms);
    return FL_EAGAIN;
  }
  c->reattaching = 1;
  c->next_reattach_ms = now + c->reattach_interval_ms;
  flx_set_retry_timer(c, 0);
  pthread_mutex_unlock(&c->mu);
  /* Without mu: connecting may take up to attach_timeout_ms, and
   * flx_reattach_serialized takes mu itself. */
  pthread_mutex_lock(&c->reattach_mu);
  const int rc = flx_reattach_serialized(c);
  pthread_mutex_unlock(&c->reattach_mu);
  char why[sizeof(c->reattach_error)];
  snprintf(why, sizeof(why), "%s", rc == FL_OK ? "" : fl_last_error());
  pthread_mutex_lock(&c->mu);
  c->reattaching = 0;
  if (c->followers > 0) pthread_cond_broadcast(&c->cv);
  if (rc == FL_OK && !flx_gone_locked(c)) return FL_OK;
  if (rc != FL_OK) memcpy(c->reattach_error, why, sizeof(why));
  if (flx_refusal_is_final(rc)) {
    c->refused = rc;
    flx_unpark_locked(c);
    return rc;
  }
  *retry_ms = c->next_reattach_ms;
  flx_park_locked(c, *retry_ms);
  return FL_EAGAIN;
}
