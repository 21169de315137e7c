#!/usr/bin/env bash
# install.client_only: libframelink built alone (-DFRAMELINK_BUILD_DAEMON=OFF) with what it
# needs and nothing more: a C compiler, CMake and libc.  The configure sees no C++ compiler
# (CXX names none that exists) and no pkg-config module (PKG_CONFIG_LIBDIR empty), and every
# find_package of the daemon's dependencies (Protobuf, spdlog, CLI11, OpenSSL, nlohmann_json,
# prometheus-cpp, Threads) is disabled, so a dependency that creeps into the client build fails
# here.  Then: the library needs only libc, the install holds the headers, the CMake package and
# framelink.pc, examples/c builds against it with find_package (C only) and its binary runs
# (exit 2 and the reason, with no daemon to attach to).
#   test-client-only.sh SOURCE_DIR CMAKE CC
set -euo pipefail
src=$1 cmake=$2 cc=$3

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-client-only.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { printf -- '--- %s\n' "$*"; }

disabled=()
for p in Protobuf spdlog CLI11 OpenSSL nlohmann_json prometheus-cpp Threads PkgConfig; do
  disabled+=("-DCMAKE_DISABLE_FIND_PACKAGE_$p=ON")
done
step "configure with -DFRAMELINK_BUILD_DAEMON=OFF, no C++ compiler, no pkg-config module"
CXX=$tmp/no-such-c++ PKG_CONFIG_LIBDIR=$tmp/none "$cmake" -S "$src" -B "$tmp/build" -G Ninja \
  -DCMAKE_C_COMPILER="$cc" -DFRAMELINK_BUILD_DAEMON=OFF -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$tmp/prefix" -DCMAKE_INSTALL_LIBDIR=lib "${disabled[@]}" >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "the client-only configure needs more than a C compiler (above)"; }
if grep -q 'CMAKE_CXX_COMPILER' "$tmp/build/CMakeCache.txt"; then
  fail "the client-only configure enabled C++: $(grep 'CMAKE_CXX_COMPILER:' "$tmp/build/CMakeCache.txt")"
fi

step "build and install"
"$cmake" --build "$tmp/build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "building libframelink alone"; }
all_targets=$(ninja -C "$tmp/build" -t targets all) || fail "ninja -t targets"
grep -q 'libframelink.so' <<<"$all_targets" || fail "ninja lists no libframelink.so target: is the listing stale?"
others=$(grep -cE '^(proxy|proto|client/cli|client/bench|tests)/' <<<"$all_targets" || true)
[[ "$others" == 0 ]] || fail "the client-only build has $others targets of the daemon, the tools or the tests"
"$cmake" --install "$tmp/build" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install"; }
for f in lib/libframelink.so.0 lib/libframelink.a include/framelink/framelink.h \
  lib/cmake/framelink/framelinkConfig.cmake lib/pkgconfig/framelink.pc; do
  [[ -e "$tmp/prefix/$f" ]] || fail "$f is not installed"
done
[[ ! -e "$tmp/prefix/bin" && ! -e "$tmp/prefix/sbin" ]] || fail "the client-only install has programs: $(ls "$tmp/prefix"/*bin)"
needed=$(readelf -d "$tmp/prefix/lib/libframelink.so.0" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | tr '\n' ' ')
[[ "$needed" == "libc.so.6 " || "$needed" == "libc.so.6 ld-linux-x86-64.so.2 " ]] ||
  fail "libframelink.so.0 needs '$needed', expected libc alone"
echo "libframelink.so.0 needs: $needed"

step "examples/c against the install (find_package, C only)"
"$cmake" -S "$src/examples/c" -B "$tmp/example" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$tmp/example.log" 2>&1 &&
  "$cmake" --build "$tmp/example" >>"$tmp/example.log" 2>&1 || { cat "$tmp/example.log"; fail "building examples/c"; }
rc=0
out=$(FRAMELINK_SOCKET=$tmp/no-daemon.sock "$tmp/example/framelink_attach_info" 2>&1) || rc=$?
[[ $rc == 2 && "$out" == *"cannot connect to framelinkd"* ]] ||
  fail "framelink_attach_info with no daemon: exit $rc, '$out' (expected exit 2 and the reason)"
echo "ok: libframelink alone: a C compiler, CMake and libc; examples/c builds and says why it cannot attach"
