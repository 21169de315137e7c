#!/usr/bin/env bash
# framelink over rdma next to perftest (ib_write_bw, ib_write_lat) and UCX (ucx_perftest put_bw /
# put_lat over UCX's rc_verbs transport) on the same two devices, size by size (each baseline run
# right after the framelink case it is compared with).  A benchmark: it measures and prints one
# table, it does not pass or fail on numbers.
#
#   tests/softroce/bench.sh --a-dev rxe_a --a-ip 10.77.1.1 --b-dev rxe_b --b-ip 10.77.1.2
#                           [--build DIR] [--sizes 4K,64K,1M,4M] [--seconds 5] [--gid 1]
#                           [--pairs 16] [--pairs-size 1M] [--latency-samples 300] [--out FILE]
#                           [--baseline-build DIR] [--rounds 2]
#
# framelink = `framelink-bench run --transports rdma --host-a A --host-b B --no-baselines`: producer
# app -> framelinkd A -> framelinkd B -> consumer app, GB/s of delivered (consumer-released) frames,
# frames/s and each daemon's CPU microseconds per frame; --pairs N pairs on N streams at once at
# --pairs-size (0: skip); 4 KiB latency submit -> receive.  ib_write_bw / ib_write_lat = server on
# B's device, client on A's, -x GID, -n iterations (never -D: its duration mode gives nonsense
# under QEMU TCG).  UCX = ucx_perftest -x rc_verbs -D zcopy, server -d B:1, client -d A:1, the
# same iterations: UCX's transport layer (UCT).  Its tag matching (UCP tag_bw, UCX_TLS=rc_v)
# cannot connect on Soft-RoCE: it wires RC up over UD, and UCX's UD endpoints time out on rxe.
# --baseline-build DIR: the framelink case of each size is also run with another build tree (say,
# the commit before a change), alternately with this one, --rounds times each; the table then
# shows both means and their ratio (same guest, same minute: the fair way to compare two trees).
# GB/s = 10^9 bytes/s.  Exit status 1 when a case could not be measured (the table still shows
# the rest), else 0.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
a_dev=${SOFTROCE_A_DEV:-}
b_dev=${SOFTROCE_B_DEV:-}
a_ip=${FRAMELINK_RDMA_A_IP:-}
b_ip=${FRAMELINK_RDMA_B_IP:-}
sizes=4K,64K,1M,4M
seconds=5
gid=1
pairs=16
pairs_size=1M
lat_samples=300
out=""
baseline_build=""
rounds=2

usage() { sed -n '2,24s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case "$1" in
    --a-dev) a_dev=$2; shift 2 ;;
    --b-dev) b_dev=$2; shift 2 ;;
    --a-ip) a_ip=$2; shift 2 ;;
    --b-ip) b_ip=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --gid) gid=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --pairs-size) pairs_size=$2; shift 2 ;;
    --latency-samples) lat_samples=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --baseline-build) baseline_build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
for v in a_dev b_dev a_ip b_ip; do
  [[ -n "${!v}" ]] || { echo "bench: --${v//_/-} is required" >&2; exit 2; }
done
cli=$build/client/bench/framelink-bench
daemon=$build/proxy/framelinkd

bytes_of() { # 64K -> 65536
  local s=${1^^} m=1
  case "$s" in *K) m=1024 ;; *M) m=$((1 << 20)) ;; *G) m=$((1 << 30)) ;; esac
  echo $((${s%[KMG]} * m))
}

daemon_args=()
if [[ -x "$daemon" ]] && "$daemon" --help 2>&1 | grep -- '--rdma-port' >/dev/null; then
  daemon_args+=(--daemon-arg=--rdma-port=0)
fi

# wait_listen PORT: until something listens on TCP PORT (at most 15 s).  Under TCG a server can
# take seconds to start, and a client that comes too early gives up at once.
wait_listen() {
  local hex i
  hex=$(printf ':%04X' "$1")
  for ((i = 0; i < 150; ++i)); do
    awk -v p="$hex" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# cell ROW N: the Nth cell (from 1) of a markdown table row, trimmed.
cell() { awk -F'|' -v n="$2" '{ v = $(n + 1); gsub(/^ +| +$/, "", v); print v }' <<<"$1"; }
ratio_of() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a > 0 && b > 0) printf "%.2f", a/b; else print "-" }'; }

