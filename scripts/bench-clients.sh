#!/usr/bin/env bash
# Throughput of the C#, Python and C producers at 1 MiB and 4 MiB through two daemons (tcp, loopback),
# measured in one run and printed as ratios to the C client (tests/clients/bench_clients.py).
#   scripts/bench-clients.sh [--sizes 1M,4M] [--bytes 1G] [--rounds 2] [--slots 8]
# FRAMELINK_BUILD_DIR selects the build tree (default build/); it must hold framelinkd, libframelink
# and the framelink CLI (scripts/build.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FRAMELINK_BUILD_DIR=${FRAMELINK_BUILD_DIR:-$root/build}
export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1
command -v dotnet >/dev/null || { echo "bench-clients: dotnet (the .NET SDK) is not installed" >&2; exit 1; }
dotnet build "$root/examples/dotnet/InspectionProducer" -c Release -nologo -v q -clp:ErrorsOnly >/dev/null
exec "${FRAMELINK_PYTHON:-/usr/bin/python3}" "$root/tests/clients/bench_clients.py" "$@"
