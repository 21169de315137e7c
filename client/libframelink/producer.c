/*
 * Producer side: the local free-slot list, metadata, submit, completions.
 *
 * Slot ownership is tracked locally so an application bug (submitting a
 * slot twice, writing a slot it gave back) is reported here, before the
 * daemon ever sees it.  Completions are drained from the ring whenever a
 * free slot is needed; they wait in a local queue until the application
 * polls them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

static int flx_check_producer(fl_client* c, const char* function) {
  if (!c) return flx_error(FL_EINVAL, "%s: client is NULL", function);
  if (c->role != FL_PRODUCER) return flx_role_error(function, "producer");
  return FL_OK;
}

int flx_queue_backlogged_locked(const fl_client* c) {
  return c->completions_wanted && c->queue_tail - c->queue_head == c->queue_cap;
}

/* Doubles the queue, keeping its order; 0 when there is no memory. */
static int flx_queue_grow_locked(fl_client* c) {
  if (c->queue_cap >= (1u << 30)) return 0;
  const uint32_t cap = c->queue_cap * 2;
  fl_completion* q = (fl_completion*)calloc(cap, sizeof(fl_completion));
  if (!q) return 0;
  uint32_t n = 0;
  for (uint64_t i = c->queue_head; i != c->queue_tail; ++i) q[n++] = c->queue[i & (c->queue_cap - 1)];
  free(c->queue);
  c->queue = q;
  c->queue_cap = cap;
  c->queue_head = 0;
  c->queue_tail = n;
  return 1;
}

static void flx_queue_push_locked(fl_client* c, const fl_completion* comp) {
  if (c->queue_tail - c->queue_head == c->queue_cap) {
    /* Only a forced drain or the orphans of a dead daemon (at most one per
     * slot) get here for an application that reads its completions: make
     * room.  One that never reads them keeps the newest. */
    if (!c->completions_wanted || !flx_queue_grow_locked(c)) {
      c->queue_head++;
      c->queue_dropped++;
    }
  }
  c->queue[c->queue_tail & (c->queue_cap - 1)] = *comp;
  c->queue_tail++;
}

/*
 * Frames the daemon will never complete: once it has dropped this attachment
 * (daemon_state DETACHED, stored after its last completion for us) or its
 * process is gone (killed), whatever is still in flight ends here, so every
 * submitted frame still gets exactly one completion.
 */
static int flx_daemon_finished_locked(fl_client* c) {
  if (__atomic_load_n(&c->live_hdr->daemon_state, __ATOMIC_ACQUIRE) == FL_DAEMON_DETACHED)
    return FL_ERR_SHUTDOWN;
  if (__atomic_load_n(&c->gone, __ATOMIC_ACQUIRE) && kill((pid_t)c->geo.daemon_pid, 0) != 0 && errno == ESRCH)
    return FL_ERR_DAEMON_GONE;
  return FL_OK;
}

void flx_fail_orphans_locked(fl_client* c, int status) {
  uint32_t failed = 0;
  for (uint32_t slot = 0; slot < c->slot_count; ++slot) {
    if (c->slot_state[slot] != FLX_SLOT_IN_FLIGHT) continue;
    const fl_slot_header* sh = flx_slot_header(c, slot); /* our own memory */
    fl_completion comp = {
        .slot = slot, .status = status, .sequence = 0, .frame_id = sh->frame_id, .length = 0};
    c->slot_state[slot] = FLX_SLOT_FREE;
    c->free_list[c->free_count++] = slot;
    __atomic_store_n(&c->in_flight, c->in_flight - 1, __ATOMIC_RELAXED);
    flx_queue_push_locked(c, &comp);
    ++failed;
  }
  if (failed > 0) flx_notify_locked(c);
}

