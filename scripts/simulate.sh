#!/usr/bin/env bash
# Runs the deterministic simulation of the frame protocol (tests/sim): seeded
# schedules of two to four daemons' real data agents on in-memory links (one
# or two receivers; with two, the stream is routed to both), with
# client deaths, daemon crashes, broken, replaced and half-open links, damaged
# payloads and (in some schedules) an adversary's forged control records,
# checking after every step that each completion tells the truth.
#   scripts/simulate.sh                       100,000 schedules from seed 1
#   scripts/simulate.sh --seconds 600         for ten minutes
#   scripts/simulate.sh --seed 4242 --schedules 1 --trace   replay one schedule with its events
# Arguments go to framelink_sim (--help lists them).  Builds it first in
# FRAMELINK_BUILD_DIR (default build/).
# A run of --schedules N from the first seed (no --seed, --seconds or --trace) is
# split into SIM_JOBS processes (default: the number of cores), each a contiguous
# range of the same seeds; a schedule depends on its seed only, so the runs are
# the same schedules as one process.  Each process's report is printed, then one
# SIMULATION PASSED/FAILED line for them all.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
FRAMELINK_SKIP_DEPS=${FRAMELINK_SKIP_DEPS:-0} "$root/scripts/build.sh" framelink_sim >/dev/null
if (($# == 0)); then set -- --schedules 100000; fi
sim=$build/tests/sim/framelink_sim

# Split only a plain `--schedules N [options]` run.
jobs=${SIM_JOBS:-$(nproc)}
schedules=""
rest=()
split=1
while (($# > 0)); do
  case $1 in
    --schedules) schedules=$2; shift 2 ;;
    --schedules=*) schedules=${1#*=}; shift ;;
    --seed | --seed=* | --seconds | --seconds=* | --trace) split=0; rest+=("$1"); shift ;;
    *) rest+=("$1"); shift ;;
  esac
done
if ((split == 0)) || [[ -z "$schedules" ]] || ((jobs < 2 || schedules < 2 * jobs)); then
  exec "$sim" ${schedules:+--schedules "$schedules"} "${rest[@]}"
fi

out=$(mktemp -d "${TMPDIR:-/tmp}/fl-simulate.XXXXXX")
trap 'rm -rf "$out"' EXIT
start=$SECONDS
pids=()
first=1
for ((j = 0; j < jobs; ++j)); do
  count=$((schedules / jobs + (j < schedules % jobs ? 1 : 0)))
  "$sim" --seed "$first" --schedules "$count" "${rest[@]}" >"$out/$j.log" 2>&1 &
  pids+=($!)
  first=$((first + count))
done
failed=0
for ((j = 0; j < jobs; ++j)); do
  status=0
  wait "${pids[$j]}" || status=$?
  echo "---- process $((j + 1)) of $jobs (exit $status):"
  cat "$out/$j.log"
  ((status == 0)) || failed=$((failed + 1))
done
if ((failed == 0)); then
  echo "SIMULATION PASSED: $schedules schedules (seeds 1..$schedules) in $jobs processes, $((SECONDS - start)) s"
else
  echo "SIMULATION FAILED: $failed of $jobs processes (seeds 1..$schedules) failed; their reports are above"
  exit 1
fi