ucx=$(command -v ucx_perftest || true)
ucx_missing="n/a (ucx_perftest not installed: apt-get install ucx-utils)"
ucx_port=$((20000 + $$ % 20000))
# ucx_perftest TEST SIZE ITERS: UCT over rc_verbs, zero-copy, server on B's device, client on A's;
# prints the client's "Final:" line (iterations, 3 x latency or overhead in us, MB/s avg/overall, msg/s avg/overall).
run_ucx() {
  local test=$1 size=$2 iters=$3
  shift 3
  local warm=$((iters / 10 + 2)) log=/tmp/ucx_perftest.srv.$$ res crc src
  ucx_port=$((ucx_port + 1))
  UCX_IB_GID_INDEX="$gid" timeout 120 "$ucx" -t "$test" -s "$size" -n "$iters" -w "$warm" -p "$ucx_port" \
    -x rc_verbs -D zcopy -d "$b_dev:1" >"$log" 2>&1 &
  local spid=$!
  wait_listen "$ucx_port"
  res=$(UCX_IB_GID_INDEX="$gid" timeout 120 "$ucx" "$b_ip" -t "$test" -s "$size" -n "$iters" -w "$warm" \
    -p "$ucx_port" -x rc_verbs -D zcopy -d "$a_dev:1" 2>&1)
  crc=$?
  wait "$spid"
  src=$?
  if [[ $crc$src == 00 ]] && grep -q '^Final:' <<<"$res"; then
    grep '^Final:' <<<"$res" | tail -1
  else
    # UCX's own error lines, not its backtrace
    echo "ucx_perftest $test -s $size failed (rc $crc/$src):" >&2
    grep -E 'UCX +(ERROR|WARN)|ssertion|[Ee]rror' <<<"$res" | head -6 >&2
    grep -E 'UCX +(ERROR|WARN)|ssertion|[Ee]rror' "$log" | head -4 >&2
  fi
  rm -f "$log"
}

# perf_bw TOOL SIZE ITERS: one perftest bandwidth run (ib_write_bw or ib_read_bw), server on B's
# device, client on A's; prints its GB/s, or nothing (and why, on stderr) when it failed.
perf_bw() { # TOOL SIZE ITERS [more perftest args]
  local tool=$1 n=$2 iters=$3 res crc spid src line gbits
  shift 3
  timeout 120 "$tool" -d "$b_dev" -x "$gid" -F --report_gbits -s "$n" -n "$iters" "$@" >/tmp/$tool.srv.$$ 2>&1 &
  spid=$!
  wait_listen 18515 # perftest's default port
  res=$(timeout 120 "$tool" -d "$a_dev" -x "$gid" -F --report_gbits -s "$n" -n "$iters" "$@" "$b_ip" 2>&1)
  crc=$?
  wait "$spid"
  src=$?
  line=$(awk -v s="$n" '$1 == s {print}' <<<"$res" | tail -1)
  echo "   $line" >&2
  gbits=$(awk '{print $4}' <<<"$line")
  if [[ $crc$src == 00 && -n "$gbits" ]]; then
    awk -v g="$gbits" 'BEGIN{printf "%.3f", g/8}'
  else
    echo "$tool failed (rc $crc/$src):" >&2
    echo "$res" | tail -8 >&2
    tail -5 /tmp/$tool.srv.$$ >&2
  fi
  rm -f /tmp/$tool.srv.$$
}

# Iterations of ib_write_bw and UCX put_bw: ~128 MiB per size, 16 .. 2000.
iters_for() {
  local n=$1 it=$(((128 << 20) / $1))
  ((it > 2000)) && it=2000
  ((it < 16)) && it=16
  echo "$it"
}

