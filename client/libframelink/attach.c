/*
 * Attach / detach: the handshake with framelinkd (handshake.c), mapping the
 * two segments it hands out, and validating the segment header before any
 * of it is used.  The daemon is trusted to be framelinkd, but not to be bug
 * free or of the same version: every size and offset is checked against
 * the real size of the memfd, so a bad header is an error, never a fault.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "framelink/attach_proto.h"

#define FLX_ATTACH_TIMEOUT_MS \
  10000 /* default: connect, then the reply (the daemon may be locking a large segment) */
#define FLX_REATTACH_INTERVAL_MS 200 /* default least time between two automatic reattach attempts */
/* Completions held locally at most, when an application never polls them. */
#define FLX_MIN_QUEUE 4096u

/* The application names its role with fl_client_role (framelink.h); the
 * request and the segment header carry it as an fl_role (shm_layout.h). */
FL_STATIC_ASSERT((int)FL_PRODUCER == (int)FL_ROLE_PRODUCER && (int)FL_CONSUMER == (int)FL_ROLE_CONSUMER,
                 "fl_client_role and fl_role must have the same values");

/* $FRAMELINK_AUTO_REATTACH: 1 when unset; 0 for "0", "off", "no" or "false";
 * 1 for "1", "on", "yes" or "true"; -1 for anything else (fl_attach says so). */
static int flx_env_auto_reattach(void) {
  const char* env = getenv("FRAMELINK_AUTO_REATTACH");
  if (env == NULL || *env == '\0') return 1;
  static const char* const off[] = {"0", "off", "no", "false"};
  static const char* const on[] = {"1", "on", "yes", "true"};
  for (size_t i = 0; i < sizeof(off) / sizeof(off[0]); ++i) {
    if (strcasecmp(env, off[i]) == 0) return 0;
    if (strcasecmp(env, on[i]) == 0) return 1;
  }
  return -1;
}

FL_API void fl_client_options_init_size(fl_client_options* options, size_t size) {
  if (!options || size < FL_CLIENT_OPTIONS_SIZE_V1) return;
  if (size > sizeof(*options)) size = sizeof(*options);
  memset(options, 0, size);
  options->struct_size = (uint32_t)size;
  options->role = FL_PRODUCER;
  /* On unless $FRAMELINK_AUTO_REATTACH turns it off: a daemon restart is a pause. */
  if (size >= FL_CLIENT_OPTIONS_SIZE_V2) options->auto_reattach = flx_env_auto_reattach() != 0;
}

/* The name in parentheses: the header's macro of the same name wraps
 * fl_client_options_init_size instead.  An application built before that
 * calls this one with an options struct of FL_CLIENT_OPTIONS_SIZE_V3 bytes. */
FL_API void(fl_client_options_init)(fl_client_options* options) {
  fl_client_options_init_size(options, FL_CLIENT_OPTIONS_SIZE_V3);
}

static int flx_add_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_add_overflow(a, b, out);
}

/* [a_off, a_off + a_len) and [b_off, b_off + b_len) intersect?  (no overflow: callers checked the ends) */
static int flx_overlap(uint64_t a_off, uint64_t a_len, uint64_t b_off, uint64_t b_len) {
  return a_off < b_off + b_len && b_off < a_off + a_len;
}

/*
 * Checks a private copy of the segment header against the real segment
 * sizes.  Returns FL_OK or an error with the message set.
 */
