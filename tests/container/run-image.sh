#!/usr/bin/env bash
# The container test: the OCI image of framelinkd built from the debs
# (packaging/container/build-image.sh), run as a container, with applications attaching to it
# from other containers as other uids through a shared directory, as the Kubernetes manifests
# and the compose file of packaging/container/ set it up.  Run as root.
#
#   tests/container/run-image.sh --debs DIR [--out DIR] [--cache DIR] [--rebuild] [--chroot]
#
# Checks:
#   * the manifests (packaging/container/compose.yaml, kubernetes/*.yaml) parse as YAML and name
#     the image's uid/gid 7700;
#   * the image: user 7700:7700, the entry point, no peer token or TLS key inside, its size;
#   * framelinkd started from the image with the host's directory DIR/run-framelink mounted at
#     /run/framelink (the hostPath of kubernetes/daemonset.yaml), owned 7700:7700 mode 0750;
#   * from a second and a third container, as uids 7701 and 7702 with group 7700 added
#     (supplementalGroups), a consumer and a producer attach through the socket and pass 50 frames
#     of 64 KiB, every one verified (payload, order, size, CRC): SO_PEERCRED and memfd passing
#     across containers that share nothing but that directory (own mount, PID, IPC, network
#     namespaces);
#   * a container as uid 7703 without the group is refused, and the message says why;
#   * `framelink doctor` from a client container finds the daemon.
#
# How the containers run.  By default with `podman run` (real containers), with the first OCI
# runtime that can start one here: crun, then runc.  On this kind of machine crun cannot (the
# cgroup v2 hierarchy holds a controller beside the v1 ones: "cgroups in hybrid mode not
# supported"), runc can; both need explicit ulimits (the machine's root lacks CAP_SYS_RESOURCE,
# so podman's default nofile/nproc are refused).  When no runtime can start a container, or with
# --chroot, the same checks run on the image's own root file system instead (podman export of a
# created container): each "container" is `unshare --mount --pid --ipc --net --uts` + chroot into
# its own copy of the image's root, as the uid given, with the socket directory bind-mounted.
# That proves the image's contents and the authorisation across namespaces, not the runtime's
# set-up; the summary line says which of the two ran, and why.
#
# --out DIR: the logs (default build/container-test).  --cache, --rebuild: build-image.sh's.
# Exit status: 0 every check passed; 1 a check failed, or the test could not run while CI=true;
# 3 the test COULD NOT RUN (podman or debootstrap missing, the image could not be built) outside
# CI; 2 usage errors.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
debs=""
out=""
cache_args=()
force_chroot=0
usage() { sed -n '2,40s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case "$1" in
    --debs) debs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --cache) cache_args+=(--cache "$2"); shift 2 ;;
    --rebuild) cache_args+=(--rebuild); shift ;;
    --chroot) force_chroot=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-image: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
in_ci=0
[[ "${CI:-}" == true || "${CI:-}" == 1 ]] && in_ci=1
start_all=$SECONDS
uid=7700 # build-image.sh's default, named by the manifests

