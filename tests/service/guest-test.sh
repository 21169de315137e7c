#!/bin/bash
# The service test proper, run as root inside the clean Debian 12 guest (see run-guest.sh): no
# network, systemd as init, the debs under test in $1/debs.  One PASS or FAIL line per check
# (INFO lines report without judging); exit status 0 when every check passed.
set -u
payload=${1:-/mnt/ci}
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
work=/var/tmp/framelink-service-test
rm -rf "$work"
mkdir -p "$work"
start_all=$SECONDS
npass=0
nfail=0
pass() { echo "PASS $1: $2"; npass=$((npass + 1)); }
fail() {
  echo "FAIL $1: $2"
  nfail=$((nfail + 1))
  shift 2
  local f
  for f in "$@"; do
    [[ -s "$f" ]] || continue
    echo "  ---- $f (last lines)"
    tail -n 25 "$f" | sed 's/^/  | /'
  done
}
journal() { journalctl -u "$1" --no-pager -n 40 >"$work/journal-$1.log" 2>&1; echo "$work/journal-$1.log"; }
finish() {
  echo "guest-test: $npass passed, $nfail failed in $((SECONDS - start_all)) s"
  ((nfail == 0 && npass > 0))
  exit $?
}
# A JSON number or the failures object from `framelink send|recv --json`.
jnum() { sed -nE "s/.*\"$2\":([0-9]+).*/\1/p" "$1" | head -1; }
jstr() { sed -nE "s/.*\"$2\":\"([^\"]*)\".*/\1/p" "$1" | head -1; }
# Runs a command as USER with that user's groups, no root left (setpriv execs: the pid is the
# command's, so signals reach it).
as() {
  local u=$1
  shift
  setpriv --reuid="$u" --regid="$u" --init-groups --reset-env "$@"
}
# The same for a background job: a function run with & would be a subshell, and $! its pid.
as_member=(setpriv --reuid=fl-member --regid=fl-member --init-groups --reset-env)
is_active() { [[ "$(systemctl is-active "$1" 2>/dev/null)" == active ]]; }
main_pid() { systemctl show -p MainPID --value "$1" 2>/dev/null; }
socket_a=/run/framelink/framelinkd.sock
socket_b=/run/framelink-second/framelinkd.sock
member=fl-member
outsider=fl-outsider

echo "guest-test: $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r), init $(cat /proc/1/comm)," \
  "$(nproc) CPUs; no network: $(ls /sys/class/net | paste -sd' ' -)"

