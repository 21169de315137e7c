// Wire format of the `tcp` data transport (one TCP connection per link,
// dialed by the daemon that dialed the gRPC Session, after HelloAck chose
// transport "tcp" and named the listener's tcp_data_port).
//
// All integers are little-endian; every struct has a fixed size and no
// implicit padding.  Bump kTcpWireVersion whenever anything here changes.
//
// 1. Handshake, dialer -> listener, exactly 64 bytes (TcpHello):
//      magic        8  "FLTCPDAT"
//      version      4  kTcpWireVersion
//      flags        4  0 (reserved)
//      session_id   8  the session_id of the gRPC Session this connection belongs to
//      token       32  tokenDigest(token, session_id), see below
//      reserved     8  0
//    Listener -> dialer, exactly 8 bytes (TcpHelloReply):
//      status       4  fl_status: FL_OK, FL_ERR_AUTH, FL_ERR_PEER_VERSION, FL_ERR_PROTOCOL
//      version      4  the listener's kTcpWireVersion
//    On a non-OK status the listener closes the connection.
//
//    Token field: HMAC-SHA256 of the session id keyed by the token
//    (transport/token_digest.h), never the token itself, so the plaintext
//    data connection neither leaks the secret that the (possibly
//    TLS-protected) gRPC Session carries nor proves it for another session.
//    The listener accepts a data connection only for a session_id that a
//    Session negotiated, with the token that Session proved.
//
// 2. Frames, in both directions after a successful handshake: a TcpFrameHeader
//    (256 bytes) followed by exactly `length` payload bytes, which land in the
//    receive buffer named by credit_id.  A receiver closes the connection
//    (FL_ERR_PROTOCOL) on a bad magic, attr_length > FL_MAX_ATTR_BYTES, or a
//    length above the named credit's capacity.  Frames for an unknown or
//    retracted credit are read and discarded (up to the receiver's
//    max_frame_bytes) and reported as FL_ERR_UNKNOWN_CREDIT.
//
// 3. Control records (credit grants, ACKs, NACKs of the peer protocol), in
//    both directions, between frames: a TcpFrameHeader with magic
//    kTcpControlMagic, `length` the record's size (1..kMaxControlBytes) and
//    every other field 0, followed by the record's bytes.  A sender writes the
//    control it has queued ahead of its next frame, in one sendmsg.  A larger
//    length closes the connection (FL_ERR_PROTOCOL).
//
// 4. Reads (pull), in both directions, between frames, always a whole
//    TcpFrameHeader with every field not named here 0:
//    request   magic kTcpReadRequestMagic, credit_id the source id (of the
//              offer), frame_id the read's id (the reader's, echoed in the
//              response), length the bytes asked for; no body.  A reader has
//              at most kMaxReadsOutstanding requests unanswered; a responder
//              asked for more closes the connection (FL_ERR_PROTOCOL).
//    response  magic kTcpReadResponseMagic, credit_id and frame_id echoed,
//              then either flags 0 and exactly the asked `length` bytes of
//              the source, or flags kTcpReadNoSource, length 0 and no body
//              when the responder exposes no such source of that length.
//              A response for a read id that is not outstanding, or of
//              another length, closes the connection (FL_ERR_PROTOCOL).
//    Responses are written in the order of their requests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "framelink/shm_layout.h"
#include "transport/frame_header.h"
#include "transport/token_digest.h"

