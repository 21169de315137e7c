// The grpc transport's hand-made DataMessage encoding and its slice parser:
// what the sender writes is a DataMessage to protobuf, what protobuf writes
// parses the same, and malformed bytes get an error, never a crash.
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "transport/grpc/grpc_wire.h"

namespace framelink::transport::testing {
namespace {

using framelink::v1::DataMessage;

// `bytes` as a ByteBuffer of slices cut at `cuts` random places (cuts == 0:
// one slice).
grpc::ByteBuffer sliced(const std::string& bytes, std::mt19937_64& rng, size_t cuts) {
  std::vector<size_t> at{0, bytes.size()};
  for (size_t i = 0; i < cuts && !bytes.empty(); ++i) at.push_back(rng() % (bytes.size() + 1));
  std::sort(at.begin(), at.end());
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i + 1 < at.size(); ++i) {
    slices.emplace_back(bytes.data() + at[i], at[i + 1] - at[i]);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string payloadOf(const ReceivedDataMessage& m) {
  std::string out(m.payload_bytes, '\0');
  if (m.payload_bytes > 0) m.copyPayload(reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

void requireSame(const DataMessage& want, const ReceivedDataMessage& got) {
  CHECK(got.has_header == want.has_header());
  if (want.has_header()) CHECK(got.header.SerializeAsString() == want.header().SerializeAsString());
  CHECK(got.offset == want.offset());
  CHECK(got.last == want.last());
  CHECK(got.session_id == want.session_id());
  CHECK(got.control == want.control());
  CHECK(got.has_read_request == want.has_read_request());
  if (want.has_read_request()) {
    CHECK(got.read_request.SerializeAsString() == want.read_request().SerializeAsString());
  }
  CHECK(got.has_read_response == want.has_read_response());
  if (want.has_read_response()) {
    CHECK(got.read_response.SerializeAsString() == want.read_response().SerializeAsString());
  }
  CHECK(payloadOf(got) == want.payload());
}

framelink::v1::ReadResponse sampleResponse(std::mt19937_64& rng) {
  framelink::v1::ReadResponse r;
  r.set_source_id(rng());
  r.set_read_id(rng() % 300);
  r.set_length(rng() % 2 ? rng() % 70'000 : 0);
  r.set_no_source(r.length() == 0 && rng() % 2);
  return r;
}

FrameHeader sampleHeader(uint64_t seed) {
  FrameHeader h;
  h.stream_id = seed * 3;
  h.sequence = seed + 1;
  h.credit_id = seed * 1'000'003;
  h.frame_id = ~seed;
  h.group_id = seed << 20;
  h.timestamp_ns = 1'700'000'000'000'000'000ull + seed;
  h.length = 70'000;
  h.crc32c = static_cast<uint32_t>(seed * 2654435761u);
  h.has_crc32c = seed & 1;
  h.maybe_redelivered = (seed >> 1) & 1;
  h.subscribers_only = (seed >> 2) & 1;
  h.attr_length = static_cast<uint32_t>(seed % (FL_MAX_ATTR_BYTES + 1));
  for (uint32_t i = 0; i < h.attr_length; ++i) h.attrs[i] = static_cast<uint8_t>(i + seed);
  return h;
}

}  // namespace

TEST_CASE("grpc wire: a chunk the sender encodes is the DataMessage protobuf expects", "[grpc][grpc_wire]") {
  std::mt19937_64 rng(7);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    const FrameHeader h = sampleHeader(seed);
    const bool with_header = seed % 3 != 0;
    const uint64_t offset = seed % 5 == 0 ? 0 : rng() % (uint64_t{1} << (seed % 40));
    const bool last = seed % 2 == 0;
    std::string payload(seed % 7 == 0 ? 0 : rng() % 3000, '\0');
    for (auto& c : payload) c = static_cast<char>(rng());

    std::string bytes;
    encodeChunkPrefix(with_header ? &h : nullptr, offset, last, payload.size(), &bytes);
    bytes += payload;

    DataMessage want;
    if (with_header) toProto(h, want.mutable_header());
    want.set_offset(offset);
    want.set_last(last);
    want.set_payload(payload);

    DataMessage by_protobuf;
    REQUIRE(by_protobuf.ParseFromString(bytes));
    CHECK(by_protobuf.SerializeAsString() == want.SerializeAsString());

    grpc::ByteBuffer buffer = sliced(bytes, rng, seed % 6);
    ReceivedDataMessage got;
    REQUIRE(parseDataMessage(&buffer, &got).empty());
    requireSame(want, got);
  }
}

TEST_CASE("grpc wire: a read request and a response's chunks are the DataMessages protobuf expects",
          "[grpc][grpc_wire]") {
  std::mt19937_64 rng(19);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    CAPTURE(seed);
    framelink::v1::ReadRequest request;
    request.set_source_id(seed % 4 == 0 ? 0 : rng());
    request.set_read_id(1 + seed);
    request.set_length(seed % 5 == 0 ? 0 : rng() % (uint64_t{1} << (seed % 40)));
    grpc::ByteBuffer asked = encodeReadRequest(request);
    DataMessage want_request;
    *want_request.mutable_read_request() = request;
    std::vector<grpc::Slice> slices;
    REQUIRE(asked.Dump(&slices).ok());
    std::string request_bytes;
    for (const auto& slice : slices)
      request_bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    DataMessage by_protobuf;
    REQUIRE(by_protobuf.ParseFromString(request_bytes));
    CHECK(by_protobuf.SerializeAsString() == want_request.SerializeAsString());
    ReceivedDataMessage got;
    REQUIRE(parseDataMessage(&asked, &got).empty());
    requireSame(want_request, got);

    // A chunk of the answer: the first names the read, the others only carry bytes.
    const framelink::v1::ReadResponse response = sampleResponse(rng);
    const bool first = seed % 3 != 0;
    const uint64_t offset = first ? 0 : rng() % (uint64_t{1} << (seed % 40));
    const bool last = seed % 2 == 0;
    std::string payload(seed % 7 == 0 ? 0 : rng() % 3000, '\0');
    for (auto& c : payload) c = static_cast<char>(rng());
    std::string bytes;
    encodeReadResponsePrefix(first ? &response : nullptr, offset, last, payload.size(), &bytes);
    bytes += payload;
    DataMessage want;
    if (first) *want.mutable_read_response() = response;
    want.set_offset(offset);
    want.set_last(last);
    want.set_payload(payload);
    REQUIRE(by_protobuf.ParseFromString(bytes));
    CHECK(by_protobuf.SerializeAsString() == want.SerializeAsString());
    grpc::ByteBuffer buffer = sliced(bytes, rng, seed % 6);
    REQUIRE(parseDataMessage(&buffer, &got).empty());
    requireSame(want, got);
  }
}

TEST_CASE("grpc wire: what protobuf serializes parses the same, in any slicing", "[grpc][grpc_wire]") {
  std::mt19937_64 rng(11);
  ReceivedDataMessage got;  // reused, as the reader does
  for (int i = 0; i < 300; ++i) {
    CAPTURE(i);
    DataMessage m;
    if (rng() % 2) toProto(sampleHeader(rng() % 1000), m.mutable_header());
    if (rng() % 2) m.set_offset(rng());
    if (rng() % 2) m.set_last(true);
    if (rng() % 2) m.set_session_id(rng());
    if (rng() % 3 == 0) m.set_control(std::string(1 + rng() % 500, static_cast<char>(rng())));
    if (rng() % 4 == 0) {
      auto* q = m.mutable_read_request();
      q->set_source_id(rng());
      q->set_read_id(rng());
      q->set_length(rng());
    }
    if (rng() % 4 == 0) *m.mutable_read_response() = sampleResponse(rng);
    if (rng() % 2) m.set_payload(std::string(rng() % 20'000, static_cast<char>(rng())));
    const std::string bytes = m.SerializeAsString();
    grpc::ByteBuffer buffer = sliced(bytes, rng, rng() % 8);
    REQUIRE(parseDataMessage(&buffer, &got).empty());
    requireSame(m, got);
  }
}

TEST_CASE("grpc wire: unknown fields are skipped as protobuf skips them", "[grpc][grpc_wire]") {
  // Field 13 varint 5, field 10 fixed64, field 11 bytes "ab", field 12 fixed32, then offset 3.
  const std::string bytes(
      "\x68\x05\x51\x01\x02\x03\x04\x05\x06\x07\x08\x5a\x02\x61\x62\x65\x01\x02\x03\x04\x10\x03", 22);
  std::mt19937_64 rng(1);
  grpc::ByteBuffer buffer = sliced(bytes, rng, 3);
  ReceivedDataMessage got;
  REQUIRE(parseDataMessage(&buffer, &got).empty());
  CHECK(got.offset == 3);
  DataMessage by_protobuf;
  REQUIRE(by_protobuf.ParseFromString(bytes));
  CHECK(by_protobuf.offset() == 3);
}

TEST_CASE("grpc wire: malformed messages are refused with the reason", "[grpc][grpc_wire]") {
  struct Case {
    std::string bytes;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {std::string("\x80", 1), "truncated or overlong field tag"},
      {std::string("\x88\x80\x80\x80\x80\x00", 6), "truncated or overlong field tag"},
      {std::string("\x10\x80\x80", 3), "truncated varint"},
      {std::string("\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 12), "truncated varint"},
      {std::string("\x1a\x05"
                   "ab",
                   4),
       "runs past"},
      {std::string("\x1a\xff\xff\xff\xff\x0f"
                   "ab",
                   8),
       "overlong length of field 3"},
      {std::string("\x1a\x82\x80\x80\x80\x80\x00"
                   "ab",
                   9),
       "overlong length of field 3"},
      {std::string("\x12\x01x", 3), "field 2 has wire type 2"},
      {std::string("\x18\x01", 2), "field 3 has wire type 0"},
      {std::string("\x0b", 1), "field 1 has wire type 3"},
      {std::string("\x6b", 1), "groups are not used"},
      {std::string("\x38\x01", 2), "field 7 has wire type 0"},
      {std::string("\x45\x01\x02\x03\x04", 5), "field 8 has wire type 5"},
      {std::string("\x00\x00", 2), "field number 0"},
      {std::string("\x69\x01\x02", 3), "truncated fixed64"},
      {std::string("\x48\x01", 2), "field 9 has wire type 0"},
      {std::string("\x0a\x02\x08\x80", 4), "frame header does not parse"},
      {std::string("\x0a\x00\x0a\x00", 4), "two frame headers"},
      {std::string("\x3a\x02\x08\x80", 4), "read request does not parse"},
      {std::string("\x42\x02\x20\x80", 4), "read response does not parse"},
      {std::string("\x3a\x00\x3a\x00", 4), "two read requests"},
      {std::string("\x42\x02\x08\x01\x42\x00", 6), "two read responses"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.reason);
    grpc::Slice slice(c.bytes.data(), c.bytes.size());
    grpc::ByteBuffer buffer(&slice, 1);
    ReceivedDataMessage got;
    const std::string why = parseDataMessage(&buffer, &got);
    CHECK_THAT(why, Catch::Contains(c.reason));
  }
}

TEST_CASE("grpc wire: a batch the sender encodes is the DataMessage protobuf expects", "[grpc][grpc_wire]") {
  std::mt19937_64 rng(41);
  for (uint64_t seed = 0; seed < 100; ++seed) {
    CAPTURE(seed);
    DataMessage want;
    std::string bytes;
    std::vector<std::string> payloads;
    const size_t frames = 1 + seed % 9;
    for (size_t i = 0; i < frames; ++i) {
      FrameHeader h = sampleHeader(seed * 16 + i);
      std::string payload(i % 4 == 0 ? 0 : rng() % 5000, '\0');
      for (auto& c : payload) c = static_cast<char>(rng());
      h.length = payload.size();
      encodeBatchedFramePrefix(h, payload.size(), &bytes);
      bytes += payload;
      DataMessage* entry = want.add_frames();
      toProto(h, entry->mutable_header());
      entry->set_last(true);
      entry->set_payload(payload);
      payloads.push_back(std::move(payload));
    }
    DataMessage by_protobuf;
    REQUIRE(by_protobuf.ParseFromString(bytes));
    CHECK(by_protobuf.SerializeAsString() == want.SerializeAsString());

    grpc::ByteBuffer buffer = sliced(bytes, rng, seed % 7);
    ReceivedDataMessage got;
    REQUIRE(parseDataMessage(&buffer, &got).empty());
    REQUIRE(got.frame_count == frames);
    CHECK_FALSE(got.has_header);
    CHECK(got.payload_bytes == 0);
    for (size_t i = 0; i < frames; ++i) {
      CHECK(got.frames[i].header.SerializeAsString() == want.frames(i).header().SerializeAsString());
      std::string payload(got.frames[i].payload_bytes, '\0');
      if (!payload.empty()) got.copyFramePayload(i, reinterpret_cast<uint8_t*>(payload.data()));
      CHECK(payload == payloads[i]);
    }
  }
}

TEST_CASE("grpc wire: a batched frame that is not one whole frame is refused", "[grpc][grpc_wire]") {
  DataMessage entry;
  toProto(sampleHeader(3), entry.mutable_header());
  entry.set_last(true);
  entry.set_payload("abc");
  DataMessage m;
  const char* reason = "is not one whole frame";
  SECTION("no header") { entry.clear_header(); }
  SECTION("not the last chunk") { entry.set_last(false); }
  SECTION("a chunk at an offset") { entry.set_offset(4096); }
  SECTION("a control record in it") { entry.set_control("x"); }
  SECTION("a read response in it") { entry.mutable_read_response()->set_read_id(1); }
  SECTION("a batch in it") {
    *entry.add_frames() = entry;
    reason = "holds a batch of its own";
  }
  *m.add_frames() = entry;
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  grpc::ByteBuffer buffer(&slice, 1);
  ReceivedDataMessage got;
  CHECK_THAT(parseDataMessage(&buffer, &got), Catch::Contains(reason));
}

TEST_CASE("grpc wire: mutated and random bytes never crash the parser", "[grpc][grpc_wire]") {
  std::mt19937_64 rng(2024);
  const FrameHeader h = sampleHeader(5);
  std::string valid;
  encodeChunkPrefix(&h, 4096, true, 300, &valid);
  valid += std::string(300, 'p');
  ReceivedDataMessage got;
  size_t refused = 0;
  for (int i = 0; i < 20'000; ++i) {
    std::string bytes = valid;
    switch (i % 4) {
      case 0:  // flip a few bytes
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k)
          bytes[rng() % bytes.size()] ^= static_cast<char>(rng());
        break;
      case 1:  // cut short
        bytes.resize(rng() % bytes.size());
        break;
      case 2:  // garbage
        bytes.resize(rng() % 64);
        for (auto& c : bytes) c = static_cast<char>(rng());
        break;
      default:  // garbage after a valid prefix
        bytes.resize(rng() % bytes.size());
        for (int k = 0; k < 16; ++k) bytes.push_back(static_cast<char>(rng()));
        break;
    }
    grpc::ByteBuffer buffer = sliced(bytes, rng, rng() % 5);
    const std::string why = parseDataMessage(&buffer, &got);
    if (!why.empty()) {
      ++refused;
      continue;
    }
    // Whatever parsed lies inside the message: reading the payload stays in bounds.
    REQUIRE(got.payload_bytes <= bytes.size());
    std::string payload = payloadOf(got);
    CHECK(payload.size() == got.payload_bytes);
  }
  CHECK(refused > 1000);  // the cases above are mostly malformed
}

}  // namespace framelink::transport::testing