# ---- 1. install, offline: the guest has no package lists and no network, so apt resolves every
# dependency against what the image already has installed.
mkdir -p /srv/debs
cp "$payload"/debs/*.deb /srv/debs/
chmod 0644 /srv/debs/*.deb
mapfile -t names < <(for f in /srv/debs/*.deb; do dpkg-deb -f "$f" Package; done)
# Every path the debs hold, and which of their directories the system had before (those must
# stay after the purge; the others must go).
for f in /srv/debs/*.deb; do dpkg-deb -c "$f"; done |
  awk '{ p = $6; sub(/^\./, "", p); sub(/\/$/, "", p); if (p != "") print substr($1, 1, 1), p }' | sort -u >"$work/contents"
awk '$1 == "d" { print $2 }' "$work/contents" | while read -r d; do [[ -d "$d" ]] && echo "$d"; done >"$work/dirs-before"
t=$SECONDS
(cd /srv/debs && apt install -y ./*.deb) >"$work/apt-install.log" 2>&1
rc=$?
not_installed=()
for n in "${names[@]}"; do
  [[ "$(dpkg-query -W -f='${db:Status-Abbrev}' "$n" 2>/dev/null)" == ii* ]] || not_installed+=("$n")
done
if ((rc == 0 && ${#not_installed[@]} == 0)); then
  pass install "apt install ./*.deb (${names[*]}) without network in $((SECONDS - t)) s"
else
  fail install "apt install exited $rc; not installed: ${not_installed[*]:-none}" "$work/apt-install.log"
  finish
fi
if getent group framelink >/dev/null && getent passwd framelink >/dev/null && [[ -r /etc/framelink/peer.token ]]; then
  pass install-user "system user and group framelink exist; /etc/framelink/peer.token is $(stat -c '%U:%G %a' /etc/framelink/peer.token)"
else
  fail install-user "after the install: group framelink $(getent group framelink >/dev/null && echo exists || echo MISSING)," \
    "user framelink $(getent passwd framelink >/dev/null && echo exists || echo MISSING)," \
    "/etc/framelink/peer.token $([[ -r /etc/framelink/peer.token ]] && echo exists || echo MISSING)"
fi
tls=/etc/framelink/tls
host_subject=$(openssl x509 -in $tls/host.crt -noout -subject -ext subjectAltName 2>&1 | paste -sd' ' -)
if [[ "$(stat -c '%U:%G %a' $tls/host.key 2>&1)" == "framelink:framelink 600" && -f $tls/peers.pem ]] &&
  grep -q "DNS:$(uname -n)" <<<"$host_subject"; then
  pass install-tls "$tls/host.key is $(stat -c '%U:%G %a' $tls/host.key), host.crt: $host_subject; peers.pem holds $(grep -c BEGIN $tls/peers.pem) certificates"
else
  fail install-tls "after the install: host.key $(stat -c '%U:%G %a' $tls/host.key 2>&1), host.crt: $host_subject," \
    "peers.pem $([[ -f $tls/peers.pem ]] && echo exists || echo MISSING)" "$work/apt-install.log"
fi

# ---- 2. the packaged service
t=$SECONDS
systemctl start framelinkd >"$work/start.log" 2>&1
rc=$?
pid=$(main_pid framelinkd)
if ((rc == 0)) && is_active framelinkd && [[ -S $socket_a ]]; then
  uid=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
  pass service-start "systemctl start framelinkd: $(systemctl is-active framelinkd) in $((SECONDS - t)) s, pid $pid as $(getent passwd "$uid" | cut -d: -f1); $socket_a is $(stat -c '%U:%G %a' $socket_a)"
else
  fail service-start "systemctl start framelinkd exited $rc, is-active: $(systemctl is-active framelinkd), socket $socket_a $([[ -S $socket_a ]] && echo exists || echo MISSING)" \
    "$work/start.log" "$(journal framelinkd)"
  finish
fi

# ---- 2b. the packaged TLS with no peer certificate yet: up for local clients, and the log says
# what to do
if journalctl -u framelinkd --no-pager -o cat | grep -q 'holds no peer certificate yet'; then
  pass tls-no-peers "with no certificate in peers.pem the packaged daemon is up and logs: $(journalctl -u framelinkd --no-pager -o cat | grep -o 'link.tls_ca_file .* holds no peer certificate yet[^.]*' | tail -1)"
else
  fail tls-no-peers "the packaged daemon does not say that peers.pem holds no peer certificate" "$(journal framelinkd)"
fi

# ---- 2c. the journal has each line at its own priority: the warning above is at priority warning
# (and not err), the "serving" line at info, and neither carries a timestamp of the daemon's own
journalctl -u framelinkd --no-pager -o cat >"$work/journal-all.log" 2>&1
journalctl -u framelinkd -p warning --no-pager -o cat >"$work/journal-warning.log" 2>&1
journalctl -u framelinkd -p err --no-pager -o cat >"$work/journal-err.log" 2>&1
journalctl -u framelinkd -p warning --no-pager -o json >"$work/journal-warning.json" 2>&1
why=""
grep -q 'holds no peer certificate yet' "$work/journal-warning.log" || why+="journalctl -p warning does not show the warning 'holds no peer certificate yet'; "
grep -q 'holds no peer certificate yet' "$work/journal-err.log" && why+="the warning shows under -p err: its priority is too high; "
grep -q "' serving: socket" "$work/journal-all.log" || why+="the 'serving' line is not in the journal; "
grep -q "' serving: socket" "$work/journal-warning.log" && why+="the 'serving' info line shows under -p warning: every line has one priority; "
grep -q '"SYSLOG_IDENTIFIER":"framelinkd"' "$work/journal-warning.json" || why+="no SYSLOG_IDENTIFIER=framelinkd on the warnings; "
grep -Eq '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ ' "$work/journal-all.log" && why+="lines carry a second timestamp; "
if [[ -z "$why" ]]; then
  pass journal-priority "journalctl -p warning -u framelinkd: $(grep -c . "$work/journal-warning.log") of $(grep -c . "$work/journal-all.log") lines, the TLS warning among them and no info line; no timestamp of the daemon's own"
else
  fail journal-priority "${why%; }" "$work/journal-warning.log" "$work/journal-all.log"
fi

# ---- 2d. the unit's sandbox: systemd-analyze security's exposure (0 best, 10 worst) at most 3.0
systemd-analyze security --no-pager framelinkd.service >"$work/security.log" 2>&1
exposure=$(sed -nE 's/.*Overall exposure level for framelinkd\.service: ([0-9]+\.[0-9]+).*/\1/p' "$work/security.log" | tail -1)
if [[ -n "$exposure" ]] && awk -v e="$exposure" 'BEGIN { exit !(e <= 3.0) }'; then
  pass security "systemd-analyze security framelinkd.service: exposure $exposure (at most 3.0)"
else
  fail security "systemd-analyze security framelinkd.service: exposure ${exposure:-not found in its output}, more than 3.0 allowed" "$work/security.log"
  sed 's/^/  | /' "$work/security.log"
fi

# ---- 3. a second daemon in the same guest, as a transient unit: its own config, socket and
# ports, the packaged token, its own TLS key made as the package makes one (it listens on
# 127.0.0.1, so its certificate names that address).  The two trust each other's certificate
# as docs/start/install.md ("Linking two hosts") says, and the packaged daemon dials it with its packaged TLS
# settings (a [[peer]] added to its conffile, as an operator would).
mkdir -p /etc/framelink-second/tls
(umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 -subj /CN=second \
  -addext subjectAltName=DNS:second,IP:127.0.0.1 -keyout /etc/framelink-second/tls/host.key \
  -out /etc/framelink-second/tls/host.crt) >"$work/openssl.log" 2>&1
chown framelink:framelink /etc/framelink-second/tls/host.key
chmod 0644 /etc/framelink-second/tls/host.crt
cat $tls/host.crt >/etc/framelink-second/tls/peers.pem
cat /etc/framelink-second/tls/host.crt >>$tls/peers.pem
cat >/etc/framelink-second/framelinkd.toml <<EOF
[daemon]
id = "second"
socket = "$socket_b"
[link]
listen = "127.0.0.1:7710"
data_listen = "127.0.0.1:0"
token_file = "/etc/framelink/peer.token"
tls_cert_file = "tls/host.crt"
tls_key_file = "tls/host.key"
tls_ca_file = "tls/peers.pem"
tls_client_auth = true
# The packaged certificate names the host name, which is the packaged daemon's id.
tls_require_cert_name = true
EOF
cat >>/etc/framelink/framelinkd.toml <<'EOF'

[[peer]]
name = "second"
address = "127.0.0.1:7710"
EOF
t=$SECONDS
# Under a short watchdog: it is killed if its data agent stops reporting while the test runs.
systemd-run --unit=framelinkd-second --property=Type=notify --property=WatchdogSec=10s \
  --property=User=framelink --property=Group=framelink \
  --property=RuntimeDirectory=framelink-second --property=RuntimeDirectoryMode=0750 \
  --property=RuntimeDirectoryPreserve=restart --property=FileDescriptorStoreMax=1024 \
  /usr/sbin/framelinkd --config /etc/framelink-second/framelinkd.toml >"$work/second.log" 2>&1
