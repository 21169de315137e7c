#include "transport/tcp/tcp_wire.h"

namespace framelink::transport::tcp {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t fnv1a(uint64_t h, const void* data, size_t n) noexcept {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
  return h;
}

}  // namespace

void tokenDigest(const std::string& token, uint64_t session_id, uint8_t out[kTokenDigestBytes]) noexcept {
  for (uint8_t lane = 0; lane < kTokenDigestBytes / 8; ++lane) {
    uint64_t h = fnv1a(kFnvOffset, &lane, 1);
    h = fnv1a(h, &session_id, sizeof session_id);
    h = fnv1a(h, token.data(), token.size());
    std::memcpy(out + size_t{lane} * 8, &h, 8);
  }
}

bool digestEqual(const uint8_t a[kTokenDigestBytes], const uint8_t b[kTokenDigestBytes]) noexcept {
  uint8_t diff = 0;
  for (size_t i = 0; i < kTokenDigestBytes; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace framelink::transport::tcp
