/*
 * The state behind an fl_client handle and the helpers its source files
 * share.  Not installed.
 *
 * Everything read from shared memory is either copied before it is trusted
 * (segment geometry is copied once at attach, ring entries and slot headers
 * are copied and validated per use) or is a single atomic word
 * (daemon_state, ring indices).
 */
#ifndef FRAMELINK_CLIENT_INTERNAL_H
#define FRAMELINK_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "framelink/attach_proto.h"
#include "framelink/framelink.h"
#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"

#if defined(__GNUC__)
#define FLX_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FLX_PRINTF(fmt, args)
#endif

/* Local view of one slot.  Producer: FREE -> HELD (acquired) -> IN_FLIGHT
 * (submitted) -> FREE (completion seen).  Consumer: FREE (the daemon's) ->
 * HELD (delivered to the application) -> FREE (released). */
enum flx_slot_state {
  FLX_SLOT_FREE = 0,
  FLX_SLOT_HELD = 1,
  FLX_SLOT_IN_FLIGHT = 2,
};

struct fl_client {
  pthread_mutex_t mu; /* guards everything below marked [mu] */

  /* Immutable after attach. */
  uint32_t role; /* FL_PRODUCER / FL_CONSUMER */
  int sock;      /* attach socket: kept open, its closing is the detach */
  int control_fd;
  int data_fd;
  /* The doorbells: our end of a SOCK_DGRAM socket pair (submit) and of a pipe
   * (completion), attach_proto.h. */
  int submit_bell;     /* we write it to wake the daemon */
  int completion_bell; /* the daemon rings it; we drain it (O_NONBLOCK) */
  int kick_efd;        /* our own eventfd, made by the first poller: wakes it (guarded by mu) */
  int epoll_fd;  /* fl_doorbell_fd: completion doorbell + attach socket (+ retry_tfd); lives as long as c */
  int retry_tfd; /* auto_reattach: timerfd in epoll_fd, due when the next attempt is */
  uint8_t* control;
  size_t control_len;
  uint8_t* data;
  size_t data_len;
  fl_segment_header geo;             /* validated private copy of the header */
  const fl_segment_header* live_hdr; /* shared: only daemon_state is read */
  fl_ring_header* submit;            /* we write */
  fl_ring_header* completion;        /* we read */
  uint32_t ring_cap;
  uint32_t slot_count;
  uint64_t slot_size;
  uint64_t slot_stride;
  uint8_t* slot_headers; /* consumer: mapped read-only; see flx_slot_header() */
  uint64_t slot_header_stride;
  uint8_t* slots;

  uint8_t* slot_state;    /* [mu] enum flx_slot_state per slot */
  uint8_t* slot_want_crc; /* [mu] producer: FL_META_CRC32C was set for the held slot */
  uint8_t* slot_lent;     /* [mu] consumer: 1 + index in lent[] of the held frame's segment, 0: its own */
  uint32_t* slot_gap;     /* [mu] consumer: frames missed before the held frame (fl_frame_gap) */
  uint32_t* free_list;    /* [mu] producer: stack of FREE slots */
  uint32_t free_count;    /* [mu] */

  /* Producer: completions drained from the ring (to find free slots) but not
   * yet returned by fl_poll/wait_completions.  Bounded.  Once the
   * application has asked for completions (completions_wanted) none is ever
   * dropped: a full queue leaves the rest in the completion ring, their
   * slots stay in flight, and fl_acquire waits until the application reads
   * (backpressure).  An application that never asks keeps acquiring; the
   * oldest completions are dropped for it (counted in queue_dropped). */
  fl_completion* queue;   /* [mu] */
  uint32_t queue_cap;     /* [mu] power of two */
  uint64_t queue_head;    /* [mu] */
  uint64_t queue_tail;    /* [mu] */
  uint64_t queue_dropped; /* [mu] */
  int completions_wanted; /* [mu] */

  uint32_t in_flight; /* atomic: written under mu, read lock-free by fl_in_flight */

