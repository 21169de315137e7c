#!/usr/bin/env bash
# The clang tree (build-clang/): one configuration that serves four checks, so that CI compiles
# the sources once for all of them instead of once each:
#   * ASan+UBSan: the daemon, the library, the CLI and every test (FRAMELINK_SANITIZE), run by
#     `ctest --test-dir build-clang -L 'unit|transport|integration|sim'`;
#   * the libFuzzer targets of tests/fuzz (FRAMELINK_BUILD_FUZZERS), run by scripts/fuzz.sh: the
#     daemon's libraries carry the fuzzers' coverage instrumentation, and the fuzzers link them;
#   * the lock annotations, -Wthread-safety as errors on every file (FRAMELINK_THREAD_SAFETY);
#   * the compile database scripts/tidy.sh runs clang-tidy with.
# The daemon, the library and the CLI compile in unity batches of 16 (clang-tidy then also reads
# each batch's headers once), the tests in batches of 8 (tests/CMakeLists.txt); the tests' own code
# is -O0 (FRAMELINK_TEST_CODE).
#
#   scripts/clang-build.sh [TARGET...]     default: every target
# FRAMELINK_CLANG_BUILD_DIR selects the tree (default build-clang/ at the top of the repository).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_CLANG_BUILD_DIR:-$root/build-clang}

for tool in clang-14 clang++-14; do
  command -v "$tool" >/dev/null 2>&1 ||
    { echo "clang-build: $tool is missing: scripts/setup-deps.sh installs clang-14 and libclang-rt-14-dev" >&2; exit 2; }
done
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 -DFRAMELINK_SANITIZE=address,undefined \
    -DFRAMELINK_BUILD_FUZZERS=ON -DFRAMELINK_THREAD_SAFETY=ON -DFRAMELINK_BUILD_EXAMPLES=OFF >/dev/null
fi
start=$SECONDS
if (($# > 0)); then
  cmake --build "$build" --target "$@"
else
  cmake --build "$build"
fi
echo "clang-build: $build built with ASan+UBSan and -Wthread-safety as errors ($((SECONDS - start)) s)"