int flx_drain_completions_locked(fl_client* c, int force) {
  if (c->corrupt)
    return flx_error(FL_ERR_RING_CORRUPT, "this attachment saw corrupt shared memory earlier: detach");
  /* Read before draining: completions pushed before DETACHED are then visible. */
  const int finished = c->in_flight > 0 ? flx_daemon_finished_locked(c) : FL_OK;
  for (uint32_t moved = 0;; ++moved) {
    if (!force && flx_queue_backlogged_locked(c)) {
      /* The rest stay in the ring, their slots in flight, until the
       * application reads: nothing is dropped (the ring holds every slot). */
      if (moved > 0) flx_notify_locked(c);
      return FL_OK;
    }
    fl_completion_desc d;
    fl_ring_result r = fl_ring_pop(c->completion, c->ring_cap, sizeof(d), &d);
    if (r == FL_RING_EMPTY) {
      if (moved > 0) flx_notify_locked(c); /* others may wait for a slot or a completion */
      if (finished != FL_OK) flx_fail_orphans_locked(c, finished);
      return FL_OK;
    }
    if (r == FL_RING_CORRUPT) return flx_corrupt_locked(c, "completion ring indices are impossible");
    flx_disarm_locked(c);
    if (d.slot >= c->slot_count)
      return flx_corrupt_locked(c, "completion names slot %u, but there are only %u slots", d.slot,
                                c->slot_count);
    if (c->slot_state[d.slot] != FLX_SLOT_IN_FLIGHT)
      return flx_corrupt_locked(c, "completion for slot %u, which is not in flight", d.slot);
    c->slot_state[d.slot] = FLX_SLOT_FREE;
    c->free_list[c->free_count++] = d.slot;
    __atomic_store_n(&c->in_flight, c->in_flight - 1, __ATOMIC_RELAXED);
    fl_completion comp = {.slot = d.slot,
                          .status = d.status,
                          .sequence = d.sequence,
                          .frame_id = d.frame_id,
                          .length = d.length,
                          .readers = d.readers,
                          .released = d.released};
    flx_queue_push_locked(c, &comp);
  }
}

static int flx_try_acquire(fl_client* c, void* arg) {
  fl_slot* out = (fl_slot*)arg;
  if (c->corrupt)
    return flx_error(FL_ERR_RING_CORRUPT, "this attachment saw corrupt shared memory earlier: detach");
  if (flx_gone_locked(c)) return flx_gone_error();
  if (c->free_count == 0) {
    int rc = flx_drain_completions_locked(c, 0);
    if (rc != FL_OK) return rc;
    if (c->free_count == 0) return FL_EAGAIN;
  }
  uint32_t slot = c->free_list[--c->free_count];
  c->slot_state[slot] = FLX_SLOT_HELD;
  c->slot_want_crc[slot] = 0;
  /* No stale metadata from the slot's previous frame goes out if the
   * application skips fl_set_meta. */
  memset(flx_slot_header(c, slot), 0, sizeof(fl_slot_header));
  out->index = slot;
  out->reserved = 0;
  out->data = c->slots + (uint64_t)slot * c->slot_stride;
  out->capacity = c->slot_size;
  return FL_OK;
}

FL_API int fl_acquire(fl_client* c, int timeout_ms, fl_slot* out) {
  int rc = flx_check_producer(c, "fl_acquire");
  if (rc != FL_OK) return rc;
  if (!out) return flx_error(FL_EINVAL, "fl_acquire: out is NULL");
  return flx_wait(c, timeout_ms, flx_try_acquire, out, "free slot (all slots are held or in flight)");
}

static int flx_check_held_locked(fl_client* c, uint32_t slot, const char* function) {
  if (slot >= c->slot_count)
    return flx_error(FL_EINVAL, "%s: slot %u is out of range (this attachment has %u slots)", function, slot,
                     c->slot_count);
  if (c->slot_state[slot] != FLX_SLOT_HELD)
    return flx_error(
        FL_EINVAL, "%s: slot %u is not held by the application (%s); acquire it with fl_acquire first",
        function, slot, c->slot_state[slot] == FLX_SLOT_IN_FLIGHT ? "it is in flight" : "it is free");
  return FL_OK;
}