  /* Waiting.  One thread at a time (the poller) sleeps in poll() on the
   * completion doorbell (completion_bell) and the attach socket; other
   * waiters (followers) sleep on `cv` and are woken whenever the poller
   * returns or the local state changes.  reader_sleeping must be set while a
   * poller sleeps or while an asynchronous user found nothing and may now
   * wait on fl_doorbell_fd (armed). */
  pthread_cond_t cv;         /* CLOCK_MONOTONIC */
  int poller_active;         /* [mu] */
  uint32_t followers;        /* [mu] */
  int armed;                 /* [mu] */
  int64_t socket_checked_ns; /* [mu] last look at the attach socket by an empty non-blocking call */

  int gone;    /* atomic: the daemon dropped this attachment (latched) */
  int corrupt; /* [mu] the daemon wrote impossible ring/slot contents (latched) */

  /* For fl_reattach: what fl_attach asked for, and where. */
  fl_attach_request request;
  char socket_path[108];         /* sizeof(sockaddr_un.sun_path) */
  uint32_t attach_timeout_ms;    /* from the options, for fl_reattach */
  int auto_reattach;             /* from the options */
  uint32_t completion_size;      /* bytes of each fl_completion the application reads (its header's) */
  uint32_t reattach_interval_ms; /* from the options (0 replaced by the default) */
  /* What the application chose (options, environment), in microseconds, or
   * FLX_WAIT_SPIN_ADVISED: what the daemon's segment header advises. */
  uint32_t wait_spin_choice;
  /* atomic: a blocking wait looks this long before it sleeps; the choice
   * resolved against each attachment's header (flx_resolve_wait_spin). */
  int64_t wait_spin_ns;
  pthread_mutex_t reattach_mu; /* one reattach at a time; taken before mu, never while holding it */
  int reattaching;             /* [mu] a call is inside an automatic reattach */
  int socket_watched;          /* [mu] the attach socket is in epoll_fd (not while parked) */
  int64_t next_reattach_ms;    /* [mu] CLOCK_MONOTONIC: no automatic attempt before */
  char reattach_error[256];    /* [mu] why the last automatic attempt failed */
  int refused;                 /* [mu] the final refusal that ended the automatic attempts, or 0 */
  uint32_t generation;         /* [mu] reattachments so far */
  /* Segments of earlier attachments, replaced by anonymous memory so that a
   * stale pointer into them cannot fault; unmapped by fl_detach. [mu] */
  struct flx_region {
    uint8_t* addr;
    size_t len;
  } * retired;
  uint32_t retired_count;
  /* Consumer: local producers' data segments the daemon lent us (lend.c),
   * mapped read-only.  [mu] */
  struct flx_lent {
    uint64_t id;
    uint8_t* base;
    size_t len;
    uint64_t slots_offset;
    uint64_t slot_stride;
    uint64_t slot_size;
    uint32_t slot_count;
    uint32_t holds; /* frames of it the application holds */
    int retired;    /* the daemon retired it: unmapped when the last frame is released */
    int used;
  } lent[FL_LEND_MAX];
};

/* Slot `slot`'s header (the caller has checked slot < slot_count). */
static inline fl_slot_header* flx_slot_header(const fl_client* c, uint32_t slot) {
  return (fl_slot_header*)(c->slot_headers + (uint64_t)slot * c->slot_header_stride);
}

/* error.c: set the thread-local message and return `status`. */
int flx_error(int status, const char* fmt, ...) FLX_PRINTF(2, 3);

/* wait.c */
typedef int (*flx_try_fn)(fl_client* client,
                          void* arg); /* called with mu held: FL_OK, FL_EAGAIN or an error */
/* Runs `try_fn` until it returns something other than FL_EAGAIN, sleeping on
 * the completion doorbell in between.  `what` names the awaited thing in
 * timeout messages ("a free slot"). */
int flx_wait(fl_client* client, int timeout_ms, flx_try_fn try_fn, void* arg, const char* what);
/* With mu held: 1 when the daemon is known to be gone (latched flag or the
 * header's daemon_state); no system call. */
int flx_gone_locked(fl_client* client);
/* With mu held: a completion ring entry was consumed, so the application is
 * busy and no longer needs the doorbell. */
void flx_disarm_locked(fl_client* client);
/* With mu held: slots were freed or completions queued; wake the waiters
 * that might now succeed. */