static int flx_validate_header(const fl_segment_header* g, uint32_t role, const char* stream,
                               uint64_t client_id, uint64_t control_size, uint64_t data_size) {
  const char* hint = "(framelinkd bug or version skew: update libframelink and framelinkd together)";
  if (g->magic != FL_SEGMENT_MAGIC)
    return flx_error(FL_ERR_VERSION, "control segment has magic 0x%016llx, not a framelink segment %s",
                     (unsigned long long)g->magic, hint);
  if (g->layout_version != FL_LAYOUT_VERSION)
    return flx_error(FL_ERR_VERSION,
                     "framelinkd uses shared-memory layout version %u, this libframelink %s understands %u: "
                     "install matching versions",
                     g->layout_version, fl_version(), FL_LAYOUT_VERSION);
  if (g->role != role)
    return flx_error(FL_ERR_RING_CORRUPT, "segment is for role %u, but role %u was requested %s", g->role,
                     role, hint);
  if (g->client_id != client_id)
    return flx_error(FL_ERR_RING_CORRUPT, "segment names client %llu, the attach reply client %llu %s",
                     (unsigned long long)g->client_id, (unsigned long long)client_id, hint);
  if (strncmp(g->stream_name, stream, FL_STREAM_NAME_MAX) != 0)
    return flx_error(FL_ERR_RING_CORRUPT, "segment is for another stream than '%s' %s", stream, hint);
  if (g->control_size != control_size || g->data_size != data_size)
    return flx_error(FL_ERR_RING_CORRUPT,
                     "segment header sizes (control %llu, data %llu) disagree with the attach reply "
                     "(control %llu, data %llu) %s",
                     (unsigned long long)g->control_size, (unsigned long long)g->data_size,
                     (unsigned long long)control_size, (unsigned long long)data_size, hint);
  if (g->slot_count == 0 || g->slot_size == 0 || g->slot_stride < g->slot_size)
    return flx_error(FL_ERR_RING_CORRUPT, "bad slot geometry: count %u, size %llu, stride %llu %s",
                     g->slot_count, (unsigned long long)g->slot_size, (unsigned long long)g->slot_stride,
                     hint);
  if (!fl_ring_is_pow2(g->ring_capacity) || g->ring_capacity < g->slot_count)
    return flx_error(FL_ERR_RING_CORRUPT, "ring capacity %u is not a power of two >= slot count %u %s",
                     g->ring_capacity, g->slot_count, hint);

  /* Control segment: header, submit ring, completion ring, inside and disjoint. */
  const uint64_t sub_len = fl_ring_bytes(g->ring_capacity, sizeof(fl_submit_desc));
  const uint64_t comp_len = fl_ring_bytes(g->ring_capacity, sizeof(fl_completion_desc));
  uint64_t sub_end, comp_end;
  if (g->submit_ring_offset % FL_CACHE_LINE != 0 || g->completion_ring_offset % FL_CACHE_LINE != 0 ||
      flx_add_overflows(g->submit_ring_offset, sub_len, &sub_end) || sub_end > control_size ||
      flx_add_overflows(g->completion_ring_offset, comp_len, &comp_end) || comp_end > control_size ||
      flx_overlap(0, sizeof(fl_segment_header), g->submit_ring_offset, sub_len) ||
      flx_overlap(0, sizeof(fl_segment_header), g->completion_ring_offset, comp_len) ||
      flx_overlap(g->submit_ring_offset, sub_len, g->completion_ring_offset, comp_len))
    return flx_error(
        FL_ERR_RING_CORRUPT,
        "rings (submit at %llu, completion at %llu, capacity %u) do not fit the %llu-byte control "
        "segment %s",
        (unsigned long long)g->submit_ring_offset, (unsigned long long)g->completion_ring_offset,
        g->ring_capacity, (unsigned long long)control_size, hint);

  /* Data segment: slot headers and slots, inside and disjoint.  Two shapes:
   * a packed header array apart from the slots, or each header immediately
   * before its slot (what framelinkd makes). */
  const int packed = g->slot_header_stride == sizeof(fl_slot_header);
  const int interleaved = g->slot_header_stride == g->slot_stride &&
                          g->slot_stride - g->slot_size >= sizeof(fl_slot_header) &&
                          g->slot_headers_offset + sizeof(fl_slot_header) == g->slots_offset;
  uint64_t hdr_len, hdr_end, slots_len, slots_end;
  if ((!packed && !interleaved) || g->slot_headers_offset % 8 != 0 ||
      __builtin_mul_overflow((uint64_t)(g->slot_count - 1), g->slot_header_stride, &hdr_len) ||
      flx_add_overflows(hdr_len, sizeof(fl_slot_header), &hdr_len) ||
      flx_add_overflows(g->slot_headers_offset, hdr_len, &hdr_end) || hdr_end > data_size ||
      __builtin_mul_overflow((uint64_t)(g->slot_count - 1), g->slot_stride, &slots_len) ||
      flx_add_overflows(slots_len, g->slot_size, &slots_len) ||
      flx_add_overflows(g->slots_offset, slots_len, &slots_end) || slots_end > data_size ||
      (packed && !interleaved && flx_overlap(g->slot_headers_offset, hdr_len, g->slots_offset, slots_len)))
    return flx_error(FL_ERR_RING_CORRUPT,
                     "%u slots of %llu bytes (stride %llu, headers at %llu stride %llu, slots at %llu) do "
                     "not fit the %llu-byte data segment %s",
                     g->slot_count, (unsigned long long)g->slot_size, (unsigned long long)g->slot_stride,
                     (unsigned long long)g->slot_headers_offset, (unsigned long long)g->slot_header_stride,
                     (unsigned long long)g->slots_offset, (unsigned long long)data_size, hint);
  return FL_OK;
}

