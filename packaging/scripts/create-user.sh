# The framelink system group and user that framelinkd.service runs as (idempotent).
if ! getent group framelink >/dev/null; then
  groupadd --system framelink
fi
if ! getent passwd framelink >/dev/null; then
  useradd --system --gid framelink --no-create-home --home-dir /nonexistent \
    --shell /usr/sbin/nologin --comment "framelink daemon" framelink
fi
# The shared secret peers present (link.token_file): made once, readable by
# root and the daemon only; an existing one (copied from the peer) is kept.
if [ ! -e /etc/framelink/peer.token ]; then
  mkdir -p /etc/framelink
  (umask 077 && head -c 32 /dev/urandom | base64 > /etc/framelink/peer.token)
  chgrp framelink /etc/framelink/peer.token
  chmod 0640 /etc/framelink/peer.token
fi
