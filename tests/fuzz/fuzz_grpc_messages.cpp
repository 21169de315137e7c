// libFuzzer target: the grpc data transport's DataMessage parser fed
// whatever a peer could send on the Data call, cut into slices the way gRPC
// may hand them over.  Invariants: no crash; what parses lies inside the
// message (the payload is copied into a buffer exactly its size, so ASan
// reports a read past the message or a write past the buffer); and what
// parses is a DataMessage protobuf reads the same way (read requests and
// responses included).  GrpcTransport's reassembly of chunks (control
// records and read requests between them, a credit retracted mid-frame, read
// responses) is fuzz_grpc_reassembly's; test_transport_retract_mid_frame.cpp
// pins the retraction across threads.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "transport/grpc/grpc_wire.h"

using namespace framelink::transport;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_grpc_messages: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte says where to cut the rest into slices.
  const uint8_t cuts = data[0];
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (int bit = 0; bit < 8 && at < bytes.size(); ++bit) {
    if ((cuts & (1u << bit)) == 0) continue;
    const size_t n = std::min<size_t>(bytes.size() - at, 1 + bit * 3);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  if (at < bytes.size() || slices.empty()) slices.emplace_back(bytes.data() + at, bytes.size() - at);
  grpc::ByteBuffer buffer(slices.data(), slices.size());

  ReceivedDataMessage got;
  if (!parseDataMessage(&buffer, &got).empty()) return 0;
  if (got.payload_bytes > bytes.size()) fail("payload longer than the message");
  std::vector<uint8_t> payload(got.payload_bytes);
  if (!payload.empty()) got.copyPayload(payload.data());

  framelink::v1::DataMessage m;
  if (!m.ParseFromString(bytes)) fail("parsed, but protobuf refuses the bytes");
  if (m.has_header() != got.has_header) fail("header presence differs from protobuf");
  if (m.has_header() && m.header().SerializeAsString() != got.header.SerializeAsString()) {
    fail("header differs from protobuf");
  }
  if (m.offset() != got.offset || m.last() != got.last || m.session_id() != got.session_id) {
    fail("a scalar field differs from protobuf");
  }
  if (m.control() != got.control) fail("control differs from protobuf");
  if (m.has_read_request() != got.has_read_request) fail("read request presence differs from protobuf");
  if (m.has_read_request() && m.read_request().SerializeAsString() != got.read_request.SerializeAsString()) {
    fail("read request differs from protobuf");
  }
  if (m.has_read_response() != got.has_read_response) fail("read response presence differs from protobuf");
  if (m.has_read_response() &&
      m.read_response().SerializeAsString() != got.read_response.SerializeAsString()) {
    fail("read response differs from protobuf");
  }
  if (m.payload() != std::string(payload.begin(), payload.end())) fail("payload differs from protobuf");
  return 0;
}
