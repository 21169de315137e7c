#!/usr/bin/env bash
# The C client in a minimal Debian 12 root, which has nothing of this machine: debootstrap minbase
# plus a C compiler, CMake, make and pkg-config (no C++ compiler, no gRPC, no library of the daemon).
#   1. libframelink from the source tarball with -DFRAMELINK_BUILD_DAEMON=OFF: configure, build,
#      install, and examples/c built against the install and run;
#   2. the debs libframelink0 and libframelink-dev installed with dpkg, and examples/c (copied alone,
#      no source tree) built against them with find_package and with pkg-config, and run.
# Each program runs with no daemon to attach to: it must exit 2 and say it cannot connect.
#
#   tests/install/minimal-root.sh --debs DIR [--cache DIR]
#
# --cache DIR (or $FRAMELINK_CI_CACHE/client-root, default /var/cache/framelink-ci/client-root):
# where the debootstrap root is kept as a tar, made once per package set and mirror.
# Needs root (debootstrap, chroot, a private mount namespace). Exit status 0 when all passed.
set -euo pipefail

root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
debs=""
cache=${FRAMELINK_CI_CACHE:-/var/cache/framelink-ci}/client-root
while (($#)); do
  case $1 in
    --debs) debs=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    *) echo "minimal-root: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -n "$debs" ]] || { echo "usage: $0 --debs DIR [--cache DIR]" >&2; exit 2; }
((EUID == 0)) || { echo "minimal-root: run as root (debootstrap, chroot)" >&2; exit 2; }
for t in debootstrap unshare flock dpkg-deb; do
  command -v "$t" >/dev/null || { echo "minimal-root: $t is missing (scripts/setup-deps.sh --softroce)" >&2; exit 2; }
done
debs=$(cd "$debs" && pwd)
say() { echo "minimal-root: $*"; }
fail() {
  echo "minimal-root: FAILED: $*" >&2
  exit 1
}
# shellcheck source=../../scripts/debian-root.sh
source "$root_dir/scripts/debian-root.sh"
mirror=$(debian_mirror)

# ---- the root: minbase + what a C build needs, as a tar (built once per key)
pkgs=(gcc libc6-dev cmake make pkg-config)
key=$({ printf '%s\n' "${pkgs[@]}"; echo "$mirror"; } | sha256sum | cut -c1-16)
base=$cache/root-$key.tar
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
work=$(mktemp -d "${TMPDIR:-/tmp}/fl-minroot.XXXXXX")
trap 'remove_scratch "$work"' EXIT
tree=$work/root
t=$SECONDS
if [[ -s "$base" ]]; then
  say "root $base (cached: minbase + ${pkgs[*]})"
  mkdir -p "$tree"
  tar --numeric-owner -C "$tree" -xf "$base"
