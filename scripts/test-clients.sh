#!/usr/bin/env bash
# Tests of the .NET and Python clients against real daemons:
#   1. dotnet test client/dotnet/tests/FrameLink.Tests   (xunit)
#   2. pytest client/python/tests tests/clients            (Python client; C# producer -> Python ingestor)
# Needs framelinkd and libframelink in FRAMELINK_BUILD_DIR (default build/; scripts/build.sh makes them),
# dotnet (the .NET SDK) and /usr/bin/python3 with python3-numpy and python3-pytest (scripts/setup-deps.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FRAMELINK_BUILD_DIR=${FRAMELINK_BUILD_DIR:-$root/build}
export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
python=${FRAMELINK_PYTHON:-/usr/bin/python3}

for f in "$FRAMELINK_BUILD_DIR/proxy/framelinkd" "$FRAMELINK_BUILD_DIR/client/libframelink.so.0"; do
  [[ -e "$f" ]] || { echo "test-clients: $f is missing: run scripts/build.sh first" >&2; exit 1; }
done
if ! command -v dotnet >/dev/null 2>&1; then
  echo "test-clients: dotnet (the .NET SDK, 8.0 or later) is not installed; it is needed for client/dotnet." >&2
  echo "  Install it (Debian: the dotnet-sdk package from Microsoft's repository) and run again." >&2
  exit 1
fi
if ! "$python" -c 'import numpy, pytest' 2>/dev/null; then
  echo "test-clients: $python lacks numpy or pytest: run scripts/setup-deps.sh (python3-numpy python3-pytest)" >&2
  exit 1
fi

status=0
echo "== dotnet test client/dotnet/tests/FrameLink.Tests"
dotnet build "$root/examples/dotnet/InspectionProducer" -c Release -nologo -v q -clp:ErrorsOnly || status=1
dotnet test "$root/client/dotnet/tests/FrameLink.Tests" -c Release -nologo -v q || status=1
echo "== pytest client/python/tests tests/clients"
FRAMELINK_DOTNET_EXAMPLE="$root/examples/dotnet/InspectionProducer/bin/Release/net10.0/InspectionProducer.dll" \
  "$python" -m pytest -q -p no:cacheprovider "$root/client/python/tests" "$root/tests/clients" || status=1
if ((status == 0)); then
  echo "test-clients: .NET and Python client tests passed"
else
  echo "test-clients: CLIENT TESTS FAILED -- see the output above"
fi
exit "$status"
