#include "transport/grpc/grpc_wire.h"

#include <algorithm>
#include <cstring>

#include <grpcpp/impl/rpc_method.h>

namespace framelink::transport {

namespace {

// DataMessage field numbers (link.proto).
constexpr uint32_t kFieldHeader = 1;
constexpr uint32_t kFieldOffset = 2;
constexpr uint32_t kFieldPayload = 3;
constexpr uint32_t kFieldLast = 4;
constexpr uint32_t kFieldSessionId = 5;
constexpr uint32_t kFieldControl = 6;
constexpr uint32_t kFieldReadRequest = 7;
constexpr uint32_t kFieldReadResponse = 8;
constexpr uint32_t kFieldFrames = 9;

constexpr uint32_t kWireVarint = 0;
constexpr uint32_t kWireFixed64 = 1;
constexpr uint32_t kWireLength = 2;
constexpr uint32_t kWireFixed32 = 5;

void putVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void putTag(uint32_t field, uint32_t wire_type, std::string* out) {
  putVarint((field << 3) | wire_type, out);
}

// Reads across the slices of one message.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const auto& s : slices_) remaining_ += s.size();
    skipEmpty();
  }

  uint64_t remaining() const noexcept { return remaining_; }
  size_t slice() const noexcept { return slice_; }
  size_t pos() const noexcept { return pos_; }

  // At most `max_bytes` bytes: protobuf reads tags and lengths as 32-bit
  // varints of up to five bytes, other varints of up to ten.
  bool readVarint(uint64_t* v, int max_bytes = 10) noexcept {
    uint64_t result = 0;
    for (int shift = 0; shift < 7 * max_bytes; shift += 7) {
      if (remaining_ == 0) return false;
      const uint8_t b = slices_[slice_].begin()[pos_];
      advance(1);
      result |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) {
        *v = result;
        return true;
      }
    }
    return false;  // longer than max_bytes
  }

  bool skip(uint64_t n) noexcept {
    if (n > remaining_) return false;
    while (n > 0) {
      const size_t here = std::min<uint64_t>(n, slices_[slice_].size() - pos_);
      advance(here);
      n -= here;
    }
    return true;
  }

  // The next n bytes (n <= remaining()) appended to `out`.
  void append(uint64_t n, std::string* out) {
    while (n > 0) {
      const size_t here = std::min<uint64_t>(n, slices_[slice_].size() - pos_);
      out->append(reinterpret_cast<const char*>(slices_[slice_].begin()) + pos_, here);
      advance(here);
      n -= here;
    }
  }

  // Narrows the cursor to its next n bytes (n <= remaining()), as if the
  // message ended there; returns what widen() takes to undo it once they
  // are read.
  uint64_t narrow(uint64_t n) noexcept {
    const uint64_t rest = remaining_ - n;
    remaining_ = n;
    return rest;
  }
  void widen(uint64_t rest) noexcept { remaining_ += rest; }

  // The next n bytes if they lie in one slice, else null.
  const uint8_t* contiguous(uint64_t n) const noexcept {
    if (remaining_ == 0 || slices_[slice_].size() - pos_ < n) return nullptr;
    return slices_[slice_].begin() + pos_;
  }

 private:
  void advance(size_t n) noexcept {
    pos_ += n;
    remaining_ -= n;
    skipEmpty();
  }
  void skipEmpty() noexcept {
    while (slice_ < slices_.size() && pos_ == slices_[slice_].size()) {
      ++slice_;
      pos_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t pos_ = 0;
  uint64_t remaining_ = 0;
};

}  // namespace

void toProto(const FrameHeader& h, framelink::v1::FrameHeader* p) {
  p->set_stream_id(h.stream_id);
  p->set_sequence(h.sequence);
  p->set_credit_id(h.credit_id);
  p->set_frame_id(h.frame_id);
  p->set_group_id(h.group_id);
  p->set_timestamp_ns(h.timestamp_ns);
  p->set_length(h.length);
  p->set_has_crc32c(h.has_crc32c != 0);
  p->set_maybe_redelivered(h.maybe_redelivered != 0);
  p->set_subscribers_only(h.subscribers_only != 0);
  p->set_crc32c(h.crc32c);
  p->set_attributes(reinterpret_cast<const char*>(h.attrs),
                    h.attr_length <= FL_MAX_ATTR_BYTES ? h.attr_length : FL_MAX_ATTR_BYTES);
}

