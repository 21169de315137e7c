/*
 * libframelink: the C ABI applications use to talk to framelinkd.
 *
 * Depends on libc only.  Every function returns an int status (FL_OK = 0 or
 * an fl_status); on failure fl_last_error() returns a thread-local message
 * that says what was wrong and what to do.  One handle type, fl_client, with
 * exactly one destroy function, fl_detach().
 *
 * Threading: an fl_client may be used from several threads at once; blocking
 * calls do not hold its internal lock while they sleep.
 *
 * Producer:
 *   fl_acquire -> write payload into slot.data -> fl_set_meta -> fl_submit
 *   fl_poll_completions / fl_wait_completions: one completion per submitted
 *   frame, status FL_OK (delivered to and released by the remote consumer)
 *   or a failure status; the slot is free again after its completion.
 * Consumer:
 *   fl_receive -> read frame.data (read-only memory) -> fl_release
 */
#ifndef FRAMELINK_FRAMELINK_H
#define FRAMELINK_FRAMELINK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FRAMELINK_BUILDING) && defined(__GNUC__)
#define FL_API __attribute__((visibility("default")))
#else
#define FL_API
#endif

#define FL_VERSION_MAJOR 0
#define FL_VERSION_MINOR 2
#define FL_VERSION_PATCH 0

/* Where framelinkd listens for attaches unless configured otherwise ([daemon] socket_path), and
 * where a client looks when neither its options nor $FRAMELINK_SOCKET name a socket. */
#define FL_DEFAULT_SOCKET_PATH "/run/framelink/framelinkd.sock"

/*
 * Status codes, grouped by blast radius.  Also used as completion statuses
 * in the shared-memory rings and as reasons in peer NACKs.
 */
typedef enum fl_status {
  FL_OK = 0, /* success; as a completion status: DELIVERED */

  /* 1..99: outcome of one call, nothing is broken */
  FL_EAGAIN = 1,    /* non-blocking call: nothing available now */
  FL_ETIMEDOUT = 2, /* blocking call: the timeout expired */
  FL_EINVAL = 3,    /* bad argument to the call */
  FL_EINTR = 4,     /* interrupted by a signal */
  FL_EBUSY = 5,     /* resource still in use */

  /* 100..199: one frame failed (completion statuses) */
  FL_ERR_BAD_SLOT = 100,       /* slot index out of range */
  FL_ERR_SLOT_NOT_OWNED = 101, /* slot is already in flight or not held by this client */
  FL_ERR_TOO_LARGE = 102,      /* length exceeds the producer's or the consumer's slot size */
  FL_ERR_BAD_METADATA = 103,   /* slot header invalid (attribute length, flags) */
  FL_ERR_BAD_DESCRIPTOR = 104, /* ring entry invalid (reserved flags set) */
  FL_ERR_DOUBLE_RELEASE = 105, /* consumer released a slot it does not hold */
  FL_ERR_NO_CONSUMER = 106,    /* no consumer took the frame before the credit timeout */
  FL_ERR_TIMEOUT = 107,        /* the frame was not acknowledged in time */
  FL_ERR_PEER_REJECTED = 108,  /* the remote daemon refused the frame (see its log) */
  FL_ERR_CRC_MISMATCH = 109,   /* payload CRC32C did not match */
  FL_ERR_NO_ROUTE = 110,       /* no peer is configured for this stream */
  FL_ERR_LINK_LOST = 111,      /* the link to the peer broke while the frame was in flight */
  FL_ERR_SHUTDOWN = 112,       /* the daemon is shutting down */
  FL_ERR_NO_LINK = 113,        /* the stream's peer has not linked since the daemon started */

  /* 200..299: this client's attachment */
  FL_ERR_DAEMON_UNREACHABLE = 200, /* cannot connect to the daemon socket */
  FL_ERR_ATTACH_REFUSED = 201,     /* policy refused this uid/gid */
  FL_ERR_QUOTA = 202,              /* the daemon's memory or client caps are taken now: may pass later */
  FL_ERR_VERSION = 203,            /* attach protocol or layout version mismatch */
  FL_ERR_BAD_REQUEST = 204,        /* malformed attach request (role, stream name, sizes) */
  FL_ERR_DAEMON_GONE = 205,        /* the daemon went away: reattach */
  FL_ERR_RESOURCES = 206,          /* the daemon could not allocate memory or fds */
  FL_ERR_RING_CORRUPT = 207,       /* the client's rings were corrupted: detached */
  FL_ERR_LIMIT = 208,              /* slot count/size or bytes over a per-client limit: final */

  /* 300..399: a peer link */
  FL_ERR_AUTH = 300,           /* peer presented a wrong or no token */
  FL_ERR_PEER_VERSION = 301,   /* peer speaks an incompatible protocol version */
  FL_ERR_PROTOCOL = 302,       /* peer sent a malformed or unexpected message */
  FL_ERR_UNKNOWN_STREAM = 303, /* peer referred to a stream that is not open */
  FL_ERR_UNKNOWN_CREDIT = 304, /* peer used a credit it was not granted */

  /* 400..499: the device / transport */
  FL_ERR_TRANSPORT = 400, /* the transport failed this frame (see the daemon log) */
  FL_ERR_DEVICE = 401,    /* the RDMA device failed: every link on it is down until it recovers */
} fl_status;

