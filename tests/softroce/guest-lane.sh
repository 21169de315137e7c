#!/usr/bin/env bash
# The Soft-RoCE lane inside the guest (started by tests/softroce/run-lane.sh through
# tests/softroce/vm/softroce-vm.sh --pair): each step under its own timeout, one PASS/FAIL line per
# step, and $SOFTROCE_OUT/summary.txt for the host.
#   ctest     ctest -L rdma (the rdma conformance suite and every other rdma-labelled test)
#   hugepage  a daemon segment on 2 MiB pages registered as an MR, one RDMA WRITE into it
#   e2e       two framelinkd over rdma (rxe_a / rxe_b), send/recv verified, link cut, tcp fallback
#   bench     framelink rdma vs ib_write_bw, ib_write_lat and UCX rc_verbs (informational, never fails the lane)
# Environment: FRAMELINK_BUILD_DIR (the build tree), LANE_STEPS (comma list), LANE_E2E_CASES (e2e.sh
# --cases; empty: all), LANE_TIMEOUT (the guest command's limit: the bench gets what is left), LANE_BENCH_BASELINE
# (a build tree the bench compares with; empty: none), LANE_BENCH_ROUNDS (runs of each), LANE_BENCH_SECONDS
# (seconds of each framelink case, default 5), LANE_BENCH_SIZES (default 4K,64K,1M,4M), SOFTROCE_*
# from the VM.
# Exit status: number of failed steps among ctest, hugepage, e2e.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
out=${SOFTROCE_OUT:-/tmp/softroce-lane}
steps=${LANE_STEPS:-ctest,hugepage,e2e,bench}
export FRAMELINK_RDMA_A_IP=${FRAMELINK_RDMA_A_IP:-${SOFTROCE_A_IP:-10.77.1.1}}
export FRAMELINK_RDMA_B_IP=${FRAMELINK_RDMA_B_IP:-${SOFTROCE_B_IP:-10.77.1.2}}
a_dev=${SOFTROCE_A_DEV:-rxe_a}
b_dev=${SOFTROCE_B_DEV:-rxe_b}
a_net=${SOFTROCE_A_NETDEV:-sra}
summary=$out/summary.txt
mkdir -p "$out"
: >"$summary"
failed=0
t0=$(date +%s.%N)

uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo "lane: guest up ${SECONDS}s into the command, uptime $(uptime_s)s; build $build; steps $steps"
echo "lane: A=$FRAMELINK_RDMA_A_IP ($a_dev on $a_net), B=$FRAMELINK_RDMA_B_IP ($b_dev), $(nproc) vCPUs," \
  "hugepages $(cat /proc/sys/vm/nr_hugepages)"

# step NAME GATED(1|0) LIMIT_SECONDS CMD...: runs CMD under timeout, log in $out/NAME.log (and the console)
step() {
  local name=$1 gated=$2 limit=$3
  shift 3
  local s e rc took verdict detail
  printf '\n==== lane step %s (limit %ss): %s\n' "$name" "$limit" "$*"
  s=$(date +%s.%N)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  e=$(date +%s.%N)
  took=$(awk -v s="$s" -v e="$e" 'BEGIN{printf "%.1f", e-s}')
  if ((rc == 0)); then
    verdict=PASS
  elif ((gated)); then
    verdict=FAIL
    failed=$((failed + 1))
  else
    verdict=INFO
  fi
  detail=""
  case "$rc" in
    0) ;;
    124 | 137) detail="timed out after ${limit}s" ;;
    *) detail="exit $rc" ;;
  esac
  case "$name" in
    ctest) detail="${detail:+$detail; }$(grep -E 'tests passed|No tests were found' "$out/$name.log" | tail -1)" ;;
    hugepage) detail="${detail:+$detail; }$(grep -E '^(PASS|FAIL|SKIP)' "$out/$name.log" | tail -1)" ;;
    e2e) detail="${detail:+$detail; }$(grep -E '^e2e [a-z]+ +(PASS|FAIL)' "$out/$name.log" | awk '{printf "%s%s=%s", sep, $2, $3; sep=", "}')" ;;
  esac
  printf '==== %s %s (%ss)%s\n' "$verdict" "$name" "$took" "${detail:+: $detail}"
  printf '%-4s %-9s %6ss  %s\n' "$verdict" "$name" "$took" "$detail" >>"$summary"
  if [[ "$name" == e2e ]]; then grep -E '^e2e [a-z]+ +(PASS|FAIL)' "$out/$name.log" | sed 's/^/       /' >>"$summary"; fi
}

