#!/usr/bin/env bash
# Builds what is needed, then runs the test suite.
#   scripts/test.sh                 every test (labels: unit, transport, integration, install; not `rdma`,
#                                   which needs RDMA devices: tests/softroce/run-lane.sh runs it)
#   scripts/test.sh -L unit         any further arguments go to ctest (and skip the client tests)
#   scripts/test.sh clients         only the .NET and Python client tests (scripts/test-clients.sh)
# With no arguments the .NET and Python client tests run after ctest; FRAMELINK_CLIENT_TESTS=0 skips them.
# FRAMELINK_BUILD_DIR selects the build tree (default build/), as for scripts/build.sh.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}

"$root/scripts/build.sh"

status=0
if [[ "${1:-}" == clients ]]; then
  FRAMELINK_BUILD_DIR=$build "$root/scripts/test-clients.sh" || status=$?
else
  if (($# == 0)); then
    ctest --test-dir "$build" --output-on-failure -LE rdma || status=$?
    echo "scripts/test.sh: the rdma-labelled tests need RDMA devices; tests/softroce/run-lane.sh runs them"
  else
    ctest --test-dir "$build" --output-on-failure "$@" || status=$?
  fi
  if (($# == 0)) && [[ "${FRAMELINK_CLIENT_TESTS:-1}" != 0 ]]; then
    FRAMELINK_BUILD_DIR=$build "$root/scripts/test-clients.sh" || status=$?
  fi
fi
if ((status == 0)); then
  echo "scripts/test.sh: all tests passed ($build)"
else
  echo "scripts/test.sh: TESTS FAILED ($build; ctest exit $status) -- see the output above"
fi
exit "$status"