rc=$?
# framelink reload, as the operator runs it: the [[peer]] applies at once, and so does the
# certificate appended to peers.pem (the daemon's gRPC watches the TLS files); the restart after
# it is the one the checks below start from.
pid_before=$(main_pid framelinkd)
framelink reload >"$work/reload-peer.log" 2>&1
rc2=$?
sed 's/^/  reload| /' "$work/reload-peer.log"
systemctl restart framelinkd >>"$work/second.log" 2>&1
rc3=$?
if ((rc == 0 && rc2 == 0 && rc3 == 0)) && is_active framelinkd-second && is_active framelinkd && [[ -S $socket_b ]] &&
  grep -q 'applied: \[\[peer\]\] second added (dials 127.0.0.1:7710)' "$work/reload-peer.log" &&
  grep -q 'applied: \[link\] tls_ca_file: the certificates in it changed' "$work/reload-peer.log"; then
  pass second-daemon "framelinkd-second (systemd-run, 127.0.0.1:7710, $socket_b) active; framelink reload (pid $pid_before) applied it as [[peer]] and the certificate appended to peers.pem; framelinkd restarted in $((SECONDS - t)) s"
else
  fail second-daemon "systemd-run exited $rc, framelink reload $rc2, restart $rc3; framelinkd-second $(systemctl is-active framelinkd-second), framelinkd $(systemctl is-active framelinkd)" \
    "$work/second.log" "$work/reload-peer.log" "$(journal framelinkd-second)" "$(journal framelinkd)"
  finish
fi

# ---- 3b. the operator's preflight on an installed system: framelink doctor reads the packaged
# configuration and asks the daemon over its socket (its lines are printed for the log); once
# the link is up (until then doctor says WARN: no link up yet)
for _ in $(seq 1 60); do
  framelink links --json 2>/dev/null | grep -q '"state": *"up"' && break
  sleep 0.5
done
framelink doctor >"$work/doctor.log" 2>&1
sed 's/^/  doctor| /' "$work/doctor.log"
if grep -q '^OK   daemon' "$work/doctor.log" && grep -Eq '^OK   peer +second .*link up over' "$work/doctor.log"; then
  pass doctor "framelink doctor: daemon answers, peer 'second' reachable and linked ($(grep -c '^OK' "$work/doctor.log") OK, $(grep -c '^WARN' "$work/doctor.log") WARN, $(grep -c '^FAIL' "$work/doctor.log") FAIL)"
else
  fail doctor "framelink doctor did not find the daemon or the peer 'second'" "$work/doctor.log"
fi

# ---- 3c. the link runs TLS: the second daemon's listener presents its certificate and refuses a
# dialer without one, and the packaged daemon linked with it (it presented the packaged one)
openssl s_client -connect 127.0.0.1:7710 -CAfile /etc/framelink-second/tls/host.crt -verify_return_error \
  </dev/null >"$work/s_client.log" 2>&1
verified=$(grep -c 'Verify return code: 0 (ok)' "$work/s_client.log")
timeout 10 openssl s_client -connect 127.0.0.1:7710 -alpn h2 -CAfile /etc/framelink-second/tls/host.crt \
  </dev/null >"$work/s_client-nocert.log" 2>&1
sleep 1
refused=$(journalctl -u framelinkd-second --no-pager -o cat | grep -c 'peer did not return a certificate')
if ((verified >= 1 && refused >= 1)) && journalctl -u framelinkd --no-pager -o cat | grep -q 'connected to peer second'; then
  pass tls-link "127.0.0.1:7710 presents the certificate of 'second' and refuses a dialer without one \
('peer did not return a certificate' in its log); framelinkd connected to peer second"
else
  fail tls-link "TLS on 127.0.0.1:7710: certificate verified $verified, dialer without a certificate refused $refused" \
    "$work/s_client.log" "$work/s_client-nocert.log" "$(journal framelinkd)" "$(journal framelinkd-second)"
fi

# ---- 4. the users: one in group framelink, one outside it
useradd --create-home --groups framelink "$member" && useradd --create-home "$outsider"
if id -nG "$member" | grep -qw framelink && ! id -nG "$outsider" | grep -qw framelink; then
  pass users "$member in groups ($(id -nG "$member")), $outsider in ($(id -nG "$outsider"))"
else
  fail users "useradd did not give $member group framelink: $(id "$member" 2>&1); $(id "$outsider" 2>&1)"
fi

# ---- 5. frames from the packaged daemon to the second one, as the member: a consumer on the
# second daemon, a producer on the packaged one (the default socket)
t=$SECONDS
"${as_member[@]}" framelink recv --socket "$socket_b" --stream svc-a --count 200 --verify --expect-order \
  --expect-size 256K --timeout-ms 60000 >"$work/recv1.log" 2>&1 &
rpid=$!
as "$member" framelink send --stream svc-a --count 200 --size 256K --crc >"$work/send1.log" 2>&1
src=$?
wait "$rpid"
rrc=$?
if ((src == 0 && rrc == 0)) && grep -q 'all passed the checks' "$work/recv1.log"; then
  pass frames "$member: 200 frames of 256 KiB, framelinkd -> framelinkd-second, every frame verified (payload, attrs, order, CRC) in $((SECONDS - t)) s: $(head -1 "$work/send1.log")"
else
  fail frames "send exited $src, recv exited $rrc" "$work/send1.log" "$work/recv1.log" "$(journal framelinkd)" "$(journal framelinkd-second)"
fi

