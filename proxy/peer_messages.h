// The peer protocol as the data agent reads it: every control message a peer
// daemon sends after the handshake, bounded and validated here, in one
// place, and turned into a plain struct.  Whatever gets past decode() is
// within the protocol's bounds; what depends on the agent's state (a grant
// for a stream it knows, the streams a link has open) is checked where that
// state lives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "framelink/v1/link.pb.h"
#include "transport/transport.h"

namespace framelink::peer {

constexpr size_t kMaxCreditsPerStream = 65536;  // bound on what a peer may grant us on one stream
constexpr size_t kMaxAcksPerMessage = 4096;     // frames one ACK may name
constexpr size_t kMaxStreamsPerLink = 4096;     // streams a peer may have open on one link
constexpr size_t kMaxTextBytes = 256;           // what a NACK message or Fin reason keeps

struct StreamOpen {
  uint64_t stream_id = 0;
  std::string name;
};
struct StreamClose {
  uint64_t stream_id = 0;
};
struct CreditGrant {
  uint64_t stream_id = 0;
  std::vector<transport::RemoteCredit> credits;  // each of a non-zero length
  uint64_t largest_slot = 0;                     // of the stream's consumers; 0: not said
};
struct CreditRevoke {
  uint64_t stream_id = 0;
  std::vector<uint64_t> credit_ids;
  bool returned = false;  // the sender gives back credits it did not use
};
// The sender's credits on the stream fell to a quarter of what it held.
struct CreditLow {
  uint64_t stream_id = 0;
  uint64_t credits_left = 0;
};
struct Ack {
  uint64_t stream_id = 0;
  std::vector<uint64_t> sequences;  // at most kMaxAcksPerMessage
};
struct Nack {
  uint64_t stream_id = 0;
  uint64_t sequence = 0;
  int code = 0;         // never FL_OK: a NACK without a code is FL_ERR_PEER_REJECTED
  std::string message;  // at most kMaxTextBytes
};
struct Fin {
  std::string reason;  // at most kMaxTextBytes
};
struct Keepalive {};
// Out of the protocol's bounds: the link it came on is closed with a
// Fin(PROTOCOL) saying why.
struct Violation {
  std::string why;
};

using Message = std::variant<StreamOpen, StreamClose, CreditGrant, CreditRevoke, CreditLow, Ack, Nack, Fin,
                             Keepalive, Violation>;

Message decode(const v1::PeerMessage& message);

// Fills `out` (stream_id aside) with these sequences, at most
// kMaxAcksPerMessage: each run of consecutive ones as a (first, count) pair,
// the others one by one.  decode() gives back the same sequences in the
// same order.
void encodeAck(const uint64_t* sequences, size_t count, v1::Ack* out);

// A stream name a peer may open: 1..FL_STREAM_NAME_MAX-1 of [A-Za-z0-9._-].
bool validStreamName(const std::string& name);

}  // namespace framelink::peer
