#!/usr/bin/env bash
# A fleet on one machine: N framelinkd (64 by default), each in a network namespace of its own on
# one bridge, with no [[peer]] at all -- they find each other in a real etcd (Debian's
# etcd-server), or in the DNS SRV records a real dnsmasq serves (--registry dns), and link only
# where a stream needs it.  Then, every frame verified:
#   1. converge   every daemon finds the N-1 others (its framelink_discovery_peers)
#   2. fan-out    a producer on host 1 reaches readers on 12 other hosts: six with a subscriber
#                 (every frame), and one queue group of twelve members on six hosts (each frame
#                 to one member of the twelve)
#   3. replace    a reader host is killed and a new one, with a new address, starts: it is found
#                 and its reader gets frames of the running stream
#   4. registry down  etcd (or dnsmasq) is killed mid-stream: delivery goes on
# The figures (time to converge, memory, threads and descriptors per daemon, links held, the idle
# fleet's CPU) are printed as a benchmark, never asserted against a time.  Needs root (ip netns).
# The last line is "FLEET: PASSED ..." or "FLEET: FAILED ...".
#
#   tests/fleet/run-fleet.sh [--daemons N] [--registry etcd|dns] [--poll-ms MS] [--build DIR] [--keep]
#     --registry  etcd (default): the daemons publish themselves under leases and watch the others;
#                 dns: the records of _framelink._tcp.fleet.test (dnsmasq --srv-host), read every 3 s
#     --poll-ms   how often each daemon looks at its own streams all the same (default 30000, the daemon's own)
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${FRAMELINK_BUILD_DIR:-$root/build}
n=64
poll_ms=30000
registry=etcd
keep=0
while (($#)); do
  case "$1" in
    --daemons) n=$2; shift 2 ;;
    --poll-ms) poll_ms=$2; shift 2 ;;
    --registry) registry=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -h | --help) sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "fleet: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
daemon=$build/proxy/framelinkd
cli=$build/client/cli/framelink
fail() {
  echo "FLEET: FAILED -- $*"
  exit 1
}
((n >= 14)) || fail "--daemons must be at least 14 (a producer, 12 reader hosts and a spare)"
[[ $(id -u) == 0 ]] || fail "needs root for ip netns (run as root, as CI does)"
[[ -x $daemon && -x $cli ]] || fail "no $daemon or $cli: build first (cmake --build $build)"
[[ $registry == etcd || $registry == dns ]] || fail "--registry is etcd or dns, not $registry"
if [[ $registry == etcd ]]; then
  command -v etcd >/dev/null || fail "no etcd: apt-get install etcd-server (scripts/setup-deps.sh installs it)"
else
  command -v dnsmasq >/dev/null || fail "no dnsmasq: apt-get install dnsmasq-base (scripts/setup-deps.sh installs it)"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/fl-fleet.XXXXXX")
tag=fl$$ # names of this run's namespaces and links: two runs do not meet
bridge=${tag}br
etcd_ip=10.88.0.1
etcd_url=http://$etcd_ip:2379
start_ns=$(date +%s%N)
log() { printf '[fleet %6.1fs] %s\n' "$(awk -v s="$start_ns" -v e="$(date +%s%N)" 'BEGIN{print (e-s)/1e9}')" "$*"; }
declare -A daemon_pid=() # host index -> pid
declare -A host_ip=()    # host index -> its address
pids=()
etcd_pid=""
dns_pid=""
srv_name=_framelink._tcp.fleet.test

cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${daemon_pid[@]}"; do kill "$p" 2>/dev/null; done
  [[ -n $etcd_pid ]] && kill "$etcd_pid" 2>/dev/null
  [[ -n $dns_pid ]] && kill "$dns_pid" 2>/dev/null
  sleep 0.5
  for p in "${pids[@]}" "${daemon_pid[@]}" $etcd_pid $dns_pid; do kill -9 "$p" 2>/dev/null; done
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${tag}-"); do ip netns delete "$ns"; done
  ip link delete "$bridge" 2>/dev/null
  if [[ -n ${neigh_was:-} ]]; then
    read -r t1 t2 t3 <<<"$neigh_was"
    echo "$t1" >$neigh/gc_thresh1
    echo "$t2" >$neigh/gc_thresh2
    echo "$t3" >$neigh/gc_thresh3
  fi
  ((keep)) && echo "fleet: work dir kept: $work" || rm -rf "$work"
}
trap cleanup EXIT