# ---- 5c. the Python client as a user installs it (python3-framelink, no pip, no build tree): a consumer
# of a few lines on the second daemon, the packaged producer on the first; every frame's CRC checked
# (it stops after COUNT different frames: a frame redelivered after a restart is printed twice)
cat >"$work/consumer.py" <<'EOF'
import framelink, sys
seen = set()
with framelink.Consumer(sys.argv[3] if len(sys.argv) > 3 else "svc-py", socket_path=sys.argv[1]) as consumer:
    while len(seen) < int(sys.argv[2]):
        with consumer.receive(timeout=60) as frame:
            seen.add(frame.frame_id)
            print(frame.frame_id, frame.length, frame.has_crc32c and framelink.crc32c(frame.buffer()) == frame.crc32c, flush=True)
EOF
chmod 0644 "$work/consumer.py"
t=$SECONDS
"${as_member[@]}" python3 "$work/consumer.py" "$socket_b" 40 >"$work/py-consumer.log" 2>&1 &
rpid=$!
for _ in $(seq 60); do  # python3 starts slower than framelink recv: send once the consumer is attached
  framelink clients --socket "$socket_b" --json 2>/dev/null | grep -q 'svc-py' && break
  sleep 0.5
done
as "$member" framelink send --stream svc-py --count 40 --size 64K --crc >"$work/send-py.log" 2>&1
src=$?
wait "$rpid"
rrc=$?
py_ok=$(grep -c ' 65536 True$' "$work/py-consumer.log")
if ((src == 0 && rrc == 0 && py_ok == 40)); then
  pass python-consumer "python3-framelink $(dpkg-query -W -f='${Version}' python3-framelink): a consumer of seven lines received 40 frames of 64 KiB, every CRC32C matched, in $((SECONDS - t)) s"
else
  fail python-consumer "send exited $src, the consumer exited $rrc, $py_ok of 40 frames verified" "$work/send-py.log" "$work/py-consumer.log"
fi

# ---- 5d. the C# producer of the packaged feed (run-guest.sh built it with `dotnet add package FrameLink`
# from framelink-nuget, native AOT) on the packaged daemon, to the same Python consumer on the second;
# both daemons restart under them (a hot restart each): neither application sees an error or attaches
# again, every frame is delivered and received.
t=$SECONDS
cs_count=300
lines() { grep -c ' 65536 True$' "$1" 2>/dev/null; }
if [[ ! -x "$payload/producer" ]]; then
  fail csharp-producer "no C# producer in the payload: framelink-nuget was not among the debs, or it did not build"
else
  "${as_member[@]}" python3 "$work/consumer.py" "$socket_b" "$cs_count" svc-cs >"$work/cs-consumer.log" 2>&1 &
  rpid=$!
  for _ in $(seq 60); do
    framelink clients --socket "$socket_b" --json 2>/dev/null | grep -q 'svc-cs' && break
    sleep 0.5
  done
  # 20 ms between frames: both restarts happen while it sends.
  "${as_member[@]}" "$payload/producer" svc-cs "$cs_count" 20 >"$work/cs-producer.log" 2>&1 &
  ppid=$!
  for _ in $(seq 300); do (($(lines "$work/cs-consumer.log") >= 30)) && break; sleep 0.1; done
  systemctl restart framelinkd >"$work/cs-restart.log" 2>&1
  r1=$?
  at1=$(lines "$work/cs-consumer.log")
  for _ in $(seq 300); do (($(lines "$work/cs-consumer.log") >= at1 + 30)) && break; sleep 0.1; done
  systemctl restart framelinkd-second >>"$work/cs-restart.log" 2>&1
  r2=$?
  at2=$(lines "$work/cs-consumer.log")
  wait "$ppid"
  src=$?
  wait "$rpid"
  rrc=$?
  cs_ok=$(grep ' 65536 True$' "$work/cs-consumer.log" | cut -d' ' -f1 | sort -un | wc -l)
  if ((src == 0 && rrc == 0 && r1 == 0 && r2 == 0 && cs_ok == cs_count && at1 < cs_count && at2 < cs_count)) &&
    grep -q "$cs_count frames sent, $cs_count delivered" "$work/cs-producer.log"; then
    pass csharp-producer "C# (FrameLink from /usr/share/framelink/nuget, native AOT) -> framelinkd -> framelinkd-second -> Python: $cs_count frames of 64 KiB, both daemons restarted under them (after $at1 and $at2 frames), every CRC32C matched, all $cs_count delivered, in $((SECONDS - t)) s"
  else
    fail csharp-producer "producer exited $src, consumer exited $rrc, restarts exited $r1/$r2 (after $at1 and $at2 frames), $cs_ok of $cs_count frames verified" "$work/cs-producer.log" "$work/cs-consumer.log" "$work/cs-restart.log" "$(journal framelinkd)" "$(journal framelinkd-second)"
  fi
fi

# ---- 5a. systemctl status says what the daemon serves: it sends STATUS= every 5 s while it changes
status_text=""
for _ in $(seq 1 30); do
  status_text=$(systemctl show -p StatusText --value framelinkd)
  [[ "$status_text" =~ ([0-9]+)\ frames\ delivered ]] && ((BASH_REMATCH[1] >= 200)) && break
  sleep 0.5
done
if [[ "$status_text" =~ ([0-9]+)\ frames\ delivered ]] && ((BASH_REMATCH[1] >= 200)) &&
  [[ "$status_text" == "serving: "*" attached; links up to 1 of 1 peer;"* ]]; then
  pass status "systemctl status framelinkd, after the 200 frames: \"$status_text\""
else
  fail status "framelinkd's StatusText after 200 frames: \"$status_text\" (expected its link to second up and at least 200 frames delivered)" \
    "$(journal framelinkd)"
fi

