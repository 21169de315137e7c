// Certificate revocation lists (link.tls_crl_file), read with OpenSSL: a peer
// whose certificate a CRL of the trusted CAs lists is refused when it links.
#pragma once

#include <cstddef>
#include <string>

#include "common/result.h"

namespace framelink {

// Checks that `crl_pem` holds one CRL or more, each signed by a certificate
// in `ca_pem` (tls_ca_file); `revoked` gets how many serials they list in all.
Status checkCrls(const std::string& crl_pem, const std::string& ca_pem, size_t& revoked);

// Empty when the first certificate of `cert_pem` is in none of the CRLs of
// `crl_pem` (matched by issuer and serial number); else which CRL lists it and
// since when.  A certificate that does not parse is not revoked here: the
// TLS handshake, which verified it, had the last word on its form.
std::string revocation(const std::string& crl_pem, const std::string& cert_pem);

}  // namespace framelink
