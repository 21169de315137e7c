/*
 * framelink shared-memory ABI.
 *
 * This header is a wire protocol between framelinkd and every client library
 * (C, .NET, Python).  Fixed-width fields, explicit padding, offsets (never
 * pointers), a static assertion on every size and offset.  Bump
 * FL_LAYOUT_VERSION whenever anything here changes, but for a field carved
 * from reserved bytes whose zero means what older peers did (they write
 * zeros there and never read them).
 *
 * Each attached client gets two memfd segments:
 *
 *   control segment (client maps read-write)
 *     fl_segment_header                      at 0
 *     submit ring      (client -> daemon)    at header.submit_ring_offset
 *     completion ring  (daemon -> client)    at header.completion_ring_offset
 *
 *   data segment (producer maps read-write, consumer maps read-only)
 *     slot i's fl_slot_header   at slot_headers_offset + i * slot_header_stride
 *     slot i's payload          at slots_offset + i * slot_stride
 *
 * framelinkd lays each slot header immediately before its payload
 * (slot_header_stride == slot_stride, slots_offset == slot_headers_offset +
 * 256, payloads page aligned), so that one RDMA write lands a frame's header
 * and payload together.  Clients accept that shape and the plain one (a
 * packed header array, slot_header_stride == 256, apart from the slots).
 *
 * Producer: submit entries are frames to send, completion entries are their
 * terminal outcome (DELIVERED = FL_OK, or a failure status).
 * Consumer: completion entries are delivered frames, submit entries are
 * releases of slots the consumer is done with.
 */