# ---- 5b. the journal's fields select the lines about one peer, one stream and one client: the
# link to 'second' and the producer of svc-a above
journalctl -u framelinkd FL_PEER=second --no-pager -o cat >"$work/journal-peer.log" 2>&1
journalctl -u framelinkd FL_STREAM=svc-a --no-pager -o cat >"$work/journal-stream.log" 2>&1
client=$(grep -m1 -o "^client [0-9]* attached" "$work/journal-stream.log" | cut -d' ' -f2)
for _ in $(seq 20); do # the daemon logs the detach once it sees the producer's socket close
  journalctl -u framelinkd FL_CLIENT="${client:-none}" --no-pager -o cat >"$work/journal-client.log" 2>&1
  grep -q "^client $client detached" "$work/journal-client.log" && break
  sleep 0.5
done
journalctl -u framelinkd FL_CLIENT="${client:-none}" --no-pager -o verbose >"$work/journal-client-verbose.log" 2>&1
why=""
grep -q 'connected to peer second' "$work/journal-peer.log" || why+="FL_PEER=second does not select 'connected to peer second'; "
grep -q "' serving: socket" "$work/journal-peer.log" && why+="FL_PEER=second selects the 'serving' line, which is about no peer; "
[[ -n "$client" ]] || why+="FL_STREAM=svc-a selects no 'client N attached' line; "
grep -q "^client $client detached" "$work/journal-client.log" || why+="FL_CLIENT=$client does not select the client's 'detached' line; "
grep -Eq "client [0-9]+ attached" <(grep -v "^client $client attached" "$work/journal-client.log") &&
  why+="FL_CLIENT=$client selects another client's attach; "
grep -q "^    FL_STREAM=svc-a$" "$work/journal-client-verbose.log" || why+="-o verbose shows no FL_STREAM=svc-a; "
grep -q "^    FL_CLIENT=$client$" "$work/journal-client-verbose.log" || why+="-o verbose shows no FL_CLIENT=$client; "
if [[ -z "$why" ]]; then
  pass journal-fields "journalctl -u framelinkd FL_PEER=second: $(grep -c . "$work/journal-peer.log") lines, FL_STREAM=svc-a: $(grep -c . "$work/journal-stream.log"), FL_CLIENT=$client: $(grep -c . "$work/journal-client.log") (its attach and detach); -o verbose shows FL_CLIENT and FL_STREAM"
else
  fail journal-fields "${why%; }" "$work/journal-peer.log" "$work/journal-stream.log" "$work/journal-client-verbose.log"
fi

# ---- 6. a user outside the group is refused, with a message that says why
as "$outsider" framelink send --stream svc-x --count 1 --size 4K >"$work/outsider.log" 2>&1
rc=$?
if ((rc != 0)) && grep -q 'Permission denied' "$work/outsider.log" && grep -q "group" "$work/outsider.log"; then
  pass outsider "$outsider refused (exit $rc): $(head -1 "$work/outsider.log")"
else
  fail outsider "$outsider: framelink send exited $rc; expected a refusal that names the permission and the group" "$work/outsider.log"
fi

# ---- 7. hot restart: `systemctl restart framelinkd` and a package upgrade under a running
# producer.  The stopping daemon hands its attach listener and its clients to systemd's file
# descriptor store and the next one takes them over: every frame delivered, none failed, the
# producer never attaches again, and the consumer on the second daemon sees every frame once.
# stream_through NAME COUNT SAME_PID COMMAND...: COUNT frames of 1 MiB at 30/s from a producer on
# framelinkd to a consumer on framelinkd-second, COMMAND run 3 s in (SAME_PID: 1 when the daemon's
# process stays, a reload); the figures in one line.
stream_through() {
  local name=$1 count=$2 same_pid=$3
  shift 3
  local t=$SECONDS
  "${as_member[@]}" framelink recv --socket "$socket_b" --stream "svc-$name" --verify --json \
    >"$work/recv-$name.json" 2>"$work/recv-$name.err" &
  local rpid=$!
  # SIGINT after 150 s at most: the producer then stops and still prints its summary.
  timeout -s INT -k 10 150 "${as_member[@]}" framelink send --stream "svc-$name" --count "$count" --rate 30 \
    --size 1M --json >"$work/send-$name.json" 2>"$work/send-$name.err" &
  local spid=$!
  sleep 3
  local pid_before pid_after rc src
  pid_before=$(main_pid framelinkd)
  "$@" >"$work/$name.log" 2>&1
  rc=$?
  pid_after=$(main_pid framelinkd)
  wait "$spid"
  src=$?
  sleep 1
  kill -INT "$rpid" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$rpid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$rpid" 2>/dev/null
  wait "$rpid"
  local submitted delivered failed reattaches received bad recv_error gap taken why=""
  submitted=$(jnum "$work/send-$name.json" submitted)
  delivered=$(jnum "$work/send-$name.json" delivered)
  failed=$(jnum "$work/send-$name.json" failed)
  reattaches=$(jnum "$work/send-$name.json" reattaches)
  received=$(jnum "$work/recv-$name.json" received)
  bad=$(jnum "$work/recv-$name.json" bad)
  recv_error=$(jstr "$work/recv-$name.json" error)
  gap=$(sed -nE 's/.*"longest_gap_ms":([0-9]+).*/\1/p' "$work/recv-$name.json" | head -1)
  taken=$(journalctl -u framelinkd --no-pager -o cat | grep -c 'taken over from the daemon before')
  ((rc == 0)) || why+="'$*' exited $rc; "
  is_active framelinkd || why+="framelinkd is $(systemctl is-active framelinkd); "
  if ((same_pid)); then
    [[ -n "$pid_before" && "$pid_before" == "$pid_after" ]] || why+="the daemon's pid went $pid_before -> $pid_after; "
  else
    [[ -n "$pid_before" && "$pid_before" != "$pid_after" ]] || why+="the daemon's pid stayed $pid_before; "
  fi
  [[ "${submitted:-}" == "$count" && "${delivered:-}" == "$count" ]] ||
    why+="submitted ${submitted:-?}, delivered ${delivered:-?} of $count; "
  [[ "${failed:-x}" == 0 ]] || why+="${failed:-?} frames failed ($(grep -o '"failures":{[^}]*}' "$work/send-$name.json")); "
  [[ "${reattaches:-x}" == 0 ]] || why+="the producer attached again ${reattaches:-?} times (the hand-over did not reach it); "
  [[ "${received:-}" == "$count" && "${bad:-x}" == 0 && -z "$recv_error" ]] ||
    why+="the consumer received ${received:-?} of $count, ${bad:-?} bad (${recv_error:-}); "
  # The guest's CPU is emulated (TCG) and shares the host's two cores with the other CI stages:
  # the daemon's exit, start and TLS link take 0.2-3.7 s here, 60-120 ms on the host, where
  # tests/integration/test_hot_restart.cpp holds the same restart to 1 s.  Here the pause is a
  # figure, bounded only by what a start can take.
  ((${gap:-99999} <= 10000)) || why+="delivery paused ${gap:-?} ms (10 s allowed in the emulated guest); "
  if [[ -z "$why" ]]; then
    pass "$name" "'$*' under a producer of 1 MiB frames (pid $pid_before -> $pid_after, $taken take-overs in the journal so far): $count frames delivered, 0 failed, 0 reattaches; the consumer received $received, verified; longest pause in delivery ${gap} ms ($((SECONDS - t)) s)"
  else
    fail "$name" "${why%; } (send exit $src)" "$work/$name.log" "$work/send-$name.json" "$work/send-$name.err" \
      "$work/recv-$name.json" "$work/recv-$name.err" "$(journal framelinkd)" "$(journal framelinkd-second)"
  fi
}
stream_through hot-restart 300 0 systemctl restart framelinkd

