#!/usr/bin/env bash
# Configures (first time only) and builds framelink; incremental afterwards.
#   scripts/build.sh [TARGET...]          default: everything
# Environment:
#   FRAMELINK_BUILD_DIR   build tree (default: build/ at the top of the repository)
#   FRAMELINK_CMAKE_ARGS  extra arguments for the first configure, e.g. "-DFRAMELINK_SANITIZE=address,undefined"
#   FRAMELINK_SKIP_DEPS=1 do not run scripts/setup-deps.sh first
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}

if [[ "${FRAMELINK_SKIP_DEPS:-0}" != 1 ]]; then
  "$root/scripts/setup-deps.sh"
fi

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  # shellcheck disable=SC2086  # FRAMELINK_CMAKE_ARGS is a list of arguments
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${FRAMELINK_CMAKE_ARGS:-}
fi

if (($# > 0)); then
  cmake --build "$build" --target "$@"
else
  cmake --build "$build"
fi