rows=()
extra_rows=()
declare -A ib_write_gbs
declare -A fl_push_gbs # framelink's GB/s (push) per size, for the stream-level pull rows
declare -A fl_push_cpu # and its daemons' CPU per frame, A / B
declare -A fl_push_fps # and its frames/s
unmeasured=0
IFS=, read -r -a size_list <<<"$sizes"
pairs_bytes=$(bytes_of "$pairs_size")
first=1
for sz in "${size_list[@]}"; do
  n=$(bytes_of "$sz")
  iters=$(iters_for "$n")
  # framelink; the first invocation also measures the 4 KiB latency, the one at --pairs-size the pairs
  fl="failed"
  fl_gbs=""
  fl_fps="-"
  fl_cpu="-"
  if [[ -x "$cli" ]]; then
    more=(--latency-samples 0 --pairs 0)
    ((first)) && more[1]=$lat_samples
    ((n == pairs_bytes && pairs > 1)) && more[3]=$pairs && more+=(--pairs-size "$sz")
    echo "== framelink-bench run rdma $sz (${seconds}s) ${more[*]}"
    res=$(timeout 180 "$cli" run --transports rdma --host-a "$a_ip" --host-b "$b_ip" --no-baselines \
      --sizes "$sz" --seconds "$seconds" --idle-seconds 0 "${more[@]}" "${daemon_args[@]}" 2>&1)
    rc=$?
    row=$(grep -E '^\| rdma [0-9.]+ [KMG]?i?B \|' <<<"$res" | head -1)
    fl_gbs=$(sed -nE 's/^\| rdma [^|]*\| ([0-9.]+) GB\/s.*/\1/p' <<<"$row")
    if [[ -n "$fl_gbs" ]]; then
      fl_push_gbs[$sz]=$fl_gbs
      fl="$fl_gbs GB/s"
      grep -q UNVERIFIED <<<"$row" && fl="$fl UNVERIFIED"
      fl_fps=$(cell "$row" 3)
      fl_push_fps[$sz]=$fl_fps
      fl_cpu=$(cell "$row" 9)
      fl_push_cpu[$sz]=$fl_cpu
    else
      unmeasured=$((unmeasured + 1))
      echo "$res" | tail -15
      fl="failed (rc $rc)"
    fi
    echo "   $row"
    prow=$(grep -E '^\| rdma .* pairs at once \|' <<<"$res" | head -1)
    if [[ -n "$prow" ]]; then
      echo "   $prow"
      extra_rows+=("| $(cell "$prow" 1) | $(cell "$prow" 2) | $(cell "$prow" 3) | $(cell "$prow" 9) | $(cell "$prow" 4) | $(cell "$prow" 5) | - | - |")
      grep -qE '^[0-9.]+ GB/s' <<<"$(cell "$prow" 2)" || unmeasured=$((unmeasured + 1))
    fi
    lrow=$(grep -E '^\| rdma latency ' <<<"$res" | head -1)
    if [[ -n "$lrow" ]]; then
      echo "   $lrow"
      fl_lat=$(cell "$lrow" 2)
      fl_lat_cpu=$(cell "$lrow" 9)
      fl_lat_p50=$(sed -nE 's/^p50 ([0-9.]+) us.*/\1/p' <<<"$fl_lat")
      [[ -n "$fl_lat_p50" ]] || unmeasured=$((unmeasured + 1))
    fi
  fi
  first=0
  # ib_write_bw
  echo "== ib_write_bw $sz x $iters ($a_dev -> $b_dev)"
  ib_gbs=$(perf_bw ib_write_bw "$n" "$iters")
  ib_write_gbs[$sz]=$ib_gbs
  if [[ -n "$ib_gbs" ]]; then
    ib="$ib_gbs GB/s"
  else
    ib="failed"
    unmeasured=$((unmeasured + 1))
  fi
  # UCX put_bw over rc_verbs
  ux="$ucx_missing"
  ux_gbs=""
  if [[ -n "$ucx" ]]; then
    echo "== ucx_perftest put_bw $sz x $iters (-x rc_verbs, $a_dev -> $b_dev)"
    final=$(run_ucx put_bw "$n" "$iters")
    echo "   $final"
    ux_mbs=$(awk '{print $7}' <<<"$final")
    if [[ -n "$ux_mbs" ]]; then
      ux_gbs=$(awk -v m="$ux_mbs" 'BEGIN{printf "%.3f", m * 1048576 / 1e9}')
      ux="$ux_gbs GB/s ($(awk '{printf "%.0f", $9}' <<<"$final") msg/s)"
    else
      ux="failed"
      unmeasured=$((unmeasured + 1))
    fi
  fi
  rows+=("| $sz | $fl | $fl_fps | $fl_cpu | $ib | $(ratio_of "$fl_gbs" "$ib_gbs") | $ux | $(ratio_of "$fl_gbs" "$ux_gbs") |")
