#!/usr/bin/env bash
# Tests of the .NET and Python clients against real daemons:
#   1. dotnet test client/dotnet/tests/FrameLink.Tests   (xunit, FrameLink by project reference)
#   2. dotnet pack client/dotnet/src/FrameLink (net10.0, with its .snupkg) into $FRAMELINK_BUILD_DIR/dotnet/feed, then
#      dotnet test client/dotnet/tests/FrameLink.PackageTests (FrameLink from that feed, as an application)
#   3. pytest client/python/tests tests/clients            (Python client; C# producer -> Python ingestor),
#      against the installed package: the wheel is built into $FRAMELINK_BUILD_DIR/python/dist and
#      installed into a fresh venv there (--system-site-packages: numpy and pytest from Debian);
#      mypy checks the installed package's type hints (py.typed)
# Needs framelinkd and libframelink in FRAMELINK_BUILD_DIR (default build/; scripts/build.sh makes them),
# dotnet (the .NET SDK) and /usr/bin/python3 with python3-numpy, python3-pytest, python3-venv,
# python3-pip, python3-setuptools, python3-wheel and mypy (scripts/setup-deps.sh).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export FRAMELINK_BUILD_DIR=${FRAMELINK_BUILD_DIR:-$root/build}
export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
python=${FRAMELINK_PYTHON:-/usr/bin/python3}

for f in "$FRAMELINK_BUILD_DIR/proxy/framelinkd" "$FRAMELINK_BUILD_DIR/client/libframelink.so.0"; do
  [[ -e "$f" ]] || { echo "test-clients: $f is missing: run scripts/build.sh first" >&2; exit 1; }
done
if ! command -v dotnet >/dev/null 2>&1; then
  echo "test-clients: dotnet (the .NET SDK, 10.0 or later: FrameLink builds for net10.0) is not installed." >&2
  echo "  Install it (Debian: the dotnet-sdk package from Microsoft's repository) and run again." >&2
  exit 1
fi
if ! "$python" -c 'import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ("numpy", "pytest", "venv", "pip", "setuptools", "wheel")))' ||
  ! command -v mypy >/dev/null; then
  echo "test-clients: $python lacks numpy, pytest, venv, pip, setuptools or wheel, or mypy is missing:" \
    "run scripts/setup-deps.sh (python3-numpy python3-pytest python3-venv python3-pip python3-setuptools" \
    "python3-wheel mypy)" >&2
  exit 1
fi

status=0
echo "== dotnet test client/dotnet/tests/FrameLink.Tests"
dotnet build "$root/examples/dotnet/InspectionProducer" -c Release -nologo -v q -clp:ErrorsOnly || status=1
dotnet test "$root/client/dotnet/tests/FrameLink.Tests" -c Release -nologo -v q || status=1
echo "== dotnet pack client/dotnet/src/FrameLink; dotnet test client/dotnet/tests/FrameLink.PackageTests"
export FRAMELINK_NUGET_FEED=$FRAMELINK_BUILD_DIR/dotnet/feed
rm -rf "$FRAMELINK_NUGET_FEED"
# Every build packs the same version: drop the one restored last time so the new package is taken.
rm -rf "$FRAMELINK_BUILD_DIR/dotnet/packages/framelink"
if dotnet pack "$root/client/dotnet/src/FrameLink" -c Release -o "$FRAMELINK_NUGET_FEED" -nologo -v q -clp:ErrorsOnly; then
  ls "$FRAMELINK_NUGET_FEED"/FrameLink.*.nupkg
  dotnet test "$root/client/dotnet/tests/FrameLink.PackageTests" -c Release -nologo -v q || status=1
else
  echo "test-clients: dotnet pack of FrameLink failed" >&2
  status=1
fi
echo "== python: wheel, venv, mypy, pytest client/python/tests tests/clients"
py=$FRAMELINK_BUILD_DIR/python
rm -rf "$py" && mkdir -p "$py/src"
# Built from a copy, so that setuptools leaves no build/ or egg-info in the source tree.
cp -r "$root/client/python/pyproject.toml" "$root/client/python/README.md" "$root/client/python/framelink" "$py/src/"
"$python" -m venv --system-site-packages --without-pip "$py/venv"  # pip: Debian's, seen through the system site
venv_python=$py/venv/bin/python
if "$venv_python" -m pip wheel -q --no-build-isolation --no-deps --no-index -w "$py/dist" "$py/src" &&
  "$venv_python" -m pip install -q --no-deps --no-index "$py"/dist/framelink-*.whl; then
  ls "$py"/dist/framelink-*.whl
  # From $py: neither mypy nor pytest may see the source tree's framelink/ (conftest checks it).
  (cd "$py" && mypy --python-executable "$venv_python" --cache-dir "$py/mypy-cache" \
    --config-file "$root/client/python/pyproject.toml" -p framelink) || status=1
  (cd "$py" && FRAMELINK_DOTNET_EXAMPLE="$root/examples/dotnet/InspectionProducer/bin/Release/net10.0/InspectionProducer.dll" \
    "$venv_python" -m pytest -q -p no:cacheprovider "$root/client/python/tests" "$root/tests/clients") || status=1
else
  echo "test-clients: building or installing the framelink wheel failed" >&2
  status=1
fi
if ((status == 0)); then
  echo "test-clients: .NET and Python client tests passed"
else
  echo "test-clients: CLIENT TESTS FAILED -- see the output above"
fi
exit "$status"