enum fl_client_role {
  FL_PRODUCER = 1,
  FL_CONSUMER = 2,
};

typedef struct fl_client fl_client;

typedef struct fl_client_options {
  uint32_t struct_size;    /* set by fl_client_options_init */
  uint32_t role;           /* FL_PRODUCER or FL_CONSUMER */
  const char* socket_path; /* NULL: $FRAMELINK_SOCKET, else FL_DEFAULT_SOCKET_PATH */
  const char* stream;      /* stream name, [A-Za-z0-9._-]{1,63} */
  const char* client_name; /* informational; NULL: the program name */
  uint32_t slot_count;     /* 0: the daemon's [limits] default_slot_count (8 unless configured) */
  uint32_t
      attach_timeout_ms; /* 0: 10000; bounds the connect and the daemon's reply (fl_attach, fl_reattach) */
  uint64_t slot_size;    /* 0: the daemon's [limits] default_slot_size (4 MiB unless configured) */
  /* Read only when struct_size covers them: an application built against the
   * header before them (FL_CLIENT_OPTIONS_SIZE_V1) gets their defaults. */
  /*
   * On by default (fl_client_options_init sets 1 unless $FRAMELINK_AUTO_REATTACH
   * is 0, off, no or false; an application built before this field gets the
   * same default).  Nonzero: a call that waits for work (fl_acquire, fl_poll_completions,
   * fl_wait_completions, fl_receive) and finds the daemon gone calls
   * fl_reattach itself, at most once every reattach_interval_ms (an attempt
   * may take up to attach_timeout_ms), and carries on with the new attachment
   * when it succeeds: a producer's frames that were in flight complete with
   * FL_ERR_DAEMON_GONE, as fl_reattach says.  Until the daemon is back these
   * calls find nothing instead of failing -- FL_EAGAIN (fl_poll_completions:
   * count 0) when non-blocking, FL_ETIMEDOUT at their timeout, the message
   * saying that the daemon is gone -- and fl_doorbell_fd turns readable when
   * the next attempt is due.  fl_submit and fl_release while the daemon is
   * gone, and fl_check_daemon, still report FL_ERR_DAEMON_GONE.  Slots and
   * frames of an earlier attachment are void after a reattach:
   * fl_client_get_info's generation says which attachment is current.
   * A daemon that is back but refuses this client for good (FL_ERR_LIMIT,
   * FL_ERR_ATTACH_REFUSED, FL_ERR_VERSION, FL_ERR_BAD_REQUEST: asking again
   * gets the same answer) ends the attempts: the call that saw the refusal
   * returns it, once, with the daemon's reason; later calls report
   * FL_ERR_DAEMON_GONE naming it, and fl_doorbell_fd stays readable.
   * fl_reattach tries again (after the daemon's configuration changed).
   */
  uint32_t auto_reattach;
  uint32_t reattach_interval_ms; /* 0: 200; the least time between two automatic attempts */
  /* Read only when struct_size covers it (FL_CLIENT_OPTIONS_SIZE_V3). */
  /*
   * Consumer, nonzero: a subscriber, which gets every frame of the stream.
   * 0: a member of the stream's queue group, which shares the frames with
   * the group's other members (each frame to one of them).  Frames from
   * another host cross the link once and are lent to every subscriber here.
   */
  uint32_t subscribe;
  /*
   * Producer: the size of the fl_completion the application was built with
   * (fl_client_options_init, as this header defines it, sets
   * sizeof(fl_completion)): fl_poll_completions and fl_wait_completions fill
   * that much of each.  0: FL_COMPLETION_SIZE_V1, an application built before
   * readers and released (a binding that calls the library's function itself
   * sets this to its own size).
   */
  uint32_t completion_size;
  /* Read only when struct_size covers it (more than FL_CLIENT_OPTIONS_SIZE_V3). */
  /*
   * Consumer, nonzero: frames of the stream from other hosts are pulled to
   * this host while this consumer is attached -- the sender offers each one
   * and this host's daemon reads it (RDMA READ on rdma) when a slot here is
   * free -- as if the daemon's pull_streams listed the stream.  It applies to
   * the stream on this host, so to its other consumers here too.  0: as the
   * daemon is configured.
   */
  uint32_t pull;
  /*
   * How long, in microseconds, a blocking call (fl_acquire, fl_receive,
   * fl_wait_completions) that finds nothing keeps looking at its ring before
   * it sleeps on the doorbell, giving the CPU to other threads between looks
   * (sched_yield).  A frame that comes within it is taken without the
   * daemon's wake-up (a pipe write) and this thread's (a context switch);
   * while frames flow that is most of each frame's cost.  At most
   * FL_WAIT_SPIN_MAX_US.  0: $FRAMELINK_WAIT_SPIN_US when set (0 there: no
   * spin), else what the daemon advises for its host (its
   * client_wait_spin_us, 0 there: no spin), else -- a daemon too old to
   * advise -- FL_WAIT_SPIN_DEFAULT_US.  FL_WAIT_SPIN_OFF: sleep at once.
   * fl_wait_spin_us says what it came to; the .NET and Python bindings'
   * async calls spin as long before they await fl_doorbell_fd.
   */
  uint32_t wait_spin_us;
} fl_client_options;