static int flx_map(int fd, uint64_t size, int prot, const char* what, uint8_t** out, size_t* out_len) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return flx_error(FL_ERR_RESOURCES, "cannot fstat the %s segment: %s", what, strerror(errno));
  if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size < size || size == 0 || size > SIZE_MAX)
    return flx_error(FL_ERR_RING_CORRUPT,
                     "the %s segment (%lld bytes) is smaller than the %llu bytes announced", what,
                     (long long)st.st_size, (unsigned long long)size);
  void* p = mmap(NULL, (size_t)size, prot, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return flx_error(FL_ERR_RESOURCES, "cannot map the %llu-byte %s segment: %s", (unsigned long long)size,
                     what, strerror(errno));
  *out = (uint8_t*)p;
  *out_len = (size_t)size;
  return FL_OK;
}

static fl_client* flx_alloc_client(uint32_t slot_count, uint32_t ring_cap) {
  fl_client* c = (fl_client*)calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->sock = c->control_fd = c->data_fd = c->submit_bell = c->completion_bell = c->kick_efd = -1;
  c->epoll_fd = c->retry_tfd = -1;
  uint32_t qcap = FLX_MIN_QUEUE;
  while (qcap < ring_cap * 4u && qcap < (1u << 24)) qcap <<= 1;
  c->queue_cap = qcap;
  c->slot_state = (uint8_t*)calloc(slot_count, 1);
  c->slot_want_crc = (uint8_t*)calloc(slot_count, 1);
  c->slot_lent = (uint8_t*)calloc(slot_count, 1);
  c->slot_gap = (uint32_t*)calloc(slot_count, sizeof(uint32_t));
  c->free_list = (uint32_t*)calloc(slot_count, sizeof(uint32_t));
  c->queue = (fl_completion*)calloc(qcap, sizeof(fl_completion));
  pthread_condattr_t ca;
  int cv_ok = pthread_condattr_init(&ca) == 0;
  /* Followers' deadlines are CLOCK_MONOTONIC, like the poller's. */
  cv_ok =
      cv_ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 && pthread_cond_init(&c->cv, &ca) == 0;
  int mu_ok = 0, rmu_ok = 0;
  if (c->slot_state && c->slot_want_crc && c->slot_lent && c->slot_gap && c->free_list && c->queue && cv_ok) {
    mu_ok = pthread_mutex_init(&c->mu, NULL) == 0;
    rmu_ok = mu_ok && pthread_mutex_init(&c->reattach_mu, NULL) == 0;
  }
  if (!rmu_ok) {
    if (mu_ok) pthread_mutex_destroy(&c->mu);
    if (cv_ok) pthread_cond_destroy(&c->cv);
    free(c->slot_state);
    free(c->slot_want_crc);
    free(c->slot_lent);
    free(c->slot_gap);
    free(c->free_list);
    free(c->queue);
    free(c);
    return NULL;
  }
  return c;
}

void flx_free_shell(fl_client* c) {
  pthread_mutex_destroy(&c->reattach_mu);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  free(c->slot_state);
  free(c->slot_want_crc);
  free(c->slot_lent);
  free(c->slot_gap);
  free(c->free_list);
  free(c->queue);
  free(c);
}

/* What an attach maps: both segments, and the validated private copy of the
 * control segment's header. */
