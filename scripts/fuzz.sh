#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (in build-fuzz/) and
# runs each one for a bounded time over a scratch copy of its seed corpus
# (tests/fuzz/corpus/<target>/ is only read).  A crash, a leak, a timeout or
# a broken invariant fails the run and leaves the input in
# build-fuzz/fuzz-artifacts/ to reproduce it with `build-fuzz/tests/fuzz/<target> FILE`.
#
#   scripts/fuzz.sh [SECONDS]     seconds per target (default 60; FUZZ_SECONDS too)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seconds=${1:-${FUZZ_SECONDS:-60}}
build=${FRAMELINK_FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=(fuzz_ring fuzz_attach fuzz_tcp_frames fuzz_peer_messages)

for tool in clang-14 clang++-14; do
  command -v "$tool" >/dev/null 2>&1 ||
    { echo "fuzz: $tool is missing: scripts/setup-deps.sh installs clang-14 and libclang-rt-14-dev" >&2; exit 2; }
done
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFRAMELINK_BUILD_FUZZERS=ON -DFRAMELINK_BUILD_EXAMPLES=OFF -DFRAMELINK_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$build" --target "${targets[@]}"

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
