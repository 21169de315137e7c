#!/usr/bin/env bash
# install.c_consumer: see CMakeLists.txt next to this file.
#   test-c-consumer.sh BUILD_DIR SOURCE_DIR CMAKE CC FRAMELINKD VERSION LIBDIR
set -euo pipefail
build=$1 src=$2 cmake=$3 cc=$4 framelinkd=$5 version=$6 libdir=$7

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fl-install-test.XXXXXX")
daemon_pid=
cleanup() {
  if [[ -n "$daemon_pid" ]]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
step() { printf -- '--- %s\n' "$*"; }

prefix=$tmp/prefix
step "install components client and client_dev into $prefix"
for component in client client_dev; do
  "$cmake" --install "$build" --prefix "$prefix" --component "$component" >"$tmp/install-$component.log" ||
    { cat "$tmp/install-$component.log"; fail "cmake --install --component $component"; }
done
for f in "$libdir/libframelink.so.0" "$libdir/libframelink.so" "$libdir/libframelink.a" \
  include/framelink/framelink.h include/framelink/framelink.hpp \
  "$libdir/cmake/framelink/framelinkConfig.cmake" "$libdir/cmake/framelink/framelinkConfigVersion.cmake" \
  "$libdir/cmake/framelink/framelinkTargets.cmake" "$libdir/pkgconfig/framelink.pc"; do
  [[ -e "$prefix/$f" ]] || fail "$f is not installed (files: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' '))"
done
[[ "$(readlink "$prefix/$libdir/libframelink.so")" == libframelink.so.0 ]] ||
  fail "libframelink.so should be the namelink to libframelink.so.0, is -> $(readlink "$prefix/$libdir/libframelink.so")"
# Only the two public targets are exported; internal ones (framelink::settings,
# framelink::crc32c, ...) would make find_package fail or leak build flags.
mapfile -t exported < <(grep -ohE 'framelink::[A-Za-z0-9_]+' "$prefix/$libdir/cmake/framelink/"framelinkTargets*.cmake | sort -u)
[[ "${exported[*]}" == "framelink::framelink framelink::framelink_static" ]] ||
  fail "exported targets are '${exported[*]}', expected 'framelink::framelink framelink::framelink_static'"
if grep -qE 'BUILD_INTERFACE|/client/libframelink|-Wall' "$prefix/$libdir/cmake/framelink/"framelinkTargets*.cmake; then
  fail "framelinkTargets*.cmake refers to the build tree or build flags"
fi

step "find_package(framelink CONFIG) build of examples/c"
# CMAKE_FIND_USE_PACKAGE_REGISTRY=OFF and the prefix path: the package must come from $prefix,
# not from a copy installed on this machine.
"$cmake" -S "$src/examples/c" -B "$tmp/cmake-build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" 2>&1 ||
  { cat "$tmp/configure.log"; fail "configuring examples/c against $prefix"; }
found_dir=$(sed -n 's/^framelink_DIR:PATH=//p' "$tmp/cmake-build/CMakeCache.txt")
[[ "$found_dir" == "$prefix/$libdir/cmake/framelink" ]] ||
  fail "find_package found framelink in '$found_dir', not in $prefix/$libdir/cmake/framelink"
"$cmake" --build "$tmp/cmake-build" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; fail "building examples/c"; }

step "find_package(framelink CONFIG) build of examples/cpp (framelink.hpp)"
"$cmake" -S "$src/examples/cpp" -B "$tmp/cmake-build-cpp" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=Release >"$tmp/configure-cpp.log" 2>&1 ||
  { cat "$tmp/configure-cpp.log"; fail "configuring examples/cpp against $prefix"; }
"$cmake" --build "$tmp/cmake-build-cpp" >"$tmp/build-cpp.log" 2>&1 ||
  { cat "$tmp/build-cpp.log"; fail "building examples/cpp"; }
cpp_bin=$tmp/cmake-build-cpp/framelink_roundtrip
shared_bin=$tmp/cmake-build/framelink_attach_info
static_bin=$tmp/cmake-build/framelink_attach_info_static
lib_used=$(ldd "$shared_bin" | awk '$1 == "libframelink.so.0" { print $3 }')
[[ "$lib_used" == "$prefix/$libdir/libframelink.so.0" ]] ||
  fail "$shared_bin loads libframelink.so.0 from '$lib_used', not from $prefix"