namespace framelink::transport::tcp {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the tcp wire format is little-endian; add byte swapping for this host");

inline constexpr char kTcpHelloMagic[8] = {'F', 'L', 'T', 'C', 'P', 'D', 'A', 'T'};
inline constexpr uint32_t kTcpWireVersion = 4;  // 2: control records; 3: reads; 4: HMAC-SHA256 token proof
inline constexpr uint32_t kTcpFrameMagic = 0x46524D31;         // bytes 31 4D 52 46 on the wire
inline constexpr uint32_t kTcpControlMagic = 0x4C544331;       // bytes 31 43 54 4C on the wire
inline constexpr uint32_t kTcpReadRequestMagic = 0x51524C46;   // "FLRQ"
inline constexpr uint32_t kTcpReadResponseMagic = 0x53524C46;  // "FLRS"
inline constexpr uint32_t kTcpReadNoSource = 1u << 0;          // response flags

struct TcpHello {
  char magic[8];
  uint32_t version;
  uint32_t flags;
  uint64_t session_id;
  uint8_t token[kTokenDigestBytes];
  uint8_t reserved[8];
};
static_assert(sizeof(TcpHello) == 64);
static_assert(offsetof(TcpHello, session_id) == 16);
static_assert(offsetof(TcpHello, token) == 24);

struct TcpHelloReply {
  uint32_t status;
  uint32_t version;
};
static_assert(sizeof(TcpHelloReply) == 8);

struct TcpFrameHeader {
  uint32_t magic;  // kTcpFrameMagic
  uint32_t flags;  // kTcpFrameCrc32c | kTcpFrameMaybeRedelivered | kTcpFrameSubscribersOnly
  uint64_t stream_id;
  uint64_t sequence;
  uint64_t credit_id;
  uint64_t frame_id;
  uint64_t group_id;
  uint64_t timestamp_ns;
  uint64_t length;  // payload bytes that follow
  uint32_t crc32c;
  uint32_t attr_length;  // <= FL_MAX_ATTR_BYTES
  uint8_t attrs[FL_MAX_ATTR_BYTES];
};
static_assert(FL_MAX_ATTR_BYTES == 192, "TcpFrameHeader layout assumes 192 attribute bytes");
static_assert(sizeof(TcpFrameHeader) == 264);
static_assert(offsetof(TcpFrameHeader, stream_id) == 8);
static_assert(offsetof(TcpFrameHeader, length) == 56);
static_assert(offsetof(TcpFrameHeader, crc32c) == 64);
static_assert(offsetof(TcpFrameHeader, attrs) == 72);

inline constexpr uint32_t kTcpFrameCrc32c = 1u << 0;
inline constexpr uint32_t kTcpFrameMaybeRedelivered = 1u << 1;
inline constexpr uint32_t kTcpFrameSubscribersOnly = 1u << 2;

inline TcpFrameHeader toWire(const FrameHeader& h) noexcept {
  TcpFrameHeader w{};
  w.magic = kTcpFrameMagic;
  w.flags = (h.has_crc32c ? kTcpFrameCrc32c : 0u) | (h.maybe_redelivered ? kTcpFrameMaybeRedelivered : 0u) |
            (h.subscribers_only ? kTcpFrameSubscribersOnly : 0u);
  w.stream_id = h.stream_id;
  w.sequence = h.sequence;
  w.credit_id = h.credit_id;
  w.frame_id = h.frame_id;
  w.group_id = h.group_id;
  w.timestamp_ns = h.timestamp_ns;
  w.length = h.length;
  w.crc32c = h.crc32c;
  w.attr_length = h.attr_length;
  std::memcpy(w.attrs, h.attrs, sizeof w.attrs);
  return w;
}

// The receiver fails the link on a bad magic or an attr_length above
// FL_MAX_ATTR_BYTES before it converts; should such a header reach here
// anyway, its attr_length becomes 0 with no attributes.
inline FrameHeader fromWire(const TcpFrameHeader& w) noexcept {
  FrameHeader h;
  h.stream_id = w.stream_id;
  h.sequence = w.sequence;
  h.credit_id = w.credit_id;
  h.frame_id = w.frame_id;
  h.group_id = w.group_id;
  h.timestamp_ns = w.timestamp_ns;
  h.length = w.length;
  h.crc32c = w.crc32c;
  h.has_crc32c = (w.flags & kTcpFrameCrc32c) ? 1 : 0;
  h.maybe_redelivered = (w.flags & kTcpFrameMaybeRedelivered) ? 1 : 0;
  h.subscribers_only = (w.flags & kTcpFrameSubscribersOnly) ? 1 : 0;
  h.attr_length = w.attr_length <= FL_MAX_ATTR_BYTES ? w.attr_length : 0;
  std::memcpy(h.attrs, w.attrs, h.attr_length);
  return h;
}

}  // namespace framelink::transport::tcp
