# The framelink system group and user that framelinkd.service runs as (idempotent).
if ! getent group framelink >/dev/null; then
  groupadd --system framelink
fi
if ! getent passwd framelink >/dev/null; then
  useradd --system --gid framelink --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "framelink daemon" framelink
fi
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
