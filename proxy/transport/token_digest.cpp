#include "transport/token_digest.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

namespace framelink::transport {

void tokenDigest(const std::string& token, uint64_t session_id, uint8_t out[kTokenDigestBytes]) noexcept {
  uint8_t message[sizeof session_id];
  for (size_t i = 0; i < sizeof message; ++i) message[i] = static_cast<uint8_t>(session_id >> (8 * i));
  unsigned int length = 0;
  // An empty key is a valid HMAC key; OpenSSL wants a non-null pointer for it.
  static const uint8_t kNoKey = 0;
  const void* key = token.empty() ? static_cast<const void*>(&kNoKey) : token.data();
  if (HMAC(EVP_sha256(), key, static_cast<int>(token.size()), message, sizeof message, out, &length) ==
          nullptr ||
      length != kTokenDigestBytes) {
    // Cannot happen with SHA-256; a digest of zeros proves nothing anyone
    // would send, so the handshake is refused rather than accepted.
    std::memset(out, 0, kTokenDigestBytes);
  }
}

bool digestEqual(const uint8_t a[kTokenDigestBytes], const uint8_t b[kTokenDigestBytes]) noexcept {
  return CRYPTO_memcmp(a, b, kTokenDigestBytes) == 0;
}

}  // namespace framelink::transport
