#!/usr/bin/env bash
# Two releases link: framelinkd and framelink of the previous release (the commit
# packaging/previous-release.txt names, built here from this repository's history) against those
# of this tree, both ways, on each transport that needs no RDMA device:
#   * the previous release's daemon dials this tree's: frames from its `framelink send` reach a
#     `framelink recv --verify --expect-order` of this tree;
#   * this tree's daemon dials the previous release's: frames the other way.
# Each case sends --crc frames (the receiving daemon checks each payload's CRC32C) and fails
# unless every frame ends DELIVERED at the producer and arrives, in order and intact, at the
# consumer.  The last line is "PREVIOUS RELEASE: PASSED ..." or "PREVIOUS RELEASE: FAILED ...".
#
#   tests/compat/previous-release.sh [--build DIR] [--out DIR] [--frames N] [--size BYTES]
#     --build   this tree's build (default $FRAMELINK_BUILD_DIR or build/): framelinkd, framelink
#     --out     where the previous release is unpacked and built (default build/previous-release);
#               its objects go through ccache, so a second run on a machine compiles nothing
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
out=""
frames=200
size=256K
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --frames) frames=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "previous-release: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
out=${out:-$build/previous-release}
fail() {
  echo "PREVIOUS RELEASE: FAILED -- $*"
  exit 1
}

read -r commit version < <(grep -vE '^\s*(#|$)' "$root/packaging/previous-release.txt" | head -1)
[[ "$commit" =~ ^[0-9a-f]{40}$ ]] ||
  fail "packaging/previous-release.txt names no commit (a line '<40-hex commit> <version>' expected)"
git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null ||
  fail "commit $commit (release $version) is not in this clone: it needs the history (git fetch --unshallow)"

new_daemon=$build/proxy/framelinkd
new_cli=$build/client/cli/framelink
for b in "$new_daemon" "$new_cli"; do
  [[ -x "$b" ]] || fail "$b is missing: scripts/build.sh builds it"
done

# The previous release from the history: its sources as they were (git archive), the daemon and
# the CLI only.  -O1 without debug information: these binaries are run here, never debugged or
# shipped.  In unity batches (half the compile) unless its sources are not ready for that -- an
# older tree may keep helpers of one name in two files -- then file by file.
src=$out/src-${commit:0:12}
tree=$out/build-${commit:0:12}
start=$SECONDS
build_previous() {
  rm -rf "$tree"
  cmake -S "$src" -B "$tree" -G Ninja -DCMAKE_BUILD_TYPE=None -DCMAKE_C_FLAGS=-O1 -DCMAKE_CXX_FLAGS=-O1 \
    -DCMAKE_UNITY_BUILD="$1" -DCMAKE_UNITY_BUILD_BATCH_SIZE=16 -DFRAMELINK_BUILD_TESTS=OFF \
    -DFRAMELINK_BUILD_EXAMPLES=OFF >"$out/configure.log" 2>&1 ||
    { tail -20 "$out/configure.log"; fail "configuring release $version ($commit)"; }
  cmake --build "$tree" --target framelinkd framelink_cli >"$out/build.log" 2>&1
}
if [[ ! -x "$tree/proxy/framelinkd" || ! -x "$tree/client/cli/framelink" ]]; then
  rm -rf "$src"
  mkdir -p "$src"
  git -C "$root" archive "$commit" | tar -x -C "$src" || fail "git archive $commit"
  if ! build_previous ON; then
    echo "release $version does not compile in unity batches ($(grep -m1 'error:' "$out/build.log" | cut -c1-160)); file by file"
    build_previous OFF || { tail -30 "$out/build.log"; fail "building release $version ($commit)"; }
  fi
fi
old_daemon=$tree/proxy/framelinkd
old_cli=$tree/client/cli/framelink
echo "previous release $version ($commit) built in $((SECONDS - start)) s: $old_daemon"

work=$(mktemp -d "${TMPDIR:-/tmp}/fl-compat.XXXXXX")
pids=()
stop_daemons() {
  local p
  for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]+"${pids[@]}"}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  pids=()
}
trap 'stop_daemons; rm -rf "$work"' EXIT
token=compat-$RANDOM$RANDOM

