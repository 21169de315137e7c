// The frame header's converters, one pair per wire (shared-memory slot
// header, tcp, rdma, grpc): every field survives a round trip, the flags map
// both ways, the attribute bounds hold, and the tcp and rdma headers are laid
// out byte for byte as their peers (and the fuzz corpora) expect.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/frame_header.h"
#include "transport/grpc/grpc_wire.h"
#include "transport/rdma/rdma_wire.h"
#include "transport/tcp/tcp_wire.h"

namespace framelink::transport {
namespace {

// Every field distinct and wider than 32 bits where it can be, so that a
// swapped or truncated field shows.
FrameHeader sample(uint32_t attr_length, bool crc, bool redelivered) {
  FrameHeader h;
  h.stream_id = 0x0102030405060708ULL;
  h.sequence = 0x1112131415161718ULL;
  h.credit_id = 0x2122232425262728ULL;
  h.frame_id = 0x3132333435363738ULL;
  h.group_id = 0x4142434445464748ULL;
  h.timestamp_ns = 0x5152535455565758ULL;
  h.length = 0x0000006162636465ULL;
  h.crc32c = 0xA1B2C3D4u;
  h.has_crc32c = crc ? 1 : 0;
  h.maybe_redelivered = redelivered ? 1 : 0;
  h.subscribers_only = redelivered ? 0 : 1;
  h.attr_length = attr_length;
  for (uint32_t i = 0; i < attr_length; ++i) h.attrs[i] = static_cast<uint8_t>(i * 7 + 3);
  return h;
}

// The fields a wire carries; credit_id and stream_id only where it carries them.
void checkSame(const FrameHeader& a, const FrameHeader& b, bool stream_id = true, bool credit_id = true) {
  if (stream_id) CHECK(a.stream_id == b.stream_id);
  if (credit_id) CHECK(a.credit_id == b.credit_id);
  CHECK(a.sequence == b.sequence);
  CHECK(a.frame_id == b.frame_id);
  CHECK(a.group_id == b.group_id);
  CHECK(a.timestamp_ns == b.timestamp_ns);
  CHECK(a.length == b.length);
  CHECK(a.crc32c == b.crc32c);
  CHECK(a.has_crc32c == b.has_crc32c);
  CHECK(a.maybe_redelivered == b.maybe_redelivered);
  CHECK(a.subscribers_only == b.subscribers_only);
  REQUIRE(a.attr_length == b.attr_length);
  CHECK(std::memcmp(a.attrs, b.attrs, sizeof a.attrs) == 0);
}

// Little-endian integer of `width` bytes at `offset` of `bytes`.
uint64_t le(const uint8_t* bytes, size_t offset, size_t width) {
  uint64_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= uint64_t{bytes[offset + i]} << (8 * i);
  return v;
}

struct FlagCase {
  bool crc;
  bool redelivered;
};

FlagCase flagCase() {
  return GENERATE(FlagCase{false, false}, FlagCase{true, false}, FlagCase{false, true}, FlagCase{true, true});
}

}  // namespace

// ------------------------------------------------------------ shared memory

TEST_CASE("slot header round trip keeps every field a slot header carries", "[transport][frame_header]") {
  const FlagCase f = flagCase();
  const uint32_t attr_length = GENERATE(0u, 1u, 37u, FL_MAX_ATTR_BYTES);
  const FrameHeader h = sample(attr_length, f.crc, f.redelivered);
  fl_slot_header s{};
  toSlotHeader(h, &s);
  CHECK(s.frame_id == h.frame_id);
  CHECK(s.group_id == h.group_id);
  CHECK(s.timestamp_ns == h.timestamp_ns);
  CHECK(s.length == h.length);
  CHECK(s.sequence == h.sequence);
  CHECK(s.crc32c == h.crc32c);
  CHECK(s.flags ==
        ((f.crc ? uint32_t{FL_SLOT_HAS_CRC32C} : 0u) |
         (f.redelivered ? uint32_t{FL_SLOT_MAYBE_REDELIVERED} : uint32_t{FL_SLOT_GROUP_ELSEWHERE})));
  CHECK(s.attr_length == attr_length);
  CHECK(std::memcmp(s.attrs, h.attrs, attr_length) == 0);

  FrameHeader back;
  back.stream_id = 99;  // a slot header has no stream or credit: left alone
  back.credit_id = 98;
  fromSlotHeader(s, &back);
  CHECK(back.stream_id == 99);
  CHECK(back.credit_id == 98);
  checkSame(h, back, false, false);
}

TEST_CASE("slot header: reserved fields and attribute bytes past attr_length are left as they are",
          "[transport][frame_header]") {
  fl_slot_header s;
  std::memset(&s, 0xEE, sizeof s);
  toSlotHeader(sample(5, true, false), &s);
  CHECK(s.reserved0 == 0xEEEEEEEEu);
  for (uint8_t b : s.reserved1) CHECK(b == 0xEE);
  CHECK(s.attrs[4] == 4 * 7 + 3);
  CHECK(s.attrs[5] == 0xEE);
  CHECK(s.attrs[FL_MAX_ATTR_BYTES - 1] == 0xEE);
}

TEST_CASE("slot header bounds: attr_length above FL_MAX_ATTR_BYTES", "[transport][frame_header]") {
  SECTION("read: becomes 0 with no attributes") {
    fl_slot_header s{};
    s.frame_id = 7;
    s.attr_length = FL_MAX_ATTR_BYTES + 1;
    std::memset(s.attrs, 'x', sizeof s.attrs);
    FrameHeader h;
    fromSlotHeader(s, &h);
    CHECK(h.frame_id == 7);
    CHECK(h.attr_length == 0);
    CHECK(h.attrs[0] == 0);
  }
  SECTION("write: never more than FL_MAX_ATTR_BYTES attribute bytes") {
    struct {
      fl_slot_header s;
      uint8_t after[16];
    } region;
    std::memset(&region, 0xEE, sizeof region);
    FrameHeader h = sample(FL_MAX_ATTR_BYTES, false, false);
    h.attr_length = 1000;
    toSlotHeader(h, &region.s);
    CHECK(region.s.attrs[FL_MAX_ATTR_BYTES - 1] == h.attrs[FL_MAX_ATTR_BYTES - 1]);
    for (uint8_t b : region.after) CHECK(b == 0xEE);
  }
  SECTION("unknown flag bits are not read as anything") {
    fl_slot_header s{};
    s.flags = ~uint32_t{FL_SLOT_HAS_CRC32C | FL_SLOT_MAYBE_REDELIVERED | FL_SLOT_GROUP_ELSEWHERE};
    FrameHeader h;
    fromSlotHeader(s, &h);
    CHECK(h.has_crc32c == 0);
    CHECK(h.maybe_redelivered == 0);
    CHECK(h.subscribers_only == 0);
  }
}

// --------------------------------------------------------------------- tcp

TEST_CASE("tcp wire round trip keeps every field", "[transport][frame_header][tcp]") {
  const FlagCase f = flagCase();
  const uint32_t attr_length = GENERATE(0u, 1u, 37u, FL_MAX_ATTR_BYTES);
  const FrameHeader h = sample(attr_length, f.crc, f.redelivered);
  const tcp::TcpFrameHeader w = tcp::toWire(h);
  checkSame(h, tcp::fromWire(w));
}

TEST_CASE("tcp wire header is laid out byte for byte as documented", "[transport][frame_header][tcp]") {
  const FlagCase f = flagCase();
  const FrameHeader h = sample(37, f.crc, f.redelivered);
  const tcp::TcpFrameHeader w = tcp::toWire(h);
  uint8_t b[sizeof w];
  std::memcpy(b, &w, sizeof w);
  REQUIRE(sizeof b == 264);
  CHECK(std::memcmp(b, "\x31\x4D\x52\x46", 4) == 0);                      // magic
  CHECK(le(b, 4, 4) == ((f.crc ? 1u : 0u) | (f.redelivered ? 2u : 4u)));  // 4: subscribers only
  CHECK(le(b, 8, 8) == h.stream_id);
  CHECK(le(b, 16, 8) == h.sequence);
  CHECK(le(b, 24, 8) == h.credit_id);
  CHECK(le(b, 32, 8) == h.frame_id);
  CHECK(le(b, 40, 8) == h.group_id);
  CHECK(le(b, 48, 8) == h.timestamp_ns);
  CHECK(le(b, 56, 8) == h.length);
  CHECK(le(b, 64, 4) == h.crc32c);
  CHECK(le(b, 68, 4) == 37);
  CHECK(std::memcmp(b + 72, h.attrs, 37) == 0);
  for (size_t i = 72 + 37; i < sizeof b; ++i) CHECK(b[i] == 0);  // unused attribute bytes go as zeros
}

TEST_CASE("tcp wire bounds: attr_length above FL_MAX_ATTR_BYTES reads as 0",
          "[transport][frame_header][tcp]") {
  // The receiver fails the link before it converts such a header (see
  // test_tcp_wire.cpp); the converter itself stays within the struct.
  tcp::TcpFrameHeader w = tcp::toWire(sample(FL_MAX_ATTR_BYTES, true, false));
  w.attr_length = FL_MAX_ATTR_BYTES + 1;
  const FrameHeader h = tcp::fromWire(w);
  CHECK(h.attr_length == 0);
  CHECK(h.attrs[0] == 0);
  CHECK(h.frame_id == w.frame_id);
}

// -------------------------------------------------------------------- rdma

TEST_CASE("rdma wire round trip keeps every field, the credit id from the receiver",
          "[transport][frame_header][rdma]") {
  const FlagCase f = flagCase();
  const uint32_t attr_length = GENERATE(0u, 1u, 37u, FL_MAX_ATTR_BYTES);
  const FrameHeader h = sample(attr_length, f.crc, f.redelivered);
  rdma::RdmaWireHeader w{};
  rdma::toWire(h, &w);
  FrameHeader back;
  rdma::fromWire(w, h.credit_id, &back);
  checkSame(h, back);
  rdma::fromWire(w, 5, &back);
  CHECK(back.credit_id == 5);
}

TEST_CASE("rdma wire header is the slot header, with has_crc32c and stream_id in its reserved fields",
          "[transport][frame_header][rdma]") {
  const FlagCase f = flagCase();
  const FrameHeader h = sample(37, f.crc, f.redelivered);
  rdma::RdmaWireHeader w{};
  rdma::toWire(h, &w);
  uint8_t b[rdma::kWireHeaderBytes];
  std::memcpy(b, &w, sizeof b);
  REQUIRE(sizeof b == 256);
  CHECK(le(b, 0, 8) == h.frame_id);
  CHECK(le(b, 8, 8) == h.group_id);
  CHECK(le(b, 16, 8) == h.timestamp_ns);
  CHECK(le(b, 24, 8) == h.length);
  CHECK(le(b, 32, 8) == h.sequence);
  CHECK(le(b, 40, 4) == h.crc32c);
  CHECK(le(b, 44, 4) == ((f.crc ? 1u : 0u) | (f.redelivered ? 2u : 16u)));  // 16: FL_SLOT_GROUP_ELSEWHERE
  CHECK(le(b, 48, 4) == 37);
  CHECK(le(b, 52, 4) == (f.crc ? 1u : 0u));  // reserved0: has_crc32c
  CHECK(le(b, 56, 8) == h.stream_id);        // reserved1: stream_id
  CHECK(std::memcmp(b + 64, h.attrs, 37) == 0);

  // What lands is what the consumer's library reads as a slot header.
  FrameHeader as_slot;
  fromSlotHeader(w, &as_slot);
  checkSame(h, as_slot, false, false);
}

TEST_CASE("rdma wire: the receiver reads has_crc32c from reserved0", "[transport][frame_header][rdma]") {
  rdma::RdmaWireHeader w{};
  rdma::toWire(sample(0, true, false), &w);
  w.reserved0 = 0;  // flags still say FL_SLOT_HAS_CRC32C
  FrameHeader h;
  rdma::fromWire(w, 1, &h);
  CHECK(h.has_crc32c == 0);
}

TEST_CASE("rdma wire: a reused header buffer carries no earlier frame's attributes",
          "[transport][frame_header][rdma]") {
  // The transport reuses its send-header buffers across the link's streams.
  rdma::RdmaWireHeader w{};
  rdma::toWire(sample(FL_MAX_ATTR_BYTES, false, false), &w);
  const FrameHeader shorter = sample(5, false, false);
  rdma::toWire(shorter, &w);
  CHECK(std::memcmp(w.attrs, shorter.attrs, 5) == 0);
  for (uint32_t i = 5; i < FL_MAX_ATTR_BYTES; ++i) CHECK(w.attrs[i] == 0);
}

TEST_CASE("rdma wire bounds: attr_length above FL_MAX_ATTR_BYTES", "[transport][frame_header][rdma]") {
  SECTION("read: becomes 0 with no attributes") {
    rdma::RdmaWireHeader w{};
    rdma::toWire(sample(FL_MAX_ATTR_BYTES, false, false), &w);
    w.attr_length = FL_MAX_ATTR_BYTES + 1;
    FrameHeader h;
    rdma::fromWire(w, 3, &h);
    CHECK(h.attr_length == 0);
    CHECK(h.attrs[0] == 0);
    CHECK(h.stream_id == 0x0102030405060708ULL);
  }
  SECTION("write: the attribute copy stops at FL_MAX_ATTR_BYTES") {
    struct {
      rdma::RdmaWireHeader w;
      uint8_t after[16];
    } region;
    std::memset(&region, 0xEE, sizeof region);
    FrameHeader h = sample(FL_MAX_ATTR_BYTES, false, false);
    h.attr_length = FL_MAX_ATTR_BYTES + 1;
    rdma::toWire(h, &region.w);
    for (uint8_t b : region.after) CHECK(b == 0xEE);
  }
}

// -------------------------------------------------------------------- grpc

TEST_CASE("grpc wire round trip keeps every field", "[transport][frame_header][grpc]") {
  const FlagCase f = flagCase();
  const uint32_t attr_length = GENERATE(0u, 1u, 37u, FL_MAX_ATTR_BYTES);
  const FrameHeader h = sample(attr_length, f.crc, f.redelivered);
  framelink::v1::FrameHeader p;
  toProto(h, &p);
  CHECK(p.attributes().size() == attr_length);
  CHECK(p.has_crc32c() == f.crc);
  CHECK(p.maybe_redelivered() == f.redelivered);
  CHECK(p.subscribers_only() == !f.redelivered);
  // Through the bytes that go on the wire, not just the message object.
  framelink::v1::FrameHeader parsed;
  REQUIRE(parsed.ParseFromString(p.SerializeAsString()));
  FrameHeader back;
  std::memset(back.attrs, 0xEE, sizeof back.attrs);
  REQUIRE(fromProto(parsed, &back));
  checkSame(h, back);  // attribute bytes past attr_length are zero again
}

TEST_CASE("grpc wire bounds: attributes above FL_MAX_ATTR_BYTES are refused",
          "[transport][frame_header][grpc]") {
  framelink::v1::FrameHeader p;
  toProto(sample(4, true, true), &p);
  FrameHeader h;
  h.frame_id = 77;
  SECTION("193 bytes") {
    p.set_attributes(std::string(FL_MAX_ATTR_BYTES + 1, 'a'));
    CHECK_FALSE(fromProto(p, &h));
    CHECK(h.frame_id == 77);  // untouched
  }
  SECTION("192 bytes are taken") {
    p.set_attributes(std::string(FL_MAX_ATTR_BYTES, 'a'));
    REQUIRE(fromProto(p, &h));
    CHECK(h.attr_length == FL_MAX_ATTR_BYTES);
    CHECK(h.attrs[FL_MAX_ATTR_BYTES - 1] == 'a');
  }
  SECTION("send: never more than FL_MAX_ATTR_BYTES") {
    FrameHeader big = sample(FL_MAX_ATTR_BYTES, false, false);
    big.attr_length = 1000;
    toProto(big, &p);
    CHECK(p.attributes().size() == FL_MAX_ATTR_BYTES);
  }
}

}  // namespace framelink::transport
