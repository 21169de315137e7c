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
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
FRAMELINK_SKIP_DEPS=${FRAMELINK_SKIP_DEPS:-0} "$root/scripts/build.sh" framelink_sim >/dev/null
if (($# == 0)); then set -- --schedules 100000; fi
exec "$build/tests/sim/framelink_sim" "$@"