struct flx_segments {
  uint8_t* control;
  size_t control_len;
  uint8_t* data;
  size_t data_len;
  fl_segment_header geo;
};

/* The ring headers the daemon wrote must agree with the (validated) segment
 * header before either ring is used. */
static int flx_check_ring_headers(const uint8_t* control, const fl_segment_header* geo) {
  const fl_ring_header* sr = (const fl_ring_header*)(control + geo->submit_ring_offset);
  const fl_ring_header* cr = (const fl_ring_header*)(control + geo->completion_ring_offset);
  if (sr->capacity != geo->ring_capacity || cr->capacity != geo->ring_capacity ||
      sr->entry_size != sizeof(fl_submit_desc) || cr->entry_size != sizeof(fl_completion_desc))
    return flx_error(
        FL_ERR_RING_CORRUPT,
        "ring headers (capacity %u/%u, entry size %u/%u) disagree with the segment header (capacity %u, "
        "entry sizes %zu/%zu)",
        sr->capacity, cr->capacity, sr->entry_size, cr->entry_size, geo->ring_capacity,
        sizeof(fl_submit_desc), sizeof(fl_completion_desc));
  return FL_OK;
}

/* Maps the control segment into seg and checks it before anything in it is
 * used: its header (copied to seg->geo), the daemon still serving, the ring
 * headers.  On failure seg->control may be mapped: the caller unmaps it. */
static int flx_map_control(int fd, const fl_attach_request* req, const fl_attach_reply* reply,
                           struct flx_segments* seg) {
  int rc =
      flx_map(fd, reply->control_size, PROT_READ | PROT_WRITE, "control", &seg->control, &seg->control_len);
  if (rc != FL_OK) return rc;
  if (seg->control_len < sizeof(fl_segment_header))
    return flx_error(FL_ERR_RING_CORRUPT, "the control segment (%zu bytes) is smaller than its header",
                     seg->control_len);
  memcpy(&seg->geo, seg->control, sizeof(seg->geo));
  rc = flx_validate_header(&seg->geo, req->role, req->stream, reply->client_id, reply->control_size,
                           reply->data_size);
  if (rc != FL_OK) return rc;
  if (__atomic_load_n(&((const fl_segment_header*)seg->control)->daemon_state, __ATOMIC_ACQUIRE) !=
      FL_DAEMON_SERVING)
    return flx_gone_error();
  return flx_check_ring_headers(seg->control, &seg->geo);
}

/* We only read the completion doorbell to clear it: non-blocking, so
 * several waiters never block in read(). */
static int flx_completion_bell_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    return flx_error(FL_ERR_RESOURCES, "cannot make the completion doorbell non-blocking: %s",
                     strerror(errno));
  return FL_OK;
}

/* Gives the new client `c` (nobody else sees it yet) the attach socket, the
 * passed fds and the mapped segments; fl_detach releases them from here on. */
static void flx_fill_client(fl_client* c, const fl_attach_request* req, int sock,
                            const int fds[FL_ATTACH_FD_COUNT], const struct flx_segments* seg) {
  const fl_segment_header* geo = &seg->geo;
  c->role = req->role;
  c->sock = sock;
  c->control_fd = fds[0];
  c->data_fd = fds[1];
  c->submit_bell = fds[2];
  c->completion_bell = fds[3];
  c->control = seg->control;
  c->control_len = seg->control_len;
  c->data = seg->data;
  c->data_len = seg->data_len;
  c->geo = *geo;
  c->live_hdr = (const fl_segment_header*)seg->control;
  c->submit = (fl_ring_header*)(seg->control + geo->submit_ring_offset);
  c->completion = (fl_ring_header*)(seg->control + geo->completion_ring_offset);
  c->ring_cap = geo->ring_capacity;
  c->slot_count = geo->slot_count;
  c->slot_size = geo->slot_size;
  c->slot_stride = geo->slot_stride;
  c->slot_headers = seg->data + geo->slot_headers_offset;
  c->slot_header_stride = geo->slot_header_stride;
  c->slots = seg->data + geo->slots_offset;
  if (c->role == FL_PRODUCER) {
    /* A stack: pushed in reverse so the first acquire gets slot 0. */
    for (uint32_t i = 0; i < c->slot_count; ++i) c->free_list[i] = c->slot_count - 1 - i;
    c->free_count = c->slot_count;
  }
}

