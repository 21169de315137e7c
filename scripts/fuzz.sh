#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (in build-fuzz/) and
# runs each one for a bounded time over a scratch copy of its seed corpus
# (tests/fuzz/corpus/<target>/ is only read).  A crash, a leak, a timeout or
# a broken invariant fails the run and leaves the input in
# build-fuzz/fuzz-artifacts/ to reproduce it with `build-fuzz/tests/fuzz/<target> FILE`.
#
# The same clang build checks the lock rules: it is configured with
# FRAMELINK_THREAD_SAFETY=ON (-Wthread-safety as errors) and also builds the
# daemon, the CLI and the unit-test executables, so that every annotated file
# is compiled with the analysis on.  Its compile_commands.json is what
# scripts/tidy.sh runs clang-tidy with.
#
#   scripts/fuzz.sh [SECONDS]      seconds per target (default 60; FUZZ_SECONDS too)
#   scripts/fuzz.sh --build-only   only the clang build (thread-safety check), no fuzzing
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_only=0
if [[ "${1:-}" == --build-only ]]; then
  build_only=1
  shift
fi
seconds=${1:-${FUZZ_SECONDS:-60}}
build=${FRAMELINK_FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=(fuzz_ring fuzz_attach fuzz_tcp_frames fuzz_grpc_messages fuzz_peer_messages
  fuzz_grpc_reassembly fuzz_session_writer)
# Built only with rdma-core (FRAMELINK_ENABLE_RDMA): run when the build has it.
optional_targets=(fuzz_rdma_receive)
# What the thread-safety analysis must see besides the fuzzers: every
# annotated file is in the daemon (proxy/), and the tests include its headers.
checked=(framelinkd framelink_cli framelink_test_daemon framelink_test_config framelink_test_cli
  framelink_transport_tests framelink_test_rdma_transport)

for tool in clang-14 clang++-14; do
  command -v "$tool" >/dev/null 2>&1 ||
    { echo "fuzz: $tool is missing: scripts/setup-deps.sh installs clang-14 and libclang-rt-14-dev" >&2; exit 2; }
done
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFRAMELINK_BUILD_FUZZERS=ON -DFRAMELINK_BUILD_EXAMPLES=OFF \
    -DFRAMELINK_THREAD_SAFETY=ON >/dev/null
else
  cmake -DFRAMELINK_THREAD_SAFETY=ON "$build" >/dev/null  # a tree configured before the option existed
fi
# The rdma unit test and fuzzer exist only when rdma-core is installed.
mapfile -t known < <(cmake --build "$build" --target help | sed -nE 's/^([A-Za-z0-9_.+-]+): .*/\1/p')
for t in "${optional_targets[@]}"; do
  if printf '%s\n' "${known[@]}" | grep -qx "$t"; then targets+=("$t"); fi
done
build_targets=("${targets[@]}")
for t in "${checked[@]}"; do
  if printf '%s\n' "${known[@]}" | grep -qx "$t"; then build_targets+=("$t"); fi
done
build_start=$SECONDS
cmake --build "$build" --target "${build_targets[@]}"
echo "fuzz: clang build with -Wthread-safety passed (${#build_targets[@]} targets, $((SECONDS - build_start)) s)"
if ((build_only)); then exit 0; fi

artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
failed=0
results=()
for t in "${targets[@]}"; do
  scratch=$(mktemp -d "${TMPDIR:-/tmp}/fl-fuzz-$t.XXXXXX")
  log=$build/fuzz-$t.log
  echo "fuzz: $t for ${seconds}s (seeds: tests/fuzz/corpus/$t)"
  set +e
  "$build/tests/fuzz/$t" -max_total_time="$seconds" -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t-" "$scratch" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  rm -rf "$scratch"
  if ((rc == 0)); then
    results+=("$t ${runs:-?} runs, coverage ${cov:-?}")
  else
    failed=$((failed + 1))
    results+=("$t FAILED (exit $rc)")
    echo "---- $t: last lines of $log"
    grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written|deadly signal|runtime error' "$log" | head -20
    tail -5 "$log"
  fi
done
if ((failed)); then
  echo "FUZZ FAILED: $(IFS=';'; echo "${results[*]}")"
  exit 1
fi
echo "FUZZ PASSED: $(IFS=';'; echo "${results[*]}")"