#ifndef FRAMELINK_SHM_LAYOUT_H
#define FRAMELINK_SHM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define FL_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
extern "C" {
#else
#define FL_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define FL_SEGMENT_MAGIC UINT64_C(0x4B4E4C454D415246) /* "FRAMELNK" little-endian */
#define FL_LAYOUT_VERSION 4u
#define FL_CACHE_LINE 64u
#define FL_STREAM_NAME_MAX 64u /* bytes, including the terminating NUL */
/* The longest stream name: the NUL-terminated name must fit the fixed fields
 * that carry it (fl_attach_request.stream, fl_segment_header.stream_name). */
#define FL_STREAM_NAME_LEN_MAX (FL_STREAM_NAME_MAX - 1u)
#define FL_MAX_ATTR_BYTES 192u /* user attributes per frame */
#define FL_PAGE_SIZE 4096u
#define FL_HUGE_PAGE_SIZE (2u * 1024u * 1024u)

/*
 * The one stream-name rule, shared by the client library, the daemon's attach
 * check, its configuration (peer names and routes) and the peer protocol:
 * 1 to FL_STREAM_NAME_LEN_MAX (63) characters of [A-Za-z0-9._-].  `len` is
 * the name's length without a terminator; a NUL inside it makes the name
 * invalid.  For a fixed field that may lack its NUL, pass
 * strnlen(field, sizeof field): a full field (no NUL) is then too long.
 * Returns 1 when valid, 0 otherwise.
 */
static inline int fl_stream_name_valid(const char* name, size_t len) {
  size_t i;
  if (name == NULL || len == 0 || len > FL_STREAM_NAME_LEN_MAX) return 0;
  for (i = 0; i < len; ++i) {
    const char c = name[i];
    const int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
                   c == '_' || c == '-';
    if (!ok) return 0;
  }
  return 1;
}

enum fl_role {
  FL_ROLE_PRODUCER = 1,
  FL_ROLE_CONSUMER = 2,
};

/* fl_segment_header.daemon_state */
enum fl_daemon_state {
  FL_DAEMON_SERVING = 1,  /* the daemon serves this attachment */
  FL_DAEMON_DETACHED = 2, /* the daemon dropped this attachment (shutdown, error) */
};

/* fl_slot_header.flags */
enum fl_slot_flags {
  FL_SLOT_HAS_CRC32C = 1u << 0, /* crc32c holds the CRC32C of the payload */
  /* Consumer: the frame was sent again after the receiving daemon restarted.
   * The consumer of the daemon before the restart may have seen it already. */
  FL_SLOT_MAYBE_REDELIVERED = 1u << 1,
  /* Consumer: a frame of a producer attached to the same daemon, not copied:
   * the payload is in that producer's data segment, which the daemon lent
   * this consumer read-only (an fl_lend_message on the attach socket, see
   * attach_proto.h).  The slot header says where: reserved1 holds the lend
   * id (8 bytes, little-endian), reserved0 the producer's slot.  Everything
   * else in the header is the daemon's validated copy of the producer's. */
  FL_SLOT_LENT = 1u << 2,
  /* Consumer: frames of the stream were not delivered to this subscriber
   * before this one (a stream in the daemon's drop_streams, while it was
   * too far behind).  The completion's `readers` says how many. */
  FL_SLOT_GAP = 1u << 3,
  /* Consumer (a subscriber): a member of the stream's queue group on another
   * host got this frame; it came to this host for its subscribers only. */
  FL_SLOT_GROUP_ELSEWHERE = 1u << 4,
};

/*
 * One SPSC ring.  The header is followed by `capacity` entries of
 * `entry_size` bytes.  head and tail are free-running (never wrapped);
 * entry i lives at index (i & (capacity - 1)).
 *
 * Wake-up protocol: a reader about to sleep stores reader_sleeping = 1
 * (seq_cst), re-checks the ring, and only then blocks on its doorbell.  A
 * writer publishes tail (release), issues a seq_cst fence, and writes the
 * reader's doorbell only when reader_sleeping is set.  The hot path makes no
 * system call.
 */
typedef struct fl_ring_header {
  uint64_t tail; /* written by the writer: entries [head, tail) are readable */
  uint8_t pad0[FL_CACHE_LINE - 8];
  uint64_t head; /* written by the reader: entries before head are consumed */
  uint8_t pad1[FL_CACHE_LINE - 8];
  uint32_t reader_sleeping; /* 1 while the reader is (about to be) blocked */
  uint8_t pad2[FL_CACHE_LINE - 4];
  uint32_t capacity;   /* power of two, written once by the daemon */
  uint32_t entry_size; /* bytes per entry, written once by the daemon */
  uint8_t pad3[FL_CACHE_LINE - 8];
} fl_ring_header;

FL_STATIC_ASSERT(sizeof(fl_ring_header) == 4 * FL_CACHE_LINE, "fl_ring_header size");
FL_STATIC_ASSERT(offsetof(fl_ring_header, tail) == 0, "tail offset");
FL_STATIC_ASSERT(offsetof(fl_ring_header, head) == FL_CACHE_LINE, "head offset");
FL_STATIC_ASSERT(offsetof(fl_ring_header, reader_sleeping) == 2 * FL_CACHE_LINE, "sleep flag offset");
FL_STATIC_ASSERT(offsetof(fl_ring_header, capacity) == 3 * FL_CACHE_LINE, "capacity offset");
FL_STATIC_ASSERT(offsetof(fl_ring_header, entry_size) == 3 * FL_CACHE_LINE + 4, "entry_size offset");

/* Submit ring entry (client -> daemon).  Producer: a frame in `slot` of
 * `length` bytes.  Consumer: release of `slot` (length ignored). */
typedef struct fl_submit_desc {
  uint32_t slot;
  uint32_t flags; /* reserved, must be 0 */
  uint64_t length;
} fl_submit_desc;

FL_STATIC_ASSERT(sizeof(fl_submit_desc) == 16, "fl_submit_desc size");
FL_STATIC_ASSERT(offsetof(fl_submit_desc, slot) == 0, "submit slot offset");
FL_STATIC_ASSERT(offsetof(fl_submit_desc, flags) == 4, "submit flags offset");
FL_STATIC_ASSERT(offsetof(fl_submit_desc, length) == 8, "submit length offset");

/* Completion ring entry (daemon -> client).  Producer: terminal outcome of
 * the frame submitted from `slot` (status FL_OK = delivered).  Consumer: a
 * frame delivered into `slot` (status FL_OK). */
typedef struct fl_completion_desc {
  uint32_t slot;
  int32_t status; /* enum fl_status from framelink.h */
  uint64_t sequence;
  uint64_t length;
  uint64_t frame_id; /* producer: its slot header's at submit, whatever the status (0: FL_ERR_BAD_SLOT) */
  /* Producer: the readers the frame was meant for on every host, and how
   * many of them released it (when status is FL_OK, all but the subscribers
   * of a drop stream skipped for it).  Consumer: `readers` is
   * the frames of the stream it missed just before this one (the slot
   * header has FL_SLOT_GAP then), `released` 0. */
  uint32_t readers;
  uint32_t released;
} fl_completion_desc;

FL_STATIC_ASSERT(sizeof(fl_completion_desc) == 40, "fl_completion_desc size");
FL_STATIC_ASSERT(offsetof(fl_completion_desc, slot) == 0, "completion slot offset");
FL_STATIC_ASSERT(offsetof(fl_completion_desc, status) == 4, "completion status offset");
FL_STATIC_ASSERT(offsetof(fl_completion_desc, sequence) == 8, "completion sequence offset");
FL_STATIC_ASSERT(offsetof(fl_completion_desc, length) == 16, "completion length offset");
FL_STATIC_ASSERT(offsetof(fl_completion_desc, frame_id) == 24, "completion frame_id offset");
FL_STATIC_ASSERT(offsetof(fl_completion_desc, readers) == 32, "completion readers offset");
FL_STATIC_ASSERT(offsetof(fl_completion_desc, released) == 36, "completion released offset");

/* Per-slot frame metadata, in the data segment.  Producer: written by the
 * app before submit (the daemon copies and validates it).  Consumer: written
 * by the daemon before delivery (read-only to the app). */
typedef struct fl_slot_header {
  uint64_t frame_id;
  uint64_t group_id;
  uint64_t timestamp_ns;
  uint64_t length;   /* consumer: payload bytes delivered; producer: ignored */
  uint64_t sequence; /* consumer: per-(link, stream) sequence; producer: ignored */
  uint32_t crc32c;
  uint32_t flags;       /* enum fl_slot_flags */
  uint32_t attr_length; /* <= FL_MAX_ATTR_BYTES */
  /*
   * No application reads or writes these, but they are not unused.  On rdma
   * the frame header on the wire is this struct
   * (proxy/transport/rdma/rdma_wire.h), and the RDMA write lands it in the
   * consumer's slot header with
   *   reserved0  has_crc32c (0 or 1)
   *   reserved1  the sending daemon's id for the stream (8 bytes, little-endian)
   * A consumer's slot header holds those after a frame that came over rdma,
   * the lend of an FL_SLOT_LENT frame, and older bytes otherwise; a
   * producer's are ignored.  Moving or resizing
   * them changes the rdma wire as well.
   */
  uint32_t reserved0;
  uint8_t reserved1[8];
  uint8_t attrs[FL_MAX_ATTR_BYTES];
} fl_slot_header;

FL_STATIC_ASSERT(sizeof(fl_slot_header) == 256, "fl_slot_header size");
FL_STATIC_ASSERT(offsetof(fl_slot_header, frame_id) == 0, "frame_id offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, group_id) == 8, "group_id offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, timestamp_ns) == 16, "timestamp offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, length) == 24, "length offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, sequence) == 32, "sequence offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, crc32c) == 40, "crc32c offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, flags) == 44, "flags offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, attr_length) == 48, "attr_length offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, reserved0) == 52, "reserved0 offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, reserved1) == 56, "reserved1 offset");
FL_STATIC_ASSERT(offsetof(fl_slot_header, attrs) == 64, "attrs offset");