# The "cable" between the two hosts is the veth sra<->srb.  It is cut by dropping every packet
# on both ends (netem loss 100%): RC queue pairs exhaust their retries, the gRPC keepalive
# expires, and both daemons must re-establish the link and replay.  (Taking the netdev down
# instead also works for the cut, but with Linux 6.1 rxe new rdma_cm connections between the
# same two processes then never complete; see tests/softroce/README.md, pitfall 12.)
modprobe sch_netem 2>/dev/null || true
b_net=${SOFTROCE_B_NETDEV:-srb}
cut_down="tc qdisc add dev $a_net root netem loss 100% && tc qdisc add dev $b_net root netem loss 100%"
cut_up="tc qdisc del dev $a_net root; tc qdisc del dev $b_net root"

IFS=, read -r -a want <<<"$steps"
for s in "${want[@]}"; do
  case "$s" in
    ctest)
      # The hugepage test is labelled rdma too; it gets its own step below.
      step ctest 1 180 ctest --test-dir "$build" -L rdma -E '^rdma_hugepage_mr$' --output-on-failure \
        --no-tests=error --timeout 150
      ;;
    hugepage)
      step hugepage 1 60 env FRAMELINK_RDMA_REQUIRE_HUGEPAGES=1 "$build/tests/softroce/framelink_rdma_hugepage_mr"
      ;;
    e2e)
      # A case takes 5-35 s here; one that hangs fails after 75 s with the daemons' state, and the
      # others still run.
      step e2e 1 420 bash "$here/e2e.sh" --build "$build" --a-ip "$FRAMELINK_RDMA_A_IP" \
        --b-ip "$FRAMELINK_RDMA_B_IP" --cut-down "$cut_down" --cut-up "$cut_up" --case-budget 75 \
        ${LANE_E2E_CASES:+--cases "$LANE_E2E_CASES"}
      ;;
    bench)
      # Under TCG: throughput at the sizes of the rdma targets only (4 KiB against ib_write_bw is
      # the small-frame target), a short latency run.
      baseline=()
      limit=320
      [[ -n "${LANE_BENCH_BASELINE:-}" ]] && baseline=(--baseline-build "$LANE_BENCH_BASELINE" --rounds "${LANE_BENCH_ROUNDS:-2}") &&
        limit=$((320 + 120 * ${LANE_BENCH_ROUNDS:-2}))
      # The bench never fails the lane, so it must not take the guest past its own limit either.
      left=$((${LANE_TIMEOUT:-100000} - SECONDS - 20))
      if ((left < 90)); then
        echo "lane: bench not run: ${left}s left of the guest's ${LANE_TIMEOUT}s" | tee -a "$summary"
        continue
      fi
      ((limit > left)) && limit=$left
      step bench 0 "$limit" bash "$here/bench.sh" --build "$build" --a-dev "$a_dev" --a-ip "$FRAMELINK_RDMA_A_IP" \
        --b-dev "$b_dev" --b-ip "$FRAMELINK_RDMA_B_IP" --seconds "${LANE_BENCH_SECONDS:-5}" --sizes "${LANE_BENCH_SIZES:-4K,64K,1M,4M}" --latency-samples 200 \
        --out "$out/bench-table.md" "${baseline[@]}"
      ;;
    *) echo "lane: unknown step $s" | tee -a "$summary"; failed=$((failed + 1)) ;;
  esac
done

for d in "$a_dev" "$b_dev"; do
  echo "$d counters: $(rdma statistic show link "$d/1" 2>/dev/null |
    awk '{for(i=3;i<NF;i+=2) if($(i+1)!=0) printf "%s=%s ", $i, $(i+1)}')"
done | tee "$out/rxe-counters.txt"
total=$(awk -v s="$t0" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1f", e-s}')
echo "steps took ${total}s; guest uptime $(uptime_s)s" >>"$summary"
exit "$failed"
