// The shared-memory and attach ABI, checked at run time as well: the
// static_asserts in the headers only hold for the compiler that built the
// daemon, these tests document the layout for other-language bindings.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <string>

#include "framelink/attach_proto.h"
#include "framelink/framelink.h"
#include "framelink/shm_layout.h"
#include "framelink/shm_ring.h"

TEST_CASE("ring header layout", "[layout]") {
  CHECK(sizeof(fl_ring_header) == 256);
  CHECK(offsetof(fl_ring_header, tail) == 0);
  CHECK(offsetof(fl_ring_header, head) == 64);
  CHECK(offsetof(fl_ring_header, reader_sleeping) == 128);
  CHECK(offsetof(fl_ring_header, capacity) == 192);
  CHECK(offsetof(fl_ring_header, entry_size) == 196);
}

TEST_CASE("ring entry layouts", "[layout]") {
  CHECK(sizeof(fl_submit_desc) == 16);
  CHECK(offsetof(fl_submit_desc, slot) == 0);
  CHECK(offsetof(fl_submit_desc, flags) == 4);
  CHECK(offsetof(fl_submit_desc, length) == 8);

  CHECK(sizeof(fl_completion_desc) == 40);
  CHECK(offsetof(fl_completion_desc, slot) == 0);
  CHECK(offsetof(fl_completion_desc, status) == 4);
  CHECK(offsetof(fl_completion_desc, sequence) == 8);
  CHECK(offsetof(fl_completion_desc, length) == 16);
  CHECK(offsetof(fl_completion_desc, frame_id) == 24);
  CHECK(offsetof(fl_completion_desc, readers) == 32);
  CHECK(offsetof(fl_completion_desc, released) == 36);
}

TEST_CASE("slot header layout", "[layout]") {
  CHECK(sizeof(fl_slot_header) == 256);
  CHECK(offsetof(fl_slot_header, frame_id) == 0);
  CHECK(offsetof(fl_slot_header, group_id) == 8);
  CHECK(offsetof(fl_slot_header, timestamp_ns) == 16);
  CHECK(offsetof(fl_slot_header, length) == 24);
  CHECK(offsetof(fl_slot_header, sequence) == 32);
  CHECK(offsetof(fl_slot_header, crc32c) == 40);
  CHECK(offsetof(fl_slot_header, flags) == 44);
  CHECK(offsetof(fl_slot_header, attr_length) == 48);
  CHECK(offsetof(fl_slot_header, reserved0) == 52);
  CHECK(offsetof(fl_slot_header, reserved1) == 56);
  CHECK(offsetof(fl_slot_header, attrs) == 64);
  CHECK(sizeof(fl_slot_header::attrs) == FL_MAX_ATTR_BYTES);
  CHECK(FL_MAX_ATTR_BYTES == 192);
}

TEST_CASE("segment header layout", "[layout]") {
  CHECK(sizeof(fl_segment_header) == 256);
  CHECK(offsetof(fl_segment_header, magic) == 0);
  CHECK(offsetof(fl_segment_header, layout_version) == 8);
  CHECK(offsetof(fl_segment_header, role) == 12);
  CHECK(offsetof(fl_segment_header, daemon_pid) == 16);
  CHECK(offsetof(fl_segment_header, daemon_start_ns) == 24);
  CHECK(offsetof(fl_segment_header, client_id) == 32);
  CHECK(offsetof(fl_segment_header, slot_count) == 40);
  CHECK(offsetof(fl_segment_header, ring_capacity) == 44);
  CHECK(offsetof(fl_segment_header, slot_size) == 48);
  CHECK(offsetof(fl_segment_header, slot_stride) == 56);
  CHECK(offsetof(fl_segment_header, control_size) == 64);
  CHECK(offsetof(fl_segment_header, submit_ring_offset) == 72);
  CHECK(offsetof(fl_segment_header, completion_ring_offset) == 80);
  CHECK(offsetof(fl_segment_header, data_size) == 88);
  CHECK(offsetof(fl_segment_header, slot_headers_offset) == 96);
  CHECK(offsetof(fl_segment_header, slots_offset) == 104);
  CHECK(offsetof(fl_segment_header, daemon_state) == 112);
  CHECK(offsetof(fl_segment_header, data_on_hugepages) == 116);
  CHECK(offsetof(fl_segment_header, stream_name) == 120);
  CHECK(offsetof(fl_segment_header, slot_header_stride) == 120 + FL_STREAM_NAME_MAX);
  CHECK(offsetof(fl_segment_header, spin_advice_flags) == 128 + FL_STREAM_NAME_MAX);
  CHECK(offsetof(fl_segment_header, client_wait_spin_us) == 132 + FL_STREAM_NAME_MAX);
  CHECK(offsetof(fl_segment_header, reserved) == 136 + FL_STREAM_NAME_MAX);
}

