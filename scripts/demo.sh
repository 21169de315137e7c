#!/usr/bin/env bash
# The main job, on one machine: builds framelinkd and framelink-bench if
# needed, then runs `framelink-bench demo` -- two daemons ("host A" and "host B"), a
# producer attached to A and a consumer attached to B (separate processes),
# N frames verified byte for byte, throughput and latency printed.
#   scripts/demo.sh                         2000 frames of 1 MiB over tcp
#   scripts/demo.sh --transport grpc --frames 500 --size 4M
# Arguments go to `framelink-bench demo` (see `build/client/bench/framelink-bench demo --help`).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}

"$root/scripts/build.sh" framelinkd framelink_bench

args=("$@")
if [[ " $* " != *" --framelinkd "* && " $* " != *" --framelinkd="* ]]; then
  args+=(--framelinkd "$build/proxy/framelinkd")
fi
exec "$build/client/bench/framelink-bench" demo "${args[@]}"