/* fl_client_options.wait_spin_us: the default, the most, and none. */
#define FL_WAIT_SPIN_DEFAULT_US 20u
#define FL_WAIT_SPIN_MAX_US 1000000u
#define FL_WAIT_SPIN_OFF 0xFFFFFFFFu

/* struct_size of an fl_client_options from before auto_reattach (still accepted). */
#define FL_CLIENT_OPTIONS_SIZE_V1 48u
/* struct_size of an fl_client_options from before subscribe (still accepted). */
#define FL_CLIENT_OPTIONS_SIZE_V2 56u
/* struct_size of an fl_client_options from before pull (still accepted). */
#define FL_CLIENT_OPTIONS_SIZE_V3 64u

typedef struct fl_client_info {
  uint64_t client_id;
  uint64_t slot_size;
  uint32_t slot_count;
  uint32_t role;
  uint64_t daemon_pid;
  uint64_t daemon_start_ns;
  uint32_t data_on_hugepages;
  uint32_t generation; /* 0 after fl_attach, +1 for each fl_reattach that attached anew */
} fl_client_info;

/* A producer slot held by the application between fl_acquire and fl_submit. */
typedef struct fl_slot {
  uint32_t index;
  uint32_t reserved;
  uint8_t* data;     /* slot_size writable bytes */
  uint64_t capacity; /* == slot_size */
} fl_slot;

enum fl_meta_flags {
  FL_META_CRC32C = 1u << 0, /* compute the payload CRC32C at submit; the receiver checks it */
};

typedef struct fl_frame_meta {
  uint64_t frame_id; /* the application's own id, carried to the receiver and echoed in the completion */
  uint64_t group_id; /* the application's own grouping (a wafer, a batch, a scan), carried as it is */
  uint64_t timestamp_ns;
  uint32_t flags;       /* enum fl_meta_flags */
  uint32_t attr_length; /* <= FL_MAX_ATTR_BYTES (192) */
  const uint8_t* attrs;
} fl_frame_meta;

