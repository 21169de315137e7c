// The `grpc` data transport's wire: framelink.v1.DataMessage
// (proto/framelink/v1/link.proto) on the Link.Data call, handled as raw
// grpc::ByteBuffers so that payload bytes are never copied into or out of a
// protobuf `bytes` field.
//
// Sending: the sender encodes the small fields of a chunk (header, offset,
// last, and the tag and length of `payload`) itself and appends the payload
// as a grpc::Slice that points into the producer's slot.  The fields go in
// the order 1, 2, 4, 3 -- protobuf parsers accept any order, so the bytes
// are still a valid DataMessage for any peer that parses it with protobuf.
// A read response's chunks are the same, read_response (8) in place of the
// header and the payload pointing into the exposed source.
//
// Receiving: parseDataMessage() walks the fields over the received slices
// and remembers where the payload lies; the caller copies it once, straight
// into the credited buffer (or the read's).
//
// The namespace is framelink::transport (not ...::grpc, which would shadow
// ::grpc inside it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/support/async_stream.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <grpcpp/support/sync_stream.h>

#include "framelink/v1/link.pb.h"
#include "transport/frame_header.h"
#include "transport/frame_header_proto.h"  // toProto / fromProto, defined in grpc_wire.cpp

namespace framelink::transport {

// The full name of the Link.Data method.
inline constexpr char kDataMethod[] = "/framelink.v1.Link/Data";

// What one batch holds at most: frames of up to kMaxBatchedFrameBytes each,
// kMaxBatchFrames of them, kMaxBatchBytes of payload in all (well inside
// the 4 MiB any receiver accepts, grpc_limits.h).
inline constexpr size_t kMaxBatchFrames = 256;
inline constexpr uint64_t kMaxBatchedFrameBytes = uint64_t{256} << 10;
inline constexpr uint64_t kMaxBatchBytes = uint64_t{1} << 20;

using RawClientDataStream = grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
using RawAsyncClientDataStream = grpc::ClientAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

// Starts a Link.Data call whose messages are raw ByteBuffers.  gRPC 1.51's
// generated stub offers ByteBuffers only on its async and callback APIs; the
// blocking API the transport uses is reached the way the generated code
// reaches it.  Add the call metadata to `context` first.
std::unique_ptr<RawClientDataStream> openRawDataCall(const std::shared_ptr<grpc::Channel>& channel,
                                                     grpc::ClientContext* context);
// The same call on the asynchronous API, its completions on `cq`; not
// started (StartCall).  The stream lives in the call's memory: free it
// before `context`.
std::unique_ptr<RawAsyncClientDataStream> prepareRawDataCall(const std::shared_ptr<grpc::Channel>& channel,
                                                             grpc::ClientContext* context,
                                                             grpc::CompletionQueue* cq);

// The bytes of a DataMessage that carries one chunk, except its payload:
// fields header (only when `header` is set), offset, last, then the tag and
// length of `payload` (when payload_bytes > 0).  The payload bytes follow
// in the same message.  Appends to `out`.
void encodeChunkPrefix(const FrameHeader* header, uint64_t offset, bool last, uint64_t payload_bytes,
                       std::string* out);

// The same for a chunk of a read response: read_response (only when
// `response` is set: on the first chunk), offset, last, the payload's tag and
// length.
void encodeReadResponsePrefix(const framelink::v1::ReadResponse* response, uint64_t offset, bool last,
                              uint64_t payload_bytes, std::string* out);

// The bytes before the payload of one frame in a batch: the
// tag and length of a `frames` entry, then the entry's fields header, last
// and the tag and length of its `payload`.  Appends to `out`; the payload
// follows, then the next frame's prefix.
void encodeBatchedFramePrefix(const FrameHeader& header, uint64_t payload_bytes, std::string* out);

// A DataMessage with only `control` set.
grpc::ByteBuffer encodeControl(const std::string& record);
// A DataMessage with only `read_request` set.
grpc::ByteBuffer encodeReadRequest(const framelink::v1::ReadRequest& request);
// A DataMessage with only `session_id` set (the first message of a call).
grpc::ByteBuffer encodeSessionId(uint64_t session_id);

// One frame of a batch: its header and where its payload lies.
struct BatchedFrame {
  framelink::v1::FrameHeader header;
  uint64_t payload_bytes = 0;
  size_t payload_slice = 0;
  size_t payload_pos = 0;
};

// One received DataMessage.  Holds references to the received slices; reuse
// one for every message of a stream (it keeps its capacity).
struct ReceivedDataMessage {
  bool has_header = false;
  framelink::v1::FrameHeader header;
  uint64_t offset = 0;
  bool last = false;
  uint64_t session_id = 0;
  std::string control;
  bool has_read_request = false;
  framelink::v1::ReadRequest read_request;
  bool has_read_response = false;
  framelink::v1::ReadResponse read_response;
  uint64_t payload_bytes = 0;
  // The batch (`frames`): its first frame_count entries.
  size_t frame_count = 0;
  std::vector<BatchedFrame> frames;

  // Copies the payload (payload_bytes) to `dst`.
  void copyPayload(uint8_t* dst) const noexcept;
  // Copies the payload of frames[i] to `dst`.
  void copyFramePayload(size_t i, uint8_t* dst) const noexcept;

  // Where the payload lies, for copyPayload.
  std::vector<grpc::Slice> slices;
  size_t payload_slice = 0;
  size_t payload_pos = 0;

  // Where a batched frame's fields are parsed (a DataMessage in a DataMessage).
  std::unique_ptr<ReceivedDataMessage> entry;
  bool is_entry = false;  // this is such an entry: it holds no batch of its own
};

// Parses `buffer` into `out`.  Returns an empty string, or what is wrong with
// the bytes (truncated field, length past the end, a known field with the
// wrong wire type, an unparsable header or read request or response, two of
// one of those, a batched frame that is not one whole frame).  Unknown fields are
// skipped, as protobuf does.  `buffer` is left empty (its slices move to
// `out`).
std::string parseDataMessage(grpc::ByteBuffer* buffer, ReceivedDataMessage* out);

}  // namespace framelink::transport
