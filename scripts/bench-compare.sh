#!/usr/bin/env bash
# Before/after: `framelink-bench run` of another revision against this tree's build, run in
# turns on the same machine, with the median of each case and the ratio (this / base).
#   scripts/bench-compare.sh REV [ROUNDS] [-- BENCH-ARGS...]
#     REV         a git revision (built once into build/bench-compare/<commit>/, a detached worktree)
#     ROUNDS      turns per side (default 3); each side's binaries drive their own daemons
#     BENCH-ARGS  passed to both `framelink-bench run` runs (default: --transports tcp,grpc
#                 --sizes 64K,1M,4M --seconds 3)
# Throughput cases compare GB/s (higher is better), latency cases p50 (lower is better);
# a ratio above 1 means this tree is faster.  Needs an idle machine: it is a measurement.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
rev=${1:?usage: scripts/bench-compare.sh REV [ROUNDS] [-- BENCH-ARGS...]}
shift
rounds=3
if (($# > 0)) && [[ $1 != -- ]]; then
  rounds=$1
  shift
fi
[[ ${1:-} == -- ]] && shift
bench_args=("$@")
((${#bench_args[@]} > 0)) || bench_args=(--transports tcp,grpc --sizes 64K,1M,4M --seconds 3)

commit=$(git -C "$root" rev-parse --verify "$rev^{commit}")
base_tree=$root/build/bench-compare/$commit
if [[ ! -d $base_tree ]]; then
  git -C "$root" worktree add --detach "$base_tree" "$commit" >/dev/null
fi
echo "bench-compare: building $rev ($commit) in $base_tree"
FRAMELINK_SKIP_DEPS=1 FRAMELINK_BUILD_DIR="$base_tree/build" "$base_tree/scripts/build.sh" framelinkd framelink_bench >/dev/null 2>&1 ||
  FRAMELINK_SKIP_DEPS=1 FRAMELINK_BUILD_DIR="$base_tree/build" "$base_tree/scripts/build.sh" framelinkd framelink_cli >/dev/null
echo "bench-compare: building this tree in $build"
FRAMELINK_SKIP_DEPS=1 FRAMELINK_BUILD_DIR="$build" "$root/scripts/build.sh" framelinkd framelink_bench >/dev/null

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for ((i = 1; i <= rounds; ++i)); do
  for side in base this; do
    if [[ $side == base ]]; then dir=$base_tree/build; else dir=$build; fi
    echo "bench-compare: round $i of $rounds, $side"
    bench=("$dir/client/bench/framelink-bench" run) # before it was a program of its own: `framelink bench`
    [[ -x "${bench[0]}" ]] || bench=("$dir/client/cli/framelink" bench)
    "${bench[@]}" --framelinkd "$dir/proxy/framelinkd" --idle-seconds 0 \
      "${bench_args[@]}" >"$out/$side.$i" 2>"$out/$side.$i.err" || {
      cat "$out/$side.$i.err" >&2
      exit 1
    }
  done
done

python3 - "$out" "$rounds" "$rev" <<'EOF'
import re, statistics, sys
out, rounds, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def cases(path):
    found = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        if len(cells) < 2 or cells[1] in ('-', 'framelink', '---'):
            continue
        gb = re.match(r'([\d.]+) GB/s', cells[1])
        p50 = re.match(r'p50 ([\d.]+) us', cells[1])
        if gb:
            found[cells[0]] = ('GB/s', float(gb.group(1)))
        elif p50:
            found[re.sub(r' \(\d+ samples\)', '', cells[0])] = ('us p50', float(p50.group(1)))
    return found
runs = {side: [cases(f'{out}/{side}.{i}') for i in range(1, rounds + 1)] for side in ('base', 'this')}
print(f'\n| case | {rev}: median (min-max) of {rounds} | this tree: median (min-max) of {rounds} | this / base |')
print('|---|---|---|---|')
for name, (unit, _) in runs['this'][0].items():
    b = [r[name][1] for r in runs['base'] if name in r]
    t = [r[name][1] for r in runs['this'] if name in r]
    if not b or not t:
        continue
    mb, mt = statistics.median(b), statistics.median(t)
    ratio = mt / mb if unit == 'GB/s' else mb / mt  # above 1: this tree is faster
    print(f'| {name} | {mb:.3g} ({min(b):.3g}-{max(b):.3g}) {unit} | {mt:.3g} ({min(t):.3g}-{max(t):.3g}) {unit} | {ratio:.2f} |')
print('\nratio: GB/s this/base; latency base/this (so above 1 is faster either way)')
EOF
