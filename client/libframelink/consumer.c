/*
 * Consumer side: deliveries from the completion ring, releases on the
 * submit ring.  A delivered slot lives in memory the consumer can only read;
 * its header is copied and validated before anything in it is used.  A
 * frame of a producer on the same host (FL_SLOT_LENT) is read where the
 * producer wrote it, in a segment the daemon lent us (lend.c).
 */
#include <string.h>

#include "client_internal.h"

static int flx_check_consumer(fl_client* c, const char* function) {
  if (!c) return flx_error(FL_EINVAL, "%s: client is NULL", function);
  if (c->role != FL_CONSUMER) return flx_role_error(function, "consumer");
  return FL_OK;
}

static int flx_try_receive(fl_client* c, void* arg) {
  fl_frame* out = (fl_frame*)arg;
  if (c->corrupt)
    return flx_error(FL_ERR_RING_CORRUPT, "this attachment saw corrupt shared memory earlier: detach");
  fl_completion_desc d;
  fl_ring_result r = fl_ring_pop(c->completion, c->ring_cap, sizeof(d), &d);
  if (r == FL_RING_EMPTY) return FL_EAGAIN;
  if (r == FL_RING_CORRUPT) return flx_corrupt_locked(c, "completion ring indices are impossible");
  flx_disarm_locked(c);
  if (d.status != FL_OK) {
    /* Not a frame: the daemon reports a problem with something we sent it,
     * e.g. the release of a slot it did not consider delivered. */
    return flx_error(d.status, "framelinkd rejected the release of slot %u: %s", d.slot,
                     fl_status_str(d.status));
  }
  if (d.slot >= c->slot_count)
    return flx_corrupt_locked(c, "delivery into slot %u, but there are only %u slots", d.slot, c->slot_count);
  if (c->slot_state[d.slot] != FLX_SLOT_FREE)
    return flx_corrupt_locked(c, "delivery into slot %u, which the application still holds", d.slot);

  fl_slot_header h;
  memcpy(&h, flx_slot_header(c, d.slot), sizeof(h));
  if (h.length > c->slot_size && !(h.flags & FL_SLOT_LENT)) /* a lent frame: checked against its segment */
    return flx_corrupt_locked(c, "slot %u header says %llu bytes, more than the slot size %llu", d.slot,
                              (unsigned long long)h.length, (unsigned long long)c->slot_size);
  if (h.attr_length > FL_MAX_ATTR_BYTES)
    return flx_corrupt_locked(c, "slot %u header has %u attribute bytes, at most %u are possible", d.slot,
                              h.attr_length, FL_MAX_ATTR_BYTES);

  const uint8_t* data = c->slots + (uint64_t)d.slot * c->slot_stride;
  uint32_t lent = 0;
  if (h.flags & FL_SLOT_LENT) {
    int rc = flx_lent_payload_locked(c, &h, &data, &lent);
    if (rc != FL_OK) return rc;
    ++lent; /* 0 means the consumer's own slot */
  }
  c->slot_lent[d.slot] = (uint8_t)lent;
  /* The completion's readers field is the gap for a consumer (shm_layout.h). */
  c->slot_gap[d.slot] = (h.flags & FL_SLOT_GAP) ? d.readers : 0;
  c->slot_state[d.slot] = FLX_SLOT_HELD;
  memset(out, 0, sizeof(*out));
  out->slot = d.slot;
  out->flags = h.flags & (uint32_t)(FL_SLOT_HAS_CRC32C | FL_SLOT_MAYBE_REDELIVERED | FL_SLOT_GAP |
                                    FL_SLOT_GROUP_ELSEWHERE);
  out->sequence = h.sequence;
  out->data = data;
  out->length = h.length;
  out->frame_id = h.frame_id;
  out->group_id = h.group_id;
  out->timestamp_ns = h.timestamp_ns;
  out->crc32c = h.crc32c;
  out->attr_length = h.attr_length;
  out->attrs = flx_slot_header(c, d.slot)->attrs;
  return FL_OK;
}

FL_API int fl_receive(fl_client* c, fl_frame* out, int timeout_ms) {
  int rc = flx_check_consumer(c, "fl_receive");
  if (rc != FL_OK) return rc;
  if (!out) return flx_error(FL_EINVAL, "fl_receive: out is NULL");
  return flx_wait(c, timeout_ms, flx_try_receive, out, "frame");
}

FL_API uint32_t fl_frame_gap(fl_client* c, uint32_t slot) {
  if (!c || c->role != FL_CONSUMER) return 0;
  pthread_mutex_lock(&c->mu);
  uint32_t gap = slot < c->slot_count && c->slot_state[slot] == FLX_SLOT_HELD ? c->slot_gap[slot] : 0;
  pthread_mutex_unlock(&c->mu);
  return gap;
}

FL_API int fl_release(fl_client* c, uint32_t slot) {
  int rc = flx_check_consumer(c, "fl_release");
  if (rc != FL_OK) return rc;
  pthread_mutex_lock(&c->mu);
  if (slot >= c->slot_count || c->slot_state[slot] != FLX_SLOT_HELD) {
    rc = flx_error(FL_ERR_DOUBLE_RELEASE,
                   "fl_release: slot %u is not held by this consumer (released twice, or never received)",
                   slot);
  } else if (c->corrupt) {
    rc = flx_error(FL_ERR_RING_CORRUPT, "this attachment saw corrupt shared memory earlier: detach");
  } else if (flx_gone_locked(c)) {
    c->slot_state[slot] = FLX_SLOT_FREE; /* nobody is left to give it back to */
    if (c->slot_lent[slot]) flx_lent_release_locked(c, c->slot_lent[slot] - 1u);
    c->slot_lent[slot] = 0;
    rc = flx_gone_error();
  } else {
    fl_submit_desc d = {.slot = slot, .flags = 0, .length = 0};
    fl_ring_result r = fl_ring_push(c->submit, c->ring_cap, sizeof(d), &d);
    if (r == FL_RING_CORRUPT) {
      rc = flx_corrupt_locked(c, "submit ring indices are impossible");
    } else if (r == FL_RING_FULL) {
      rc = flx_error(FL_EAGAIN, "fl_release: the submit ring is full; framelinkd is not draining it");
    } else {
      c->slot_state[slot] = FLX_SLOT_FREE;
      if (c->slot_lent[slot]) flx_lent_release_locked(c, c->slot_lent[slot] - 1u);
      c->slot_lent[slot] = 0;
    }
  }
  int wake = rc == FL_OK && fl_ring_reader_needs_wake(c->submit);
  pthread_mutex_unlock(&c->mu);
  if (wake) flx_ring_submit_doorbell(c);
  return rc;
}
