// The proof of a Session's token that a data channel (tcp, rdma) carries:
// HMAC-SHA256 keyed by the token over the session id, so that it proves the
// token for this session only, and tells an eavesdropper nothing of the
// token itself (a data channel's handshake may travel in clear).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace framelink::transport {

inline constexpr size_t kTokenDigestBytes = 32;

// HMAC-SHA256(key = token, message = session_id as 8 little-endian bytes).
void tokenDigest(const std::string& token, uint64_t session_id, uint8_t out[kTokenDigestBytes]) noexcept;

// Compares two digests in time independent of where they differ.
bool digestEqual(const uint8_t a[kTokenDigestBytes], const uint8_t b[kTokenDigestBytes]) noexcept;

}  // namespace framelink::transport