TEST_CASE("magic numbers spell their names in memory", "[layout]") {
  uint64_t magic = FL_SEGMENT_MAGIC;
  char text[9] = {};
  std::memcpy(text, &magic, 8);
  CHECK(std::string(text) == "FRAMELNK");
  uint32_t attach = FL_ATTACH_MAGIC;
  char text2[5] = {};
  std::memcpy(text2, &attach, 4);
  CHECK(std::string(text2) == "FLAT");
}

TEST_CASE("fl_ring_bytes", "[layout]") {
  CHECK(fl_ring_bytes(1, 16) == 256 + 16);
  CHECK(fl_ring_bytes(8, sizeof(fl_submit_desc)) == 256 + 128);
  CHECK(fl_ring_bytes(1024, sizeof(fl_completion_desc)) == 256 + 40960);
  // No 32-bit overflow for the largest capacities.
  CHECK(fl_ring_bytes(0x80000000u, 32) == 256 + (uint64_t{1} << 36));
}

TEST_CASE("attach messages", "[layout]") {
  CHECK(sizeof(fl_attach_request) == 160);
  CHECK(offsetof(fl_attach_request, magic) == 0);
  CHECK(offsetof(fl_attach_request, version) == 4);
  CHECK(offsetof(fl_attach_request, role) == 8);
  CHECK(offsetof(fl_attach_request, slot_count) == 12);
  CHECK(offsetof(fl_attach_request, slot_size) == 16);
  CHECK(offsetof(fl_attach_request, stream) == 24);
  CHECK(offsetof(fl_attach_request, client_name) == 88);
  CHECK(offsetof(fl_attach_request, flags) == 152);
  CHECK(offsetof(fl_attach_request, reserved) == 156);

  CHECK(sizeof(fl_attach_reply) == 296);
  CHECK(offsetof(fl_attach_reply, magic) == 0);
  CHECK(offsetof(fl_attach_reply, version) == 4);
  CHECK(offsetof(fl_attach_reply, status) == 8);
  CHECK(offsetof(fl_attach_reply, fd_count) == 12);
  CHECK(offsetof(fl_attach_reply, client_id) == 16);
  CHECK(offsetof(fl_attach_reply, control_size) == 24);
  CHECK(offsetof(fl_attach_reply, data_size) == 32);
  CHECK(offsetof(fl_attach_reply, message) == 40);
  CHECK(FL_ATTACH_FD_COUNT == 4);
}

TEST_CASE("C API roles match the segment roles", "[layout]") {
  CHECK(static_cast<int>(FL_PRODUCER) == static_cast<int>(FL_ROLE_PRODUCER));
  CHECK(static_cast<int>(FL_CONSUMER) == static_cast<int>(FL_ROLE_CONSUMER));
}

