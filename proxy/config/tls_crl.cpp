#include "config/tls_crl.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "config/config_values.h"

namespace framelink {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct CrlFree {
  void operator()(X509_CRL* c) const { X509_CRL_free(c); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Crl = std::unique_ptr<X509_CRL, CrlFree>;

Bio memory(const std::string& pem) { return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()))); }

// Every object of one kind in a PEM text, in order; the others are skipped.
std::vector<Crl> readCrls(const std::string& pem) {
  std::vector<Crl> out;
  Bio bio = memory(pem);
  while (bio) {
    X509_CRL* crl = PEM_read_bio_X509_CRL(bio.get(), nullptr, nullptr, nullptr);
    if (crl == nullptr) break;
    out.emplace_back(crl);
  }
  return out;
}

std::vector<Cert> readCerts(const std::string& pem) {
  std::vector<Cert> out;
  Bio bio = memory(pem);
  while (bio) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (cert == nullptr) break;
    out.emplace_back(cert);
  }
  return out;
}

std::string nameOf(const X509_NAME* name) {
  char buf[256] = {};
  X509_NAME_oneline(name, buf, sizeof buf);
  return buf;
}

}  // namespace

Status checkCrls(const std::string& crl_pem, const std::string& ca_pem, size_t& revoked) {
  revoked = 0;
  const std::vector<Crl> crls = readCrls(crl_pem);
  if (crls.empty()) {
    return invalidSetting(
        "link.tls_crl_file holds no certificate revocation list (PEM, -----BEGIN X509 CRL-----): make one "
        "with the CA (framelink-site-ca.sh revoke), or leave tls_crl_file out");
  }
  const std::vector<Cert> cas = readCerts(ca_pem);
  for (const Crl& crl : crls) {
    const X509_NAME* issuer = X509_CRL_get_issuer(crl.get());
    bool signed_by_ca = false;
    for (const Cert& ca : cas) {
      if (X509_NAME_cmp(issuer, X509_get_subject_name(ca.get())) != 0) continue;
      EVP_PKEY* key = X509_get0_pubkey(ca.get());
      if (key != nullptr && X509_CRL_verify(crl.get(), key) == 1) signed_by_ca = true;
    }
    if (!signed_by_ca) {
      return invalidSetting("link.tls_crl_file: the CRL of '" + nameOf(issuer) +
                            "' is not signed by a CA of link.tls_ca_file: a CRL counts only from the CA "
                            "that issued the certificates it revokes");
    }
    const STACK_OF(X509_REVOKED)* list = X509_CRL_get_REVOKED(crl.get());
    revoked += list == nullptr ? 0 : static_cast<size_t>(sk_X509_REVOKED_num(list));
  }
  return {};
}

std::string revocation(const std::string& crl_pem, const std::string& cert_pem) {
  if (crl_pem.empty() || cert_pem.empty()) return {};
  const std::vector<Cert> certs = readCerts(cert_pem);
  if (certs.empty()) return {};
  X509* cert = certs.front().get();
  for (const Crl& crl : readCrls(crl_pem)) {
    if (X509_NAME_cmp(X509_CRL_get_issuer(crl.get()), X509_get_issuer_name(cert)) != 0) continue;
    X509_REVOKED* entry = nullptr;
    if (X509_CRL_get0_by_cert(crl.get(), &entry, cert) != 1 || entry == nullptr) continue;
    char serial[80] = "?";
    if (BIGNUM* bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(cert), nullptr); bn != nullptr) {
      if (char* hex = BN_bn2hex(bn); hex != nullptr) {
        std::snprintf(serial, sizeof serial, "%s", hex);
        OPENSSL_free(hex);
      }
      BN_free(bn);
    }
    char when[64] = "?";
    Bio out(BIO_new(BIO_s_mem()));
    if (out && ASN1_TIME_print(out.get(), X509_REVOKED_get0_revocationDate(entry)) == 1) {
      const int n = BIO_read(out.get(), when, sizeof when - 1);
      when[n > 0 ? n : 0] = '\0';
    }
    return "its certificate (serial " + std::string(serial) + ") is revoked by the CRL of '" +
           nameOf(X509_CRL_get_issuer(crl.get())) + "' since " + when;
  }
  return {};
}

}  // namespace framelink