/* The first bytes of the control segment. */
typedef struct fl_segment_header {
  uint64_t magic;          /* FL_SEGMENT_MAGIC */
  uint32_t layout_version; /* FL_LAYOUT_VERSION */
  uint32_t role;           /* enum fl_role */
  uint64_t daemon_pid;
  uint64_t daemon_start_ns; /* CLOCK_REALTIME at daemon start: (pid, start) names a daemon instance */
  uint64_t client_id;
  uint32_t slot_count;
  uint32_t ring_capacity;          /* both rings; power of two >= slot_count */
  uint64_t slot_size;              /* usable bytes per slot */
  uint64_t slot_stride;            /* distance between consecutive slots, page aligned */
  uint64_t control_size;           /* bytes in the control segment */
  uint64_t submit_ring_offset;     /* in the control segment */
  uint64_t completion_ring_offset; /* in the control segment */
  uint64_t data_size;              /* bytes in the data segment */
  uint64_t slot_headers_offset;    /* in the data segment */
  uint64_t slots_offset;           /* in the data segment */
  uint32_t daemon_state;           /* enum fl_daemon_state */
  uint32_t data_on_hugepages;      /* 1 when the data segment uses 2 MiB pages */
  char stream_name[FL_STREAM_NAME_MAX];
  uint64_t slot_header_stride; /* distance between consecutive slot headers */
  /* The host's advice on how long a client's blocking wait spins before it
   * sleeps (the daemon's client_wait_spin_us), valid when spin_advice_flags
   * has FL_SPIN_ADVICE_SET.  A daemon from before these fields leaves both
   * zero (it zero-fills the header): no advice, the client's own default.
   * Carved from what was reserved, so the layout version stays. */
  uint32_t spin_advice_flags;   /* enum fl_spin_advice_flags */
  uint32_t client_wait_spin_us; /* microseconds; 0: do not spin */
  /* Pads the header to 256 bytes: 136 is the bytes of the fields other than
   * stream_name (120 before it, 16 after), so reserved starts at
   * 136 + FL_STREAM_NAME_MAX (asserted below). */
  uint8_t reserved[256 - 136 - FL_STREAM_NAME_MAX];
} fl_segment_header;

