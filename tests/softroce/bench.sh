#!/usr/bin/env bash
# framelink over rdma next to perftest's ib_write_bw on the same two devices, size by size
# (each ib_write_bw run right after the framelink case it is compared with).  A benchmark:
# it measures and prints one table, it does not pass or fail on numbers.
#
#   tests/softroce/bench.sh --a-dev rxe_a --a-ip 10.77.1.1 --b-dev rxe_b --b-ip 10.77.1.2
#                           [--build DIR] [--sizes 64K,1M,4M] [--seconds 5] [--gid 1] [--out FILE]
#
# framelink = `framelink bench --transports rdma --host-a A --host-b B --no-baselines`: producer
# app -> framelinkd A -> framelinkd B -> consumer app, GB/s of delivered (consumer-released) frames.
# ib_write_bw = server on B's device, client on A's, -x GID, -n iterations (never -D: its duration
# mode gives nonsense under QEMU TCG).  GB/s = 10^9 bytes/s.  Exit status 1 when a case could not
# be measured (the table still shows the rest), else 0.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
a_dev=${SOFTROCE_A_DEV:-}
b_dev=${SOFTROCE_B_DEV:-}
a_ip=${FRAMELINK_RDMA_A_IP:-}
b_ip=${FRAMELINK_RDMA_B_IP:-}
sizes=64K,1M,4M
seconds=5
gid=1
out=""

usage() { sed -n '2,13s/^# \{0,1\}//p' "$0"; }
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
    --out) out=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
for v in a_dev b_dev a_ip b_ip; do
  [[ -n "${!v}" ]] || { echo "bench: --${v//_/-} is required" >&2; exit 2; }
done
cli=$build/client/cli/framelink
daemon=$build/proxy/framelinkd

bytes_of() { # 64K -> 65536
  local s=${1^^} m=1
  case "$s" in *K) m=1024 ;; *M) m=$((1 << 20)) ;; *G) m=$((1 << 30)) ;; esac
  echo $((${s%[KMG]} * m))
}

daemon_args=()
if [[ -x "$daemon" ]] && "$daemon" --help 2>&1 | grep -q -- '--rdma-port'; then
  daemon_args+=(--daemon-arg=--rdma-port=0)
fi

rows=()
unmeasured=0
IFS=, read -r -a size_list <<<"$sizes"
for sz in "${size_list[@]}"; do
  n=$(bytes_of "$sz")
  # framelink
  fl="failed"
  fl_gbs=""
  if [[ -x "$cli" ]]; then
    echo "== framelink bench rdma $sz (${seconds}s)"
    res=$(timeout 120 "$cli" bench --transports rdma --host-a "$a_ip" --host-b "$b_ip" --no-baselines \
      --sizes "$sz" --seconds "$seconds" --latency-samples 0 --idle-seconds 0 "${daemon_args[@]}" 2>&1)
    rc=$?
    row=$(grep -E '^\| rdma ' <<<"$res" | head -1)
    fl_gbs=$(sed -nE 's/^\| rdma [^|]*\| ([0-9.]+) GB\/s.*/\1/p' <<<"$row")
    if [[ -n "$fl_gbs" ]]; then
      fl="$fl_gbs GB/s ($(sed -nE 's/.*\(([0-9]+) frames\/s\).*/\1/p' <<<"$row") frames/s)"
      grep -q UNVERIFIED <<<"$row" && fl="$fl UNVERIFIED"
    else
      unmeasured=$((unmeasured + 1))
      echo "$res" | tail -15
      fl="failed (rc $rc)"
    fi
    echo "   $row"
  fi
  # ib_write_bw: ~128 MiB per size, at most 2000 iterations
  iters=$(((128 << 20) / n))
  ((iters > 2000)) && iters=2000
  ((iters < 16)) && iters=16
  echo "== ib_write_bw $sz x $iters ($a_dev -> $b_dev)"
  timeout 120 ib_write_bw -d "$b_dev" -x "$gid" -F --report_gbits -s "$n" -n "$iters" >/tmp/ib_write_bw.srv.$$ 2>&1 &
  spid=$!
  sleep 1
  res=$(timeout 120 ib_write_bw -d "$a_dev" -x "$gid" -F --report_gbits -s "$n" -n "$iters" "$b_ip" 2>&1)
  crc=$?
  wait "$spid"
  src=$?
  line=$(awk -v s="$n" '$1 == s {print}' <<<"$res" | tail -1)
  ib_gbits=$(awk '{print $4}' <<<"$line")
  ib="failed (rc $crc/$src)"
  ib_gbs=""
  if [[ $crc$src == 00 && -n "$ib_gbits" ]]; then
    ib_gbs=$(awk -v g="$ib_gbits" 'BEGIN{printf "%.3f", g/8}')
    ib="$ib_gbs GB/s ($ib_gbits Gb/s)"
  else
    unmeasured=$((unmeasured + 1))
    echo "$res" | tail -8
    tail -5 /tmp/ib_write_bw.srv.$$
  fi
  rm -f /tmp/ib_write_bw.srv.$$
  echo "   $line"
  ratio="-"
  if [[ -n "$fl_gbs" && -n "$ib_gbs" ]]; then
    ratio=$(awk -v a="$fl_gbs" -v b="$ib_gbs" 'BEGIN{ if (b > 0) printf "%.2f", a/b; else print "-" }')
  fi
  rows+=("| $sz | $fl | $ib | $ratio |")
done

{
  echo
  echo "rdma: framelink vs ib_write_bw, $a_dev ($a_ip) -> $b_dev ($b_ip), $(nproc) CPUs, Linux $(uname -r)"
  echo
  echo "| frame size | framelink rdma (app -> daemon -> daemon -> app) | ib_write_bw (verbs, -x $gid) | ratio |"
  echo "|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "framelink: framelink bench --transports rdma --host-a $a_ip --host-b $b_ip --no-baselines --sizes SIZE --seconds $seconds"
  echo "ib_write_bw: server ib_write_bw -d $b_dev -x $gid -F --report_gbits -s SIZE -n ITERS; client the same with -d $a_dev ... $b_ip"
} | tee ${out:+"$out"}
((unmeasured == 0))
