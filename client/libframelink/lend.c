/*
 * Consumer: segments of producers attached to the same daemon, lent read-only
 * so that their frames reach this consumer without a copy (attach_proto.h,
 * fl_lend_message).  The daemon sends a segment's fd on the attach socket
 * before the first frame that points into it, and a retirement before the
 * frame that needs its place, so the socket is read only when a frame names
 * a lend id we do not know yet.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_internal.h"

static struct flx_lent* flx_lent_find(fl_client* c, uint64_t id) {
  for (uint32_t i = 0; i < FL_LEND_MAX; ++i) {
    if (c->lent[i].used && !c->lent[i].retired && c->lent[i].id == id) return &c->lent[i];
  }
  return NULL;
}

static void flx_lent_drop(struct flx_lent* l) {
  if (l->base) munmap(l->base, l->len);
  memset(l, 0, sizeof(*l));
}

/* One fl_lend_message from the socket.  1: one was read; 0: none waiting;
 * -1: an error (set, and the attachment is corrupt or gone). */
static int flx_lent_read_one(fl_client* c) {
  fl_lend_message m;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * FLX_MAX_FDS)];
  } u;
  struct iovec iov = {.iov_base = &m, .iov_len = sizeof(m)};
  struct msghdr msg = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
  ssize_t n = recvmsg(c->sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
  if (n <= 0) {
    __atomic_store_n(&c->gone, 1, __ATOMIC_RELEASE);
    (void)flx_error(FL_ERR_DAEMON_GONE, "framelinkd closed the attach socket");
    return -1;
  }
  /* A segment travels with one fd; any others would leak if left open. */
  int got[FLX_MAX_FDS];
  const int ngot = flx_collect_fds(&msg, got);
  int fd = ngot > 0 ? got[0] : -1;
  if (ngot > 1) flx_close_fds(got + 1, ngot - 1);
  int rc = 1;
  if ((size_t)n != sizeof(m) || m.magic != FL_LEND_MAGIC || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    (void)flx_corrupt_locked(c, "framelinkd sent a message of %zd bytes that is no lend message", n);
    rc = -1;
  } else if (m.kind == FL_LEND_RETIRE) {
    struct flx_lent* l = flx_lent_find(c, m.lend_id);
    if (l && l->holds == 0) {
      flx_lent_drop(l);
    } else if (l) {
      l->retired = 1;
    }
  } else if (m.kind != FL_LEND_SEGMENT || fd < 0) {
    (void)flx_corrupt_locked(c, "framelinkd sent lend message kind %u %s a segment", m.kind,
                             fd < 0 ? "without" : "with");
    rc = -1;
  } else if (m.slot_count == 0 || m.slots_offset > m.data_size || m.slot_size > m.slot_stride ||
             (m.data_size - m.slots_offset) / m.slot_stride < m.slot_count) {
    (void)flx_corrupt_locked(c, "lent segment %llu has impossible geometry", (unsigned long long)m.lend_id);
    rc = -1;
  } else if (flx_lent_find(c, m.lend_id)) {
    /* Lent again: a daemon that took this attachment over from another (a hot
     * restart) does not know what was lent before.  A lend id is its
     * producer's client id, one segment for that producer's life: the
     * mapping we have is that segment. */
  } else {
    struct flx_lent* free_entry = NULL;
    for (uint32_t i = 0; i < FL_LEND_MAX && !free_entry; ++i) {
      if (!c->lent[i].used) free_entry = &c->lent[i];
    }
    void* p = free_entry ? mmap(NULL, m.data_size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (!free_entry) {
      (void)flx_corrupt_locked(c, "framelinkd lent more than %u segments at once", FL_LEND_MAX);
      rc = -1;
    } else if (p == MAP_FAILED) {
      (void)flx_error(FL_ERR_RESOURCES, "cannot map the segment framelinkd lent (%llu bytes): %s",
                      (unsigned long long)m.data_size, strerror(errno));
      rc = -1;
    } else {
      *free_entry = (struct flx_lent){.id = m.lend_id,
                                      .base = (uint8_t*)p,
                                      .len = m.data_size,
                                      .slots_offset = m.slots_offset,
                                      .slot_stride = m.slot_stride,
                                      .slot_size = m.slot_size,
                                      .slot_count = m.slot_count,
                                      .used = 1};
    }
  }
  if (fd >= 0) close(fd);
  return rc;
}

int flx_lent_payload_locked(fl_client* c, const fl_slot_header* h, const uint8_t** data, uint32_t* index) {
  uint64_t id;
  memcpy(&id, h->reserved1, sizeof(id));
  struct flx_lent* l = flx_lent_find(c, id);
  /* Its segment was sent ahead of the frame: read until it is known. */
  while (!l) {
    int r = flx_lent_read_one(c);
    if (r < 0) return c->corrupt ? FL_ERR_RING_CORRUPT : FL_ERR_DAEMON_GONE;
    if (r == 0)
      return flx_corrupt_locked(c, "a frame in segment %llu, which framelinkd never lent",
                                (unsigned long long)id);
    l = flx_lent_find(c, id);
  }
  const uint32_t slot = h->reserved0;
  if (slot >= l->slot_count || h->length > l->slot_size)
    return flx_corrupt_locked(c, "a lent frame of %llu bytes in slot %u of a segment with %u slots of %llu",
                              (unsigned long long)h->length, slot, l->slot_count,
                              (unsigned long long)l->slot_size);
  *data = l->base + l->slots_offset + (uint64_t)slot * l->slot_stride;
  *index = (uint32_t)(l - c->lent);
  ++l->holds;
  return FL_OK;
}

void flx_lent_release_locked(fl_client* c, uint32_t index) {
  if (index >= FL_LEND_MAX) return;
  struct flx_lent* l = &c->lent[index];
  if (l->holds > 0) --l->holds;
  if (l->retired && l->holds == 0) flx_lent_drop(l);
}

void flx_lent_unmap_all(fl_client* c) {
  for (uint32_t i = 0; i < FL_LEND_MAX; ++i) flx_lent_drop(&c->lent[i]);
}

void flx_lent_retire_all_locked(fl_client* c) {
  for (uint32_t i = 0; i < FL_LEND_MAX; ++i) {
    if (!c->lent[i].used) continue;
    flx_retire_locked(c, c->lent[i].base, c->lent[i].len);
    memset(&c->lent[i], 0, sizeof(c->lent[i]));
  }
}