int flx_attach_at(const char* path, const fl_attach_request* req, uint32_t timeout_ms, fl_client** out) {
  if (timeout_ms == 0) timeout_ms = FLX_ATTACH_TIMEOUT_MS;
  const int64_t deadline_ms = flx_mono_ms() + timeout_ms;
  int sock = -1;
  int rc = flx_connect(path, deadline_ms, timeout_ms, &sock);
  if (rc != FL_OK) return rc;

  fl_attach_reply reply;
  memset(&reply, 0, sizeof(reply));
  int fds[FL_ATTACH_FD_COUNT];
  rc = flx_handshake(sock, path, req, deadline_ms, timeout_ms, &reply, fds);
  if (rc != FL_OK) {
    close(sock);
    return rc;
  }

  struct flx_segments seg;
  memset(&seg, 0, sizeof(seg));
  fl_client* c = NULL;

  rc = flx_map_control(fds[0], req, &reply, &seg);
  if (rc != FL_OK) goto fail;
  rc = flx_map(fds[1], reply.data_size, req->role == FL_PRODUCER ? PROT_READ | PROT_WRITE : PROT_READ, "data",
               &seg.data, &seg.data_len);
  if (rc != FL_OK) goto fail;

  c = flx_alloc_client(seg.geo.slot_count, seg.geo.ring_capacity);
  if (!c) {
    rc = flx_error(FL_ERR_RESOURCES, "out of memory for the bookkeeping of %u slots", seg.geo.slot_count);
    goto fail;
  }
  rc = flx_completion_bell_nonblocking(fds[3]);
  if (rc != FL_OK) goto fail;
  flx_fill_client(c, req, sock, fds, &seg);
  *out = c;
  return FL_OK;

fail:
  if (c) flx_free_shell(c);
  if (seg.data) munmap(seg.data, seg.data_len);
  if (seg.control) munmap(seg.control, seg.control_len);
  flx_close_fds(fds, FL_ATTACH_FD_COUNT);
  close(sock);
  return rc;
}

/* The wait spin the application chose, in microseconds: fl_client_options.
 * wait_spin_us, else $FRAMELINK_WAIT_SPIN_US, else FLX_WAIT_SPIN_ADVISED (the
 * daemon's advice, see flx_resolve_wait_spin); or an error that says what was
 * wrong. */
static int flx_wait_spin_us(uint32_t option, uint32_t* spin_us) {
  if (option == FL_WAIT_SPIN_OFF) {
    *spin_us = 0;
    return FL_OK;
  }
  if (option > FL_WAIT_SPIN_MAX_US)
    return flx_error(
        FL_EINVAL, "fl_attach: options.wait_spin_us is %u; at most %u (1 s), or FL_WAIT_SPIN_OFF for no spin",
        option, FL_WAIT_SPIN_MAX_US);
  if (option != 0) {
    *spin_us = option;
    return FL_OK;
  }
  const char* env = getenv("FRAMELINK_WAIT_SPIN_US");
  if (!env || !*env) {
    *spin_us = FLX_WAIT_SPIN_ADVISED;
    return FL_OK;
  }
  char* end = NULL;
  errno = 0;
  const unsigned long v = strtoul(env, &end, 10);
  if (errno != 0 || *end != '\0' || env[0] == '-' || v > FL_WAIT_SPIN_MAX_US)
    return flx_error(
        FL_EINVAL,
        "fl_attach: FRAMELINK_WAIT_SPIN_US='%.40s' is not a number of microseconds from 0 (no spin) "
        "to %u; fix or unset it",
        env, FL_WAIT_SPIN_MAX_US);
  *spin_us = (uint32_t)v;
  return FL_OK;
}

/* The checks of fl_attach's options that need no other field's version:
 * the struct size, the role and the stream name. */