bool fromProto(const framelink::v1::FrameHeader& p, FrameHeader* h) noexcept {
  if (p.attributes().size() > FL_MAX_ATTR_BYTES) return false;
  *h = FrameHeader{};
  h->stream_id = p.stream_id();
  h->sequence = p.sequence();
  h->credit_id = p.credit_id();
  h->frame_id = p.frame_id();
  h->group_id = p.group_id();
  h->timestamp_ns = p.timestamp_ns();
  h->length = p.length();
  h->crc32c = p.crc32c();
  h->has_crc32c = p.has_crc32c() ? 1 : 0;
  h->maybe_redelivered = p.maybe_redelivered() ? 1 : 0;
  h->subscribers_only = p.subscribers_only() ? 1 : 0;
  h->attr_length = static_cast<uint32_t>(p.attributes().size());
  std::memcpy(h->attrs, p.attributes().data(), h->attr_length);
  return true;
}

std::unique_ptr<RawClientDataStream> openRawDataCall(const std::shared_ptr<grpc::Channel>& channel,
                                                     grpc::ClientContext* context) {
  const grpc::internal::RpcMethod method(kDataMethod, grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  return std::unique_ptr<RawClientDataStream>(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel.get(),
                                                                                            method, context));
}

std::unique_ptr<RawAsyncClientDataStream> prepareRawDataCall(const std::shared_ptr<grpc::Channel>& channel,
                                                             grpc::ClientContext* context,
                                                             grpc::CompletionQueue* cq) {
  const grpc::internal::RpcMethod method(kDataMethod, grpc::internal::RpcMethod::BIDI_STREAMING, channel);
  return std::unique_ptr<RawAsyncClientDataStream>(
      grpc::internal::ClientAsyncReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel.get(), cq, method, context, /*start=*/false, /*tag=*/nullptr));
}

namespace {

// A submessage field: tag, length, bytes.
void putMessage(uint32_t field, const google::protobuf::MessageLite& m, std::string* out) {
  putTag(field, kWireLength, out);
  putVarint(m.ByteSizeLong(), out);
  m.AppendToString(out);
}

// The fields every chunk has after its first one: offset, last, and the tag
// and length of the payload that follows.
void putChunkTail(uint64_t offset, bool last, uint64_t payload_bytes, std::string* out) {
  // proto3 leaves default values out; so does this.
  if (offset != 0) {
    putTag(kFieldOffset, kWireVarint, out);
    putVarint(offset, out);
  }
  if (last) {
    putTag(kFieldLast, kWireVarint, out);
    putVarint(1, out);
  }
  if (payload_bytes > 0) {
    putTag(kFieldPayload, kWireLength, out);
    putVarint(payload_bytes, out);
  }
}

}  // namespace

void encodeChunkPrefix(const FrameHeader* header, uint64_t offset, bool last, uint64_t payload_bytes,
                       std::string* out) {
  if (header != nullptr) {
    framelink::v1::FrameHeader p;
    toProto(*header, &p);
    putMessage(kFieldHeader, p, out);
  }
  putChunkTail(offset, last, payload_bytes, out);
}

void encodeReadResponsePrefix(const framelink::v1::ReadResponse* response, uint64_t offset, bool last,
                              uint64_t payload_bytes, std::string* out) {
  if (response != nullptr) putMessage(kFieldReadResponse, *response, out);
  putChunkTail(offset, last, payload_bytes, out);
}

void encodeBatchedFramePrefix(const FrameHeader& header, uint64_t payload_bytes, std::string* out) {
  thread_local std::string entry;  // the sender thread's: keeps its capacity
  entry.clear();
  encodeChunkPrefix(&header, 0, true, payload_bytes, &entry);
  putTag(kFieldFrames, kWireLength, out);
  putVarint(entry.size() + payload_bytes, out);
  out->append(entry);
}