# ---- the network: a bridge, one namespace per host (10.88.1.I, or 10.88.2.I for a replacement).
# The kernel's ARP table is one for every namespace (gc_thresh3: 1024 entries): 64 hosts that each
# reach the 63 others (dns: each asks each what it is) need 4096, so it grows for the run.
neigh=/proc/sys/net/ipv4/neigh/default
neigh_was=$(cat $neigh/gc_thresh1 $neigh/gc_thresh2 $neigh/gc_thresh3 | tr '\n' ' ')
echo $((4 * n * n)) >$neigh/gc_thresh3
echo $((2 * n * n)) >$neigh/gc_thresh2
echo $((n * n)) >$neigh/gc_thresh1
ip link add "$bridge" type bridge || fail "cannot create a bridge"
ip addr add $etcd_ip/16 dev "$bridge"
ip link set "$bridge" up
add_host() { # INDEX IP
  local ns=$tag-$1
  ip netns add "$ns" || return 1
  ip link add "${tag}h$1" type veth peer name eth0 netns "$ns" || return 1
  ip link set "${tag}h$1" master "$bridge" up
  ip -n "$ns" addr add "$2/16" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
}

# ---- etcd, in the root namespace on the bridge's address
start_etcd() {
  etcd --name fleet --data-dir "$work/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls http://$etcd_ip:2380 --initial-advertise-peer-urls http://$etcd_ip:2380 \
    --initial-cluster fleet=http://$etcd_ip:2380 --log-level warn >>"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  local _
  for _ in $(seq 100); do
    python3 -c "import urllib.request as u; u.urlopen(u.Request('$etcd_url/v3/kv/range', b'{\"key\":\"Lw==\"}'), timeout=1)" \
      2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
# ---- or dnsmasq on the same address: an SRV record and an A record per host of host_ip, served
# again (restarted: it reads its command line once) when the hosts change.  The answer of 64 records
# comes over TCP (too large for a datagram), a connection per query: more than dnsmasq's default 20 at once.
start_dns() {
  [[ -n $dns_pid ]] && kill "$dns_pid" 2>/dev/null && wait "$dns_pid" 2>/dev/null
  local args=() i
  for i in "${!host_ip[@]}"; do
    args+=("--srv-host=$srv_name,host-$i.fleet.test,7700" "--host-record=host-$i.fleet.test,${host_ip[$i]}")
  done
  dnsmasq --keep-in-foreground --conf-file=/dev/null --listen-address=$etcd_ip --bind-interfaces --no-resolv \
    --no-hosts --pid-file= --user=root --log-facility=- --max-tcp-connections=256 "${args[@]}" >>"$work/dnsmasq.log" 2>&1 &
  dns_pid=$!
}
if [[ $registry == etcd ]]; then
  start_etcd || fail "etcd did not start (see $work/etcd.log)"
  registry_args=(--etcd "$etcd_url")
else
  registry_args=(--dns-srv "$srv_name" --dns-server "$etcd_ip" --dns-refresh-s 3)
fi

# ---- the daemons
start_daemon() { # INDEX IP
  local i=$1 dir=$work/h$1
  mkdir -p "$dir"
  ip netns exec "$tag-$i" "$daemon" --id "host-$i" --socket "$dir/sock" --ready-file "$dir/ready" \
    --listen "$2:7700" --data-listen "$2:7701" --token fleet-token --transports tcp --hugepages off \
    "${registry_args[@]}" --poll-ms "$poll_ms" --link-idle-s 10 --ack-timeout-ms 5000 \
    --credit-timeout-ms 5000 --metrics "$2:9464" --log-level info >"$dir/log" 2>&1 &
  daemon_pid[$i]=$!
  host_ip[$i]=$2
}
wait_ready() { # INDEX
  local _
  for _ in $(seq 300); do
    [[ -s $work/h$1/ready ]] && return 0
    sleep 0.1
  done
  return 1
}
# metric NAME I...: "I VALUE" for each host, from its /metrics on its own address (the bridge
# reaches every namespace); VALUE is empty when the host did not answer.
metric() {
  local name=$1 i
  shift
  for i in "$@"; do echo "$i ${host_ip[$i]}"; done | python3 -c '
import sys, urllib.request
name = sys.argv[1]
for line in sys.stdin:
    i, ip = line.split()
    value = ""
    try:
        text = urllib.request.urlopen("http://%s:9464/metrics" % ip, timeout=2).read().decode()
        for row in text.splitlines():
            if row.startswith(name + " "):
                value = str(int(float(row.split()[1])))
    except Exception:
        pass
    print(i, value)
' "framelink_$name"
}
counter() { metric "$2" "$1" | awk '{print $2}'; }

log "starting $registry and $n daemons, each in its own network namespace on bridge $bridge"
t0=$(date +%s%N)
if [[ $registry == dns ]]; then
  for i in $(seq "$n"); do host_ip[$i]=10.88.1.$i; done
  start_dns
fi
for i in $(seq "$n"); do
  add_host "$i" "10.88.1.$i" || fail "cannot create namespace $i"
  start_daemon "$i" "10.88.1.$i"
done
for i in $(seq "$n"); do wait_ready "$i" || fail "host-$i did not get ready: $(tail -3 "$work/h$i/log")"; done
t_ready=$(date +%s%N)
log "$n daemons ready in $(((t_ready - t0) / 1000000)) ms"

# 1. converge
converged=0
for _ in $(seq 600); do
  converged=$(metric discovery_peers $(seq "$n") | awk -v want=$((n - 1)) '$2 == want' | wc -l)
  ((converged == n)) && break
  sleep 0.5
done
t_conv=$(date +%s%N)
((converged == n)) || fail "only $converged of $n daemons found the $((n - 1)) others"
converge_ms=$(((t_conv - t_ready) / 1000000))
log "every daemon found the $((n - 1)) others $converge_ms ms after the last was ready"

# The idle fleet: links, memory, threads, descriptors, CPU over 10 s.
figures_of() { # PID -> "rss_kb threads fds"
  echo "$(awk '/^VmRSS/{print $2}' "/proc/$1/status") $(awk '/^Threads/{print $2}' "/proc/$1/status") $(ls "/proc/$1/fd" | wc -l)"
}
figures() { # -> "rss_kb threads fds" summed over the daemons
  local p
  for p in "${daemon_pid[@]}"; do figures_of "$p"; done | awk '{r += $1; t += $2; f += $3} END {print r, t, f}'
}
# Each thread's time on a CPU in ns and how often it was put on one (schedstat: exact, where
# /proc/PID/stat's ticks are sampled), as "NAME NS RUNS" lines summed by thread name.
cpu_by_thread() {
  local p t
  for p in "$@"; do
    for t in /proc/"$p"/task/*; do
      echo "$(cat "$t/comm" 2>/dev/null) $(awk '{print $1, $3}' "$t/schedstat" 2>/dev/null)"
    done
  done | awk 'NF == 3 {ns[$1] += $2; runs[$1] += $3} END {for (k in ns) print k, ns[k], runs[k]}' | sort
}
links_total() { metric links_up "$@" | awk '{s += $2} END {print s + 0}'; }
# measure_idle: the fleet's CPU over 10 s (% of one core, all daemons together), by thread, and
# its wakes a second per daemon; beside it the baseline, a process that only sleeps a second at a
# time, measured the same way: what one wake costs this machine.
measure_idle() {
  python3 -c 'import time
while True: time.sleep(1)' &
  local sleeper=$!
  sleep 0.5
  cpu_by_thread "${daemon_pid[@]}" >"$work/cpu0"
  cpu_by_thread "$sleeper" >"$work/base0"
  sleep 10
  cpu_by_thread "${daemon_pid[@]}" >"$work/cpu1"
  cpu_by_thread "$sleeper" >"$work/base1"
  kill "$sleeper"
  wait "$sleeper" 2>/dev/null
  # Per thread name: % of one core for the whole fleet over the 10 s.
  idle_threads=$(join "$work/cpu0" "$work/cpu1" | awk '{d = ($4 - $2) / 1e8; if (d >= 0.005) {printf "%s%s %.2f%%", sep, $1, d; sep = ", "}}')
  idle_cpu=$(join "$work/cpu0" "$work/cpu1" | awk '{s += $4 - $2} END {printf "%.2f", s / 1e8}')
  idle_wakes=$(join "$work/cpu0" "$work/cpu1" | awk -v n="$n" '{w += $5 - $3} END {printf "%.2f", w / 10 / n}')
  base_us=$(join "$work/base0" "$work/base1" | awk '{ns += $4 - $2; w += $5 - $3} END {printf "%.0f", w ? ns / w / 1000 : 0}')
  idle_ratio=$(awk -v c="$idle_cpu" -v n="$n" -v b="$base_us" 'BEGIN {printf "%.1f", b ? c * 1e4 / n / b : 0}')
}
idle_links=$(links_total $(seq "$n"))
measure_idle
read -r rss threads fds < <(figures)
log "idle: $idle_links links held; ${idle_cpu}% of one core for all $n daemons together ($idle_threads), $idle_wakes wakes a second each, each as much CPU as $idle_ratio processes waking once a second ($base_us us a wake here); per daemon $((rss / n)) KiB resident, $((threads / n)) threads, $((fds / n)) descriptors"
first_idle="${idle_cpu} % of one core; $idle_wakes wakes a second per daemon, each as much CPU as $idle_ratio processes that wake once a second ($base_us µs a wake on this machine)"
first_threads=$idle_threads

# host-1's own figures, idle and then with a link to each reader host: what a link costs
read -r h1_rss0 h1_thr0 h1_fds0 < <(figures_of "${daemon_pid[1]}")

# 2. fan-out to 12 hosts (more than the 8 routes a stream once had): hosts 2-7 one subscriber
# each, hosts 8-13 two members each of one queue group that spans them
frames=200
subscriber_hosts=(2 3 4 5 6 7)
group_hosts=(8 9 10 11 12 13)
reader_hosts=$((${#subscriber_hosts[@]} + ${#group_hosts[@]}))
for i in "${subscriber_hosts[@]}"; do
  "$cli" recv --socket "$work/h$i/sock" --stream fleet --subscribe --count $frames --verify --expect-order \
    --timeout-ms 30000 --json >"$work/recv-$i" 2>&1 &
  pids+=($!)
done
for i in "${group_hosts[@]}"; do
  for m in a b; do
    "$cli" recv --socket "$work/h$i/sock" --stream fleet --verify --timeout-ms 8000 --json >"$work/recv-$i$m" 2>&1 &
    pids+=($!)
  done
done
# the readers reach host 1 through the registry (each host publishes them within a second)
for _ in $(seq 100); do
  grep -q 'is now routed to\|readers: fleet' "$work/h1/log" && [[ $(grep -c 'readers: fleet \[' "$work/h1/log") -ge $reader_hosts ]] && break
  sleep 0.2
done
t_send=$(date +%s%N)
"$cli" send --socket "$work/h1/sock" --stream fleet --count $frames --size 64K --rate 100 --json >"$work/send" 2>&1
send_rc=$?
t_sent=$(date +%s%N)
wait "${pids[@]}" 2>/dev/null
pids=()
num() { grep -o "\"$2\":[0-9]*" "$1" | tail -1 | cut -d: -f2; }
why=""
[[ $send_rc == 0 && $(num "$work/send" delivered) == "$frames" ]] ||
  why+="producer: $(grep '^{' "$work/send" | tail -1); "
for i in "${subscriber_hosts[@]}"; do
  [[ $(num "$work/recv-$i" received) == "$frames" && $(num "$work/recv-$i" bad) == 0 ]] ||
    why+="subscriber on host-$i: $(tail -1 "$work/recv-$i"); "
done
# the queue group: each frame to one member of the twelve, none twice (the producer's completions
# say every frame was delivered), and every host of the group had a share
group_got=0
group_bad=0
shares=""
for i in "${group_hosts[@]}"; do
  got=$(($(num "$work/recv-${i}a" received) + $(num "$work/recv-${i}b" received)))
  group_got=$((group_got + got))
  group_bad=$((group_bad + $(num "$work/recv-${i}a" bad) + $(num "$work/recv-${i}b" bad)))
  shares+="${shares:+ }$got"
  ((got > 0)) || why+="queue group: host-$i had no share; "
done
((group_got == frames && group_bad == 0)) || why+="queue group: $group_got frames ($shares by host), $group_bad bad; "
[[ -z $why ]] || fail "fan-out: ${why%; }"
fan_links=$(counter 1 links_up)
read -r h1_rss1 h1_thr1 h1_fds1 < <(figures_of "${daemon_pid[1]}")
per_link=$(awk -v l="${fan_links:-0}" -v r=$((h1_rss1 - h1_rss0)) -v t=$((h1_thr1 - h1_thr0)) -v f=$((h1_fds1 - h1_fds0)) \
  'BEGIN {if (l > 0) printf "%.0f KiB resident, %.1f threads, %.1f descriptors", r / l, t / l, f / l; else print "no link"}')
log "fan-out: $frames frames of 64 KiB from host-1 to $reader_hosts hosts (${#subscriber_hosts[@]} subscribers; a queue group on ${#group_hosts[@]} hosts, shares $shares), every one verified, in $(((t_sent - t_send) / 1000000)) ms; host-1 holds $fan_links links ($per_link each)"

# Idle again once the fan-out's links have ended (link_idle_s 10): what a fleet that has carried
# frames costs at rest.
# (Only the hosts the fan-out linked are asked: 64 daemons' metrics a round took seconds in CI.)
fan_hosts=(1 "${subscriber_hosts[@]}" "${group_hosts[@]}")
for _ in $(seq 30); do
  (($(links_total "${fan_hosts[@]}") == 0)) && break
  sleep 1
done
after_links=$(links_total "${fan_hosts[@]}")
measure_idle
after_idle="${idle_cpu} % of one core with $after_links links held; $idle_wakes wakes a second per daemon, each as much CPU as $idle_ratio processes that wake once a second"
log "idle after the fan-out: $after_idle; by thread: $idle_threads"

# 3. replace: host-9 dies, host-$((n + 1)) comes at a new address with a reader; the stream runs on
"$cli" send --socket "$work/h1/sock" --stream fleet2 --count 0 --size 16K --rate 50 --json >"$work/send2" 2>&1 &
send2=$!
"$cli" recv --socket "$work/h2/sock" --stream fleet2 --subscribe --verify --timeout-ms 30000 --json >"$work/recv2-2" 2>&1 &
pids+=($!)
sleep 2
kill -9 "${daemon_pid[9]}"
unset 'daemon_pid[9]' 'host_ip[9]'
ip netns delete "$tag-9"
new=$((n + 1))
add_host "$new" "10.88.2.1" || fail "cannot create the replacement's namespace"
t_new=$(date +%s%N)
start_daemon "$new" "10.88.2.1"
[[ $registry == dns ]] && start_dns # the DNS server's records change with the host (as a headless service's do)
wait_ready "$new" || fail "the replacement did not get ready"
# (it keeps reading: a reader host whose last reader left would hold the stream's frames until
# credit_timeout_ms, as a written route to a host without readers does)
"$cli" recv --socket "$work/h$new/sock" --stream fleet2 --subscribe --verify --timeout-ms 30000 --json \
  >"$work/recv2-new" 2>&1 &
pids+=($!)
got=0
for _ in $(seq 300); do
  got=$(counter "$new" frames_received_total)
  ((${got:-0} >= 20)) && break
  sleep 0.1
done
t_got=$(date +%s%N)
((${got:-0} >= 20)) || fail "replace: the new host's reader got ${got:-0} frames in 30 s: $(tail -2 "$work/recv2-new")"
replace_ms=$(((t_got - t_new) / 1000000))
log "replace: host-9 killed; host-$new at 10.88.2.1 started, found, and its reader had 20 frames $replace_ms ms after its start"

# 4. the registry down mid-stream: the running stream goes on
before=$(counter 2 frames_received_total)
server=etcd
if [[ $registry == etcd ]]; then
  kill -9 "$etcd_pid"
  etcd_pid=""
else
  server=dnsmasq
  kill -9 "$dns_pid"
  dns_pid=""
fi
sleep 5
after=$(counter 2 frames_received_total)
((after > before + 50)) || fail "$server down: host-2 received $((after - before)) frames in 5 s (the stream stopped)"
up=$(counter 1 discovery_registry_up)
log "$server down: host-2 received $((after - before)) frames in 5 s; host-1's discovery_registry_up = $up"
kill -INT "$send2" 2>/dev/null
wait "$send2" 2>/dev/null
for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; done
wait "${pids[@]}" 2>/dev/null
pids=()
for f in "$work/recv2-2" "$work/recv2-new"; do
  [[ $(num "$f" bad) == 0 ]] || fail "a reader of the replaced host's stream found bad frames: $(tail -2 "$f")"
done

echo
what="etcd 3.4 registry"
[[ $registry == dns ]] && what="DNS SRV records of dnsmasq, read every 3 s"
echo "fleet of $n daemons (tcp, one network namespace each, $what), one machine of $(nproc) CPUs"
echo
echo "| figure | value |"
echo "|---|---|"
echo "| daemons ready (start of all) | $(((t_ready - t0) / 1000000)) ms |"
echo "| every daemon found the $((n - 1)) others | $converge_ms ms after the last was ready |"
echo "| links held, idle fleet | $idle_links |"
echo "| CPU of all $n idle daemons | $first_idle |"
echo "| ... by thread | $first_threads |"
echo "| the same, once the fan-out's links ended | $after_idle |"
echo "| per idle daemon | $((rss / n)) KiB resident, $((threads / n)) threads, $((fds / n)) descriptors |"
echo "| links held by the producer's daemon, $reader_hosts reader hosts | $fan_links |"
echo "| per link held (the producer's daemon, its growth over idle) | $per_link |"
echo "| replacement host: start to 20 frames at its reader | $replace_ms ms |"
echo "| $server down: frames at host-2 in 5 s (50 frames/s sent) | $((after - before)) |"
echo
echo "FLEET: PASSED -- $n daemons converged in $converge_ms ms; $frames frames to $reader_hosts hosts verified; a replaced host served in $replace_ms ms; delivery went on without $server"
