#!/usr/bin/env bash
# Builds in a configured build tree only what the ctest tests of a selection run:
# their executables, plus the targets named with --also (the daemon and the CLI,
# which integration tests start as processes).  The sanitizer stages use it, so
# that a sanitizer tree does not compile what its tests never start.
#
#   scripts/build-tests.sh BUILD_DIR [--also TARGET]... -- CTEST_SELECTION...
#   e.g. scripts/build-tests.sh build-tsan -- -L 'unit|transport' -E '^unit\.metrics'
#
# ctest names a test's command only once its executable exists, so the
# executables come from the add_test() lines of the generated CTestTestfile.cmake
# files, for the tests ctest selects.  A selected test whose executable is not a
# target of the tree ("?") makes it build everything.
set -euo pipefail

if (($# < 2)); then
  echo "usage: $0 BUILD_DIR [--also TARGET]... -- CTEST_SELECTION..." >&2
  exit 2
fi
build=$(cd "$1" && pwd)
shift
also=()
while (($# > 0)) && [[ "$1" != "--" ]]; do
  case "$1" in
    --also)
      also+=("$2")
      shift 2
      ;;
    *)
      echo "build-tests: unknown argument '$1' (expected --also TARGET or --)" >&2
      exit 2
      ;;
  esac
done
[[ "${1:-}" == "--" ]] && shift

mapfile -t known < <(cmake --build "$build" --target help | sed -nE 's/^([A-Za-z0-9_.+-]+): .*/\1/p')
declare -A is_target=()
for t in "${known[@]}"; do is_target[$t]=1; done
targets=()
fallback=0
selected=0
while read -r exe; do
  [[ -n "$exe" ]] || continue
  selected=1
  if [[ "$exe" == "?" ]]; then
    fallback=1
    continue
  fi
  [[ "$exe" == "$build"/* ]] || continue # scripts or system tools: nothing to build
  name=$(basename "$exe")
  if [[ -n "${is_target[$name]:-}" ]]; then targets+=("$name"); else fallback=1; fi
done < <(ctest --test-dir "$build" -N --show-only=json-v1 "$@" | python3 -c '
import json, pathlib, re, sys
selected = {t["name"] for t in json.load(sys.stdin)["tests"]}
exes = {}
for f in pathlib.Path(sys.argv[1]).rglob("CTestTestfile.cmake"):
    for m in re.finditer(r"^add_test\(\[=\[(.+?)\]=\] \"([^\"]+)\"", f.read_text(), re.M):
        exes[m.group(1)] = m.group(2)
print("\n".join(sorted({exes.get(name, "?") for name in selected})))' "$build")
if ((!selected)); then
  echo "build-tests: no test in $build is selected by: $*" >&2
  exit 2
fi
for extra in "${also[@]}"; do
  if [[ -n "${is_target[$extra]:-}" ]]; then
    targets+=("$extra")
  else
    echo "build-tests: $extra is not a target in $build" >&2
    exit 2
  fi
done

if ((fallback || ${#targets[@]} == 0)); then
  echo "build-tests: not every selected test runs a target of this tree; building every target"
  cmake --build "$build"
else
  echo "build-tests: building ${#targets[@]} targets: ${targets[*]}"
  cmake --build "$build" --target "${targets[@]}"
fi
