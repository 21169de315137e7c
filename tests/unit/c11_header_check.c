/*
 * Every public C header must compile on its own as strict C11
 * (-std=c11 -Wall -Wextra -Werror -pedantic): clients build against them
 * with whatever C compiler they have.  Built as a tiny test program so the
 * build breaks as soon as a header stops being C11-clean.
 */
#include <string.h>

#include "framelink/attach_proto.h"
#include "framelink/framelink.h"
#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"

/* The stream-name rule as a C11 client sees it: the longest name, one more,
 * bad characters. */
static int stream_name_rule(void) {
  char name[FL_STREAM_NAME_LEN_MAX + 2];
  memset(name, 'a', sizeof name);
  if (!fl_stream_name_valid(name, FL_STREAM_NAME_LEN_MAX)) return 1;
  if (fl_stream_name_valid(name, FL_STREAM_NAME_LEN_MAX + 1)) return 2;
  if (fl_stream_name_valid(name, 0)) return 3;
  if (!fl_stream_name_valid("cam_0.left-A9", 13)) return 4;
  if (fl_stream_name_valid("cam 0", 5) || fl_stream_name_valid("cam/0", 5) || fl_stream_name_valid("*", 1))
    return 5;
  if (fl_stream_name_valid("ab\0c", 4)) return 6;
  return 0;
}

int main(void) {
  if (stream_name_rule() != 0) return 10 + stream_name_rule();
  /* Use something from each header so nothing is optimised into a pass. */
  _Alignas(64) unsigned char mem[sizeof(fl_ring_header) + 4 * sizeof(fl_submit_desc)];
  fl_ring_header* ring = (fl_ring_header*)(void*)mem;
  fl_submit_desc in = {1, 0, 42};
  fl_submit_desc out = {0, 0, 0};
  fl_ring_init(ring, 4, sizeof(fl_submit_desc));
  if (fl_ring_push(ring, 4, sizeof(fl_submit_desc), &in) != FL_RING_OK) return 1;
  if (fl_ring_pop(ring, 4, sizeof(fl_submit_desc), &out) != FL_RING_OK) return 2;
  if (out.slot != 1 || out.length != 42) return 3;
  if (sizeof(fl_attach_request) != 160 || sizeof(fl_attach_reply) != 296) return 4;
  if (sizeof(fl_segment_header) != 256 || sizeof(fl_slot_header) != 256) return 5;
  fl_client_options options;
  options.role = FL_PRODUCER;
  return options.role == FL_PRODUCER && FL_OK == 0 ? 0 : 6;
}
