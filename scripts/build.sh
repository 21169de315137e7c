#!/usr/bin/env bash
# Configures (first time only) and builds framelink; incremental afterwards.
#   scripts/build.sh [TARGET...]          default: everything
# Environment:
#   FRAMELINK_BUILD_DIR   build tree (default: build/ at the top of the repository)
#   FRAMELINK_CMAKE_ARGS  extra arguments for the first configure, e.g. "-DFRAMELINK_SANITIZE=address,undefined";
#                         "-DCMAKE_UNITY_BUILD=OFF" compiles file by file (see below)
#   FRAMELINK_SKIP_DEPS=1 do not run scripts/setup-deps.sh first
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}

if [[ "${FRAMELINK_SKIP_DEPS:-0}" != 1 ]]; then
  "$root/scripts/setup-deps.sh"
fi

# The daemon, the library and the tools compile in unity batches of 16 files (as the packages and
# the sanitizer trees do): the headers they share (gRPC, protobuf, CLI11, spdlog) are read once
# per batch, and a cold build takes about half as long.  An edit recompiles its batch; a tree
# for editing one file at a time is FRAMELINK_CMAKE_ARGS=-DCMAKE_UNITY_BUILD=OFF.
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  # shellcheck disable=SC2086  # FRAMELINK_CMAKE_ARGS is a list of arguments
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 ${FRAMELINK_CMAKE_ARGS:-}
fi

if (($# > 0)); then
  cmake --build "$build" --target "$@"
else
  cmake --build "$build"
fi