void flx_notify_locked(fl_client* client);
/* With mu held: latch the corrupt state and set the message. */
int flx_corrupt_locked(fl_client* client, const char* fmt, ...) FLX_PRINTF(2, 3);
/* Wake the daemon through the submit doorbell. */
void flx_ring_submit_doorbell(fl_client* client);
int flx_gone_error(void);
/* Non-blocking check of the attach socket (takes mu): 1 when the daemon hung up. */
int flx_socket_hung_up(fl_client* client);
/* The same with mu held. */
int flx_socket_hung_up_locked(fl_client* client);
int flx_role_error(const char* function, const char* role);

/* lend.c, with mu held.  Where the payload of FL_SLOT_LENT frame `h` is:
 * FL_OK with *data and *index (in lent[]) set, or an error (corrupt). */
int flx_lent_payload_locked(fl_client* client, const fl_slot_header* h, const uint8_t** data,
                            uint32_t* index);
/* The application released a frame of lent[index]. */
void flx_lent_release_locked(fl_client* client, uint32_t index);
/* Every lent segment: unmapped (fl_detach) or retired like the client's own
 * segments (fl_reattach: a stale pointer stays harmless). */
void flx_lent_unmap_all(fl_client* client);
void flx_lent_retire_all_locked(fl_client* client);
/* reattach.c: replace [addr, addr+len) by anonymous memory until fl_detach. */
void flx_retire_locked(fl_client* client, uint8_t* addr, size_t len);
/* attach.c: connects to `path`, sends `req` and maps what the daemon hands
 * out, into a new client (no epoll fd: fl_attach adds it, fl_reattach keeps
 * its own). */
int flx_attach_at(const char* path, const fl_attach_request* req, uint32_t timeout_ms, fl_client** out);
/* attach.c: sets wait_spin_ns from wait_spin_choice and, when that is
 * FLX_WAIT_SPIN_ADVISED, the attachment's segment header (again after each
 * reattach: another daemon may advise otherwise). */
#define FLX_WAIT_SPIN_ADVISED 0xFFFFFFFEu
void flx_resolve_wait_spin(fl_client* client);
/* attach.c: frees a client that flx_attach_at made and nobody adopted. */
void flx_free_shell(fl_client* client);
int64_t flx_mono_ms(void);
/* handshake.c: the attach handshake on the daemon's socket. */
void flx_close_fds(int* fds, int n);
#define FLX_MAX_FDS 8 /* room for more than we expect, so extras are seen and closed */
struct msghdr;
/* Every SCM_RIGHTS descriptor in the message, at most FLX_MAX_FDS; returns how many. */
int flx_collect_fds(struct msghdr* msg, int got[FLX_MAX_FDS]);
int flx_connect(const char* path, int64_t deadline_ms, uint32_t timeout_ms, int* out_sock);
int flx_handshake(int s, const char* path, const fl_attach_request* req, int64_t deadline_ms,
                  uint32_t timeout_ms, fl_attach_reply* reply, int fds[FL_ATTACH_FD_COUNT]);

/* reattach.c: builds epoll_fd (and retry_tfd) for a new client. */
int flx_watch_init(fl_client* client);
/* reattach.c, for a call that found the daemon gone, with auto_reattach, mu
 * held (dropped while it connects): FL_OK when the client is attached again
 * (try again), FL_EAGAIN when not now: the daemon is not back, or the next
 * attempt is not due (*retry_ms: when it is, CLOCK_MONOTONIC); or the daemon's
 * final refusal (flx_refusal_is_final), which ends the attempts: it is kept
 * in client->refused and its reason in reattach_error. */
int flx_auto_reattach_locked(fl_client* client, int64_t* retry_ms);
/* A refusal that asking again gets unchanged (a per-client limit, the uid
 * policy, a version, a malformed request), as opposed to a daemon that is
 * not back yet or whose shared caps are taken now. */
int flx_refusal_is_final(int status);

/* producer.c: drain the completion ring into the local queue (mu held).
 * It stops at a full queue the application reads (see completions_wanted)
 * unless `force` (fl_reattach: the old ring is about to go away). */
int flx_drain_completions_locked(fl_client* client, int force);
/* producer.c: 1 when fl_acquire must wait for the application to read
 * completions: its queue is full and it has asked for them before (mu held). */
int flx_queue_backlogged_locked(const fl_client* client);
/* producer.c: every frame still in flight completes with `status` (mu held). */
void flx_fail_orphans_locked(fl_client* client, int status);

#endif /* FRAMELINK_CLIENT_INTERNAL_H */
