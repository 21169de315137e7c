#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz, built in the clang tree (build-clang/,
# scripts/clang-build.sh), each for a bounded time over a scratch copy of its seed corpus
# (tests/fuzz/corpus/<target>/ is only read), FUZZ_JOBS of them at a time (default 1; each
# is one process on one core).  A crash, a leak, a timeout or a broken invariant fails the run
# and leaves the input in build-clang/fuzz-artifacts/ to reproduce it with
# `build-clang/tests/fuzz/<target> FILE`.
#
#   scripts/fuzz.sh [SECONDS]      seconds per target (default 60; FUZZ_SECONDS too)
#   scripts/fuzz.sh --build-only   only the clang build (the whole tree: the thread-safety check)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_only=0
if [[ "${1:-}" == --build-only ]]; then
  build_only=1
  shift
fi
seconds=${1:-${FUZZ_SECONDS:-60}}
jobs=${FUZZ_JOBS:-1}
build=${FRAMELINK_CLANG_BUILD_DIR:-$root/build-clang}
export FRAMELINK_CLANG_BUILD_DIR=$build
targets=(fuzz_ring fuzz_attach fuzz_tcp_frames fuzz_grpc_messages fuzz_peer_messages
  fuzz_grpc_reassembly fuzz_session_writer)
# Built only with rdma-core (FRAMELINK_ENABLE_RDMA): run when the build has it.
optional_targets=(fuzz_rdma_receive)

if ((build_only)); then exec "$root/scripts/clang-build.sh"; fi
[[ -f "$build/CMakeCache.txt" ]] || "$root/scripts/clang-build.sh" "${targets[@]}"
mapfile -t known < <(cmake --build "$build" --target help | sed -nE 's/^([A-Za-z0-9_.+-]+): .*/\1/p')
for t in "${optional_targets[@]}"; do
  if printf '%s\n' "${known[@]}" | grep -x "$t" >/dev/null; then targets+=("$t"); fi
done
"$root/scripts/clang-build.sh" "${targets[@]}"

artifacts=$build/fuzz-artifacts
mkdir -p "$artifacts"
# One target: its run, then a line "RESULT <target> <text>" (and the log's key lines on failure).
run_one() {
  local t=$1 scratch log rc runs cov
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
    echo "RESULT ok $t ${runs:-?} runs, coverage ${cov:-?}"
  else
    echo "---- $t: last lines of $log"
    grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written|deadly signal|runtime error' "$log" | head -20
    tail -5 "$log"
    echo "RESULT failed $t FAILED (exit $rc)"
  fi
}
export -f run_one
export build seconds artifacts root
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one "$1"' _ {} | tee "$build/fuzz-results.txt"
mapfile -t results < <(sed -n 's/^RESULT [a-z]* //p' "$build/fuzz-results.txt")
failed=$(grep -c '^RESULT failed ' "$build/fuzz-results.txt" || true)
if ((failed)); then
  echo "FUZZ FAILED: $(IFS=';'; echo "${results[*]}")"
  exit 1
fi
echo "FUZZ PASSED: $(IFS=';'; echo "${results[*]}")"