typedef struct fl_completion {
  uint32_t slot;
  int32_t status; /* FL_OK = delivered, else why the frame failed */
  uint64_t sequence;
  uint64_t frame_id; /* the frame's fl_frame_meta.frame_id, whatever the status (refused at submit too) */
  uint64_t length;
  /* Filled when fl_client_options.completion_size covers them. */
  uint32_t readers; /* readers the frame was meant for, on every host (0: none, or not known) */
  /* Of those, how many released it.  FL_OK: all of them but the subscribers of a
   * drop stream skipped for it (readers - released; each is told the gap). */
  uint32_t released;
} fl_completion;

/* sizeof(fl_completion) before readers and released (still filled that far). */
#define FL_COMPLETION_SIZE_V1 32u

/* A delivered frame, valid until fl_release(frame.slot). */
typedef struct fl_frame {
  uint32_t slot;
  /* FL_SLOT_HAS_CRC32C when crc32c was sent and checked; FL_SLOT_MAYBE_REDELIVERED;
   * FL_SLOT_GROUP_ELSEWHERE when a queue group member on another host got the frame;
   * FL_SLOT_GAP when frames of the stream were skipped for this subscriber before this one
   * (a drop stream: fl_frame_gap says how many) */
  uint32_t flags;
  uint64_t sequence;
  const uint8_t* data; /* read-only */
  uint64_t length;
  uint64_t frame_id;
  uint64_t group_id; /* as the producer set it in fl_frame_meta */
  uint64_t timestamp_ns;
  uint32_t crc32c;
  uint32_t attr_length;
  const uint8_t* attrs; /* attr_length bytes, read-only */
} fl_frame;

/* Library */
FL_API const char* fl_version(void);
FL_API const char* fl_last_error(void);       /* thread-local, never NULL */
FL_API const char* fl_status_str(int status); /* "FL_ERR_TOO_LARGE: ..." */

/* Attach / detach */
/* Fills the first FL_CLIENT_OPTIONS_SIZE_V3 bytes, for applications built
 * before fl_client_options_init_size (the macro below calls that one). */
FL_API void fl_client_options_init(fl_client_options* options);
/* Defaults for the first `size` bytes of `options` (the application's
 * sizeof(fl_client_options)), never more than this library knows. */
FL_API void fl_client_options_init_size(fl_client_options* options, size_t size);
/* The application's own struct size and fl_completion size go with its
 * options: a newer library never writes or fills more than it has. */
static inline void flx_client_options_init_here(fl_client_options* options) {
  fl_client_options_init_size(options, sizeof(*options));
  if (options) options->completion_size = (uint32_t)sizeof(fl_completion);
}
#define fl_client_options_init(options) flx_client_options_init_here(options)
FL_API int fl_attach(const fl_client_options* options, fl_client** out);
FL_API void fl_detach(fl_client* client); /* NULL is fine */
FL_API int fl_client_get_info(const fl_client* client, fl_client_info* out);
/*
 * How long, in microseconds, the client's waits spin before they sleep: the
 * wait_spin_us of fl_client_options resolved (the option, the environment,
 * the daemon's advice, the default; see there) -- again after each
 * reattach, as another daemon may advise otherwise.  0: no spin (and for a
 * NULL client).  A binding that waits on fl_doorbell_fd itself spins this
 * long first, calling the non-blocking function, so that it waits as
 * fl_receive does.
 */