static int flx_check_options(const fl_client_options* options) {
  /* Older applications pass the smaller struct of their header: the fields
   * they do not know keep their defaults. */
  if (options->struct_size < FL_CLIENT_OPTIONS_SIZE_V1)
    return flx_error(FL_EINVAL,
                     "fl_attach: options.struct_size is %u; initialise options with fl_client_options_init",
                     options->struct_size);
  if (options->role != FL_PRODUCER && options->role != FL_CONSUMER)
    return flx_error(FL_EINVAL, "fl_attach: role %u is neither FL_PRODUCER (1) nor FL_CONSUMER (2)",
                     options->role);
  if (flx_env_auto_reattach() < 0)
    return flx_error(FL_EINVAL,
                     "fl_attach: FRAMELINK_AUTO_REATTACH='%.40s' is neither on (1, on, yes, true) nor off "
                     "(0, off, no, false)",
                     getenv("FRAMELINK_AUTO_REATTACH"));
  if (!options->stream ||
      !fl_stream_name_valid(options->stream, strnlen(options->stream, FL_STREAM_NAME_MAX)))
    return flx_error(FL_EINVAL,
                     "fl_attach: stream name '%.80s' is invalid: use 1 to %u characters from [A-Za-z0-9._-]",
                     options->stream ? options->stream : "(null)", FL_STREAM_NAME_LEN_MAX);
  return FL_OK;
}

FL_API int fl_attach(const fl_client_options* options, fl_client** out) {
  if (!out) return flx_error(FL_EINVAL, "fl_attach: out is NULL");
  *out = NULL;
  if (!options) return flx_error(FL_EINVAL, "fl_attach: options is NULL");
  int rc = flx_check_options(options);
  if (rc != FL_OK) return rc;
  const int has_v2 = options->struct_size >= FL_CLIENT_OPTIONS_SIZE_V2;
  const int has_v3 = options->struct_size >= FL_CLIENT_OPTIONS_SIZE_V3;
  const int has_v4 = options->struct_size >= sizeof(fl_client_options);

  const char* path = options->socket_path;
  if (!path || !*path) path = getenv("FRAMELINK_SOCKET");
  if (!path || !*path) path = FL_DEFAULT_SOCKET_PATH;

  fl_attach_request req;
  memset(&req, 0, sizeof(req));
  req.magic = FL_ATTACH_MAGIC;
  req.version = FL_ATTACH_VERSION;
  req.role = options->role;
  /* 0 lets the daemon apply its configured defaults ([limits] default_slot_*). */
  req.slot_count = options->slot_count;
  req.slot_size = options->slot_size;
  /* An application built before readers/released passes a smaller
   * fl_completion: it is filled that far, never past it. */
  const uint32_t completion_size = has_v3 ? options->completion_size : 0;
  if (completion_size != 0 && completion_size != FL_COMPLETION_SIZE_V1 &&
      completion_size < sizeof(fl_completion))
    return flx_error(FL_EINVAL,
                     "fl_attach: options.completion_size is %u, neither %u nor %zu; initialise options with "
                     "fl_client_options_init",
                     completion_size, FL_COMPLETION_SIZE_V1, sizeof(fl_completion));
  if (has_v3 && options->subscribe) {
    if (options->role != FL_CONSUMER)
      return flx_error(FL_EINVAL,
                       "fl_attach: subscribe is for consumers; a producer's frames go to every subscriber");
    req.flags |= FL_ATTACH_SUBSCRIBE;
  }
  if (has_v4 && options->pull) {
    if (options->role != FL_CONSUMER)
      return flx_error(FL_EINVAL,
                       "fl_attach: pull is for consumers; the consumer's host decides how its frames come");
    req.flags |= FL_ATTACH_PULL;
  }
  uint32_t spin_us = 0;
  rc = flx_wait_spin_us(has_v4 ? options->wait_spin_us : 0, &spin_us);
  if (rc != FL_OK) return rc;
  snprintf(req.stream, sizeof(req.stream), "%s", options->stream);
  snprintf(req.client_name, sizeof(req.client_name), "%s",
           options->client_name ? options->client_name : program_invocation_short_name);

  if (strlen(path) >= sizeof(((fl_client*)0)->socket_path))
    return flx_error(FL_EINVAL, "fl_attach: socket path '%.80s...' is too long for a Unix socket", path);

  fl_client* c = NULL;
  rc = flx_attach_at(path, &req, options->attach_timeout_ms, &c);
  if (rc != FL_OK) return rc;
  c->request = req;
  c->attach_timeout_ms = options->attach_timeout_ms;
  c->wait_spin_choice = spin_us;
  flx_resolve_wait_spin(c);
  /* An application built before the option gets the default: on, unless the environment says off. */
  c->auto_reattach = has_v2 ? options->auto_reattach != 0 : flx_env_auto_reattach() != 0;
  c->completion_size =
      completion_size >= sizeof(fl_completion) ? (uint32_t)sizeof(fl_completion) : FL_COMPLETION_SIZE_V1;
  c->reattach_interval_ms =
      has_v2 && options->reattach_interval_ms ? options->reattach_interval_ms : FLX_REATTACH_INTERVAL_MS;
  snprintf(c->socket_path, sizeof(c->socket_path), "%s", path);
  rc = flx_watch_init(c);
  if (rc != FL_OK) {
    fl_detach(c);
    return rc;
  }
  *out = c;
  return FL_OK;
}

