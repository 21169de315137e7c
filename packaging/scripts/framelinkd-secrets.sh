# framelinkd's generated secrets, a snippet pasted into the deb postinst (configure) and the
# rpm %post: the peer token and the host's TLS key and certificate.  The framelink user and
# group must exist already (systemd-sysusers, packaging/systemd/sysusers.d/framelinkd.conf).
# Idempotent.
# The shared secret peers present (link.token_file): made once, readable by the daemon's user
# only -- the members of group framelink are the applications allowed to attach, and whoever
# reads the token can link as a peer.  An existing one (copied from the peer) is kept; one an
# older package made group-readable (root:framelink 0640) is taken from the group.
if [ ! -e /etc/framelink/peer.token ]; then
  mkdir -p /etc/framelink
  (umask 077 && head -c 32 /dev/urandom | base64 > /etc/framelink/peer.token)
  chown framelink:framelink /etc/framelink/peer.token
  chmod 0600 /etc/framelink/peer.token
elif [ "$(stat -c '%U:%G %a' /etc/framelink/peer.token)" = "root:framelink 640" ]; then
  chown framelink:framelink /etc/framelink/peer.token
  chmod 0600 /etc/framelink/peer.token
fi
# The host's TLS key and self-signed certificate (link.tls_cert_file, tls_key_file), made once so
# that the token never crosses the network in clear; the key is readable by the daemon's user
# only.  peers.pem (link.tls_ca_file) is where the operator puts the certificates of the hosts
# this one links with; until then framelinkd links with no peer.  Existing files (a key the
# operator brought, a peers.pem already filled in) are kept.
if [ ! -e /etc/framelink/tls/host.key ] && [ ! -e /etc/framelink/tls/host.crt ]; then
  mkdir -p /etc/framelink/tls
  # The host name is the daemon id by default, the name tls_require_cert_name looks for.
  host=$(uname -n)
  # CA:true (openssl req -x509's default) lets a peer trust this certificate as its own root.
  (umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=$host" -addext "subjectAltName=DNS:$host" \
    -keyout /etc/framelink/tls/host.key -out /etc/framelink/tls/host.crt 2>/dev/null)
  chown framelink:framelink /etc/framelink/tls/host.key /etc/framelink/tls/host.crt
  chmod 0600 /etc/framelink/tls/host.key
  chmod 0644 /etc/framelink/tls/host.crt
fi
if [ ! -e /etc/framelink/tls/peers.pem ]; then
  mkdir -p /etc/framelink/tls
  printf '%s\n' "# The certificates (PEM) of the framelink hosts this one links with: append each" \
    "# peer's /etc/framelink/tls/host.crt here: framelinkd reads this file again every 5 s." >/etc/framelink/tls/peers.pem
  chmod 0644 /etc/framelink/tls/peers.pem
fi
