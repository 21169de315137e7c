#!/usr/bin/env bash
# The service test: the packages installed and run as a service in a clean Debian 12 guest.
# Boots a throw-away QEMU guest (TCG) of a Debian 12 root file system built by debootstrap,
# with systemd as init and no network, and runs tests/service/guest-test.sh in it: `apt install
# ./*.deb` of every deb in DIR, `systemctl start framelinkd`, frames between the packaged daemon
# and a second instance as a user in group framelink, a user outside the group refused, a
# `systemctl restart` under a running producer, the journal's priorities and fields, the unit's
# `systemd-analyze security` exposure, its watchdog and its handling of a configuration error,
# and `apt purge` leaving nothing behind.
#
#   tests/service/run-guest.sh [--debs DIR] [--out DIR] [--timeout SEC] [--cache DIR] [--rebuild]
#
# --debs DIR (or $FRAMELINK_DEBS_DIR): the debs to install (every *.deb in DIR).
# --out DIR: console.log, result.log (default build/service-guest).
# --timeout SEC: the test's limit inside the guest (default 600); the whole guest run is
#   limited to SEC + 300 s for the boot + 30 s.
# --cache DIR (or $FRAMELINK_CI_CACHE/service-guest): where the root file system image is kept
#   (default /var/cache/framelink-ci/service-guest), keyed by the packages it holds, the
#   mirror and build-rootfs.sh; --rebuild builds it anew.
# Exit status: 0 every check passed; 1 a check failed, or the guest could not run while CI=true;
# 3 the test DID NOT RUN (missing tools, guest did not boot) outside CI; 2 usage errors.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
debs=${FRAMELINK_DEBS_DIR:-}
out=""
timeout_s=600
boot_allowance=300
cache=${FRAMELINK_CI_CACHE:-/var/cache/framelink-ci}/service-guest
rebuild=0

usage() { sed -n '2,21s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case "$1" in
    --debs) debs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-guest: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
in_ci=0
[[ "${CI:-}" == true || "${CI:-}" == 1 ]] && in_ci=1
start_all=$SECONDS

# The test could not run at all: a failure in CI, a loud distinct exit elsewhere.
did_not_run() {
  echo
  if ((in_ci)); then
    echo "SERVICE GUEST: FAILED -- the guest could not run: $*"
    exit 1
  fi
  echo "SERVICE GUEST: DID NOT RUN -- $*"
  echo "(outside CI this is not a test failure; CI=true turns it into one)"
  exit 3
}

# ---- the debs
if [[ -z "$debs" ]]; then
  echo "run-guest: no debs: give --debs DIR (or FRAMELINK_DEBS_DIR) with the packages to install" >&2
  echo "  (build them first: scripts/package.sh, or dpkg-buildpackage -b -us -uc)" >&2
  exit 2
