#!/usr/bin/env bash
# clang-tidy (Debian's clang-tidy-14) with the repository's .clang-tidy over the daemon (proxy/)
# and the tools (client/cli/, client/bench/), using the compile database of the clang tree
# (build-clang/, made by scripts/clang-build.sh; this script generates the protobuf headers the sources include when they
# are missing).  That tree compiles the daemon and the CLI in unity batches, and clang-tidy reads
# each batch as one translation unit: every header is read once per batch instead of once per file
# (a third of the time), and a finding is reported at its line in the .cpp of the batch.  Runs one
# clang-tidy per batch, TIDY_JOBS at a time (default: the number of cores), prints every finding
# once and fails when there is any.
#
#   scripts/tidy.sh [FILE...]     default: every .cpp of proxy/, client/cli/ and client/bench/
#                                 (FILE: the batches that hold these files)
#   scripts/tidy.sh --record      every file, then .ci/tidy-clean lists the key of every unit (below)
set -euo pipefail

record=0
if [[ "${1:-}" == --record ]]; then
  record=1
  shift
  (($# == 0)) || { echo "tidy: --record runs over every file; no FILE with it" >&2; exit 2; }
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_CLANG_BUILD_DIR:-$root/build-clang}
jobs=${TIDY_JOBS:-$(nproc)}
tidy=clang-tidy-14

command -v "$tidy" >/dev/null 2>&1 ||
  { echo "tidy: $tidy is missing: scripts/setup-deps.sh installs it (package clang-tidy-14)" >&2; exit 2; }
if [[ ! -f "$build/compile_commands.json" ]]; then
  echo "tidy: no $build/compile_commands.json yet: configuring the clang tree (scripts/clang-build.sh)"
  FRAMELINK_CLANG_BUILD_DIR=$build "$root/scripts/clang-build.sh" framelink_proto framelink_cli_bench_proto
fi
# The generated headers (link.pb.h, bench.grpc.pb.h); nothing to do when built.
cmake --build "$build" --target framelink_proto framelink_cli_bench_proto >/dev/null

cd "$root"
if (($# > 0)); then
  candidates=("$@")
else
  mapfile -t candidates < <(git ls-files 'proxy/*.cpp' 'client/cli/*.cpp' 'client/bench/*.cpp')
fi
# The translation units that hold the candidates: the unity batch of the daemon's or the CLI's
# targets that includes the file, else the file itself when it is compiled alone (the fuzzers'
# batches and the tests that compile a daemon file again are left out).  Only what the build compiles counts
# (the rdma sources are absent without rdma-core).
mapfile -t units < <(/usr/bin/python3 - "$build" "$root" "${candidates[@]}" <<'PY'
import json, re, sys
build, root, wanted = sys.argv[1], sys.argv[2], [f"{sys.argv[2]}/{f}" for f in sys.argv[3:]]
entries = [e["file"] for e in json.load(open(f"{build}/compile_commands.json"))]
batches = {e: open(e).read() for e in entries
           if "/Unity/" in e and e.startswith((f"{build}/proxy/", f"{build}/client/cli/", f"{build}/client/bench/"))}
units = set()
for path in wanted:
    holders = [b for b, text in batches.items() if f'#include "{path}"' in text]
    if holders:
        units.add(holders[0])
    elif path in entries:
        units.add(path)
print("\n".join(sorted(units)))
PY
)
if ((${#units[@]} == 0)); then
  echo "tidy: none of the files is in $build/compile_commands.json" >&2
  exit 2
fi
# Findings in our headers and, for the batches, in the .cpp files they include.
header_filter='.*/(proxy|client/cli|client/bench|tests)/([a-z0-9_]+/)*[a-z0-9_]+\.(h|cpp)$'

out=$(mktemp -d "${TMPDIR:-/tmp}/fl-tidy.XXXXXX")
trap 'rm -rf "$out"' EXIT
# Units that passed before are not read again: a unit's key is the hash of what clang-tidy would
# read -- its preprocessed text (with this checkout's path taken out, so another clone finds it),
# its compile flags, .clang-tidy, the header filter and clang-tidy's version -- and a clean run
# leaves the key in the cache (TIDY_CACHE, default ~/.cache/framelink-tidy; TIDY_CACHE=off: none).
# A unit whose preprocessed text cannot be made is run.
# The repository carries the keys of the units as they were at a clean run too: .ci/tidy-clean,
# written by `scripts/tidy.sh --record` before a commit.  The key holds every byte clang-tidy reads
# (system headers included), so on a machine of another kind, or after any change a unit sees, its
# key differs and it is read again; on a fresh clone only what changed since the record is read.
cache=${TIDY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/framelink-tidy}
recorded=$root/.ci/tidy-clean
declare -A key_of=() clean_key=()
if [[ -f "$recorded" && "$cache" != off ]] && ((!record)); then
  while read -r key _; do
    [[ "$key" =~ ^[0-9a-f]{64}$ ]] && clean_key[$key]=1
  done <"$recorded"
fi
if [[ "$cache" != off ]]; then
  mkdir -p "$cache"
  while read -r unit key; do key_of[$unit]=$key; done < <(
    /usr/bin/python3 - "$build" "$root" "$($tidy --version | tr '\n' ' ')" "$header_filter" "${units[@]}" <<'PY'
import hashlib, json, shlex, subprocess, sys
build, root, version, header_filter, units = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
commands = {e["file"]: e for e in json.load(open(f"{build}/compile_commands.json"))}
config = open(f"{root}/.clang-tidy", "rb").read()
for unit in units:
    entry = commands.get(unit)
    if entry is None:
        continue
    args = shlex.split(entry["command"])
    # The compile without its output: -E -P (no line markers), to stdout.
    pre, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c":
            pre.append(a)
    run = subprocess.run(pre + ["-E", "-P", "-o", "-"], cwd=entry["directory"], capture_output=True)
    if run.returncode != 0:
        continue
    h = hashlib.sha256()
    for part in (version.encode(), config, header_filter.encode(),
                 " ".join(pre).replace(root, "@ROOT@").encode(), run.stdout.replace(root.encode(), b"@ROOT@")):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    print(unit, h.hexdigest())
PY
  )
fi
to_run=()
from_record=0
for u in "${units[@]}"; do
  key=${key_of[$u]:-}
  if [[ -n "$key" && -e "$cache/$key" ]]; then continue; fi
  if [[ -n "$key" && -n "${clean_key[$key]:-}" ]]; then
    from_record=$((from_record + 1))
    continue
  fi
  to_run+=("$u")
done
echo "tidy: $($tidy --version | sed -n 's/.*LLVM version /clang-tidy /p') over ${#candidates[@]} files in ${#units[@]} translation units ($((${#units[@]} - ${#to_run[@]})) unchanged since a clean run: $from_record as .ci/tidy-clean records, the others in $cache), $jobs at a time"
start=$SECONDS
# Each file's output to its own log (parallel runs would interleave lines);
# the exit status of each run goes into the log's name.
if ((${#to_run[@]} > 0)); then
  printf '%s\n' "${to_run[@]}" |
    xargs -P "$jobs" -I{} sh -c 'log="$1/$(echo "$2" | tr / _)"; if "$3" -p "$4" --config-file="$5/.clang-tidy" --header-filter="$6" --quiet "$2" >"$log.log" 2>&1; then :; else mv "$log.log" "$log.failed"; fi' \
      sh "$out" {} "$tidy" "$build" "$root" "$header_filter"
fi
took=$((SECONDS - start))

# A finding is a diagnostic naming its check; the same header finding comes
# from every file including the header, so each is printed once.
# The batches themselves #include .cpp files (bugprone-suspicious-include): not a finding of ours.
mapfile -t findings < <(find "$out" -type f -exec cat {} + | grep -E '(warning|error): .*\[[A-Za-z0-9.,-]+\]$' | grep -v '/Unity/unity_' | sort -u)
mapfile -t crashed < <(cd "$out" && for f in *.failed; do
  [[ -e "$f" ]] || continue
  grep -E '(warning|error): .*\[[A-Za-z0-9.,-]+\]$' "$f" | grep -v '/Unity/unity_' >/dev/null || echo "${f%.failed}"
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
  echo "TIDY FAILED: ${#findings[@]} findings in ${#candidates[@]} files (${took} s)"
  exit 1
fi
# Every unit run here was clean: remember it.
for u in "${to_run[@]}"; do
  if [[ -n "${key_of[$u]:-}" ]]; then touch "$cache/${key_of[$u]}"; fi
done
if ((record)); then
  {
    echo "# scripts/tidy.sh --record: the key of each translation unit clang-tidy found clean (see the"
    echo "# script), so that a fresh clone reads only the units that changed since.  Generated."
    for u in "${units[@]}"; do
      if [[ -n "${key_of[$u]:-}" ]]; then echo "${key_of[$u]} ${u#"$build"/}"; fi
    done
  } >"$recorded"
  echo "tidy: recorded $(grep -c '^[0-9a-f]' "$recorded") clean units in $recorded"
fi
echo "TIDY PASSED: ${#candidates[@]} files in ${#units[@]} translation units ($((${#units[@]} - ${#to_run[@]})) unchanged since a clean run), no findings (${took} s)"