TEST_CASE("C API structs have the layout bindings assume", "[layout]") {
  // .NET and Python declare these structs by hand (LP64); a change here breaks them.
  CHECK(sizeof(fl_client_options) == 72);
  CHECK(offsetof(fl_client_options, pull) == FL_CLIENT_OPTIONS_SIZE_V3);
  CHECK(offsetof(fl_client_options, subscribe) == FL_CLIENT_OPTIONS_SIZE_V2);
  CHECK(offsetof(fl_client_options, auto_reattach) == FL_CLIENT_OPTIONS_SIZE_V1);
  CHECK(offsetof(fl_client_options, reattach_interval_ms) == 52);
  CHECK(offsetof(fl_client_options, role) == 4);
  CHECK(offsetof(fl_client_options, socket_path) == 8);
  CHECK(offsetof(fl_client_options, stream) == 16);
  CHECK(offsetof(fl_client_options, client_name) == 24);
  CHECK(offsetof(fl_client_options, slot_count) == 32);
  CHECK(offsetof(fl_client_options, slot_size) == 40);

  CHECK(sizeof(fl_client_info) == 48);
  CHECK(offsetof(fl_client_info, slot_count) == 16);
  CHECK(offsetof(fl_client_info, daemon_pid) == 24);
  CHECK(offsetof(fl_client_info, data_on_hugepages) == 40);

  CHECK(sizeof(fl_slot) == 24);
  CHECK(offsetof(fl_slot, data) == 8);
  CHECK(offsetof(fl_slot, capacity) == 16);

  CHECK(sizeof(fl_frame_meta) == 40);
  CHECK(offsetof(fl_frame_meta, flags) == 24);
  CHECK(offsetof(fl_frame_meta, attr_length) == 28);
  CHECK(offsetof(fl_frame_meta, attrs) == 32);

  CHECK(sizeof(fl_completion) == 40);
  CHECK(offsetof(fl_completion, status) == 4);
  CHECK(offsetof(fl_completion, sequence) == 8);
  CHECK(offsetof(fl_completion, frame_id) == 16);
  CHECK(offsetof(fl_completion, length) == 24);
  CHECK(offsetof(fl_completion, readers) == FL_COMPLETION_SIZE_V1);  // the older struct ends there
  CHECK(offsetof(fl_completion, released) == 36);
  CHECK(offsetof(fl_client_options, completion_size) == 60);

  CHECK(sizeof(fl_frame) == 72);
  CHECK(offsetof(fl_frame, sequence) == 8);
  CHECK(offsetof(fl_frame, data) == 16);
  CHECK(offsetof(fl_frame, length) == 24);
  CHECK(offsetof(fl_frame, frame_id) == 32);
  CHECK(offsetof(fl_frame, group_id) == 40);
  CHECK(offsetof(fl_frame, timestamp_ns) == 48);
  CHECK(offsetof(fl_frame, crc32c) == 56);
  CHECK(offsetof(fl_frame, attr_length) == 60);
  CHECK(offsetof(fl_frame, attrs) == 64);
}

TEST_CASE("fl_stream_name_valid: 1 to FL_STREAM_NAME_LEN_MAX characters of [A-Za-z0-9._-]", "[layout]") {
  // The limit is what the fixed, NUL-terminated fields can carry.
  CHECK(FL_STREAM_NAME_LEN_MAX == 63);
  CHECK(FL_STREAM_NAME_LEN_MAX + 1 == sizeof(fl_attach_request{}.stream));
  CHECK(FL_STREAM_NAME_LEN_MAX + 1 == sizeof(fl_segment_header{}.stream_name));

  const std::string longest(FL_STREAM_NAME_LEN_MAX, 'a');
  CHECK(fl_stream_name_valid(longest.data(), longest.size()) == 1);
  const std::string too_long(FL_STREAM_NAME_LEN_MAX + 1, 'a');
  CHECK(fl_stream_name_valid(too_long.data(), too_long.size()) == 0);
  CHECK(fl_stream_name_valid("", 0) == 0);
  CHECK(fl_stream_name_valid(nullptr, 3) == 0);
  CHECK(fl_stream_name_valid("Cam_0.left-1", 12) == 1);
  for (const char* bad : {"cam 0", "cam/0", "cam*", "*", "cäm", "cam\n", "cam:0"}) {
    INFO(bad);
    CHECK(fl_stream_name_valid(bad, std::strlen(bad)) == 0);
  }
  // An embedded NUL is not part of a name.
  CHECK(fl_stream_name_valid("ab\0c", 4) == 0);
  // A full fixed field has no terminator: strnlen returns its size, one too many.
  fl_attach_request req{};
  std::memset(req.stream, 'x', sizeof req.stream);
  CHECK(fl_stream_name_valid(req.stream, strnlen(req.stream, sizeof req.stream)) == 0);
  req.stream[FL_STREAM_NAME_LEN_MAX] = '\0';
  CHECK(fl_stream_name_valid(req.stream, strnlen(req.stream, sizeof req.stream)) == 1);
}
