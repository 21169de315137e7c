#!/usr/bin/env bash
# Two framelinkd over the rdma transport on two local RDMA addresses, a `framelink send` producer
# attached to daemon A and a `framelink recv` consumer attached to daemon B; every frame is checked
# byte for byte and exactly once, in order.  Cases:
#   transfer  N frames of random sizes; /stats of both daemons says the link's transport is rdma
#   restart   the same at 20 frames/s while A, then B, restart in place (SIGUSR2: each execs itself
#             again and takes its clients over): none failed, no reattach (the
#             pause in delivery is printed)
#   cut       the same while the "cable" is cut and restored mid-stream (--cut-down / --cut-up):
#             every frame must still be delivered exactly once after the link recovers
#   fallback  A offers rdma,tcp, B allows only tcp: the link runs tcp and a daemon says why
#   faults    both daemons inject link faults (--fault-inject: A drops frames, fails work requests
#             and disconnects; B damages payloads that carry a CRC32C): every frame must still be
#             delivered exactly once, verified (order may change where a damaged frame is resent)
#   detach    two consumers share the stream and one is killed mid-stream while the producer sends
#             as fast as it can (writes into its slots in flight): the link stays up (no link
#             failure), every frame ends once, each delivered one was received, none twice
#   fanout    A routes the stream to B and C (--route fan=hostB,hostC); two subscribers on B, one
#             on C: every reader gets every frame, verified, in order; each completion counts 3
#             readers; A's transport sent each frame twice (once per host), B and C each received
#             it once (B lends it to its second subscriber)
#   pull      B pulls the stream (--pull-stream): A offers each frame and B reads it (RDMA READ on
#             rdma) into its consumer's slot, at most 4 reads in flight: every frame verified, exactly
#             once, in order; B pulled each frame once and none was written into B; then the same
#             with the link cut and restored mid-stream (when --cut-down/--cut-up are given)
#   csharp    the C# example producer (examples/dotnet/InspectionProducer) on A into the Python
#             example ingestor (examples/python/ingestor.py --pull) on B: the ingestor's attach
#             option has B pull the stream (B's configuration does not); every frame verified and
#             stored, B pulled each one.  Needs dotnet, the example built and the Python package
#             installed in $build/python/venv (scripts/test-clients.sh does both)
#
#   tests/softroce/e2e.sh --a-ip 10.77.1.1 --b-ip 10.77.1.2 [--build DIR] [--cases transfer,cut,restart,fallback,faults,detach,fanout,pull,csharp]
#                         [--frames 300] [--sizes 64K:1M] [--cut-down CMD --cut-up CMD] [--keep]
#                         [--case-budget 90]   (seconds a case may take; past it, it fails with the
#                                               daemons' /stats and logs, and the next case runs)
#                         [--transport rdma]   (tcp or grpc: the same checks over that transport)
#
# Runs as is on a machine with an RDMA NIC (both addresses may be the same) and inside the
# Soft-RoCE guest (tests/softroce/run-lane.sh).  Without --cut-down/--cut-up the cut case is
# reported as not run and counts as a failure, unless --cases leaves it out.
# Exit status: the number of failed cases.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
a_ip=${FRAMELINK_RDMA_A_IP:-}
b_ip=${FRAMELINK_RDMA_B_IP:-}
cases=transfer,cut,restart,fallback,faults,detach,fanout,pull,csharp
transport=rdma
frames=300
sizes=64K:1M
cut_down=""
cut_up=""
cut_seconds=4
case_budget=90
keep=0

usage() { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; }
while (($#)); do
  case "$1" in
    --a-ip) a_ip=$2; shift 2 ;;
    --b-ip) b_ip=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    --transport) transport=$2; shift 2 ;;
    --frames) frames=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --cut-down) cut_down=$2; shift 2 ;;
    --cut-up) cut_up=$2; shift 2 ;;
    --cut-seconds) cut_seconds=$2; shift 2 ;;
    --case-budget) case_budget=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "e2e: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -n "$a_ip" && -n "$b_ip" ]] || { echo "e2e: need --a-ip and --b-ip (or FRAMELINK_RDMA_A_IP/B_IP)" >&2; exit 2; }