done

# 4 KiB latency: ib_write_lat and UCX put_lat (both one-way, half the round trip) next to framelink's
if [[ -n "${fl_lat:-}" ]]; then
  lat_iters=1000
  echo "== ib_write_lat 4096 x $lat_iters ($a_dev -> $b_dev)"
  timeout 120 ib_write_lat -d "$b_dev" -x "$gid" -F -s 4096 -n "$lat_iters" >/tmp/ib_write_lat.srv.$$ 2>&1 &
  spid=$!
  wait_listen 18515 # perftest's default port
  res=$(timeout 120 ib_write_lat -d "$a_dev" -x "$gid" -F -s 4096 -n "$lat_iters" "$b_ip" 2>&1)
  crc=$?
  wait "$spid"
  src=$?
  line=$(awk '$1 == 4096 {print}' <<<"$res" | tail -1)
  echo "   $line"
  ibl="failed (rc $crc/$src)"
  ibl_p50=""
  if [[ $crc$src == 00 && -n "$line" ]]; then
    ibl_p50=$(awk '{print $5}' <<<"$line")
    ibl="typical $ibl_p50 us / p99 $(awk '{print $8}' <<<"$line") us"
  else
    unmeasured=$((unmeasured + 1))
    echo "$res" | tail -8
    tail -5 /tmp/ib_write_lat.srv.$$
  fi
  rm -f /tmp/ib_write_lat.srv.$$
  uxl="$ucx_missing"
  uxl_p50=""
  if [[ -n "$ucx" ]]; then
    echo "== ucx_perftest put_lat 4096 x $lat_iters (-x rc_verbs)"
    final=$(run_ucx put_lat 4096 "$lat_iters")
    echo "   $final"
    uxl_p50=$(awk '{print $3}' <<<"$final")
    if [[ -n "$uxl_p50" ]]; then
      uxl="put_lat p50 $uxl_p50 us"
    else
      uxl="failed"
      unmeasured=$((unmeasured + 1))
    fi
  fi
  r_ib=$(ratio_of "${fl_lat_p50:-}" "$ibl_p50")
  r_ux=$(ratio_of "${fl_lat_p50:-}" "$uxl_p50")
  [[ $r_ib != - ]] && r_ib+=" (p50)"
  [[ $r_ux != - ]] && r_ux+=" (p50)"
  extra_rows+=("| 4 KiB latency, submit -> receive | $fl_lat | - | $fl_lat_cpu | ib_write_lat $ibl | $r_ib | $uxl | $r_ux |")
fi