# The same through a package upgrade: the installed framelinkd deb again, as version +upgrade1
# (dpkg-deb unpacked, its version raised, built again), installed with apt; the package's
# scripts restart the service, as an upgrade to the next release does.
current=$(dpkg-query -W -f='${Version}' framelinkd)
next="$current+upgrade1"
rm -rf "$work/next" && mkdir -p "$work/next"
dpkg-deb -R /srv/debs/framelinkd_*.deb "$work/next/root" &&
  sed -i "s/^Version: .*/Version: $next/" "$work/next/root/DEBIAN/control" &&
  dpkg-deb -b "$work/next/root" "$work/next/framelinkd_${next}_$(dpkg --print-architecture).deb" >/dev/null
upgrade() { (cd "$work/next" && apt install -y ./framelinkd_*.deb) && [[ "$(dpkg-query -W -f='${Version}' framelinkd)" == "$next" ]]; }
stream_through package-upgrade 450 0 upgrade
# And a reload of both daemons (nothing changed: the links and clients are left alone).
reload_both() { systemctl reload framelinkd && framelink reload --socket "$socket_b"; }
stream_through reload-streaming 300 1 reload_both

# ---- 7b. the watchdog: the packaged unit has one and the data agent feeds it (systemd stamps
# each WATCHDOG=1); neither daemon was killed by it, nor restarted by systemd, during the test
wd_usec=$(systemctl show -p WatchdogUSec --value framelinkd)
wd0=$(systemctl show -p WatchdogTimestampMonotonic --value framelinkd)
wd1=$wd0
for _ in $(seq 1 40); do
  wd1=$(systemctl show -p WatchdogTimestampMonotonic --value framelinkd)
  [[ "$wd1" != "$wd0" && "$wd1" != 0 ]] && break
  sleep 0.5
done
timeouts=$(journalctl -u framelinkd -u framelinkd-second --no-pager -o cat | grep -ci 'watchdog timeout')
restarts="$(systemctl show -p NRestarts --value framelinkd)/$(systemctl show -p NRestarts --value framelinkd-second)"
if [[ "$wd_usec" == 30s && "$wd1" != "$wd0" && "$wd1" != 0 ]] && ((timeouts == 0)) && [[ "$restarts" == 0/0 ]] &&
  is_active framelinkd-second; then
  pass watchdog "WatchdogSec=$wd_usec, two pings $(((wd1 - wd0) / 1000)) ms apart; no watchdog timeout, no automatic restart (framelinkd/framelinkd-second: $restarts)"
else
  fail watchdog "WatchdogUSec=$wd_usec, last ping at ${wd0}us then ${wd1}us (monotonic), $timeouts watchdog timeouts, automatic restarts $restarts, framelinkd-second $(systemctl is-active framelinkd-second)" \
    "$(journal framelinkd)" "$(journal framelinkd-second)"
fi

# ---- 7c. a configuration error ends the daemon with exit status 2, which the unit does not
# restart (no loop), and says why at priority err; the good configuration starts it again
cp /etc/framelink/framelinkd.toml "$work/framelinkd.toml.good"
printf '\n[no_such_section]\nno_such_option = 1\n' >>/etc/framelink/framelinkd.toml
since=$(date '+%Y-%m-%d %H:%M:%S')
systemctl restart framelinkd >"$work/bad-config.log" 2>&1
sleep 4
bad_state=$(systemctl is-active framelinkd)
bad_status=$(systemctl show -p ExecMainStatus --value framelinkd)
bad_restarts=$(systemctl show -p NRestarts --value framelinkd)
journalctl -u framelinkd -p err --since "$since" --no-pager -o cat >"$work/journal-bad-config.log" 2>&1
cp "$work/framelinkd.toml.good" /etc/framelink/framelinkd.toml
systemctl reset-failed framelinkd >/dev/null 2>&1
systemctl start framelinkd >>"$work/bad-config.log" 2>&1
if [[ "$bad_state" != active && "$bad_status" == 2 && "$bad_restarts" == 0 ]] &&
  grep -q 'no_such_section' "$work/journal-bad-config.log" && is_active framelinkd; then
  pass config-error "a bad option: exit status 2, $bad_state, not restarted; journalctl -p err says: $(grep -m1 'no_such_section' "$work/journal-bad-config.log"); active again with the good configuration"
