#!/usr/bin/env bash
# ThreadSanitizer build (build-tsan/) of the in-process tests -- ctest labels
# unit and transport -- and a run of them; any reported race fails the run.
# Left out, because they need gRPC, which Debian does not build with TSan (its
# locks would be invisible and its internals reported as racing): the grpc
# transport variants and the integration tests, whose daemons link gRPC.  Those
# run under ASan+UBSan (.ci/run) instead.
#
#   scripts/tsan.sh [ctest arguments]     e.g. -R unit.ring
#   scripts/tsan.sh --build-only [ctest arguments]   only build what those tests run
set -euo pipefail

build_only=0
if [[ "${1:-}" == --build-only ]]; then
  build_only=1
  shift
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_TSAN_BUILD_DIR:-$root/build-tsan}

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  # Unity batches for the daemon and its libraries (the tests stay per file): half their compile time.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFRAMELINK_SANITIZE=thread \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 -DFRAMELINK_BUILD_EXAMPLES=OFF >/dev/null
fi
# halt_on_error: the first race ends the test with a failure and its report.
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:history_size=4}
# unit.grafana_dashboard and unit.metrics_exposition are left out too: they scrape a real
# framelinkd (gRPC inside, not built here), and they run in the main and ASan+UBSan stages.
if (($# == 0)); then set -- -L 'unit|transport' -E '^unit\.(grafana_dashboard|metrics_exposition)$'; fi
# The executables of those tests (the rdma conformance suite is labelled rdma).
"$root/scripts/build-tests.sh" "$build" -- "$@"
if ((build_only)); then exit 0; fi
ctest --test-dir "$build" --output-on-failure "$@"