# Push vs pull one layer down: the rdma transport alone (framelink_transport_bench: both ends in one
# process, a credit or a source exposed and ended per frame, 16 in flight; no peer protocol), next to
# ib_write_bw and ib_read_bw at the same sizes.
# 64K and 1M only: at 4 MiB with 16 in flight each way, rxe under TCG stalls ("Failed sending ACK",
# retries for minutes), and ib_read_bw after it too.
pp_sizes=64K,1M
pp_rows=()
sp_rows=() # the same sizes through two daemons, the stream pushed and pulled
# stream_pull_row SIZE IB_READ_GBS [LABEL [framelink-bench run args]]: the whole path with the stream
# pulled (daemon B lists the bench's stream in pull_streams), a row of sp_rows beside the pushed run
# of the same size.
stream_pull_row() {
  local sz=$1 rd=$2 label=${3:-$1} sres srow spull="" scpu="-"
  shift 3 2>/dev/null || shift $#
  if [[ -x "$cli" ]]; then
    echo "== framelink-bench run rdma $sz, the stream pulled (${seconds}s) $*"
    sres=$(timeout 120 "$cli" run --transports rdma --host-a "$a_ip" --host-b "$b_ip" --no-baselines \
      --sizes "$sz" --seconds "$seconds" --idle-seconds 0 --latency-samples 0 --pairs 0 \
      --daemon-arg=--pull-stream=bench0 "$@" "${daemon_args[@]}" 2>&1)
    srow=$(grep -E '^\| rdma [0-9.]+ [KMG]?i?B \|' <<<"$sres" | head -1)
    echo "   $srow"
    spull=$(sed -nE 's/^\| rdma [^|]*\| ([0-9.]+) GB\/s.*/\1/p' <<<"$srow")
    if [[ -n "$spull" ]]; then
      scpu=$(cell "$srow" 9)
    else
      unmeasured=$((unmeasured + 1))
      echo "$sres" | tail -15
    fi
  fi
  sp_rows+=("| $label | ${fl_push_gbs[$sz]:-failed} GB/s | ${spull:-failed} GB/s | $(ratio_of "${spull:-0}" "${fl_push_gbs[$sz]:-0}") | ${fl_push_cpu[$sz]:--} | $scpu | $rd GB/s | $(ratio_of "${spull:-0}" "${rd:-0}") |")
}
tbench=$build/tests/transport/framelink_transport_bench
if [[ -x "$tbench" ]]; then
  echo "== framelink_transport_bench --transport rdma --sizes $pp_sizes"
  tres=$(FRAMELINK_RDMA_A_IP=$a_ip FRAMELINK_RDMA_B_IP=$b_ip timeout 300 "$tbench" --transport rdma \
    --sizes "$pp_sizes" --bytes-per-size 32M --latency-samples 200 2>&1)
  echo "$tres"
  # Its table rows, in the order of the sizes: size, unit, frames, push, pull, pull/push.
  mapfile -t tlines < <(awk '$2 ~ /^(B|KiB|MiB)$/ && $3 ~ /^[0-9]+$/' <<<"$tres")
  i=0
  IFS=, read -r -a pp_list <<<"$pp_sizes"
  for sz in "${pp_list[@]}"; do
    n=$(bytes_of "$sz")
    echo "== ib_read_bw $sz x $(iters_for "$n") ($a_dev reads $b_dev)"
    rd=$(perf_bw ib_read_bw "$n" "$(iters_for "$n")")
    [[ -n "$rd" ]] || unmeasured=$((unmeasured + 1))
    t=${tlines[$i]:-}
    i=$((i + 1))
    push=$(awk '{print $4}' <<<"$t")
    pull=$(awk '{print $5}' <<<"$t")
    [[ -n "$pull" ]] || unmeasured=$((unmeasured + 1))
    pp_rows+=("| $sz | ${push:-failed} GB/s | ${ib_write_gbs[$sz]:-} GB/s | $(ratio_of "${push:-0}" "${ib_write_gbs[$sz]:-0}") | ${pull:-failed} GB/s | ${rd:-failed} GB/s | $(ratio_of "${pull:-0}" "${rd:-0}") | $(ratio_of "${pull:-0}" "${push:-0}") |")
    stream_pull_row "$sz" "${rd:-failed}"
  done
  # The larger sizes through the daemons only.  ib_read_bw posts each message as one READ, which
  # rxe under TCG serves at a third of the rate of 1 MiB reads at 4 MiB ("Failed sending ACK" in
  # the guest's log); the daemon reads in pieces of at most 1 MiB (read_piece_bytes).
  for sz in "${size_list[@]}"; do
    [[ ",$pp_sizes," == *",$sz,"* ]] && continue
    n=$(bytes_of "$sz")
    echo "== ib_read_bw $sz x $(iters_for "$n") ($a_dev reads $b_dev)"
    rd=$(perf_bw ib_read_bw "$n" "$(iters_for "$n")")
    [[ -n "$rd" ]] || unmeasured=$((unmeasured + 1))
    stream_pull_row "$sz" "${rd:-failed}"
  done
  # Spinning, as ib_read_lat does: the ratio's line; sleeping in poll(2) beside it.
  tlat=$(grep -E '^4 KiB one at a time, spinning' <<<"$tres" || true)
  tlat_sleep=$(grep -E '^4 KiB one at a time, sleeping' <<<"$tres" || true)
  # Reads of one source exposed once: ib_read_lat's own pattern, no window bound per frame.
  reread_us=$(sed -nE 's/^4 KiB reads of one source[^:]*: ([0-9.]+) us.*/\1/p' <<<"$tres")
  echo "== ib_read_lat 4096 x 1000"
  timeout 120 ib_read_lat -d "$b_dev" -x "$gid" -F -s 4096 -n 1000 >/tmp/ib_read_lat.srv.$$ 2>&1 &
  spid=$!
  wait_listen 18515
  rlat=$(timeout 120 ib_read_lat -d "$a_dev" -x "$gid" -F -s 4096 -n 1000 "$b_ip" 2>&1 | awk '$1 == 4096 {print $5}' | tail -1)
  wait "$spid" || true
  rm -f /tmp/ib_read_lat.srv.$$
  pull_us=$(sed -nE 's/.*pull ([0-9.]+) us.*/\1/p' <<<"$tlat")
  pp_lat="4 KiB one at a time, spinning: ${tlat#*: }; ib_read_lat typical ${rlat:-failed} us (a read's round trip, as pull's); pull / ib_read_lat $(ratio_of "${pull_us:-0}" "${rlat:-0}"); sleeping between events: ${tlat_sleep#*: }; reads of one source exposed once (no window per frame, as ib_read_lat does): ${reread_us:-failed} us, / ib_read_lat $(ratio_of "${reread_us:-0}" "${rlat:-0}")"