else
  fail config-error "with a bad option: $bad_state, exit status $bad_status, automatic restarts $bad_restarts; after the fix: $(systemctl is-active framelinkd)" \
    "$work/bad-config.log" "$work/journal-bad-config.log" "$(journal framelinkd)"
fi

# ---- 7d. systemctl reload reads the configuration again: log_level applies at once, a file that
# does not parse is refused and the daemon serves on -- the same process throughout
pid_before=$(main_pid framelinkd)
since=$(date '+%Y-%m-%d %H:%M:%S')
# Up to 10 s for the journal to show the line the reload should have written.
reload_said() {
  for _ in $(seq 1 20); do
    journalctl -u framelinkd --since "$since" --no-pager -o cat >"$work/journal-reload.log" 2>&1
    grep -q "$1" "$work/journal-reload.log" && return 0
    sleep 0.5
  done
  return 1
}
sed -i -E 's/^#log_level = "info"/log_level = "debug"/' /etc/framelink/framelinkd.toml
systemctl reload framelinkd >"$work/reload.log" 2>&1
reload_said 'reload: \[daemon\] log_level info -> debug' || true
printf '\n[no_such_section]\nno_such_option = 1\n' >>/etc/framelink/framelinkd.toml
systemctl reload framelinkd >>"$work/reload.log" 2>&1
reload_said 'reload: the configuration is refused' || true
cp "$work/framelinkd.toml.good" /etc/framelink/framelinkd.toml
if grep -q 'reload: \[daemon\] log_level info -> debug' "$work/journal-reload.log" &&
  grep -q 'reload: the configuration is refused, the running one stays' "$work/journal-reload.log" &&
  is_active framelinkd && [[ "$(main_pid framelinkd)" == "$pid_before" ]]; then
  pass reload "systemctl reload: $(grep -m1 'reload: \[daemon\] log_level' "$work/journal-reload.log"); a bad file: $(grep -m1 -o 'reload: the configuration is refused[^:]*' "$work/journal-reload.log"); still pid $pid_before, active"
else
  fail reload "after two reloads: $(systemctl is-active framelinkd), pid $(main_pid framelinkd) (was $pid_before)" \
    "$work/reload.log" "$work/journal-reload.log"
fi

# ---- 7d. a peer whose token differs: framelink links shows the refusal with the link's last error,
# and framelink doctor fails that peer with the fix, though its port answers
(umask 077 && echo "not-the-packaged-token" >/etc/framelink-second/wrong.token)
chown framelink:framelink /etc/framelink-second/wrong.token
sed -i 's|^token_file = .*|token_file = "/etc/framelink-second/wrong.token"|' /etc/framelink-second/framelinkd.toml
systemctl restart framelinkd-second >"$work/wrong-token.log" 2>&1
refusal=""
for _ in $(seq 1 60); do
  framelink links --json >"$work/links-wrong-token.json" 2>&1
  refusal=$(grep -o '"last_error": *"refused the session: [^"]*token[^"]*"' "$work/links-wrong-token.json" | head -1)
  [[ -n "$refusal" ]] && break
  sleep 0.5
done
framelink doctor >"$work/doctor-wrong-token.log" 2>&1
doctor_rc=$?
doctor_line=$(grep -m1 '^FAIL peer' "$work/doctor-wrong-token.log")
if [[ -n "$refusal" && $doctor_rc == 1 && "$doctor_line" == *"fix: configure the same token on both daemons"* ]]; then
  pass wrong-token "framelink links: $refusal; framelink doctor exits 1: $doctor_line"
else
  fail wrong-token "links' last error: '${refusal:-none}'; doctor exit $doctor_rc: '${doctor_line:-no FAIL peer line}'" \
    "$work/links-wrong-token.json" "$work/doctor-wrong-token.log" "$(journal framelinkd)"
fi

# ---- 7f. two more hosts of one site, trusting only a CA made by the packaged script
# (/usr/share/framelink/framelink-site-ca.sh), link as the ids their certificates name; the CA
# revokes site-a, site-b reloads with the new CRL: the link is cut and site-a refused from then on
ca=/root/framelink-site-ca
sca=/usr/share/framelink/framelink-site-ca.sh
t=$SECONDS
site_rc=0
{
  sh $sca init $ca && sh $sca issue $ca site-a /etc/framelink-site-a/tls 127.0.0.1 &&
    sh $sca issue $ca site-b /etc/framelink-site-b/tls 127.0.0.1
} >"$work/site-ca.log" 2>&1 || site_rc=$?
for h in site-a site-b; do
  d=/etc/framelink-$h
  [[ -f $d/tls/host.key ]] || continue
  chown framelink:framelink $d/tls/host.key
  install -m 0644 $ca/ca.crt $d/tls/site-ca.crt
  install -m 0644 $ca/crl.pem $d/tls/site-ca.crl
  cat >$d/framelinkd.toml <<EOF
[daemon]
id = "$h"
socket = "/run/framelink-$h/framelinkd.sock"
[link]
listen = "127.0.0.1:$([[ $h == site-a ]] && echo 7721 || echo 7722)"
data_listen = "127.0.0.1:0"
token_file = "/etc/framelink/peer.token"
reconnect_max_ms = 500
tls_cert_file = "tls/host.crt"
tls_key_file = "tls/host.key"
tls_ca_file = "tls/site-ca.crt"
tls_crl_file = "tls/site-ca.crl"
tls_client_auth = true
tls_require_cert_name = true
EOF
  [[ $h == site-a ]] && printf '\n[[peer]]\nname = "site-b"\naddress = "127.0.0.1:7722"\n' >>$d/framelinkd.toml
  systemd-run --unit=framelinkd-$h --property=Type=notify --property=User=framelink --property=Group=framelink \
    --property=RuntimeDirectory=framelink-$h --property=RuntimeDirectoryMode=0750 \
    /usr/sbin/framelinkd --config $d/framelinkd.toml >>"$work/site-ca.log" 2>&1 || site_rc=$?