could_not_run() {
  echo
  if ((in_ci)); then
    echo "CONTAINER IMAGE: FAILED -- the test could not run: $*"
    exit 1
  fi
  echo "CONTAINER IMAGE: COULD NOT RUN -- $*"
  echo "(outside CI this is not a test failure; CI=true turns it into one)"
  exit 3
}
[[ -n "$debs" && -d "$debs" ]] || { echo "run-image: give --debs DIR (scripts/package.sh makes the debs)" >&2; exit 2; }
((EUID == 0)) || { echo "run-image: run as root" >&2; exit 2; }
out=${out:-$root/build/container-test}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/*.log

passed=0
failed=0
failed_names=()
pass() { passed=$((passed + 1)); echo "PASS $1: $2"; }
fail() {
  failed=$((failed + 1))
  failed_names+=("$1")
  echo "FAIL $1: $2"
  shift 2
  local f
  for f in "$@"; do [[ -f "$f" ]] && sed 's/^/  | /' "$f" | tail -n 30; done
}

# ---- 1. the manifests
missing=()
for t in podman:podman debootstrap:debootstrap python3:python3 unshare:util-linux; do
  command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t#*:}")
done
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
((${#missing[@]} == 0)) || could_not_run "missing packages: ${missing[*]} (scripts/setup-deps.sh --softroce installs them)"
manifests=("$root"/packaging/container/compose.yaml "$root"/packaging/container/kubernetes/*.yaml)
if yaml_out=$(python3 - "${manifests[@]}" 2>&1 <<'EOF'
import sys, yaml
for path in sys.argv[1:]:
    docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
    kinds = [d.get("kind", "compose" if "services" in d else "?") for d in docs]
    print(f"{path.split('packaging/container/')[-1]}: {len(docs)} documents ({', '.join(kinds)})")
EOF
); then
  without_uid=()
  for m in "${manifests[@]}"; do grep -q "$uid" "$m" || without_uid+=("${m##*/}"); done
  if ((${#without_uid[@]} == 0)); then
    pass manifests "$(echo "$yaml_out" | paste -sd';' - | sed 's/;/; /g'); each names uid/gid $uid"
  else
    fail manifests "${without_uid[*]} do not name the image's uid/gid $uid"
  fi
else
  fail manifests "not YAML: $yaml_out"
fi

# ---- 2. the image
t_image=$SECONDS
"$root/packaging/container/build-image.sh" --debs "$debs" "${cache_args[@]}" 2>&1 | tee "$out/build-image.log"
rc=${PIPESTATUS[0]}
((rc == 3)) && could_not_run "$(tail -1 "$out/build-image.log")"
((rc == 0)) || could_not_run "the image could not be built (exit $rc; $out/build-image.log)"
image_secs=$((SECONDS - t_image))
version=$(dpkg-deb -f "$(ls "$debs"/framelinkd_*.deb | head -1)" Version)
image=localhost/framelinkd:$version
size=$(podman image inspect --format '{{.Size}}' "$image")
size_mb=$((size / 1024 / 1024))
user=$(podman image inspect --format '{{.Config.User}}' "$image")
entry=$(podman image inspect --format '{{json .Config.Entrypoint}}' "$image")
mnt=$(podman image mount "$image")
secrets=()
for f in etc/framelink/peer.token etc/framelink/tls/host.key etc/framelink/tls/host.crt; do
  [[ -e "$mnt/$f" ]] && secrets+=("/$f")
done
podman image unmount "$image" >/dev/null
if [[ "$user" == "$uid:$uid" && "$entry" == '["/usr/local/sbin/framelinkd-entrypoint"]' && ${#secrets[@]} == 0 ]]; then
  pass image "$image: ${size_mb} MiB, user $user, entry point $entry, no peer token or TLS key inside"
else
  fail image "$image: user '$user', entry point $entry, secrets inside: ${secrets[*]:-none}"
fi

# ---- 3. how containers run here
run=$(mktemp -d /tmp/fl-container.XXXXXX)
names=()
daemon_pid=""
cleanup() {
  local n
  for n in "${names[@]}"; do podman rm -f -t 2 "$n" >/dev/null 2>&1; done
  if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
    kill -TERM "$daemon_pid" 2>/dev/null
    for _ in $(seq 1 20); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$daemon_pid" 2>/dev/null
    wait "$daemon_pid" 2>/dev/null
  fi
  findmnt -rn -o TARGET | { grep -E "^$run/" || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  rm -rf --one-file-system "$run"
}
trap cleanup EXIT
trap 'echo "run-image: interrupted"; exit 130' INT TERM
# Ulimits podman may set: none above this machine's hard limits (no CAP_SYS_RESOURCE here).
hard_nofile=$(ulimit -Hn)
[[ "$hard_nofile" == unlimited || "$hard_nofile" -gt 65536 ]] && hard_nofile=65536
limits=(--ulimit "nofile=$hard_nofile:$hard_nofile" --ulimit nproc=4096:4096)
mode=""
why_not=()
if ((force_chroot)); then
  why_not+=("--chroot asked for it")
else
  for rt in crun runc; do
    command -v "$rt" >/dev/null 2>&1 || { why_not+=("$rt: not installed"); continue; }
    if err=$(timeout 120 podman run --rm --runtime "$rt" "${limits[@]}" --network none \
      --entrypoint /usr/sbin/framelinkd "$image" --version 2>&1); then
      mode=podman
      runtime=$rt
      break
    fi
    why_not+=("podman run --runtime $rt could not: $(echo "$err" | tail -1)")
  done
fi
if [[ "$mode" == podman ]]; then
  how_short="in real containers (podman run, runtime $runtime)"
  how="real containers: podman run --runtime $runtime --network none ${limits[*]}"
  ((${#why_not[@]})) && how+=" (${why_not[*]})"
else
  mode=chroot
  how_short="NOT in real containers: the image's root under unshare + chroot"
  how="NOT real containers (${why_not[*]}): the image's root file system (podman export) run with unshare --mount --pid --ipc --net --uts + chroot instead"
fi
echo "run-image: $how"

sockdir=$run/run-framelink # the node's /run/framelink (hostPath)
mkdir -p "$sockdir"
chown "$uid:$uid" "$sockdir"
chmod 0750 "$sockdir"
socket=/run/framelink/framelinkd.sock

if [[ "$mode" == chroot ]]; then
  cid=$(podman create "$image") || could_not_run "podman create $image failed"
  names+=("$cid")
  mkdir -p "$run/image"
  podman export "$cid" | tar --numeric-owner -C "$run/image" -x || could_not_run "podman export of $image failed"
fi
# A root of its own for each container (chroot mode): a copy of the image's.
new_root() {
  local r=$run/root-$1
  cp -a "$run/image" "$r"
  echo "$r"
}
# start_daemon: framelinkd from the image, the socket directory mounted at /run/framelink.
start_daemon() {
  if [[ "$mode" == podman ]]; then
    names+=(fl-ci-daemon-$$)
    podman run -d --name "fl-ci-daemon-$$" --runtime "$runtime" "${limits[@]}" --network none \
      -v "$sockdir:/run/framelink" "$image" >/dev/null
  else
    local r
    r=$(new_root daemon)
    unshare --mount --pid --ipc --net --uts --fork --kill-child=TERM sh -c '
      set -e; r=$1; mount --bind "$2" "$r/run/framelink"; mount -t proc proc "$r/proc"
      exec chroot "$r" setpriv --reuid "$3" --regid "$3" --clear-groups --reset-env /usr/local/sbin/framelinkd-entrypoint' \
      sh "$r" "$sockdir" "$uid" >"$out/daemon.log" 2>&1 &
    daemon_pid=$!
  fi
}
daemon_log() {
  if [[ "$mode" == podman ]]; then podman logs "fl-ci-daemon-$$" >"$out/daemon.log" 2>&1; fi
  cat "$out/daemon.log"
}
# client NAME UID GROUP|- framelink ARGS...: `framelink` from the image as UID (and GROUP added).
client() {
  local name=$1 u=$2 g=$3
  shift 3
  if [[ "$mode" == podman ]]; then
    local add=()
    [[ "$g" != - ]] && add=(--group-add "$g")
    names+=("fl-ci-$name-$$")
    podman run --rm --name "fl-ci-$name-$$" --runtime "$runtime" "${limits[@]}" --network none \
      --user "$u:$u" "${add[@]}" -v "$sockdir:/run/framelink" --entrypoint /usr/bin/framelink "$image" "$@"
  else
    local r groups=--clear-groups
    [[ "$g" != - ]] && groups=--groups=$g
    r=$(new_root "$name")
    unshare --mount --pid --ipc --net --uts --fork --kill-child sh -c '
      set -e; r=$1; mount --bind "$2" "$r/run/framelink"; mount -t proc proc "$r/proc"; u=$3; g=$4; shift 4
      exec chroot "$r" setpriv --reuid "$u" --regid "$u" "$g" --reset-env /usr/bin/framelink "$@"' \
      sh "$r" "$sockdir" "$u" "$groups" "$@"
  fi
}

# ---- 4. the daemon
t_run=$SECONDS
start_daemon
for _ in $(seq 1 60); do
  [[ -S "$sockdir/framelinkd.sock" ]] && break
  sleep 0.5
done
if [[ -S "$sockdir/framelinkd.sock" ]]; then
  pass daemon "framelinkd from the image serves $sockdir/framelinkd.sock ($(stat -c '%A %u:%g' "$sockdir/framelinkd.sock") as the host sees it)"
else
  daemon_log >/dev/null
  fail daemon "no attach socket in $sockdir after 30 s" "$out/daemon.log"
  echo "run-image: $how"
  echo "CONTAINER IMAGE: FAILED -- the daemon did not start $how_short"
  exit 1
fi

# ---- 5. a consumer and a producer, two more containers, other uids in group 7700
client recv 7701 "$uid" recv --socket "$socket" --stream ci --count 50 --verify --expect-order \
  --expect-size 64K --timeout-ms 60000 >"$out/recv.log" 2>&1 &
recv_pid=$!
sleep 2
client send 7702 "$uid" send --socket "$socket" --stream ci --count 50 --size 64K --crc >"$out/send.log" 2>&1
src=$?
wait "$recv_pid"
rrc=$?
daemon_log >/dev/null
# The daemon saw each client as its own uid (SO_PEERCRED across the containers).
seen=$(grep -Eo 'attached: pid [0-9]+ uid 770[12]' "$out/daemon.log" | sed 's/.* uid //' | sort -u | paste -sd, -)
if ((src == 0 && rrc == 0)) && grep -q 'all passed the checks' "$out/recv.log" && [[ "$seen" == 7701,7702 ]]; then
  pass frames "uid 7701 (recv) and uid 7702 (send), each in its own container with group $uid added: 50 frames of 64 KiB through the daemon's container, every one verified; the daemon saw uids $seen: $(head -1 "$out/send.log")"
else
  daemon_log >/dev/null
  fail frames "send exited $src, recv exited $rrc, the daemon saw uids '${seen}' attach (expected 7701,7702)" "$out/send.log" "$out/recv.log" "$out/daemon.log"
fi

# ---- 6. an outsider: no group 7700
client outsider 7703 - send --socket "$socket" --stream ci-x --count 1 --size 4K >"$out/outsider.log" 2>&1
orc=$?
if ((orc != 0)) && grep -q 'Permission denied' "$out/outsider.log" && grep -q group "$out/outsider.log"; then
  pass outsider "uid 7703 without group $uid refused (exit $orc): $(head -1 "$out/outsider.log")"
else
  fail outsider "uid 7703: framelink send exited $orc; expected a refusal naming the permission and the group" "$out/outsider.log"
fi

# ---- 7. the operator's preflight from an application container
client doctor 7701 "$uid" doctor --socket "$socket" >"$out/doctor.log" 2>&1
sed 's/^/  doctor| /' "$out/doctor.log"
if grep -q '^OK   daemon' "$out/doctor.log"; then
  pass doctor "framelink doctor as uid 7701 finds the daemon ($(grep -c '^OK' "$out/doctor.log") OK, $(grep -c '^WARN' "$out/doctor.log") WARN, $(grep -c '^FAIL' "$out/doctor.log") FAIL)"
else
  fail doctor "framelink doctor as uid 7701 did not find the daemon" "$out/doctor.log"
fi
daemon_log >/dev/null
run_secs=$((SECONDS - t_run))

timing="image ${image_secs}s, containers ${run_secs}s, total $((SECONDS - start_all))s"
echo
echo "run-image: logs in $out"
if ((failed > 0 || passed == 0)); then
  echo "run-image: $how"
  echo "CONTAINER IMAGE: FAILED -- $failed of $((passed + failed)) checks failed $how_short: ${failed_names[*]} ($timing)"
  exit 1
fi
echo "run-image: $how"
echo "CONTAINER IMAGE: PASSED -- $passed checks $how_short; image ${size_mb} MiB ($timing)"
exit 0