else
  echo "bench: $tbench is not built: no push-vs-pull table" >&2
  unmeasured=$((unmeasured + 1))
fi

# This tree against --baseline-build, size by size, alternately (ABBA...), --rounds runs each.
ab_rows=()
if [[ -n "$baseline_build" ]]; then
  # gbs_of BUILD SIZE: framelink's GB/s at SIZE with BUILD's CLI and daemon, "" when it failed.
  gbs_of() {
    local res
    local bench=("$1/client/bench/framelink-bench" run) # an older build: `framelink bench`
    [[ -x "${bench[0]}" ]] || bench=("$1/client/cli/framelink" bench)
    res=$(timeout 180 "${bench[@]}" --transports rdma --host-a "$a_ip" --host-b "$b_ip" \
      --no-baselines --framelinkd "$1/proxy/framelinkd" --sizes "$2" --seconds "$seconds" --idle-seconds 0 \
      --latency-samples 0 --pairs 0 "${daemon_args[@]}" 2>&1)
    local row
    row=$(grep -E '^\| rdma [0-9.]+ [KMG]?i?B \|' <<<"$res" | head -1)
    echo "   $1: ${row:-failed}" >&2 # the whole row: frames/s and each daemon's CPU per frame too
    sed -nE 's/^\| rdma [^|]*\| ([0-9.]+) GB\/s.*/\1/p' <<<"$row"
  }
  mean() { awk '{ for (i = 1; i <= NF; ++i) { s += $i; n++ } } END { if (n) printf "%.3f", s / n }' <<<"$*"; }
  for sz in "${size_list[@]}"; do
    this=() base=()
    for ((r = 0; r < rounds; ++r)); do
      if ((r % 2 == 0)); then
        g=$(gbs_of "$build" "$sz") && [[ -n $g ]] && this+=("$g")
        g=$(gbs_of "$baseline_build" "$sz") && [[ -n $g ]] && base+=("$g")
      else
        g=$(gbs_of "$baseline_build" "$sz") && [[ -n $g ]] && base+=("$g")
        g=$(gbs_of "$build" "$sz") && [[ -n $g ]] && this+=("$g")
      fi
    done
    echo "== $sz: this tree ${this[*]:-failed} GB/s, baseline ${base[*]:-failed} GB/s"
    ((${#this[@]} == rounds && ${#base[@]} == rounds)) || unmeasured=$((unmeasured + 1))
    m_this=$(mean "${this[@]}")
    m_base=$(mean "${base[@]}")
    ab_rows+=("| $sz | ${m_this:--} GB/s (${this[*]:-failed}) | ${m_base:--} GB/s (${base[*]:-failed}) | $(ratio_of "${m_this:-0}" "${m_base:-0}") |")
  done
fi

{
  echo
  echo "rdma: framelink vs ib_write_bw and UCX rc_verbs, $a_dev ($a_ip) -> $b_dev ($b_ip), $(nproc) CPUs, Linux $(uname -r)"
  echo
  echo "| frame size | framelink rdma (app -> daemon -> daemon -> app) | frames/s | daemon CPU per frame A / B | ib_write_bw (verbs, -x $gid) | ratio | UCX put_bw (rc_verbs) | ratio to UCX |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  ((${#extra_rows[@]})) && printf '%s\n' "${extra_rows[@]}"
  echo
  if [[ -n "${fl_push_fps[4K]:-}" && -n "${ib_write_gbs[4K]:-}" ]]; then
    ib_fps=$(awk -v g="${ib_write_gbs[4K]}" 'BEGIN{printf "%.0f", g * 1e9 / 4096}')
    echo "target of small frames: rdma 4 KiB frames/s / ib_write_bw 4 KiB messages/s = ${fl_push_fps[4K]} / $ib_fps = $(ratio_of "${fl_push_fps[4K]}" "$ib_fps") (target >= 0.8; not measured when it was set)"
  fi
  echo "framelink: framelink-bench run --transports rdma --host-a $a_ip --host-b $b_ip --no-baselines --sizes SIZE --seconds $seconds"
  echo "  (--pairs $pairs at $pairs_size: ratio = aggregate / one pair, then slowest / fastest pair; --latency-samples $lat_samples)"
  echo "ib_write_bw: server ib_write_bw -d $b_dev -x $gid -F --report_gbits -s SIZE -n ITERS; client the same with -d $a_dev ... $b_ip"
  echo "ib_write_lat: the same with -s 4096 -n 1000 (one-way: half the round trip; typical = median)"
  echo "UCX: ucx_perftest -t put_bw|put_lat -s SIZE -n ITERS -x rc_verbs -D zcopy, UCX_IB_GID_INDEX=$gid, server -d $b_dev:1, client -d $a_dev:1 $b_ip"
  echo "  (UCX's transport layer: its tag matching, UCX_TLS=rc_v, wires RC up over UD, which times out on rxe)"
  if ((${#pp_rows[@]})); then
    echo
    echo "rdma transport alone, push (RDMA WRITE into a credit) vs pull (RDMA READ of an offered slot)"
    echo
    echo "| frame size | push | ib_write_bw | push / ib_write_bw | pull | ib_read_bw | pull / ib_read_bw | pull / push |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${pp_rows[@]}"
    echo "$pp_lat"
    echo "transport: framelink_transport_bench --transport rdma --sizes $pp_sizes --bytes-per-size 32M (both ends in one process, 16 in flight, a window bound and invalidated per frame)"
    echo "ib_read_bw / ib_read_lat: as ib_write_bw / ib_write_lat, the client on $a_dev reading from $b_dev"
    echo
    echo "framelink rdma (app -> daemon -> daemon -> app), the stream pushed vs pulled (daemon B: --pull-stream)"
    echo
    echo "| frame size | push | pull | pull / push | daemon CPU per frame A / B, push | the same, pull | ib_read_bw | pull / ib_read_bw |"
    echo "|---|---|---|---|---|---|---|---|"
    printf '%s\n' "${sp_rows[@]}"
    echo "pull: framelink-bench run --transports rdma --host-a $a_ip --host-b $b_ip --no-baselines --sizes SIZE --seconds $seconds --daemon-arg=--pull-stream=bench0"
  fi
  if ((${#ab_rows[@]})); then
    echo
    echo "this tree ($build) vs the baseline build ($baseline_build), framelink rdma, $rounds runs each, alternately"
    echo
    echo "| frame size | this tree (mean, runs) | baseline build (mean, runs) | ratio |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ab_rows[@]}"
  fi
} | tee ${out:+"$out"}
((unmeasured == 0))