# start_daemon NAME BINARY TRANSPORT [ARGS...]: framelinkd as host<NAME> in $work/<case>/<name>.
start_daemon() {
  local name=$1 bin=$2 transport=$3 dir=$case_dir/$1
  shift 3
  mkdir -p "$dir"
  "$bin" --id "host$name" --socket "$dir/sock" --listen 127.0.0.1:0 --data-listen 127.0.0.1:0 \
    --hugepages off --transports "$transport" --token "$token" --ready-file "$dir/ready" \
    --drain-timeout-ms 1000 "$@" >"$dir/log" 2>&1 &
  pids+=($!)
  for _ in $(seq 150); do
    grep -q '^grpc_port=' "$dir/ready" 2>/dev/null && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  tail -20 "$dir/log"
  return 1
}
port_of() { sed -n 's/^grpc_port=//p' "$case_dir/$1/ready" | head -1; }
json_num() { sed -nE "s/.*\"$2\":([0-9]+).*/\\1/p" <<<"$1"; }

# one_case LABEL TRANSPORT DIALER_DAEMON DIALER_CLI LISTENER_DAEMON LISTENER_CLI: the dialer's
# daemon (hostA) links to the listener's (hostB); hostA's producer sends, hostB's consumer reads.
failures=()
passed=()
one_case() {
  local label=$1 transport=$2 a_daemon=$3 a_cli=$4 b_daemon=$5 b_cli=$6
  case_dir=$work/$label-$transport
  local stream="compat-$transport"
  if ! start_daemon B "$b_daemon" "$transport" || ! start_daemon A "$a_daemon" "$transport" --peer "hostB=127.0.0.1:$(port_of B)"; then
    failures+=("$label/$transport: a daemon did not start (logs above)")
    stop_daemons
    return
  fi
  "$b_cli" recv --socket "$case_dir/B/sock" --stream "$stream" --count "$frames" --verify --expect-order \
    --expect-size "$size" --timeout-ms 20000 --json >"$case_dir/recv.out" 2>&1 &
  local recv_pid=$!
  sleep 0.5 # the consumer attached before the first frame
  "$a_cli" send --socket "$case_dir/A/sock" --stream "$stream" --count "$frames" --size "$size" --crc --json \
    >"$case_dir/send.out" 2>&1
  local send_rc=$?
  wait "$recv_pid"
  local recv_rc=$?
  local send_json recv_json delivered failed received bad
  send_json=$(grep '^{' "$case_dir/send.out" | tail -1)
  recv_json=$(grep '^{' "$case_dir/recv.out" | tail -1)
  delivered=$(json_num "$send_json" delivered)
  failed=$(json_num "$send_json" failed)
  received=$(json_num "$recv_json" received)
  bad=$(json_num "$recv_json" bad)
  if [[ "$send_rc" == 0 && "$delivered" == "$frames" && "$failed" == 0 && "$recv_rc" == 0 &&
    "$received" == "$frames" && "$bad" == 0 ]]; then
    passed+=("$label/$transport")
    echo "ok: $label over $transport: $frames frames of $size delivered, verified in order"
  else
    failures+=("$label/$transport: send rc=$send_rc delivered=${delivered:-?} failed=${failed:-?}; recv rc=$recv_rc received=${received:-?} bad=${bad:-?}")
    echo "-- $label over $transport failed; sender: $send_json"
    echo "-- receiver: $recv_json"
    grep -v '^{' "$case_dir/send.out" "$case_dir/recv.out" | head -10
    for d in A B; do
      echo "-- host$d's log:"
      tail -15 "$case_dir/$d/log"
    done
  fi
  stop_daemons
}

for transport in tcp grpc; do
  one_case "previous->this" "$transport" "$old_daemon" "$old_cli" "$new_daemon" "$new_cli"
  one_case "this->previous" "$transport" "$new_daemon" "$new_cli" "$old_daemon" "$old_cli"
done

if ((${#failures[@]} > 0)); then
  printf '  %s\n' "${failures[@]}"
  fail "${#failures[@]} of $((${#failures[@]} + ${#passed[@]})) cases against release $version (${commit:0:12})"
fi
echo "PREVIOUS RELEASE: PASSED -- release $version (${commit:0:12}) and this tree linked both ways over tcp and grpc, ${#passed[@]} cases of $frames frames each verified"