fi
debs_abs=$(cd "$debs" 2>/dev/null && pwd) || { echo "run-guest: --debs $debs is not a directory" >&2; exit 2; }
debs=$debs_abs
shopt -s nullglob
deb_files=("$debs"/*.deb)
shopt -u nullglob
if ((${#deb_files[@]} == 0)); then
  echo "run-guest: no *.deb in $debs -- build the packages first" >&2
  exit 2
fi
out=${out:-$root/build/service-guest}
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out/console.log" "$out/result.log"

# ---- tools (scripts/setup-deps.sh --softroce installs them)
missing=()
for t in qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap mke2fs:e2fsprogs dpkg-deb:dpkg flock:util-linux; do
  command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t#*:}")
done
kver=""
for k in $(ls -1 /boot/vmlinuz-* 2>/dev/null | sed 's|/boot/vmlinuz-||' | sort -rV); do
  if [[ -r /boot/vmlinuz-$k && -r /boot/initrd.img-$k ]]; then kver=$k; break; fi
done
[[ -n "$kver" ]] || missing+=(linux-image-amd64)
if ((${#missing[@]})); then
  did_not_run "missing packages: ${missing[*]} (scripts/setup-deps.sh --softroce installs them)"
fi

# ---- what the root file system must hold: the debs' dependencies and recommends (first
# alternative each, versions dropped), minus the debs themselves (scripts/debian-root.sh, shared
# with the container image's build).
# shellcheck source=../../scripts/debian-root.sh
source "$root/scripts/debian-root.sh"
names=()
for f in "${deb_files[@]}"; do
  n=$(dpkg-deb -f "$f" Package) || { echo "run-guest: $f is not a deb" >&2; exit 2; }
  names+=("$n")
done
rootfs_list=$(debs_root_packages "Pre-Depends Depends Recommends" "${deb_files[@]}") || exit 2
mapfile -t rootfs_pkgs <<<"$rootfs_list"
[[ -n "${rootfs_pkgs[0]:-}" ]] || rootfs_pkgs=()

# The Debian mirror apt already uses here (first URI of a bookworm source), else deb.debian.org.
mirror=$(debian_mirror)

key=$({ printf '%s\n' "${rootfs_pkgs[@]}"; echo "$mirror"; cat "$here/build-rootfs.sh"; } | sha256sum | cut -c1-16)
image=$cache/rootfs-$key.img
mkdir -p "$cache" || did_not_run "cannot create the cache directory $cache"
echo "run-guest: ${#deb_files[@]} debs (${names[*]}) from $debs; kernel $kver"
echo "run-guest: root file system $image: ${#rootfs_pkgs[@]} packages besides minbase (${rootfs_pkgs[*]})"

# ---- the root file system (built once per key; the lock keeps two runs from building it twice)
rootfs_how="cached"
rootfs_secs=0
exec 9>"$cache/lock"
flock 9
if ((rebuild)); then rm -f "$image"; fi
if [[ ! -s "$image" ]]; then
  t0=$SECONDS
  if ! bash "$here/build-rootfs.sh" "$image" "$mirror" "${rootfs_pkgs[@]}"; then
    flock -u 9
    did_not_run "building the root file system failed (debootstrap from $mirror; see the lines above)"
  fi
  rootfs_secs=$((SECONDS - t0))
  rootfs_how="built in ${rootfs_secs}s"
  # Keep the three newest images: older keys belong to package sets that have changed.
  ls -1t "$cache"/rootfs-*.img 2>/dev/null | tail -n +4 | xargs -r rm -f
fi
flock -u 9
echo "run-guest: root file system $rootfs_how"

# ---- the payload disk: debs, the test and its runner
run=$(mktemp -d /tmp/service-guest.XXXXXX)
qpid=""
tailpid=""
cleanup() {
  if [[ -n "$qpid" ]] && kill -0 "$qpid" 2>/dev/null; then
    kill -TERM "$qpid" 2>/dev/null
    sleep 2
    kill -KILL "$qpid" 2>/dev/null
    wait "$qpid" 2>/dev/null
  fi
  if [[ -n "$tailpid" ]]; then kill "$tailpid" 2>/dev/null; wait "$tailpid" 2>/dev/null; fi
  rm -rf "$run"
}
trap cleanup EXIT
trap 'echo "run-guest: interrupted"; exit 130' INT TERM
mkdir -p "$run/payload/debs"
cp "${deb_files[@]}" "$run/payload/debs/"
cp "$here/guest-test.sh" "$here/guest-runner.sh" "$run/payload/"
# The C# producer: an application of the packaged NuGet feed (framelink-nuget), built here as a native
# AOT executable (the guest has no .NET); the guest runs it against the packaged daemon.
shopt -s nullglob
nuget_debs=("$debs"/framelink-nuget_*.deb)
shopt -u nullglob
if ((${#nuget_debs[@]} == 1)); then
  command -v dotnet >/dev/null || did_not_run "dotnet (the .NET SDK) is missing: it builds the C# producer from framelink-nuget"
  mkdir -p "$cache/nuget-packages"
  "$here/build-producer.sh" "${nuget_debs[0]}" "$run/payload/producer" "$cache/nuget-packages" || {
    echo "run-guest: FAILED: the C# producer does not build from ${nuget_debs[0]##*/} (above)" >&2
    exit 1
  }
else
  echo "run-guest: no framelink-nuget deb in $debs: the guest's C# producer check will fail"
fi
echo "$timeout_s" >"$run/payload/timeout"
mb=$(du -sm "$run/payload" | cut -f1)
truncate -s "$((mb + 32))M" "$run/payload.img"
mke2fs -q -t ext4 -L fl-payload -E root_owner=0:0 -d "$run/payload" "$run/payload.img" ||
  did_not_run "cannot make the payload disk (mke2fs -d)"

# ---- boot: Debian's kernel and initrd from this machine (linux-image-amd64), systemd from the
# image as init; the image is a snapshot (writes go to a temporary overlay, the cache stays clean).
# Two serial ports: ttyS0 the console, ttyS1 the test's output and exit status.
: >"$out/console.log"
: >"$out/result.log"
cpus=$(nproc)
((cpus > 2)) && cpus=2
echo "run-guest: booting (TCG, $cpus vCPUs, 2 GiB); the test's output follows"
t_boot=$SECONDS
qemu-system-x86_64 -name framelink-service-guest \
  -accel tcg,thread=multi,tb-size=256 -cpu qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt -m 2048 -smp "$cpus" \
  -nodefaults -no-user-config -display none -monitor none -no-reboot \
  -serial "file:$out/console.log" -serial "file:$out/result.log" \
  -kernel "/boot/vmlinuz-$kver" -initrd "/boot/initrd.img-$kver" \
  -append "root=/dev/vda rw rootfstype=ext4 noresume console=ttyS0 panic=-1 oops=panic mitigations=off random.trust_cpu=on nokaslr quiet loglevel=4 systemd.show_status=auto" \
  -drive "file=$image,format=raw,if=virtio,snapshot=on" \
  -drive "file=$run/payload.img,format=raw,if=virtio,readonly=on" \
  </dev/null >"$run/qemu.log" 2>&1 &