FL_API int fl_set_meta(fl_client* c, uint32_t slot, const fl_frame_meta* meta) {
  int rc = flx_check_producer(c, "fl_set_meta");
  if (rc != FL_OK) return rc;
  if (!meta) return flx_error(FL_EINVAL, "fl_set_meta: meta is NULL");
  if (meta->attr_length > FL_MAX_ATTR_BYTES)
    return flx_error(FL_EINVAL, "fl_set_meta: %u attribute bytes, at most %u are allowed", meta->attr_length,
                     FL_MAX_ATTR_BYTES);
  if (meta->attr_length > 0 && !meta->attrs)
    return flx_error(FL_EINVAL, "fl_set_meta: attr_length is %u but attrs is NULL", meta->attr_length);
  if (meta->flags & ~(uint32_t)FL_META_CRC32C)
    return flx_error(FL_EINVAL, "fl_set_meta: unknown flags 0x%x", meta->flags & ~(uint32_t)FL_META_CRC32C);
  pthread_mutex_lock(&c->mu);
  rc = flx_check_held_locked(c, slot, "fl_set_meta");
  if (rc == FL_OK) {
    fl_slot_header* h = flx_slot_header(c, slot);
    memset(h, 0, sizeof(*h));
    h->frame_id = meta->frame_id;
    h->group_id = meta->group_id;
    h->timestamp_ns = meta->timestamp_ns;
    h->attr_length = meta->attr_length;
    if (meta->attr_length > 0) memcpy(h->attrs, meta->attrs, meta->attr_length);
    c->slot_want_crc[slot] = (meta->flags & FL_META_CRC32C) ? 1 : 0;
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

FL_API int fl_submit(fl_client* c, uint32_t slot, uint64_t length) {
  int rc = flx_check_producer(c, "fl_submit");
  if (rc != FL_OK) return rc;
  pthread_mutex_lock(&c->mu);
  if (c->corrupt) {
    rc = flx_error(FL_ERR_RING_CORRUPT, "this attachment saw corrupt shared memory earlier: detach");
  } else if (flx_gone_locked(c)) {
    rc = flx_gone_error();
  } else {
    rc = flx_check_held_locked(c, slot, "fl_submit");
  }
  if (rc == FL_OK && length > c->slot_size)
    rc = flx_error(FL_ERR_TOO_LARGE,
                   "fl_submit: frame of %llu bytes does not fit slot size %llu; attach with a larger "
                   "slot_size",
                   (unsigned long long)length, (unsigned long long)c->slot_size);
  if (rc != FL_OK) {
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  fl_slot_header* h = flx_slot_header(c, slot);
  const uint8_t* payload = c->slots + (uint64_t)slot * c->slot_stride;
  h->length = length;
  if (c->slot_want_crc[slot]) {
    /* A large frame takes milliseconds to checksum: do it without the lock.
     * The slot is the caller's, so nobody else may touch it meanwhile. */
    pthread_mutex_unlock(&c->mu);
    h->crc32c = fl_crc32c(0, payload, (size_t)length);
    h->flags |= FL_SLOT_HAS_CRC32C;
    pthread_mutex_lock(&c->mu);
    rc = flx_check_held_locked(c, slot, "fl_submit"); /* abandoned by another thread meanwhile? */
    if (rc != FL_OK) {
      pthread_mutex_unlock(&c->mu);
      return rc;
    }
  } else {
    h->crc32c = 0;
    h->flags &= ~(uint32_t)FL_SLOT_HAS_CRC32C;
  }
  fl_submit_desc d = {.slot = slot, .flags = 0, .length = length};
  fl_ring_result r = fl_ring_push(c->submit, c->ring_cap, sizeof(d), &d);
  if (r == FL_RING_CORRUPT) {
    rc = flx_corrupt_locked(c, "submit ring indices are impossible");
  } else if (r == FL_RING_FULL) {
    /* Cannot happen with a working daemon (the ring holds every slot); the
     * slot stays held so the caller may retry or abandon it. */
    rc = flx_error(FL_EAGAIN, "fl_submit: the submit ring is full; framelinkd is not draining it");
  } else {
    c->slot_state[slot] = FLX_SLOT_IN_FLIGHT;
    __atomic_store_n(&c->in_flight, c->in_flight + 1, __ATOMIC_RELAXED);
  }
  int wake = rc == FL_OK && fl_ring_reader_needs_wake(c->submit);
  pthread_mutex_unlock(&c->mu);
  if (wake) flx_ring_submit_doorbell(c);
  return rc;
}

FL_API int fl_abandon(fl_client* c, uint32_t slot) {
  int rc = flx_check_producer(c, "fl_abandon");
  if (rc != FL_OK) return rc;
  pthread_mutex_lock(&c->mu);
  rc = flx_check_held_locked(c, slot, "fl_abandon");
  if (rc == FL_OK) {
    c->slot_state[slot] = FLX_SLOT_FREE;
    c->free_list[c->free_count++] = slot;
    flx_notify_locked(c);
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

typedef struct flx_batch {
  unsigned char* out; /* the application's fl_completion array, of its element size */
  size_t max;
  size_t count;
} flx_batch;

static void flx_take_queued_locked(fl_client* c, flx_batch* b) {
  while (b->count < b->max && c->queue_head != c->queue_tail) {
    memcpy(b->out + b->count++ * c->completion_size, &c->queue[c->queue_head & (c->queue_cap - 1)],
           c->completion_size);
    c->queue_head++;
  }
}

static int flx_try_completions(fl_client* c, void* arg) {
  flx_batch* b = (flx_batch*)arg;
  c->completions_wanted = 1;
  const int was_backlogged = flx_queue_backlogged_locked(c);
  /* Oldest first: the queue, then what the ring adds behind it (reading
   * the queue first makes room, so a backlogged ring moves on). */
  flx_take_queued_locked(c, b);
  int rc = flx_drain_completions_locked(c, 0);
  flx_take_queued_locked(c, b);
  if (was_backlogged && b->count > 0) flx_notify_locked(c); /* acquirers waited on us, not the ring */
  /* Completions already drained are handed out even if the ring then
   * turned out to be corrupt; the error comes on the next call. */
  if (b->count > 0) return FL_OK;
  return rc != FL_OK ? rc : FL_EAGAIN;
}

FL_API int fl_poll_completions(fl_client* c, fl_completion* out, size_t max, size_t* count) {
  if (count) *count = 0;
  int rc = flx_check_producer(c, "fl_poll_completions");
  if (rc != FL_OK) return rc;
  if (!count || (!out && max > 0)) return flx_error(FL_EINVAL, "fl_poll_completions: out or count is NULL");
  if (max == 0) return FL_OK;
  flx_batch b = {.out = (unsigned char*)out, .max = max, .count = 0};
  rc = flx_wait(c, 0, flx_try_completions, &b, "completion");
  *count = b.count;
  /* Polling is not an error when nothing completed yet. */
  return rc == FL_EAGAIN ? FL_OK : rc;
}

FL_API int fl_wait_completions(fl_client* c, fl_completion* out, size_t max, size_t* count, int timeout_ms) {
  if (count) *count = 0;
  int rc = flx_check_producer(c, "fl_wait_completions");
  if (rc != FL_OK) return rc;
  if (!count || !out || max == 0)
    return flx_error(FL_EINVAL, "fl_wait_completions: out or count is NULL, or max is 0");
  flx_batch b = {.out = (unsigned char*)out, .max = max, .count = 0};
  rc = flx_wait(c, timeout_ms, flx_try_completions, &b, "completion");
  *count = b.count;
  return rc;
}

FL_API int fl_in_flight(const fl_client* c, uint32_t* count) {
  if (!c || !count) return flx_error(FL_EINVAL, "fl_in_flight: client or count is NULL");
  if (c->role != FL_PRODUCER) return flx_role_error("fl_in_flight", "producer");
  *count = __atomic_load_n(&c->in_flight, __ATOMIC_RELAXED);
  return FL_OK;
}