FL_API uint32_t fl_wait_spin_us(const fl_client* client);
/* FL_OK while the daemon that served the attach still serves it, FL_ERR_DAEMON_GONE otherwise. */
FL_API int fl_check_daemon(fl_client* client);
/*
 * Attach again to the daemon at the same socket, with the options of
 * fl_attach, after the daemon went away (FL_ERR_DAEMON_GONE) and is back --
 * without a new handle.  FL_OK at once, changing nothing, while the daemon
 * that served the attach still serves it.  While no daemon accepts it fails
 * (FL_ERR_DAEMON_UNREACHABLE ...) and the client stays as it was: try later.
 * After FL_OK:
 *   - producer: each frame that was in flight gets its completion with
 *     FL_ERR_DAEMON_GONE (the old daemon may or may not have delivered it);
 *     completions not yet polled are kept;
 *   - every slot, frame and data pointer from before is void: its memory
 *     reads as zeros and takes writes harmlessly until fl_detach;
 *   - slot_count / slot_size may differ (the new daemon's limits): see
 *     fl_client_get_info, whose generation has grown by one;
 *   - fl_doorbell_fd is the same fd, the same file and watches the new
 *     attachment: registrations of it in an event loop stay valid.
 * Other threads may be inside calls on the same client meanwhile (they carry
 * on with the new attachment); slots and frames they hold become void.
 * With auto_reattach (fl_client_options) the waiting calls do this themselves.
 */
FL_API int fl_reattach(fl_client* client);
/*
 * One fd for an event loop (epoll, poll, libuv, asyncio, .NET): readable
 * (POLLIN) when fl_acquire / fl_poll_completions / fl_receive may return
 * something, and also when the daemon that serves the client goes away, so
 * an application waiting on it never sleeps through the loss of its daemon.
 * It is an epoll fd holding the completion doorbell and the attach socket
 * (and, with auto_reattach, a timer for the next attempt): wait on it, never
 * read it.  Only rung after a call found nothing: call fl_poll_completions /
 * fl_acquire(..., 0) / fl_receive(..., 0) until it reports nothing (count 0 /
 * FL_EAGAIN) -- that arms the doorbell -- and only then wait.  Readiness may
 * be spurious; just call again.  After the daemon went away it stays readable
 * and the calls report FL_ERR_DAEMON_GONE, until fl_reattach (or, with
 * auto_reattach, until the next attempt is due).  The same fd for the life of
 * the client, across fl_reattach; closed by fl_detach.
 */
FL_API int fl_doorbell_fd(const fl_client* client);

/* Producer.  timeout_ms: 0 = non-blocking (FL_EAGAIN), < 0 = wait forever. */
FL_API int fl_acquire(fl_client* client, int timeout_ms, fl_slot* out);
FL_API int fl_set_meta(fl_client* client, uint32_t slot, const fl_frame_meta* meta);
FL_API int fl_submit(fl_client* client, uint32_t slot, uint64_t length);
/* Give back an acquired slot without sending it. */
FL_API int fl_abandon(fl_client* client, uint32_t slot);
/*
 * Completions, oldest first.  Once an application has called either of these
 * it loses none: completions it has not read yet wait in a local queue (4096
 * or more), and when that is full fl_acquire waits (or fails FL_EAGAIN /
 * FL_ETIMEDOUT, saying so) until they are read.  Read them from another
 * thread, or between acquires.  An application that never calls them keeps
 * acquiring; only the newest completions are kept for it.
 */
FL_API int fl_poll_completions(fl_client* client, fl_completion* out, size_t max, size_t* count);
FL_API int fl_wait_completions(fl_client* client, fl_completion* out, size_t max, size_t* count,
                               int timeout_ms);
/* Frames submitted and not yet completed. */
FL_API int fl_in_flight(const fl_client* client, uint32_t* count);

/* Consumer.  timeout_ms as above. */
FL_API int fl_receive(fl_client* client, fl_frame* out, int timeout_ms);
FL_API int fl_release(fl_client* client, uint32_t slot);
/* The frames of its stream this subscriber missed just before the frame it
 * holds in `slot` (the daemon skipped it on a drop stream while it was too
 * far behind; saturates at UINT32_MAX).  0: none, or the slot holds no frame. */
FL_API uint32_t fl_frame_gap(fl_client* client, uint32_t slot);

/* CRC32C (Castagnoli) of a buffer, as the daemon computes it. */
FL_API uint32_t fl_crc32c(uint32_t seed, const void* data, size_t length);

#ifdef __cplusplus
}
#endif

#endif /* FRAMELINK_FRAMELINK_H */
