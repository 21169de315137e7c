/*
 * Local attach protocol between an application (libframelink) and
 * framelinkd: fixed-layout messages over an AF_UNIX SOCK_SEQPACKET socket.
 *
 *   client -> daemon   fl_attach_request (exactly one message)
 *   daemon -> client   fl_attach_reply; when status == FL_OK the message
 *                      carries, with SCM_RIGHTS, fds in this order:
 *                      [0] control segment memfd   (map read-write)
 *                      [1] data segment memfd      (producer: read-write,
 *                                                   consumer: read-only, sealed)
 *                      [2] submit doorbell: the client's end of a SOCK_DGRAM pair (write to wake the daemon)
 *                      [3] completion doorbell: the client's end of a SOCK_DGRAM pair (the daemon rings it)
 *
 * The socket then stays open for the life of the attachment; closing it is
 * the detach (or tells the daemon that the client died).  The daemon
 * identifies the peer with SO_PEERCRED.
 */
#ifndef FRAMELINK_ATTACH_PROTO_H
#define FRAMELINK_ATTACH_PROTO_H

#include <stdint.h>

#include "framelink/shm_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_ATTACH_MAGIC 0x54414C46u /* "FLAT" */
/* 2: the doorbells are datagram socket pairs (1: eventfds shared with the daemon). */
#define FL_ATTACH_VERSION 2u
#define FL_ATTACH_FD_COUNT 4u
#define FL_CLIENT_NAME_MAX 64u
#define FL_ATTACH_MESSAGE_MAX 256u

typedef struct fl_attach_request {
  uint32_t magic;   /* FL_ATTACH_MAGIC */
  uint32_t version; /* FL_ATTACH_VERSION */
  uint32_t role;    /* enum fl_role */
  uint32_t slot_count;
  uint64_t slot_size;
  char stream[FL_STREAM_NAME_MAX];      /* NUL-terminated, [A-Za-z0-9._-]+ */
  char client_name[FL_CLIENT_NAME_MAX]; /* NUL-terminated, informational */
  uint32_t flags;                       /* reserved, must be 0 */
  uint32_t reserved;
} fl_attach_request;

FL_STATIC_ASSERT(sizeof(fl_attach_request) == 160, "fl_attach_request size");
FL_STATIC_ASSERT(offsetof(fl_attach_request, slot_size) == 16, "slot_size offset");
FL_STATIC_ASSERT(offsetof(fl_attach_request, stream) == 24, "stream offset");
FL_STATIC_ASSERT(offsetof(fl_attach_request, client_name) == 88, "client_name offset");
FL_STATIC_ASSERT(offsetof(fl_attach_request, flags) == 152, "flags offset");

typedef struct fl_attach_reply {
  uint32_t magic;    /* FL_ATTACH_MAGIC */
  uint32_t version;  /* FL_ATTACH_VERSION */
  int32_t status;    /* enum fl_status: FL_OK or why the attach was refused */
  uint32_t fd_count; /* FL_ATTACH_FD_COUNT when status == FL_OK, else 0 */
  uint64_t client_id;
  uint64_t control_size;
  uint64_t data_size;
  char message[FL_ATTACH_MESSAGE_MAX]; /* NUL-terminated: what was wrong and what to do */
} fl_attach_reply;

FL_STATIC_ASSERT(sizeof(fl_attach_reply) == 296, "fl_attach_reply size");
FL_STATIC_ASSERT(offsetof(fl_attach_reply, client_id) == 16, "client_id offset");
FL_STATIC_ASSERT(offsetof(fl_attach_reply, message) == 40, "message offset");

#ifdef __cplusplus
}
#endif

#endif /* FRAMELINK_ATTACH_PROTO_H */