daemon=$build/proxy/framelinkd
cli=$build/client/cli/framelink
for b in "$daemon" "$cli"; do
  [[ -x "$b" ]] || { echo "e2e: $b is missing: cmake --build $build --target framelinkd framelink_cli" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/fl-rdma-e2e.XXXXXX")
token=e2e-$RANDOM$RANDOM
pids=()
extra_a=() # more framelinkd flags for A / B (the faults case)
extra_b=()
order_flag=--expect-order
cleanup() {
  local p
  for p in "${pids[@]+"${pids[@]}"}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]+"${pids[@]}"}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  pids=()
}
trap 'cleanup; ((keep)) || rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

log() {
  printf '[e2e %6.1fs] %s\n' "$(awk -v s="$start_ns" -v e="$(date +%s%N)" 'BEGIN{print (e-s)/1e9}')" "$*"
  [[ -n "${work:-}" && -d "$work" ]] && printf '%s\n' "$*" >"$work/last_step" # a hung case's summary names it
}
start_ns=$(date +%s%N)

# key=value from a ready file
ready_value() { sed -n "s/^$2=//p" "$1" | head -1; }

# GET http://127.0.0.1:PORT/PATH without curl (bash /dev/tcp); prints the body.
http_get() {
  local port=$1 path=$2 resp
  { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$path" >&3
  resp=$(timeout 5 cat <&3)
  exec 3<&-
  printf '%s\n' "${resp#*$'\r\n\r\n'}"
}

# start_daemon NAME IP TRANSPORTS PORT [extra args...]; sets ${NAME}_pid, files in $work/NAME.*
start_daemon() {
  local name=$1 ip=$2 transports=$3 port=$4
  shift 4
  local dir=$work/$name
  mkdir -p "$dir"
  rm -f "$dir/ready"
  local rdma_args=()
  [[ "$transports" == *rdma* ]] && rdma_args=(--rdma-port 0)
  "$daemon" --id "host${name^^}" --socket "$dir/sock" --listen "$ip:$port" --data-listen "$ip:0" \
    "${rdma_args[@]}" --transports "$transports" --token "$token" --metrics 127.0.0.1:0 \
    --ready-file "$dir/ready" --log-level info "$@" >"$dir/log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  printf -v "${name}_pid" '%s' "$pid"
  for _ in $(seq 150); do
    [[ -s "$dir/ready" ]] && grep -q '^metrics_port=' "$dir/ready" && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "e2e: framelinkd $name did not get ready (15 s); its log:"
  tail -20 "$dir/log"
  return 1
}

# stats NAME: the daemon's /stats JSON on one line
stats() { http_get "$(ready_value "$work/$1/ready" metrics_port)" /stats | tr -d '\n'; }
# link_transport NAME: the transport of the daemon's first link in /stats ("" when no link)
link_transport() { stats "$1" | grep -o '"links":\[{[^]]*' | grep -o '"transport":"[a-z]*"' | head -1 | cut -d'"' -f4; }
json_num() { grep -o "\"$2\": *[0-9]*" <<<"$1" | head -1 | cut -d: -f2 | tr -d ' '; }

wait_link() { # NAME TRANSPORT: wait (20 s) until the daemon reports a link, print its transport
  local t=""
  for _ in $(seq 200); do
    t=$(link_transport "$1")
    [[ -n "$t" ]] && break
    sleep 0.1
  done
  echo "$t"
}

# start_pair TRANSPORTS_A TRANSPORTS_B: B listens, A dials B (A routes every stream to its peer)
start_pair() {
  local port_b=7700
  [[ "$a_ip" == "$b_ip" ]] && port_b=7701
  start_daemon b "$b_ip" "$2" "$port_b" "${extra_b[@]}" || return 1
  start_daemon a "$a_ip" "$1" 7700 --peer "hostB=$b_ip:$port_b" "${extra_a[@]}" || return 1
  log "daemons up: A pid $a_pid on $a_ip ($1), B pid $b_pid on $b_ip:$port_b ($2); rdma ports A=$(ready_value "$work/a/ready" rdma_port) B=$(ready_value "$work/b/ready" rdma_port)"
}

show_logs() {
  local n
  for n in a b c; do
    [[ -f "$work/$n/log" ]] || continue
    echo "---- framelinkd $n log (last 25 lines; $work/$n/log)"
    tail -25 "$work/$n/log"
  done
}

# transfer STREAM [send args...]: runs consumer (B) and producer (A); sets send_json/recv_json/send_rc/recv_rc
run_transfer() {
  local stream=$1
  shift
  "$cli" recv --socket "$work/b/sock" --stream "$stream" --count "$frames" --verify $order_flag \
    --expect-random-size "$sizes" --expect-seed 7 --timeout-ms 60000 --json >"$work/$stream.recv" 2>&1 &
  local rpid=$!
  pids+=("$rpid")
  sleep 0.5
  "$cli" send --socket "$work/a/sock" --stream "$stream" --count "$frames" --random-size "$sizes" --seed 7 \
    --json "$@" >"$work/$stream.send" 2>&1 &
  send_pid=$!
  pids+=("$send_pid")
  recv_pid=$rpid
}
finish_transfer() {
  local stream=$1
  wait "$send_pid"
  send_rc=$?
  wait "$recv_pid"
  recv_rc=$?
  send_json=$(grep '^{' "$work/$stream.send" | tail -1)
  recv_json=$(grep '^{' "$work/$stream.recv" | tail -1)
  echo "  sender:   rc=$send_rc $send_json"
  echo "  receiver: rc=$recv_rc $recv_json"
  grep -v '^{' "$work/$stream.send" "$work/$stream.recv" | head -10
}
check_transfer() { # -> 0 when every frame was delivered exactly once, in order, verified
  local ok=0 delivered failed received bad
  delivered=$(json_num "$send_json" delivered)
  failed=$(json_num "$send_json" failed)
  received=$(json_num "$recv_json" received)
  bad=$(json_num "$recv_json" bad)
  [[ "$send_rc" == 0 && "$delivered" == "$frames" && "$failed" == 0 ]] ||
    { echo "  !! sender: expected $frames delivered and 0 failed, got delivered=${delivered:-?} failed=${failed:-?} (rc $send_rc)"; ok=1; }
  [[ "$recv_rc" == 0 && "$received" == "$frames" && "$bad" == 0 ]] && grep -q '"ok":true' <<<"$recv_json" ||
    { echo "  !! receiver: expected $frames frames, verified, in order, no duplicates; got received=${received:-?} bad=${bad:-?} (rc $recv_rc)"; ok=1; }
  return $ok
}

fails=0
result() { # CASE STATUS DETAIL
  printf 'e2e %-9s %s  %s\n' "$1" "$2" "$3"
  : >"$work/result.$1" # the case has its result; run_case no longer holds it to its budget
  [[ "$2" == PASS ]] || fails=$((fails + 1))
}

case_transfer() {
  log "case transfer: $frames frames of $sizes over $transport"
  start_pair "$transport" "$transport" || { show_logs; result transfer FAIL "daemons did not start (does this framelinkd have --rdma-port and the rdma transport?)"; return; }
  local ta tb
  ta=$(wait_link a)
  tb=$(wait_link b)
  log "link transport in /stats: A=$ta B=$tb"
  run_transfer xfer
  finish_transfer xfer
  local why=""
  check_transfer || why="frames lost, duplicated or corrupted"
  [[ "$ta" == "$transport" && "$tb" == "$transport" ]] ||
    why="${why:+$why; }/stats link transport A='$ta' B='$tb', want $transport"
  # Credits go as slot credits where the transport's addresses follow the consumer's region.  On
  # rdma every credit carries its own memory-window key, so only the one that announced the
  # region does; the others go whole (with their address and key).
  local granted whole
  granted=$(json_num "$(stats b)" credits_granted)
  whole=$(json_num "$(stats b)" credits_granted_whole)
  log "credits granted by B: ${granted:-?}, of them whole: ${whole:-?}"
  local want_whole=0
  [[ "$transport" == rdma ]] && want_whole=$((${granted:-0} - 1))
  [[ "${granted:-0}" -gt 0 && "${whole:-x}" == "$want_whole" ]] ||
    why="${why:+$why; }B granted ${granted:-?} credits, ${whole:-?} of them whole, want all but the region's first whole (a window key each)"
  if [[ -z "$why" ]]; then
    result transfer PASS "$frames frames verified, exactly once, in order; link transport $transport; $(json_num "$send_json" bytes_delivered) bytes, $(grep -o '"gb_per_s":[0-9.]*' <<<"$send_json" | cut -d: -f2) GB/s"
  else
    show_logs
    result transfer FAIL "$why"
  fi
  cleanup
}

case_cut() {
  if [[ -z "$cut_down" || -z "$cut_up" ]]; then
    result cut FAIL "not run: give --cut-down and --cut-up commands (e.g. 'ip link set IFACE down')"
    return
  fi
  log "case cut: $frames frames at 30 frames/s, link cut for ${cut_seconds}s mid-stream"
  start_pair "$transport" "$transport" || { show_logs; result cut FAIL "daemons did not start"; return; }
  local ta
  ta=$(wait_link a)
  run_transfer cut --rate 30
  # cut once the consumer side has seen some frames, while most are still to come
  local got=0
  for _ in $(seq 300); do
    got=$(json_num "$(stats b)" frames_received)
    ((${got:-0} >= frames / 6)) && break
    sleep 0.1
  done
  log "B has received $got frames: cutting the link ($cut_down)"
  bash -c "$cut_down"
  sleep "$cut_seconds"
  log "restoring the link ($cut_up); B has received $(json_num "$(stats b)" frames_received) frames"
  bash -c "$cut_up"
  finish_transfer cut
  local tb_after link_failures
  tb_after=$(link_transport a)
  link_failures=$(stats a | grep -o '"link_failures":[0-9]*' | cut -d: -f2)
  log "after the cut: A's link transport '$tb_after'"
  local why=""
  check_transfer || why="not every frame was delivered exactly once after the link recovered (replay after link loss)"
  [[ "$ta" == "$transport" ]] || why="${why:+$why; }link transport before the cut '$ta', want $transport"
  if [[ -z "$why" ]]; then
    result cut PASS "link cut ${cut_seconds}s mid-stream; $frames frames verified, exactly once, in order${link_failures:+; link failures $link_failures}"
  else
    grep -iE 'link .* down|reconnect|replay|rdma' "$work/a/log" "$work/b/log" | tail -12
    show_logs
    result cut FAIL "$why"
  fi
  cleanup
}

# restart_in_place NAME: SIGUSR2 to the daemon, which execs itself again and takes its clients over
# (the same pid); waits (15 s) until it is ready again.
restart_in_place() {
  local dir=$work/$1 pid_var=${1}_pid
  rm -f "$dir/ready"
  kill -USR2 "${!pid_var}" || return 1
  for _ in $(seq 150); do
    [[ -s "$dir/ready" ]] && grep -q '^metrics_port=' "$dir/ready" && return 0
    kill -0 "${!pid_var}" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# wait_received N: until B has received N frames of the case's stream (30 s at most); prints B's count
wait_received() {
  local got=0
  for _ in $(seq 300); do
    got=$(json_num "$(stats b)" frames_received)
    ((${got:-0} >= $1)) && break
    sleep 0.1
  done
  echo "${got:-0}"
}

case_restart() {
  log "case restart: $frames frames at 20 frames/s over $transport; A, then B, restarted in place (SIGUSR2) mid-stream"
  start_pair "$transport" "$transport" || { show_logs; result restart FAIL "daemons did not start"; return; }
  local ta
  ta=$(wait_link a)
  run_transfer restart --rate 20
  # Each restart once frames have flowed, so both fall mid-stream however slow the guest is: A's
  # after a fifth of them, B's once 30 more have come after A's.
  local why="" t0 got
  got=$(wait_received $((frames / 5)))
  t0=$(date +%s%N)
  restart_in_place a || why="A did not come back from SIGUSR2; "
  log "A restarted in place in $((($(date +%s%N) - t0) / 1000000)) ms (B had received $got frames)"
  got=$(wait_received $((got + 30)))
  ((got < frames)) || why+="the stream had ended before B's restart (the case proves nothing); "
  t0=$(date +%s%N)
  restart_in_place b || why+="B did not come back from SIGUSR2; "
  log "B restarted in place in $((($(date +%s%N) - t0) / 1000000)) ms (it had received $got of $frames frames)"
  finish_transfer restart
  check_transfer || why+="frames lost, failed, duplicated or corrupted; "
  local reattaches gap again
  reattaches=$(json_num "$send_json" reattaches)
  again=$(json_num "$recv_json" redelivered)
  gap=$(grep -o '"longest_gap_ms":[0-9]*' <<<"$recv_json" | cut -d: -f2)
  [[ "${reattaches:-x}" == 0 ]] || why+="the producer attached again ${reattaches:-?} times; "
  grep -q 'hot restart: 1 client taken over' "$work/a/log" || why+="A's log names no take-over of its client; "
  grep -q 'hot restart: 1 client taken over' "$work/b/log" || why+="B's log names no take-over of its client; "
  grep -h 'not taken over' "$work/a/log" "$work/b/log" | head -2 | sed 's/^/  /'
  [[ "$(link_transport a)" == "$transport" && "$ta" == "$transport" ]] || why+="link transport '$ta' then '$(link_transport a)', want $transport; "
  # The lane's guest is emulated (TCG) and shares the host's two cores with the other CI stages:
  # the daemon's exec, start (the rdma device's among it) and link take 1.5-3 s here; on a host
  # (tcp, grpc) test_hot_restart.cpp holds a restart in place to 1 s, and it takes 30-50 ms
  # there.  Here the pause is a figure, bounded only by what a start can take.
  ((${gap:-99999} <= 10000)) || why+="delivery paused ${gap:-?} ms (10 s allowed in the emulated guest); "
  if [[ -z "$why" ]]; then
    result restart PASS "A and B restarted in place mid-stream; $frames frames verified, exactly once, in order, none failed, no reattach; longest pause in delivery ${gap} ms; ${again:-?} delivered again, flagged"
  else
    show_logs
    result restart FAIL "${why%; }"
  fi
  cleanup
}

case_fallback() {
  log "case fallback: A offers rdma,tcp, B allows tcp only"
  start_pair rdma,tcp tcp || { show_logs; result fallback FAIL "daemons did not start"; return; }
  local ta tb
  ta=$(wait_link a)
  tb=$(wait_link b)
  local saved=$frames
  frames=50
  run_transfer fb
  finish_transfer fb
  local why=""
  check_transfer || why="the transfer over the fallback link failed"
  frames=$saved
  [[ "$ta" == tcp && "$tb" == tcp ]] || why="${why:+$why; }link transport A='$ta' B='$tb', want tcp"
  # The reason must be visible to an operator: in /stats or in a daemon's log.
  local reason
  reason=$( { stats a; echo; stats b; echo; } | grep -oiE '"[a-z_]*reason[a-z_]*":"[^"]*"' | head -2)
  [[ -n "$reason" ]] || reason=$(grep -hiE 'rdma.*(not offered|not allowed|not supported|unavailable|fall|instead|because|reason)|(fall ?back|instead|reason).*rdma' \
    "$work/a/log" "$work/b/log" | head -2)
  echo "  reason given: ${reason:-(none)}"
  [[ -n "$reason" ]] || why="${why:+$why; }neither /stats nor the logs say why the link is not rdma"
  if [[ -z "$why" ]]; then
    result fallback PASS "link runs tcp; reason: $(head -1 <<<"$reason" | cut -c1-160)"
  else
    show_logs
    result fallback FAIL "$why"
  fi
  cleanup
}

case_faults() {
  local saved_frames=$frames saved_sizes=$sizes
  frames=120
  sizes=64K:256K
  extra_a=(--fault-inject "seed=5,drop=0.02,fail=0.02,disconnect=0.01,dup=0.05,delay=0.05,delay_ms=20")
  extra_b=(--fault-inject "seed=6,corrupt=0.05,delay=0.05,delay_ms=20")
  order_flag="" # a resent frame arrives after later ones
  log "case faults: $frames frames of $sizes over $transport with injected link faults"
  start_pair "$transport" "$transport" || { show_logs; result faults FAIL "daemons did not start"; }
  if [[ -n "${a_pid:-}" ]] && kill -0 "$a_pid" 2>/dev/null; then
    wait_link a >/dev/null
    run_transfer faults --crc
    finish_transfer faults
    local metrics_a replayed resent breaks why=""
    metrics_a=$(http_get "$(ready_value "$work/a/ready" metrics_port)" /metrics)
    replayed=$(sed -n 's/^framelink_frames_replayed_total //p' <<<"$metrics_a")
    resent=$(sed -n 's/^framelink_frames_resent_crc_total //p' <<<"$metrics_a")
    breaks=$(sed -n 's/^framelink_link_failures_total //p' <<<"$metrics_a")
    log "A: link failures ${breaks:-?}, frames replayed ${replayed:-?}, resent after CRC mismatch ${resent:-?}"
    check_transfer || why="not every frame was delivered exactly once, verified, through the faults"
    ((${breaks:-0} > 0)) || why="${why:+$why; }no link broke: the faults were not injected"
    if [[ -z "$why" ]]; then
      result faults PASS "$frames frames verified, exactly once; link failures $breaks, replayed $replayed, resent after CRC mismatch $resent"
    else
      show_logs
      result faults FAIL "$why"
    fi
  fi
  cleanup
  frames=$saved_frames
  sizes=$saved_sizes
  extra_a=()
  extra_b=()
  order_flag=--expect-order
}

case_detach() {
  log "case detach: $frames frames of $sizes over $transport, one of two consumers killed after $((frames / 4))"
  start_pair "$transport" "$transport" || { show_logs; result detach FAIL "daemons did not start"; return; }
  wait_link a >/dev/null
  local leaver=$((frames / 4)) c pid1 pid2
  for c in 1 2; do
    "$cli" recv --socket "$work/b/sock" --stream detach --count "$frames" --verify --expect-random-size "$sizes" \
      --expect-seed 7 --timeout-ms 8000 --journal "$work/detach.$c.journal" --json >"$work/detach.$c.recv" 2>&1 &
    printf -v "pid$c" '%s' "$!"
    pids+=("$!")
  done
  sleep 0.5
  "$cli" send --socket "$work/a/sock" --stream detach --count "$frames" --random-size "$sizes" --seed 7 \
    --json >"$work/detach.send" 2>&1 &
  local send_pid=$!
  pids+=("$send_pid")
  # Consumer 1 dies while it takes frames: its free slots are credited to A, whose writes into
  # them are on their way.
  local got1=0
  for _ in $(seq 600); do
    got1=$(cat "$work/detach.1.journal" 2>/dev/null | wc -l)
    ((got1 >= leaver)) && break
    sleep 0.05
  done
  kill -KILL "$pid1" 2>/dev/null
  log "consumer 1 killed after $got1 frames"
  wait "$send_pid"
  local send_rc=$?
  wait "$pid2"
  local rc2=$?
  local sj r2 delivered failed got2 bad2 lines unique link_failures
  sj=$(grep '^{' "$work/detach.send" | tail -1)
  r2=$(grep '^{' "$work/detach.2.recv" | tail -1)
  echo "  sender:     rc=$send_rc $sj"
  echo "  consumer 2: rc=$rc2 $r2"
  delivered=$(json_num "$sj" delivered)
  failed=$(json_num "$sj" failed)
  got2=$(json_num "$r2" received)
  bad2=$(json_num "$r2" bad)
  got1=$(wc -l <"$work/detach.1.journal")
  lines=$(cat "$work"/detach.*.journal | wc -l)
  unique=$(awk '{print $3}' "$work"/detach.*.journal | sort -u | wc -l)
  link_failures=$(json_num "$(stats a)" link_failures)
  local why=""
  [[ "${link_failures:-x}" == 0 ]] || why="A's link failed ${link_failures:-?} time(s) when a consumer died"
  [[ $((${delivered:-0} + ${failed:-0})) == "$frames" ]] ||
    why="${why:+$why; }the sender ended ${delivered:-?} delivered + ${failed:-?} failed frames, want $frames in all"
  [[ "$lines" == "$unique" ]] || why="${why:+$why; }a frame reached the consumers twice ($lines received, $unique distinct)"
  ((${delivered:-0} <= lines)) || why="${why:+$why; }$delivered frames reported delivered, only $lines received"
  [[ "${bad2:-x}" == 0 ]] || why="${why:+$why; }consumer 2: ${bad2:-?} frames failed verification"
  if [[ -z "$why" ]]; then
    result detach PASS "consumer 1 killed after $got1 frames; consumer 2 got $got2; delivered $delivered, failed $failed (NO_CONSUMER); link failures 0"
  else
    show_logs
    result detach FAIL "$why"
  fi
  cleanup
}

case_fanout() {
  local saved_frames=$frames saved_sizes=$sizes
  frames=60
  sizes=64K:256K
  log "case fanout: $frames frames of $sizes over $transport from A to two subscribers on B and one on C"
  local port_b=7701 port_c=7702
  if ! start_daemon b "$b_ip" "$transport" "$port_b" || ! start_daemon c "$b_ip" "$transport" "$port_c" ||
    ! start_daemon a "$a_ip" "$transport" 7700 --peer "hostB=$b_ip:$port_b" --peer "hostC=$b_ip:$port_c" \
      --route fan=hostB,hostC; then
    show_logs
    result fanout FAIL "daemons did not start"
    frames=$saved_frames sizes=$saved_sizes
    cleanup
    return
  fi
  wait_link b >/dev/null
  wait_link c >/dev/null
  local r rpids=()
  for r in b1 b2 c1; do
    "$cli" recv --socket "$work/${r:0:1}/sock" --stream fan --subscribe --count "$frames" --verify --expect-order \
      --expect-random-size "$sizes" --expect-seed 7 --timeout-ms 60000 --json >"$work/fan.$r.recv" 2>&1 &
    rpids+=("$!")
    pids+=("$!")
  done
  sleep 0.5
  "$cli" send --socket "$work/a/sock" --stream fan --count "$frames" --random-size "$sizes" --seed 7 --crc \
    --json >"$work/fan.send" 2>&1
  local send_rc=$? why="" rc i=0
  local sj
  sj=$(grep '^{' "$work/fan.send" | tail -1)
  echo "  sender: rc=$send_rc $sj"
  [[ "$send_rc" == 0 && "$(json_num "$sj" delivered)" == "$frames" && "$(json_num "$sj" failed)" == 0 ]] ||
    why="the sender did not see $frames frames delivered"
  [[ "$(json_num "$sj" readers_min)" == 3 && "$(json_num "$sj" readers_max)" == 3 ]] ||
    why="${why:+$why; }completions counted $(json_num "$sj" readers_min)..$(json_num "$sj" readers_max) readers, want 3"
  for r in b1 b2 c1; do
    wait "${rpids[$i]}"
    rc=$?
    i=$((i + 1))
    local rj
    rj=$(grep '^{' "$work/fan.$r.recv" | tail -1)
    echo "  reader $r: rc=$rc $rj"
    [[ "$rc" == 0 && "$(json_num "$rj" received)" == "$frames" && "$(json_num "$rj" bad)" == 0 ]] &&
      grep -q '"ok":true' <<<"$rj" || why="${why:+$why; }reader $r did not get every frame verified, in order"
  done
  # Once over each link: A sent 2 x frames, B and C each took in frames (the counters are
  # published twice a second).
  local sent got_b got_c
  metric() { http_get "$(ready_value "$work/$1/ready" metrics_port)" /metrics | sed -n "s/^framelink_$2 //p"; }
  for _ in $(seq 50); do
    sent=$(metric a transport_frames_sent_total)
    got_b=$(metric b transport_frames_received_total)
    got_c=$(metric c transport_frames_received_total)
    [[ "${sent:-0}" -ge $((2 * frames)) && "${got_b:-0}" -ge "$frames" && "${got_c:-0}" -ge "$frames" ]] && break
    sleep 0.1
  done
  log "A's transport sent ${sent:-?} frames; B received ${got_b:-?}, C ${got_c:-?}; link transports B=$(link_transport b) C=$(link_transport c)"
  [[ "${sent:-x}" == $((2 * frames)) && "${got_b:-x}" == "$frames" && "${got_c:-x}" == "$frames" ]] ||
    why="${why:+$why; }A sent ${sent:-?} frames (want $((2 * frames))), B received ${got_b:-?} and C ${got_c:-?} (want $frames each)"
  [[ "$(link_transport b)" == "$transport" && "$(link_transport c)" == "$transport" ]] ||
    why="${why:+$why; }the links are not $transport"
  if [[ -z "$why" ]]; then
    result fanout PASS "$frames frames to 2 hosts over $transport: 3 readers verified each, in order; A sent $sent (one per host)"
  else
    show_logs
    result fanout FAIL "$why"
  fi
  cleanup
  frames=$saved_frames
  sizes=$saved_sizes
}

case_pull() {
  log "case pull: B pulls; $frames frames of $sizes over $transport, then the link cut mid-stream"
  extra_b=(--pull-stream pull --pull-stream pullcut --pull-reads-per-link 4)
  start_pair "$transport" "$transport" || { extra_b=(); show_logs; result pull FAIL "daemons did not start"; return; }
  extra_b=()
  local ta why="" pulled offered reads written
  ta=$(wait_link a)
  run_transfer pull
  finish_transfer pull
  check_transfer || why="frames lost, duplicated or corrupted"
  for _ in $(seq 30); do # the transports' counters reach /stats twice a second
    reads=$(json_num "$(stats b)" transport_reads_completed)
    [[ "${reads:-0}" -ge "$frames" ]] && break
    sleep 0.1
  done
  pulled=$(json_num "$(stats b)" frames_pulled)
  offered=$(json_num "$(stats a)" frames_offered)
  written=$(json_num "$(stats b)" transport_frames_received)
  log "A offered ${offered:-?} frames; B pulled ${pulled:-?} (its transport read ${reads:-?}), ${written:-?} written into B"
  # What made A offer a frame again, if it did: refusals, replays, links that went.
  grep -hE 'sending it again|will be sent again|is down|protocol error|failed' "$work/a/log" "$work/b/log" | tail -8
  [[ "$ta" == "$transport" ]] || why="${why:+$why; }link transport '$ta', want $transport"
  # Each frame offered once: an offer made again means a read failed or the link went.
  [[ "${pulled:-x}" == "$frames" && "${reads:-x}" == "$frames" && "${written:-x}" == 0 && "${offered:-x}" == "$frames" ]] ||
    why="${why:+$why; }B pulled ${pulled:-?} (read ${reads:-?}) and had ${written:-?} written, A offered ${offered:-?}; want $frames, $frames, 0, $frames"
  local cut_note="link cut not run (no --cut-down/--cut-up)"
  if [[ -z "$why" && -n "$cut_down" && -n "$cut_up" ]]; then
    run_transfer pullcut --rate 30
    local got=0
    for _ in $(seq 300); do
      got=$(json_num "$(stats b)" frames_received)
      ((${got:-0} >= frames + frames / 6)) && break
      sleep 0.1
    done
    log "B has received $got frames: cutting the link ($cut_down)"
    bash -c "$cut_down"
    sleep "$cut_seconds"
    bash -c "$cut_up"
    finish_transfer pullcut
    # How the link came back: it failed (its queue pair gave up), or a daemon found its data path
    # stalled (nothing taken, or no read completed, for link_timeout_ms) and closed it.
    local link_failures stalled_a stalled_b
    link_failures=$(json_num "$(stats b)" link_failures)
    stalled_a=$(json_num "$(stats a)" links_stalled)
    stalled_b=$(json_num "$(stats b)" links_stalled)
    if check_transfer; then
      cut_note="link cut ${cut_seconds}s mid-stream, $frames more frames verified, exactly once, in order; link failures ${link_failures:-?}, of them closed as stalled by A ${stalled_a:-?}, by B ${stalled_b:-?}"
    else
      why="after a link cut, not every pulled frame was delivered exactly once"
    fi
  fi
  if [[ -z "$why" ]]; then
    result pull PASS "$frames frames pulled over $transport, verified, exactly once, in order; $cut_note"
  else
    show_logs
    result pull FAIL "$why"
  fi
  cleanup
}

case_csharp() {
  local example=$root/examples/dotnet/InspectionProducer/bin/Release/net10.0/InspectionProducer.dll
  local python=$build/python/venv/bin/python count=20
  local missing=""
  command -v dotnet >/dev/null || missing="dotnet (the .NET SDK)"
  [[ -f "$example" ]] || missing="${missing:+$missing, }$example (dotnet build examples/dotnet/InspectionProducer -c Release)"
  [[ -x "$python" ]] || missing="${missing:+$missing, }$python (a venv with the framelink package)"
  if [[ -n "$missing" ]]; then
    result csharp FAIL "not run: missing $missing; scripts/test-clients.sh builds and installs them"
    return
  fi
  log "case csharp: C# producer on A, Python ingestor on B attached with pull; $count frames of 1 MiB over $transport"
  start_pair "$transport" "$transport" || { show_logs; result csharp FAIL "daemons did not start"; return; }
  local ta why=""
  ta=$(wait_link a)
  export DOTNET_CLI_HOME=$work DOTNET_NOLOGO=1 DOTNET_CLI_TELEMETRY_OPTOUT=1
  FRAMELINK_LIBRARY=$build/client/libframelink.so.0 "$python" "$root/examples/python/ingestor.py" --pull \
    --stream inspect --socket "$work/b/sock" --out "$work/frames" --count "$count" --verify --timeout 60 \
    --slots 4 --slot-size $((1 << 20)) --ready-file "$work/ingestor.ready" >"$work/ingestor.out" 2>&1 &
  local ipid=$!
  pids+=("$ipid")
  for _ in $(seq 300); do
    [[ -e "$work/ingestor.ready" ]] && break
    kill -0 "$ipid" 2>/dev/null || break
    sleep 0.1
  done
  dotnet "$example" --stream inspect --socket "$work/a/sock" --count "$count" --size 1M --slots 4 --json \
    >"$work/producer.out" 2>&1
  local prc=$? irc
  wait "$ipid"
  irc=$?
  local sent got pulled written
  sent=$(grep '^{' "$work/producer.out" | tail -1)
  got=$(grep '^{' "$work/ingestor.out" | tail -1)
  pulled=$(json_num "$(stats b)" frames_pulled)
  written=$(json_num "$(stats b)" transport_frames_received)
  echo "  producer: rc=$prc $sent"
  echo "  ingestor: rc=$irc $got"
  log "B pulled ${pulled:-?} frames, ${written:-?} written into B"
  [[ "$prc" == 0 && "$(json_num "$sent" delivered)" == "$count" && "$(json_num "$sent" failed)" == 0 ]] ||
    why="the C# producer did not have $count frames delivered: $(tail -3 "$work/producer.out")"
  [[ "$irc" == 0 && "$(json_num "$got" stored)" == "$count" && "$(json_num "$got" bad)" == 0 ]] ||
    why="${why:+$why; }the Python ingestor did not store $count verified frames: $(tail -3 "$work/ingestor.out")"
  [[ "${pulled:-x}" == "$count" && "${written:-x}" == 0 ]] ||
    why="${why:+$why; }B pulled ${pulled:-?} and had ${written:-?} written; want $count and 0"
  [[ "$ta" == "$transport" ]] || why="${why:+$why; }link transport '$ta', want $transport"
  if [[ -z "$why" ]]; then
    result csharp PASS "$count frames of 1 MiB from C# to Python, pulled over $transport by the consumer's option, verified and stored"
  else
    show_logs
    result csharp FAIL "$why"
  fi
  cleanup
}

# show_state: what each running daemon says of itself (/stats) and the end of its log, for a case
# that did not finish
show_state() {
  local n
  for n in a b c; do
    [[ -s "$work/$n/ready" ]] || continue
    echo "---- framelinkd $n /stats"
    stats "$n" | head -c 20000
    echo
  done
  show_logs
  for n in a b c; do
    [[ -f "$work/$n/log" ]] || continue
    echo "---- framelinkd $n log: warnings and errors (last 20)"
    grep -E ' (warning|error|critical) \[' "$work/$n/log" | tail -20
  done
}

# run_case NAME BUDGET_SECONDS: runs case_NAME in a subshell; one that has no result after its
# budget is reported FAIL with the daemons' state, and stopped, so that the cases after it still run
# and a hang says where it hung.  Stopping the daemons of a case that has its result is not counted
# (cleanup bounds it: 5 s a process).
run_case() {
  local name=$1 budget=$2 cpid rc started=$SECONDS
  rm -f "$work/result.$name"
  (
    trap cleanup EXIT
    trap 'exit 124' TERM
    fails=0
    "case_$name"
    exit "$fails"
  ) &
  cpid=$!
  while kill -0 "$cpid" 2>/dev/null; do
    if [[ ! -e "$work/result.$name" ]] && ((SECONDS - started >= budget)); then
      local where progress=""
      where=$(cat "$work/last_step" 2>/dev/null) # the case's, before this line replaces it
      [[ -s "$work/b/ready" ]] && progress="; B has received $(json_num "$(stats b)" frames_received) frames"
      log "case $name: still running after ${budget}s; the daemons' state:"
      show_state
      kill -TERM "$cpid" 2>/dev/null
      wait "$cpid" 2>/dev/null
      result "$name" FAIL "did not finish in ${budget}s; last step: ${where:-none}${progress} (the daemons' state is in the log above)"
      return
    fi
    sleep 0.2
  done
  wait "$cpid"
  rc=$?
  fails=$((fails + rc))
}

echo "e2e: framelinkd $daemon, A=$a_ip B=$b_ip, cases $cases, work dir $work, ${case_budget}s a case at most"
IFS=, read -r -a want <<<"$cases"
for c in "${want[@]}"; do
  case "$c" in
    transfer | cut | restart | fallback | faults | detach | fanout | pull | csharp) run_case "$c" "$case_budget" ;;
    *) echo "e2e: unknown case $c" >&2; fails=$((fails + 1)) ;;
  esac
done
((keep)) && echo "e2e: work dir kept: $work"
echo "e2e: $fails case(s) failed"
exit "$fails"
