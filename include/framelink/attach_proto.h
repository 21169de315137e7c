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
 *
 * After the reply the daemon sends a consumer nothing but fl_lend_message:
 *   FL_LEND_SEGMENT  carries one fd with SCM_RIGHTS, a read-only file of a
 *                    local producer's data segment (mapping it writable, or
 *                    opening it again for writing, fails), named by lend_id
 *                    in the FL_SLOT_LENT frames that point into it;
 *   FL_LEND_RETIRE   no fd: lend_id names nothing any more, unmap it once no
 *                    frame of it is held.
 * Each goes before the completion entry of the frame that needs it, so a
 * consumer reads them only when it meets a lend id it does not know; the
 * daemon never lends one consumer more than FL_LEND_MAX segments at once.
 *
 * Admin requests (framelink stats / clients / links) use the same socket
 * with a message of their own kind, told apart by its magic:
 *
 *   client -> daemon   fl_admin_request (exactly one message)
 *   daemon -> client   fl_admin_reply; when status == FL_OK it carries one fd
 *                      with SCM_RIGHTS: a sealed memfd holding `json_size`
 *                      bytes of JSON (the daemon's counters, clients, links)
 *
 * and the daemon then closes the connection.  The snapshot travels in a
 * memfd, not in the socket, so a reply of any size is one small datagram
 * and an admin client that never reads cannot make the daemon wait.  Only
 * root, the daemon's own uid or gid and members of its admin group may ask;
 * anyone else gets FL_ERR_ATTACH_REFUSED with a message naming the rule.
 * The attach messages and FL_ATTACH_VERSION are unchanged by this: a daemon
 * that predates admin requests answers one with an fl_attach_reply refusing
 * a request of the wrong size.
 */
#ifndef FRAMELINK_ATTACH_PROTO_H
#define FRAMELINK_ATTACH_PROTO_H

#include <stdint.h>

#include "framelink/shm_layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_ATTACH_MAGIC 0x54414C46u /* "FLAT" */
/* 3: lent segments (fl_lend_message) and subscribers (FL_ATTACH_SUBSCRIBE); FL_ATTACH_PULL came
 * later in 3 (a daemon before it refuses the flag, saying so).
 * 2: the doorbells are datagram socket pairs (1: eventfds shared with the daemon); the
 * completion doorbell is now a pipe (its read end the client's), which clients of 2 and 3
 * read alike. */
#define FL_ATTACH_VERSION 3u
#define FL_ATTACH_FD_COUNT 4u
#define FL_CLIENT_NAME_MAX 64u
#define FL_ATTACH_MESSAGE_MAX 256u

typedef struct fl_attach_request {
  uint32_t magic;   /* FL_ATTACH_MAGIC */
  uint32_t version; /* FL_ATTACH_VERSION */
  uint32_t role;    /* enum fl_role */
  uint32_t slot_count;
  uint64_t slot_size;
  char stream[FL_STREAM_NAME_MAX];      /* NUL-terminated; the rule: fl_stream_name_valid() */
  char client_name[FL_CLIENT_NAME_MAX]; /* NUL-terminated, informational */
  uint32_t flags;                       /* enum fl_attach_flags; other bits must be 0 */
  uint32_t reserved;
} fl_attach_request;
enum fl_attach_flags {
  /* Consumer: every frame of the stream, not a share of them (a queue group member). */
  FL_ATTACH_SUBSCRIBE = 1u << 0,
  /* Consumer: frames of the stream from peers are pulled to this host while it is attached. */
  FL_ATTACH_PULL = 1u << 1,
};

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

#define FL_LEND_MAGIC 0x444E4C46u /* "FLND" */
#define FL_LEND_MAX 64u           /* segments lent to one consumer at a time */
enum fl_lend_kind {
  FL_LEND_SEGMENT = 1,
  FL_LEND_RETIRE = 2,
};
typedef struct fl_lend_message {
  uint32_t magic; /* FL_LEND_MAGIC */
  uint32_t kind;  /* enum fl_lend_kind */
  uint64_t lend_id;
  /* FL_LEND_SEGMENT: the segment's geometry (slot i's payload at
   * slots_offset + i * slot_stride, slot_size bytes); 0 otherwise. */
  uint64_t data_size;
  uint64_t slots_offset;
  uint64_t slot_stride;
  uint64_t slot_size;
  uint32_t slot_count;
  uint32_t reserved;
} fl_lend_message;
FL_STATIC_ASSERT(sizeof(fl_lend_message) == 56, "fl_lend_message size");
FL_STATIC_ASSERT(offsetof(fl_lend_message, lend_id) == 8, "lend_id offset");
FL_STATIC_ASSERT(offsetof(fl_lend_message, slot_count) == 48, "lend slot_count offset");

#define FL_ADMIN_MAGIC 0x44414C46u /* "FLAD" */
#define FL_ADMIN_VERSION 1u
#define FL_ADMIN_JSON_MAX (16u << 20) /* the daemon refuses to build a larger snapshot */

enum fl_admin_command {
  FL_ADMIN_SNAPSHOT = 1, /* counters, clients and links, as JSON */
  FL_ADMIN_RELOAD = 2,   /* read the configuration again and apply it (as SIGHUP); the outcome as JSON */
};

typedef struct fl_admin_request {
  uint32_t magic;   /* FL_ADMIN_MAGIC */
  uint32_t version; /* FL_ADMIN_VERSION */
  uint32_t command; /* enum fl_admin_command */
  uint32_t flags;   /* reserved, must be 0 */
  uint64_t reserved[2];
} fl_admin_request;

FL_STATIC_ASSERT(sizeof(fl_admin_request) == 32, "fl_admin_request size");
FL_STATIC_ASSERT(offsetof(fl_admin_request, command) == 8, "command offset");

typedef struct fl_admin_reply {
  uint32_t magic;    /* FL_ADMIN_MAGIC */
  uint32_t version;  /* FL_ADMIN_VERSION */
  int32_t status;    /* enum fl_status: FL_OK or why the request was refused */
  uint32_t fd_count; /* 1 when status == FL_OK, else 0 */
  uint64_t json_size;
  char message[FL_ATTACH_MESSAGE_MAX]; /* NUL-terminated: what was wrong and what to do */
} fl_admin_reply;

FL_STATIC_ASSERT(sizeof(fl_admin_reply) == 280, "fl_admin_reply size");
FL_STATIC_ASSERT(offsetof(fl_admin_reply, json_size) == 16, "json_size offset");
FL_STATIC_ASSERT(offsetof(fl_admin_reply, message) == 24, "admin message offset");

#ifdef __cplusplus
}
#endif

#endif /* FRAMELINK_ATTACH_PROTO_H */
