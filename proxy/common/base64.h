// Base64 (RFC 4648, with padding) through OpenSSL's EVP_EncodeBlock and
// EVP_DecodeBlock: etcd's JSON gateway carries keys and values so.  The
// caller links OpenSSL::Crypto.
#pragma once

#include <openssl/evp.h>

#include <optional>
#include <string>
#include <string_view>

namespace framelink {

inline std::string base64Encode(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// nullopt when `in` is not base64.
inline std::optional<std::string> base64Decode(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out(in.size() / 4 * 3, '\0');
  const int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  if (n < 0) return std::nullopt;
  size_t pad = 0;  // EVP_DecodeBlock counts the padding's bytes as zeros
  for (size_t i = in.size(); i > 0 && in[i - 1] == '='; --i) ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

}  // namespace framelink