grpc::ByteBuffer encodeControl(const std::string& record) {
  std::string bytes;
  bytes.reserve(record.size() + 11);
  putTag(kFieldControl, kWireLength, &bytes);
  putVarint(record.size(), &bytes);
  bytes.append(record);
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer encodeReadRequest(const framelink::v1::ReadRequest& request) {
  std::string bytes;
  putMessage(kFieldReadRequest, request, &bytes);
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer encodeSessionId(uint64_t session_id) {
  std::string bytes;
  putTag(kFieldSessionId, kWireVarint, &bytes);
  putVarint(session_id, &bytes);
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

namespace {

// Copies n bytes that start at `pos` in slices[s] to `dst`.
void copyFromSlices(const std::vector<grpc::Slice>& slices, size_t s, size_t pos, uint64_t n,
                    uint8_t* dst) noexcept {
  while (n > 0) {
    const size_t here = std::min<uint64_t>(n, slices[s].size() - pos);
    std::memcpy(dst, slices[s].begin() + pos, here);
    dst += here;
    n -= here;
    ++s;
    pos = 0;
  }
}

}  // namespace

void ReceivedDataMessage::copyPayload(uint8_t* dst) const noexcept {
  copyFromSlices(slices, payload_slice, payload_pos, payload_bytes, dst);
}

void ReceivedDataMessage::copyFramePayload(size_t i, uint8_t* dst) const noexcept {
  const BatchedFrame& f = frames[i];
  copyFromSlices(slices, f.payload_slice, f.payload_pos, f.payload_bytes, dst);
}

namespace {

// Empties `out` for the next message (keeping its capacity).
void clearMessage(ReceivedDataMessage* out) {
  out->has_header = false;
  out->header.Clear();
  out->offset = 0;
  out->last = false;
  out->session_id = 0;
  out->control.clear();
  out->has_read_request = false;
  out->read_request.Clear();
  out->has_read_response = false;
  out->read_response.Clear();
  out->payload_bytes = 0;
  out->payload_slice = 0;
  out->payload_pos = 0;
  out->frame_count = 0;
  out->slices.clear();
}

std::string parseField(SliceCursor& in, ReceivedDataMessage* out, std::string* scratch);

// A `frames` entry of `length` bytes at the cursor: a DataMessage that is one
// whole frame (header, last, its payload; nothing else).
std::string parseBatchedFrame(SliceCursor& in, uint64_t length, ReceivedDataMessage* out,
                              std::string* scratch) {
  if (out->is_entry) return "a batched frame holds a batch of its own";
  if (!out->entry) {
    out->entry = std::make_unique<ReceivedDataMessage>();
    out->entry->is_entry = true;
  }
  ReceivedDataMessage& e = *out->entry;
  clearMessage(&e);
  const uint64_t rest = in.narrow(length);
  while (in.remaining() > 0) {
    std::string error = parseField(in, &e, scratch);
    if (!error.empty()) return "batched frame " + std::to_string(out->frame_count) + ": " + error;
  }
  in.widen(rest);
  const bool whole_frame = e.has_header && e.last && e.offset == 0 && e.session_id == 0 &&
                           e.control.empty() && !e.has_read_request && !e.has_read_response;
  if (!whole_frame) {
    return "batched frame " + std::to_string(out->frame_count) +
           " is not one whole frame (header, last and its payload only)";
  }
  if (out->frame_count == out->frames.size()) out->frames.emplace_back();
  BatchedFrame& f = out->frames[out->frame_count++];
  f.header.Swap(&e.header);
  f.payload_bytes = e.payload_bytes;
  f.payload_slice = e.payload_slice;
  f.payload_pos = e.payload_pos;
  return {};
}

// A submessage (the frame header, a read request or response) of `length`
// bytes at the cursor; parsed in place when they lie in one slice, else from
// a copy in `scratch`.  Once per message: protobuf would merge a second one
// into the first, which no sender means.
std::string parseSubmessage(SliceCursor& in, uint64_t length, google::protobuf::MessageLite* message,
                            bool* present, const char* what, std::string* scratch) {
  if (*present) return std::string("two ") + what + "s in one message";
  const uint8_t* p = in.contiguous(length);
  bool parsed = false;
  if (p != nullptr) {
    parsed = message->ParseFromArray(p, static_cast<int>(length));
    in.skip(length);
  } else {
    scratch->clear();
    in.append(length, scratch);
    parsed = message->ParseFromString(*scratch);
  }
  if (!parsed) return std::string("the ") + what + " does not parse";
  *present = true;
  return {};
}

// A length-delimited field: the submessages are parsed, the payload only located
// (copyPayload copies it later), the control record copied, others skipped.
std::string parseLengthField(SliceCursor& in, uint64_t field, ReceivedDataMessage* out,
                             std::string* scratch) {
  uint64_t value = 0;
  if (!in.readVarint(&value, 5) || value > 0x7fffffff) {
    return "truncated or overlong length of field " + std::to_string(field);
  }
  if (value > in.remaining()) {
    return "field " + std::to_string(field) + " of " + std::to_string(value) + " bytes runs past the " +
           std::to_string(in.remaining()) + " bytes left in the message";
  }
  if (field == kFieldHeader) {
    return parseSubmessage(in, value, &out->header, &out->has_header, "frame header", scratch);
  }
  if (field == kFieldReadRequest) {
    return parseSubmessage(in, value, &out->read_request, &out->has_read_request, "read request", scratch);
  }
  if (field == kFieldReadResponse) {
    return parseSubmessage(in, value, &out->read_response, &out->has_read_response, "read response", scratch);
  }
  if (field == kFieldFrames) return parseBatchedFrame(in, value, out, scratch);
  if (field == kFieldPayload) {
    // The last occurrence counts, as in protobuf.
    out->payload_bytes = value;
    out->payload_slice = in.slice();
    out->payload_pos = in.pos();
    in.skip(value);
  } else if (field == kFieldControl) {
    out->control.clear();
    in.append(value, &out->control);
  } else {
    in.skip(value);
  }
  return {};
}

// One field (tag and value) at the cursor into `out`; what is wrong with it,
// or an empty string.
std::string parseField(SliceCursor& in, ReceivedDataMessage* out, std::string* scratch) {
  uint64_t tag = 0;
  if (!in.readVarint(&tag, 5)) return "truncated or overlong field tag";
  tag &= 0xffffffff;  // as protobuf reads it
  const uint64_t field = tag >> 3;
  const uint32_t wire = static_cast<uint32_t>(tag & 7);
  if (field == 0) return "field number 0 is invalid";
  const bool known = field >= kFieldHeader && field <= kFieldFrames;
  const bool length_field = field == kFieldHeader || field == kFieldPayload || field == kFieldControl ||
                            field == kFieldReadRequest || field == kFieldReadResponse ||
                            field == kFieldFrames;
  if (known && wire != (length_field ? kWireLength : kWireVarint)) {
    return "field " + std::to_string(field) + " has wire type " + std::to_string(wire);
  }
  uint64_t value = 0;
  switch (wire) {
    case kWireVarint:
      if (!in.readVarint(&value)) return "truncated varint in field " + std::to_string(field);
      if (field == kFieldOffset) out->offset = value;
      if (field == kFieldLast) out->last = value != 0;
      if (field == kFieldSessionId) out->session_id = value;
      return {};
    case kWireFixed64:
      if (!in.skip(8)) return "truncated fixed64 in field " + std::to_string(field);
      return {};
    case kWireFixed32:
      if (!in.skip(4)) return "truncated fixed32 in field " + std::to_string(field);
      return {};
    case kWireLength:
      return parseLengthField(in, field, out, scratch);
    default:
      return "field " + std::to_string(field) + " has wire type " + std::to_string(wire) +
             " (groups are not used)";
  }
}

}  // namespace

std::string parseDataMessage(grpc::ByteBuffer* buffer, ReceivedDataMessage* out) {
  clearMessage(out);
  if (!buffer->Dump(&out->slices).ok()) return "the message could not be read";
  buffer->Clear();

  SliceCursor in(out->slices);
  std::string scratch;  // a submessage split across slices
  while (in.remaining() > 0) {
    std::string error = parseField(in, out, &scratch);
    if (!error.empty()) return error;
  }
  return {};
}

}  // namespace framelink::transport