/* fl_segment_header.spin_advice_flags */
enum fl_spin_advice_flags {
  FL_SPIN_ADVICE_SET = 1u << 0, /* client_wait_spin_us holds the daemon's advice */
};

FL_STATIC_ASSERT(sizeof(fl_segment_header) == 256, "fl_segment_header size");
FL_STATIC_ASSERT(offsetof(fl_segment_header, magic) == 0, "magic offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, layout_version) == 8, "layout_version offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, role) == 12, "role offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, daemon_pid) == 16, "daemon_pid offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, daemon_start_ns) == 24, "daemon_start_ns offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, client_id) == 32, "client_id offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, slot_count) == 40, "slot_count offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, ring_capacity) == 44, "ring_capacity offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, slot_size) == 48, "slot_size offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, slot_stride) == 56, "slot_stride offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, control_size) == 64, "control_size offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, submit_ring_offset) == 72, "submit_ring_offset offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, completion_ring_offset) == 80, "completion_ring_offset offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, data_size) == 88, "data_size offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, slot_headers_offset) == 96, "slot_headers_offset offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, slots_offset) == 104, "slots_offset offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, daemon_state) == 112, "daemon_state offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, data_on_hugepages) == 116, "data_on_hugepages offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, stream_name) == 120, "stream_name offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, slot_header_stride) == 184, "slot_header_stride offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, spin_advice_flags) == 192, "spin_advice_flags offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, client_wait_spin_us) == 196, "client_wait_spin_us offset");
FL_STATIC_ASSERT(offsetof(fl_segment_header, reserved) == 136 + FL_STREAM_NAME_MAX, "reserved offset");

/* Sizes of a ring with `capacity` entries of `entry_size` bytes. */
static inline uint64_t fl_ring_bytes(uint32_t capacity, uint32_t entry_size) {
  return (uint64_t)sizeof(fl_ring_header) + (uint64_t)capacity * entry_size;
}

#ifdef __cplusplus
}
#endif

#endif /* FRAMELINK_SHM_LAYOUT_H */
