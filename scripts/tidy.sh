#!/usr/bin/env bash
# clang-tidy (Debian's clang-tidy-14) with the repository's .clang-tidy over
# the daemon (proxy/) and the CLI (client/cli/), using the compile database of
# the clang build in build-fuzz/ (scripts/fuzz.sh makes it; it also generates
# the protobuf headers these sources include).  Runs one clang-tidy per file,
# TIDY_JOBS at a time (default: the number of cores), prints every finding once
# and fails when there is any.
#
#   scripts/tidy.sh [FILE...]     default: every .cpp of proxy/ and client/cli/
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_FUZZ_BUILD_DIR:-$root/build-fuzz}
jobs=${TIDY_JOBS:-$(nproc)}
tidy=clang-tidy-14

command -v "$tidy" >/dev/null 2>&1 ||
  { echo "tidy: $tidy is missing: scripts/setup-deps.sh installs it (package clang-tidy-14)" >&2; exit 2; }
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "tidy: no $build/compile_commands.json yet: making the clang build (scripts/fuzz.sh --build-only)"
  "$root/scripts/fuzz.sh" --build-only
fi
# The generated headers (link.pb.h, bench.grpc.pb.h); nothing to do when built.
cmake --build "$build" --target framelink_proto framelink_cli_bench_proto >/dev/null

cd "$root"
if (($# > 0)); then
  candidates=("$@")
else
  mapfile -t candidates < <(git ls-files 'proxy/*.cpp' 'client/cli/*.cpp')
fi
# Files left out until their findings are fixed (`scripts/tidy.sh FILE` lists them); none now.
skip=()
# Only what the build compiles (the rdma sources are absent without rdma-core).
files=()
for f in "${candidates[@]}"; do
  if (($# == 0)) && printf '%s\n' "${skip[@]}" | grep -qxF "$f"; then continue; fi
  if grep -qF "\"file\": \"$root/$f\"" "$build/compile_commands.json"; then files+=("$f"); fi
done
if ((${#files[@]} == 0)); then
  echo "tidy: none of the files is in $build/compile_commands.json" >&2
  exit 2
fi

out=$(mktemp -d "${TMPDIR:-/tmp}/fl-tidy.XXXXXX")
trap 'rm -rf "$out"' EXIT
echo "tidy: $($tidy --version | sed -n 's/.*LLVM version /clang-tidy /p') over ${#files[@]} files, $jobs at a time"
start=$SECONDS
# Each file's output to its own log (parallel runs would interleave lines);
# the exit status of each run goes into the log's name.
printf '%s\n' "${files[@]}" |
  xargs -P "$jobs" -I{} sh -c 'log="$1/$(echo "$2" | tr / _)"; if "$3" -p "$4" --quiet "$2" >"$log.log" 2>&1; then :; else mv "$log.log" "$log.failed"; fi' \
    sh "$out" {} "$tidy" "$build"
took=$((SECONDS - start))

# A finding is a diagnostic naming its check; the same header finding comes
# from every file including the header, so each is printed once.
mapfile -t findings < <(cat "$out"/* | grep -E '(warning|error): .*\[[A-Za-z0-9.,-]+\]$' | sort -u)
mapfile -t crashed < <(cd "$out" && for f in *.failed; do
  [[ -e "$f" ]] || continue
  grep -qE '(warning|error): .*\[[A-Za-z0-9.,-]+\]$' "$f" || echo "${f%.failed}"
done)
if ((${#findings[@]} > 0)); then
  printf '%s\n' "${findings[@]}"
  echo "to see one in context: $tidy -p $build FILE"
fi
if ((${#crashed[@]} > 0)); then
  echo "tidy: clang-tidy failed without a finding on: ${crashed[*]}"
  for f in "${crashed[@]}"; do tail -5 "$out/$f.failed"; done
fi
if ((${#findings[@]} > 0 || ${#crashed[@]} > 0)); then
  echo "TIDY FAILED: ${#findings[@]} findings in ${#files[@]} files (${took} s)"
  exit 1
fi
echo "TIDY PASSED: ${#files[@]} files, no findings (${took} s)"
