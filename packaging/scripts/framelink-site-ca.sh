#!/bin/sh
# A site's certificate authority for framelink, with openssl: every host gets a certificate that
# the site CA signs and that names its daemon id, and every host trusts the CA alone
# (link.tls_ca_file), so adding a host touches only that host.  Installed with framelinkd as
# /usr/share/framelink/framelink-site-ca.sh.
#
#   framelink-site-ca.sh init CA_DIR
#       a new CA in CA_DIR (made, mode 0700): ca.key (keep it off the hosts) and ca.crt, the file
#       each host trusts: copy it to /etc/framelink/tls/site-ca.crt and set
#       tls_ca_file = "/etc/framelink/tls/site-ca.crt" in [link]
#   framelink-site-ca.sh issue CA_DIR ID OUT_DIR [NAME...]
#       OUT_DIR/host.key and OUT_DIR/host.crt for daemon id ID, signed by the CA: the certificate
#       names ID (CN and subjectAltName DNS:ID) and each NAME the host is dialed by (a DNS name,
#       or an IPv4/IPv6 address).  Copy both to /etc/framelink/tls/ on the host (host.key 0600,
#       owned by framelink); with tls_require_cert_name a peer accepts the host only as ID.
#       OUT_DIR/ca.crt is the CA's certificate, for a host that does not trust it yet.
#   framelink-site-ca.sh revoke CA_DIR ID
#       revokes the certificates issued to ID and writes CA_DIR/crl.pem anew: copy it to every
#       host's tls_crl_file and `systemctl reload framelinkd` there; ID is refused when it links.
#
# Keys are EC P-256; certificates are valid for FRAMELINK_CERT_DAYS days (default 825), the CA for
# FRAMELINK_CA_DAYS (default 3650).  Exit status: 0 done, 1 openssl failed, 2 wrong usage.
set -eu

usage() {
  sed -n '7,19p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
fail() {
  echo "framelink-site-ca: $*" >&2
  exit 1
}
command -v openssl >/dev/null 2>&1 || fail "needs openssl (apt-get install openssl)"
# openssl ca's configuration for the CA in $ca (the revocations and the CRL), written beside it.
cnf() {
  printf '%s\n' "[ca]" "default_ca = site" "[site]" "database = $ca/index.txt" "crlnumber = $ca/crlnumber" \
    "certificate = $ca/ca.crt" "private_key = $ca/ca.key" "default_md = sha256" \
    "default_crl_days = ${FRAMELINK_CRL_DAYS:-30}" >"$ca/openssl-ca.cnf"
  echo "$ca/openssl-ca.cnf"
}
# CA_DIR/crl.pem from the revocations so far.
gencrl() {
  openssl ca -config "$(cnf)" -gencrl -out "$ca/crl.pem" >"$ca/openssl.log" 2>&1 ||
    fail "openssl ca -gencrl: $(cat "$ca/openssl.log")"
  rm -f "$ca/openssl.log"
  chmod 0644 "$ca/crl.pem"
}
[ $# -ge 2 ] || usage
cmd=$1 ca=$2
shift 2

case $cmd in
  init)
    [ $# -eq 0 ] || usage
    [ ! -e "$ca/ca.key" ] || fail "$ca/ca.key exists already: a CA is made once"
    mkdir -p "$ca"
    chmod 0700 "$ca"
    (umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -days "${FRAMELINK_CA_DAYS:-3650}" -subj "/CN=framelink site CA" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout "$ca/ca.key" -out "$ca/ca.crt" 2>"$ca/openssl.log") || fail "openssl req: $(cat "$ca/openssl.log")"
    rm -f "$ca/openssl.log"
    chmod 0644 "$ca/ca.crt"
    mkdir -p "$ca/issued"
    : >"$ca/index.txt"
    echo 01 >"$ca/crlnumber"
    gencrl
    echo "framelink-site-ca: the CA is $ca/ca.crt (trust it on every host: tls_ca_file), its CRL $ca/crl.pem" \
      "(tls_crl_file); keep $ca/ca.key secret"
    ;;
  issue)
    [ $# -ge 2 ] || usage
    id=$1 out=$2
    shift 2
    case $id in
      '' | *[!A-Za-z0-9._-]*) fail "'$id' is not a daemon id ([A-Za-z0-9._-], as [daemon] id)" ;;
    esac
    [ -f "$ca/ca.key" ] && [ -f "$ca/ca.crt" ] || fail "$ca holds no CA: framelink-site-ca.sh init $ca first"
    san="DNS:$id"
    for name in "$@"; do
      case $name in
        *:* | *[0-9].[0-9]*.[0-9]*.[0-9]*) san="$san,IP:$name" ;;
        *) san="$san,DNS:$name" ;;
      esac
    done
    mkdir -p "$out"
    ext=$(mktemp)
    trap 'rm -f "$ext" "$out/host.csr"' EXIT
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
      "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" >"$ext"
    (umask 077 && openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$id" \
      -keyout "$out/host.key" -out "$out/host.csr" 2>"$out/openssl.log") ||
      fail "openssl req: $(cat "$out/openssl.log")"
    openssl x509 -req -in "$out/host.csr" -CA "$ca/ca.crt" -CAkey "$ca/ca.key" -CAcreateserial \
      -CAserial "$ca/ca.srl" -days "${FRAMELINK_CERT_DAYS:-825}" -extfile "$ext" -out "$out/host.crt" \
      2>"$out/openssl.log" || fail "openssl x509: $(cat "$out/openssl.log")"
    rm -f "$out/openssl.log"
    chmod 0644 "$out/host.crt"
    mkdir -p "$ca/issued"
    cat "$out/host.crt" >>"$ca/issued/$id.crt"
    cp "$ca/ca.crt" "$out/ca.crt"
    echo "framelink-site-ca: $out/host.crt names $id ($san), signed by $ca/ca.crt (copied to $out/ca.crt); $out/host.key is its key"
    ;;
  revoke)
    [ $# -eq 1 ] || usage
    id=$1
    [ -s "$ca/issued/$id.crt" ] || fail "$ca/issued/$id.crt: no certificate was issued to '$id' by this CA"
    each=$(mktemp -d)
    trap 'rm -rf "$each"' EXIT
    # One certificate a file: every one issued to the id (re-issues included).
    awk -v dir="$each" '/-----BEGIN CERTIFICATE-----/ { n++ } { print > (dir "/" n ".crt") }' "$ca/issued/$id.crt"
    for c in "$each"/*.crt; do
      openssl ca -config "$(cnf)" -revoke "$c" >"$ca/openssl.log" 2>&1 ||
        grep -qi 'already revoked' "$ca/openssl.log" || fail "openssl ca -revoke: $(cat "$ca/openssl.log")"
    done
    gencrl
    echo "framelink-site-ca: '$id' revoked; give every host $ca/crl.pem as its tls_crl_file and reload it"
    ;;
  *) usage ;;
esac