else
  say "root: debootstrap bookworm from $mirror (minbase + ${pkgs[*]})"
  inc=$(printf '%s,' "${pkgs[@]}")
  debootstrap --variant=minbase --include="${inc%,}" --components=main bookworm "$tree" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    fail "debootstrap"
  }
  unmount_under "$work"
  rm -rf "$tree"/var/lib/apt/lists/* "$tree"/var/cache/apt/* "$tree"/debootstrap
  tar --numeric-owner -C "$tree" -cf "$base.tmp" .
  mv -f "$base.tmp" "$base"
  ls -1t "$cache"/root-*.tar | tail -n +3 | xargs -r rm -f
fi
for absent in g++ c++ protoc; do
  [[ ! -e "$tree/usr/bin/$absent" ]] || fail "the root has /usr/bin/$absent: it is not minimal"
done
say "the root holds $(chroot "$tree" dpkg-query -W -f='.\n' | wc -l) packages ($((SECONDS - t)) s)"

# ---- what goes in: the source tarball, examples/c alone, the two debs
"$root_dir/scripts/dist-tarball.sh" "$work" >/dev/null
mkdir -p "$tree/src" "$tree/example" "$tree/debs"
tar -C "$tree/src" --strip-components=1 -xzf "$work"/framelink-*.tar.gz
cp -r "$root_dir/examples/c/." "$tree/example/"
for p in libframelink0 libframelink-dev; do
  f=("$debs/${p}_"*.deb)
  [[ -f "${f[0]}" ]] || fail "no ${p}_*.deb in $debs"
  cp "${f[0]}" "$tree/debs/"
done

cat >"$tree/check.sh" <<'EOF'
set -eu
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C
runs_and_says_why() {  # each example with no daemon: exit 2 and "cannot connect"
  for bin in "$@"; do
    rc=0
    "$bin" example /nonexistent.sock >/dev/null 2>/tmp/err || rc=$?
    [ "$rc" = 2 ] && grep -q 'cannot connect to framelinkd' /tmp/err ||
      { echo "FAIL: $bin exited $rc: $(cat /tmp/err)"; exit 1; }
  done
}
echo "--- 1. libframelink from source, -DFRAMELINK_BUILD_DAEMON=OFF ($(gcc --version | head -1), $(cmake --version | head -1))"
cmake -S /src -B /build -DFRAMELINK_BUILD_DAEMON=OFF -DCMAKE_BUILD_TYPE=Release >/tmp/configure.log 2>&1 ||
  { cat /tmp/configure.log; echo "FAIL: configure"; exit 1; }
cmake --build /build -j2 >/tmp/build.log 2>&1 || { cat /tmp/build.log; echo "FAIL: build"; exit 1; }
cmake --install /build >/tmp/install.log 2>&1 || { cat /tmp/install.log; echo "FAIL: install"; exit 1; }
cmake -S /example -B /example-build-src >/tmp/ex1.log 2>&1 && cmake --build /example-build-src >>/tmp/ex1.log 2>&1 ||
  { cat /tmp/ex1.log; echo "FAIL: examples/c against the install in /usr/local"; exit 1; }
grep -q 'framelink_DIR:PATH=/usr/local/' /example-build-src/CMakeCache.txt || { echo "FAIL: examples/c did not find /usr/local's package"; exit 1; }
LD_LIBRARY_PATH=/usr/local/lib runs_and_says_why /example-build-src/framelink_attach_info /example-build-src/framelink_attach_info_static
echo "ok: built, installed in /usr/local, examples/c built against it and run"
rm -rf /usr/local/lib/libframelink* /usr/local/lib/*/libframelink* /usr/local/include/framelink /usr/local/lib/cmake/framelink \
  /usr/local/lib/*/cmake/framelink /usr/local/lib/pkgconfig/framelink.pc /usr/local/lib/*/pkgconfig/framelink.pc /usr/local/share/pkgconfig/framelink.pc
echo "--- 2. the debs: dpkg -i libframelink0 libframelink-dev; examples/c alone, against /usr"
dpkg -i /debs/*.deb >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; echo "FAIL: dpkg -i"; exit 1; }
cmake -S /example -B /example-build-deb >/tmp/ex2.log 2>&1 && cmake --build /example-build-deb >>/tmp/ex2.log 2>&1 ||
  { cat /tmp/ex2.log; echo "FAIL: examples/c against the installed debs"; exit 1; }
grep -q 'framelink_DIR:PATH=/usr/lib/' /example-build-deb/CMakeCache.txt || { echo "FAIL: examples/c did not find the deb's package"; exit 1; }
gcc -std=c11 -Wall -Werror -o /tmp/pc_attach_info /example/attach_info.c $(pkg-config --cflags --libs framelink) ||
  { echo "FAIL: examples/c/attach_info.c with pkg-config's flags"; exit 1; }
runs_and_says_why /example-build-deb/framelink_attach_info /example-build-deb/framelink_attach_info_static /tmp/pc_attach_info
echo "ok: libframelink0 $(dpkg-query -W -f='${Version}' libframelink0) and libframelink-dev installed; examples/c built with find_package and pkg-config and run"
EOF

say "in the root (chroot, private mounts)"
unshare --mount --fork -- sh -c "mount -t proc proc '$tree/proc' && mount -t tmpfs tmpfs '$tree/tmp' &&
  mount --rbind /dev '$tree/dev' && chroot '$tree' /bin/sh /check.sh" || fail "(above)"
say "passed in $((SECONDS - t)) s: the client library from source and from the debs, in a root with a C compiler and no C++ one"
