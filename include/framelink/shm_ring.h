/*
 * The SPSC ring protocol over fl_ring_header (shm_layout.h), shared by
 * framelinkd and libframelink.  Built in place over memory someone else
 * allocated: fl_ring_init() once (daemon), then one writer and one reader,
 * possibly in different processes.
 *
 * The reader never trusts what it reads: fl_ring_pop() copies an entry into
 * caller-owned memory, and callers validate the copy.  A corrupt index (a
 * writer that moved tail past head + capacity) is reported as FL_RING_CORRUPT
 * rather than read.
 */
#ifndef FRAMELINK_SHM_RING_H
#define FRAMELINK_SHM_RING_H

#include <stdint.h>
#include <string.h>

#include "framelink/shm_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fl_ring_result {
  FL_RING_OK = 0,
  FL_RING_EMPTY = 1,   /* pop: nothing to read */
  FL_RING_FULL = 2,    /* push: no room */
  FL_RING_CORRUPT = 3, /* indices are impossible: the other side wrote garbage */
} fl_ring_result;

static inline int fl_ring_is_pow2(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

/* Initialise a ring in place.  `capacity` must be a power of two. */
static inline void fl_ring_init(fl_ring_header* ring, uint32_t capacity, uint32_t entry_size) {
  memset(ring, 0, sizeof(*ring));
  ring->capacity = capacity;
  ring->entry_size = entry_size;
}

static inline uint8_t* fl_ring_entries(fl_ring_header* ring) { return (uint8_t*)(ring + 1); }

/*
 * Writer side.  `cap` and `esz` are the values the writer trusts (its own
 * copy from setup), never re-read from shared memory.
 */
static inline fl_ring_result fl_ring_push(fl_ring_header* ring, uint32_t cap, uint32_t esz,
                                          const void* entry) {
  uint64_t tail = __atomic_load_n(&ring->tail, __ATOMIC_RELAXED);
  uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_ACQUIRE);
  if (tail - head > cap) return FL_RING_CORRUPT;
  if (tail - head == cap) return FL_RING_FULL;
  memcpy(fl_ring_entries(ring) + (tail & (uint64_t)(cap - 1)) * esz, entry, esz);
  __atomic_store_n(&ring->tail, tail + 1, __ATOMIC_RELEASE);
  return FL_RING_OK;
}

/*
 * After one or more pushes: returns 1 when the reader asked to be woken
 * (the caller then rings the reader's doorbell).  The seq_cst fence pairs
 * with the reader's seq_cst store of reader_sleeping.
 */
static inline int fl_ring_reader_needs_wake(fl_ring_header* ring) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return __atomic_load_n(&ring->reader_sleeping, __ATOMIC_RELAXED) != 0;
}

/* Reader side: copy the next entry out into `out` (esz bytes). */
static inline fl_ring_result fl_ring_pop(fl_ring_header* ring, uint32_t cap, uint32_t esz, void* out) {
  uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
  uint64_t tail = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
  if (tail == head) return FL_RING_EMPTY;
  if (tail - head > cap) return FL_RING_CORRUPT;
  memcpy(out, fl_ring_entries(ring) + (head & (uint64_t)(cap - 1)) * esz, esz);
  __atomic_store_n(&ring->head, head + 1, __ATOMIC_RELEASE);
  return FL_RING_OK;
}

/* Number of readable entries (a snapshot). */
static inline uint64_t fl_ring_readable(fl_ring_header* ring) {
  uint64_t head = __atomic_load_n(&ring->head, __ATOMIC_RELAXED);
  uint64_t tail = __atomic_load_n(&ring->tail, __ATOMIC_ACQUIRE);
  return tail - head;
}

/*
 * Reader about to sleep: announce it, then re-check.  Returns 1 when the
 * ring is still empty (the caller may block on its doorbell), 0 when an entry
 * arrived meanwhile (the caller must not block; it should clear the flag).
 */
static inline int fl_ring_prepare_sleep(fl_ring_header* ring) {
  __atomic_store_n(&ring->reader_sleeping, 1u, __ATOMIC_SEQ_CST);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return fl_ring_readable(ring) == 0;
}

static inline void fl_ring_end_sleep(fl_ring_header* ring) {
  __atomic_store_n(&ring->reader_sleeping, 0u, __ATOMIC_RELAXED);
}

#ifdef __cplusplus
}
#endif

#endif /* FRAMELINK_SHM_RING_H */