done
site_up=0
for _ in $(seq 1 60); do
  framelink links --socket /run/framelink-site-b/framelinkd.sock --json 2>/dev/null | grep -q '"state": *"up"' &&
    { site_up=1; break; }
  sleep 0.5
done
# site-a's key is lost: the CA revokes it; site-b takes the new CRL and reloads (SIGHUP).
cut="" refused=""
if ((site_up)); then
  { sh $sca revoke $ca site-a && install -m 0644 $ca/crl.pem /etc/framelink-site-b/tls/site-ca.crl &&
    systemctl kill -s HUP --kill-whom=main framelinkd-site-b; } >>"$work/site-ca.log" 2>&1 || site_rc=$?
  for _ in $(seq 1 60); do
    cut=$(journalctl -u framelinkd-site-b --no-pager -o cat | grep -m1 'peer site-a: link cut: ')
    refused=$(journalctl -u framelinkd-site-b --no-pager -o cat | grep -m1 "refused: it claims to be 'site-a', but its certificate")
    [[ -n "$cut" && -n "$refused" ]] && break
    sleep 0.5
  done
fi
sleep 1
b_links=$(framelink links --socket /run/framelink-site-b/framelinkd.sock --json 2>&1)
if ((site_rc == 0 && site_up)) && [[ -n "$cut" && -n "$refused" ]] && ! grep -q '"state": *"up"' <<<"$b_links"; then
  pass site-ca "site-a and site-b, trusting only the site CA, linked; after the revocation and a reload site-b says: $cut; at site-a's redial: ${refused:0:120}... ($((SECONDS - t)) s)"
else
  fail site-ca "exit $site_rc, linked $site_up, cut '${cut:0:80}', refused '${refused:0:80}'" "$work/site-ca.log" \
    "$(journal framelinkd-site-a)" "$(journal framelinkd-site-b)"
fi
systemctl stop framelinkd-site-a framelinkd-site-b >/dev/null 2>&1
rm -rf /etc/framelink-site-a /etc/framelink-site-b $ca

# ---- 8. purge: nothing of the packages may be left
systemctl stop framelinkd-second >/dev/null 2>&1
rm -rf /etc/framelink-second
# ---- 8a. first, a peer that is down: the packaged daemon says so at priority warning
found=""
for _ in $(seq 1 60); do
  found=$(journalctl -u framelinkd -p warning --no-pager -o cat | grep -m1 'peer second at 127.0.0.1:7710: no ')
  [[ -n "$found" ]] && break
  sleep 0.5
done
if [[ -n "$found" ]]; then
  pass peer-down-warning "with framelinkd-second stopped, journalctl -p warning -u framelinkd shows: $found"
else
  fail peer-down-warning "journalctl -p warning -u framelinkd shows nothing about the stopped peer second within 30 s" "$(journal framelinkd)"
fi
t=$SECONDS
apt purge -y "${names[@]}" >"$work/apt-purge.log" 2>&1
rc=$?
left_pkgs=()
for n in "${names[@]}"; do
  s=$(dpkg-query -W -f='${db:Status-Abbrev}' "$n" 2>/dev/null)
  [[ -z "$s" || "${s:1:1}" == n ]] || left_pkgs+=("$n($s)")
done
if ((rc == 0 && ${#left_pkgs[@]} == 0)); then
  pass purge "apt purge ${names[*]} in $((SECONDS - t)) s"
else
  fail purge "apt purge exited $rc; still known to dpkg: ${left_pkgs[*]:-none}" "$work/apt-purge.log"
fi
left=()
while read -r type p; do
  if [[ "$type" == d ]]; then
    [[ -d "$p" ]] && ! grep -qxF "$p" "$work/dirs-before" && left+=("$p/")
  elif [[ -e "$p" || -L "$p" ]]; then
    left+=("$p")
  fi
done <"$work/contents"
if ((${#left[@]} == 0)); then
  pass purge-files "none of the $(wc -l <"$work/contents") paths the debs held is left (conffile and its directory included)"
else
  fail purge-files "left after the purge: ${left[*]}"
fi
leftovers=()
[[ -e /etc/framelink/peer.token ]] && leftovers+=(/etc/framelink/peer.token)
[[ -e $tls ]] && leftovers+=("$tls")
[[ -e /etc/framelink ]] && leftovers+=(/etc/framelink)
[[ -e /run/framelink ]] && leftovers+=(/run/framelink)
load=$(systemctl show -p LoadState --value framelinkd 2>/dev/null)
[[ "$load" == not-found ]] || leftovers+=("unit framelinkd.service (LoadState=$load)")
procs=$(grep -lx framelinkd /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3 | paste -sd, -)
[[ -z "$procs" ]] || leftovers+=("framelinkd processes $procs")
if getent passwd framelink >/dev/null || getent group framelink >/dev/null; then
  owned=$(find / /run -xdev \( -user framelink -o -group framelink \) 2>/dev/null | head -5 | paste -sd' ' -)
  [[ -z "$owned" ]] || leftovers+=("files owned by framelink: $owned")
fi
if ((${#leftovers[@]} == 0)); then
  pass purge-clean "no /etc/framelink (peer.token, tls/), no /run/framelink, unit not-found, no framelinkd process, no file owned by framelink"
else
  fail purge-clean "left after the purge: $(printf '%s; ' "${leftovers[@]}")"
fi
# Debian leaves system users in place on purge unless the package removes them: report which.
if getent passwd framelink >/dev/null; then
  echo "INFO user: the system user framelink is kept after the purge (the packages do not remove it)"
else
  echo "INFO user: the purge removed the system user framelink"
fi
finish
