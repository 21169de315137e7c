#!/usr/bin/env bash
# Builds what is needed, then runs the test suite.
#   scripts/test.sh                 every test (labels: unit, transport, integration)
#   scripts/test.sh -L unit         any further arguments go to ctest
# FRAMELINK_BUILD_DIR selects the build tree (default build/), as for scripts/build.sh.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}

"$root/scripts/build.sh"

status=0
ctest --test-dir "$build" --output-on-failure "$@" || status=$?
if ((status == 0)); then
  echo "scripts/test.sh: all tests passed ($build)"
else
  echo "scripts/test.sh: TESTS FAILED ($build; ctest exit $status) -- see the output above"
fi
exit "$status"
