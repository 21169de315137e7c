#!/usr/bin/env bash
# The Soft-RoCE lane: the rdma transport tested with real verbs on a machine without RDMA
# hardware.  Boots one throw-away QEMU guest (Debian's kernel + rdma_rxe, two Soft-RoCE devices
# rxe_a 10.77.1.1 / rxe_b 10.77.1.2 over a veth "cable", 64 x 2 MiB hugepages) over an existing
# build tree and runs tests/softroce/guest-lane.sh in it: ctest -L rdma, the hugepage MR check,
# the two-daemon end-to-end test (with a link cut and the tcp fallback) and the benchmark.
#
#   tests/softroce/run-lane.sh [--only ctest|hugepage|e2e|bench[,...]] [--out DIR] [--timeout SEC]
#                              [--baseline-build DIR [--rounds N]]
#
# --baseline-build DIR: the bench also runs framelink from DIR (another build tree, e.g. the commit
# before a change) alternately with this one, N runs each (default 2), and prints the ratio
# (bench.sh --baseline-build).
# FRAMELINK_BUILD_DIR selects the build tree (default build/); it must already be built.
# LANE_BENCH_SECONDS: seconds of each framelink case of the bench (default 5; CI runs 2).
# LANE_BENCH_SIZES: the bench's frame sizes (default 4K,64K,1M,4M; CI runs 4K,1M).
# Exit status: 0 every step passed (the bench is informational); 1 a step failed, or the guest
# could not run while CI=true; 3 the lane DID NOT RUN (no qemu/kernel, guest did not boot) on a
# machine outside CI; 2 usage errors.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
steps=ctest,hugepage,e2e,bench
out=""
baseline=""
rounds=2
timeout_s=600 # the guest command's limit; boot allowance 90 s + 30 s on top: < 12 min in all

usage() { sed -n '2,18s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case "$1" in
    --only) steps=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --baseline-build) baseline=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run-lane: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
IFS=, read -r -a _steps <<<"$steps"
for s in "${_steps[@]}"; do
  case "$s" in ctest | hugepage | e2e | bench) ;; *) echo "run-lane: unknown step '$s'" >&2; exit 2 ;; esac
done
build=$(cd "$build" 2>/dev/null && pwd) || { echo "run-lane: build tree ${FRAMELINK_BUILD_DIR:-$root/build} does not exist" >&2; exit 2; }
out=${out:-$build/softroce-lane}
in_ci=0
[[ "${CI:-}" == true || "${CI:-}" == 1 ]] && in_ci=1

# The lane could not run at all: a failure in CI, a loud distinct exit elsewhere.
did_not_run() {
  echo
  if ((in_ci)); then
    echo "SOFT-ROCE LANE FAILED: the guest could not run: $*"
    exit 1
  fi
  echo "SOFT-ROCE LANE DID NOT RUN: $*"
  echo "(outside CI this is not a test failure; CI=true turns it into one)"
  exit 3
}

# ---- packages (qemu, Debian kernel with rdma_rxe, busybox, perftest ...)
if [[ "${FRAMELINK_SKIP_DEPS:-0}" != 1 ]] || ! "$root/scripts/setup-deps.sh" --softroce --check >/dev/null 2>&1; then
  "$root/scripts/setup-deps.sh" --softroce || did_not_run "cannot install the packages (scripts/setup-deps.sh --softroce)"
fi

# ---- the build tree: the guest runs these binaries as they are
need=("$build/proxy/framelinkd" "$build/client/cli/framelink" "$build/client/bench/framelink-bench")
[[ ",$steps," == *,hugepage,* ]] && need+=("$build/tests/softroce/framelink_rdma_hugepage_mr")
missing=()
for f in "${need[@]}"; do [[ -x "$f" ]] || missing+=("$f"); done
if ((${#missing[@]})); then
  echo "run-lane: not built: ${missing[*]}"
  echo "run-lane: build first: cmake --build $build --target framelinkd framelink_cli framelink_bench framelink_rdma_hugepage_mr"
  echo "SOFT-ROCE LANE FAILED: the build tree is incomplete"
  exit 1
fi
# The guest CPU is qemu64 + SSE4.2 (TCG): code built for the host CPU would die of SIGILL there.
if grep -qE '^CMAKE_(C|CXX)_FLAGS[^=]*=.*-march=native' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "SOFT-ROCE LANE FAILED: $build is configured with -march=native; the guest CPU is baseline x86-64"
  exit 1
fi

rm -rf "$out"
mkdir -p "$out"
echo "run-lane: build $build, steps $steps, results in $out"
start=$SECONDS

(cd "$root" && "$here/vm/softroce-vm.sh" --pair --mtu 9000 --hugepages 64 -t "$timeout_s" --boot-allowance 90 \
  -w "$build" -o "$out" \
  -e "FRAMELINK_BUILD_DIR=$build" -e "LANE_STEPS=$steps" -e "LANE_BENCH_BASELINE=$baseline" -e "LANE_BENCH_ROUNDS=$rounds" \
  -e "LANE_BENCH_SECONDS=${LANE_BENCH_SECONDS:-5}" -e "LANE_BENCH_SIZES=${LANE_BENCH_SIZES:-64K,1M,4M}" \
  -e "LANE_E2E_CASES=${LANE_E2E_CASES:-}" -e "LANE_TIMEOUT=$timeout_s" \
  -e FRAMELINK_RDMA_A_IP=10.77.1.1 -e FRAMELINK_RDMA_B_IP=10.77.1.2 \
  -- bash "$here/guest-lane.sh") 2> >(tee "$out/vm-stderr.log" >&2)
rc=$?

took=$((SECONDS - start))

boot=$(sed -nE 's/.*softroce-guest: ready after ([0-9.]+)s.*/\1/p' "$out/console.log" 2>/dev/null | head -1)
echo
echo "==================== Soft-RoCE lane summary ===================="
echo "VM wall time ${took}s, guest ready after ${boot:-?}s of guest uptime, guest exit $rc"
if [[ -s "$out/summary.txt" ]]; then cat "$out/summary.txt"; fi
if [[ -s "$out/bench-table.md" ]]; then cat "$out/bench-table.md"; fi
echo "logs: $out/{console,cmd,setup,dmesg}.log and one log per step"

case "$rc" in
  124) [[ -s "$out/summary.txt" ]] || did_not_run "the guest hit its time limit before any step finished (exit 124)"
       echo "SOFT-ROCE LANE FAILED: the guest hit its time limit (${timeout_s}s) -- see $out/cmd.log"
       exit 1 ;;
  125) did_not_run "VM or infrastructure failure (exit 125): $(grep -h -m1 -E 'missing packages|did not report|cannot|hard timeout' "$out/vm-stderr.log" 2>/dev/null || echo "see the output above")" ;;
  126) did_not_run "guest setup failed (exit 126: modprobe rdma_rxe / rdma link add); see $out/setup.log" ;;
esac
if [[ ! -s "$out/summary.txt" ]]; then
  echo "SOFT-ROCE LANE FAILED: the guest script wrote no summary (exit $rc)"
  exit 1
fi
gated_fail=$(grep -cE '^FAIL ' "$out/summary.txt")
if ((rc != 0 || gated_fail > 0)); then
  echo "SOFT-ROCE LANE FAILED: $(grep -E '^FAIL ' "$out/summary.txt" | awk '{print $2}' | paste -sd, -) failed"
  exit 1
fi
echo "SOFT-ROCE LANE PASSED: $(grep -E '^PASS ' "$out/summary.txt" | awk '{print $2}' | paste -sd, -)"
exit 0