if ldd "$static_bin" | grep libframelink >/dev/null; then fail "$static_bin should not need libframelink.so"; fi

step "pkg-config build of examples/c"
export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
[[ "$(pkg-config --modversion framelink)" == "$version" ]] ||
  fail "pkg-config --modversion framelink says '$(pkg-config --modversion framelink)', expected $version"
flags=$(pkg-config --cflags --libs framelink)
echo "pkg-config --cflags --libs framelink: $flags"
[[ "$flags" == *"-I$prefix/include"* && "$flags" == *"-L$prefix/$libdir"* && "$flags" == *-lframelink* ]] ||
  fail "pkg-config flags do not point into $prefix: $flags"
pc_bin=$tmp/pc_attach_info
# shellcheck disable=SC2086  # $flags is a list of compiler arguments
"$cc" -std=c11 -Wall -Werror -o "$pc_bin" "$src/examples/c/attach_info.c" $flags ||
  fail "compiling examples/c/attach_info.c with the pkg-config flags"
pc_lib=$(LD_LIBRARY_PATH=$prefix/$libdir ldd "$pc_bin" | awk '$1 == "libframelink.so.0" { print $3 }')
[[ "$pc_lib" == "$prefix/$libdir/libframelink.so.0" ]] || fail "$pc_bin loads libframelink.so.0 from '$pc_lib'"

run() { LD_LIBRARY_PATH=$prefix/$libdir "$@"; }

step "no daemon: a clear error"
for bin in "$shared_bin" "$static_bin" "$pc_bin"; do
  status=0
  run "$bin" example "$tmp/nobody-listens.sock" >"$tmp/out" 2>"$tmp/err" || status=$?
  [[ $status -eq 2 ]] || fail "$bin without a daemon exited $status, expected 2 (stderr: $(cat "$tmp/err"))"
  grep -q "cannot connect to framelinkd at $tmp/nobody-listens.sock" "$tmp/err" ||
    fail "$bin without a daemon printed: $(cat "$tmp/err")"
  grep -q "^libframelink $version" "$tmp/out" || fail "$bin did not print 'libframelink $version': $(cat "$tmp/out")"
done

step "a real framelinkd"
socket=$tmp/d.sock
"$framelinkd" --id install-test --socket "$socket" --ready-file "$tmp/ready" --listen 127.0.0.1:0 \
  --data-listen 127.0.0.1:0 --hugepages off --log-level warn >"$tmp/daemon.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do
  [[ -s "$tmp/ready" ]] && grep -q grpc_port "$tmp/ready" && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$tmp/daemon.log"; fail "framelinkd exited before it was ready"; }
  sleep 0.05
done
grep -q grpc_port "$tmp/ready" 2>/dev/null || { cat "$tmp/daemon.log"; fail "framelinkd wrote no ready file in 10 s"; }
for bin in "$shared_bin" "$static_bin" "$pc_bin"; do
  run "$bin" example "$socket" >"$tmp/out" 2>"$tmp/err" ||
    fail "$bin could not attach to framelinkd: $(cat "$tmp/err")"
  grep -q "attached to framelinkd pid $daemon_pid as producer of 'example': client [0-9]*, 2 slots of 65536 bytes" "$tmp/out" ||
    fail "$bin printed: $(cat "$tmp/out")"
  sed -n 2p "$tmp/out"
done
status=0
run "$cpp_bin" example-cpp "$tmp/nobody-listens.sock" >"$tmp/out" 2>"$tmp/err" || status=$?
[[ $status -eq 2 ]] && grep -q "cannot connect to framelinkd" "$tmp/err" ||
  fail "$cpp_bin without a daemon exited $status, expected 2 with the reason (stderr: $(cat "$tmp/err"))"
run "$cpp_bin" example-cpp "$socket" 50 65536 >"$tmp/out" 2>"$tmp/err" ||
  fail "$cpp_bin against framelinkd: $(cat "$tmp/err") $(cat "$tmp/out")"
grep -q "^stream 'example-cpp': 50 frames of 65536 bytes, 50 intact, 50 delivered" "$tmp/out" ||
  fail "$cpp_bin printed: $(cat "$tmp/out")"
cat "$tmp/out"
echo "PASS: installed libframelink builds and runs examples/c via find_package and pkg-config, and examples/cpp"