void flx_resolve_wait_spin(fl_client* c) {
  uint32_t us = c->wait_spin_choice;
  if (us == FLX_WAIT_SPIN_ADVISED) {
    /* Zero flags: a daemon from before the advice, which zero-filled it. */
    const int advised = (c->geo.spin_advice_flags & FL_SPIN_ADVICE_SET) != 0;
    us = advised ? c->geo.client_wait_spin_us : FL_WAIT_SPIN_DEFAULT_US;
    if (us > FL_WAIT_SPIN_MAX_US) us = FL_WAIT_SPIN_MAX_US;
  }
  __atomic_store_n(&c->wait_spin_ns, (int64_t)us * 1000, __ATOMIC_RELAXED);
}

FL_API uint32_t fl_wait_spin_us(const fl_client* c) {
  if (!c) return 0;
  return (uint32_t)(__atomic_load_n(&c->wait_spin_ns, __ATOMIC_RELAXED) / 1000);
}

FL_API void fl_detach(fl_client* c) {
  if (!c) return;
  if (c->data) munmap(c->data, c->data_len);
  if (c->control) munmap(c->control, c->control_len);
  for (uint32_t i = 0; i < c->retired_count; ++i) munmap(c->retired[i].addr, c->retired[i].len);
  flx_lent_unmap_all(c);
  free(c->retired);
  int fds[8] = {c->epoll_fd,    c->retry_tfd,       c->control_fd, c->data_fd,
                c->submit_bell, c->completion_bell, c->sock,       c->kick_efd};
  flx_close_fds(fds, 8);
  flx_free_shell(c);
}

FL_API int fl_client_get_info(const fl_client* c, fl_client_info* out) {
  if (!c || !out) return flx_error(FL_EINVAL, "fl_client_get_info: client or out is NULL");
  memset(out, 0, sizeof(*out));
  out->client_id = c->geo.client_id;
  out->slot_size = c->slot_size;
  out->slot_count = c->slot_count;
  out->role = c->role;
  out->daemon_pid = c->geo.daemon_pid;
  out->daemon_start_ns = c->geo.daemon_start_ns;
  out->data_on_hugepages = c->geo.data_on_hugepages;
  out->generation = __atomic_load_n(&c->generation, __ATOMIC_RELAXED);
  return FL_OK;
}

FL_API int fl_check_daemon(fl_client* c) {
  if (!c) return flx_error(FL_EINVAL, "fl_check_daemon: client is NULL");
  pthread_mutex_lock(&c->mu);
  int gone = flx_gone_locked(c);
  pthread_mutex_unlock(&c->mu);
  if (gone || flx_socket_hung_up(c)) return flx_gone_error();
  return FL_OK;
}

/* See framelink.h: an epoll fd over the doorbell and the attach socket
 * (reattach.c keeps its set current). */
FL_API int fl_doorbell_fd(const fl_client* c) {
  if (!c) {
    flx_error(FL_EINVAL, "fl_doorbell_fd: client is NULL");
    return -1;
  }
  return c->epoll_fd;
}