qpid=$!
tail -n +1 -F "$out/result.log" 2>/dev/null | sed -u -e 's/\r$//' -e '/^FRAMELINK-GUEST-RC=/d' &
tailpid=$!

limit=$((boot_allowance + timeout_s + 30))
deadline=$((SECONDS + limit))
timed_out=0
booted_said=0
ended_at=""
while kill -0 "$qpid" 2>/dev/null; do
  if ((SECONDS >= deadline)); then
    timed_out=1
    echo "run-guest: hard time limit (${limit}s) reached; stopping QEMU (pid $qpid)"
    kill -TERM "$qpid" 2>/dev/null
    sleep 3
    kill -KILL "$qpid" 2>/dev/null
    break
  fi
  # The test has ended: give the guest 20 s to power off, then stop QEMU (the disk is a snapshot).
  if grep -q '^FRAMELINK-GUEST-RC=' "$out/result.log" 2>/dev/null; then
    ended_at=${ended_at:-$SECONDS}
    if ((SECONDS - ended_at > 20)); then
      echo "run-guest: the guest did not power off within 20 s of the test's end; stopping QEMU"
      kill -TERM "$qpid" 2>/dev/null
      sleep 3
      kill -KILL "$qpid" 2>/dev/null
      break
    fi
  fi
  # The test has not started within the boot allowance: the guest is not coming up.
  if ((!booted_said)) && ! grep -q 'guest-runner: system up' "$out/result.log" 2>/dev/null; then
    if ((SECONDS - t_boot > boot_allowance)); then
      echo "run-guest: the guest did not start the test within ${boot_allowance}s; stopping QEMU"
      kill -TERM "$qpid" 2>/dev/null
      sleep 3
      kill -KILL "$qpid" 2>/dev/null
      break
    fi
  else
    booted_said=1
  fi
  sleep 0.5
done
wait "$qpid" 2>/dev/null
qpid=""
guest_secs=$((SECONDS - t_boot))
sleep 0.5
kill "$tailpid" 2>/dev/null
wait "$tailpid" 2>/dev/null
tailpid=""
tr -d '\r' <"$out/result.log" >"$run/result" && mv -f "$run/result" "$out/result.log"

up=$(sed -nE 's/.*system up after ([0-9.]+) s of uptime.*/\1/p' "$out/result.log" | head -1)
rc=$(sed -nE 's/^FRAMELINK-GUEST-RC=([0-9]+).*/\1/p' "$out/result.log" | tail -1)
pass=$(grep -c '^PASS ' "$out/result.log")
fail=$(grep -c '^FAIL ' "$out/result.log")
timing="root file system $rootfs_how, guest ${guest_secs}s (test started at ${up:-?}s of uptime), total $((SECONDS - start_all))s"
echo
echo "run-guest: logs in $out (console.log: the guest's console; result.log: the test's output)"
if [[ -s "$run/qemu.log" ]]; then echo "run-guest: qemu said:"; sed 's/^/  /' "$run/qemu.log"; fi

if [[ -z "$up" ]]; then
  echo "run-guest: the guest never started the test; the console's last lines:"
  tail -n 40 "$out/console.log" | tr -d '\r' | sed 's/^/  /'
  did_not_run "the guest did not boot to the test (kernel $kver, image $image; $timing)"
fi
if ((timed_out)) || [[ -z "$rc" ]]; then
  echo "SERVICE GUEST: FAILED -- the guest hit its time limit or died before the test ended ($pass passed, $fail failed so far; $timing)"
  exit 1
fi
if [[ "$rc" != 0 ]] || ((fail > 0 || pass == 0)); then
  echo "SERVICE GUEST: FAILED -- $fail of $((pass + fail)) checks failed: $(grep '^FAIL ' "$out/result.log" | sed -E 's/^FAIL ([^:]*).*/\1/' | paste -sd';' -) (test exit $rc; $timing)"
  exit 1
fi
echo "SERVICE GUEST: PASSED -- $pass checks ($timing)"
exit 0
