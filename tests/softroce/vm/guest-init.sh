#!/bin/bash
# Stage 2 of the Soft-RoCE guest.  Runs as PID 1 inside the QEMU guest after the
# initramfs has mounted the host's root (9p, read-only) under a tmpfs overlay.
# It is copied by softroce-vm.sh into the per-run share and started by
# switch_root; it is never meant to be run on the host.
#
# Contract with the host (softroce-vm.sh):
#   /run/softroce/share/config.sh   variables (SR_*) + exported env for the command
#   /run/softroce/share/cmd.sh      the command to run (argv already quoted)
#   /run/softroce/out/              results: rc, cmd.log, setup.log, dmesg.log
# The command's exit status is written to /run/softroce/out/rc.  The guest always
# powers itself off at the end (or the kernel panics -> QEMU exits via -no-reboot).

SHARE=/run/softroce/share
OUT=/run/softroce/out
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

poweroff_now() {
    sync
    # busybox poweroff -f == reboot(RB_POWER_OFF): no init system needed.
    /bin/busybox poweroff -f 2>/dev/null
    echo o > /proc/sysrq-trigger
    sleep 10
}

die() {
    echo "softroce-guest: SETUP FAILED: $*" | tee -a "$OUT/setup.log" >&2
    echo 126 > "$OUT/rc"
    dmesg > "$OUT/dmesg.log" 2>/dev/null
    poweroff_now
}

mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /dev/hugepages
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t hugetlbfs hugetlbfs /dev/hugepages
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null

# shellcheck disable=SC1091
. "$SHARE/config.sh" || die "cannot read $SHARE/config.sh"

: > "$OUT/setup.log"
log() { echo "softroce-guest: $*" >> "$OUT/setup.log"; [ "${SR_VERBOSE:-0}" = 1 ] && echo "softroce-guest: $*"; }
run() { log "+ $*"; "$@" >> "$OUT/setup.log" 2>&1; }

hostname softroce-guest 2>/dev/null
ulimit -l unlimited
ulimit -n 65536
ulimit -c 0
run ip link set lo up

run modprobe rdma_rxe || die "modprobe rdma_rxe"
run modprobe rdma_ucm || die "modprobe rdma_ucm"
run modprobe ib_uverbs || die "modprobe ib_uverbs"

if [ "${SR_HUGEPAGES:-0}" -gt 0 ]; then
    echo "$SR_HUGEPAGES" > /proc/sys/vm/nr_hugepages
    log "nr_hugepages=$(cat /proc/sys/vm/nr_hugepages) (asked $SR_HUGEPAGES)"
fi

wait_active() { # $1 = rdma device
    local i
    for i in $(seq 1 100); do
        if rdma link show "$1/1" 2>/dev/null | grep -q 'state ACTIVE'; then return 0; fi
        sleep 0.1
    done
    return 1
}

# --- topology -------------------------------------------------------------
# "Single host": a dummy netdev with an address and rxe0 on top.  Traffic
# between two processes on rxe0 is RoCEv2 loopback inside rdma_rxe.
run ip link add sr0 type dummy || die "ip link add sr0"
run ip link set sr0 mtu "$SR_MTU"
run ip addr add "$SR_IP/24" dev sr0
run ip link set sr0 up
run rdma link add rxe0 type rxe netdev sr0 || die "rdma link add rxe0"
wait_active rxe0 || die "rxe0 never became ACTIVE"

if [ "$SR_PAIR" = 1 ]; then
    # "Two hosts" inside one kernel: a veth pair, an rxe device on each end.
    # rdma_rxe (Linux 6.1) only has its UDP/4791 socket in the initial netns,
    # so both ends stay in the initial netns and policy routing forces the
    # traffic between the two local addresses over the veth wire instead of
    # the loopback device (see tests/softroce/README.md, pitfall 6).
    run ip link add sra type veth peer name srb || die "veth"
    for d in sra srb; do
        run ip link set "$d" mtu "$SR_MTU"
        run sysctl -qw "net.ipv4.conf.$d.accept_local=1" "net.ipv4.conf.$d.rp_filter=0"
        # A veth hands each packet to the receive backlog of the CPU that sent
        # it, so a queue pair whose packets leave from two CPUs arrives out of
        # order (rxe: sequence NAKs, go-back-N resends, retry timeouts; none
        # lost).  RPS keeps each flow on one CPU, in order, as a NIC queue does.
        for q in /sys/class/net/"$d"/queues/rx-*; do
            printf '%x' $(((1 << $(nproc)) - 1)) >"$q/rps_cpus" || die "rps_cpus on $d"
        done
    done
    run sysctl -qw net.ipv4.conf.all.rp_filter=0
    run ip addr add "$SR_A_IP/24" dev sra
    run ip addr add "$SR_B_IP/24" dev srb
    run ip link set sra up
    run ip link set srb up
    # Locally generated traffic to the *other* end's address (iif lo), and
    # lookups bound to sra/srb (oif), use per-end tables that route over the
    # veth; only after that comes the local table (moved from pref 0 to 200).
    # Incoming packets (iif sra/srb) still hit the local table and are
    # delivered (accept_local=1 allows a local source address).
    run ip rule add pref 100 iif lo to "$SR_B_IP" lookup 100
    run ip rule add pref 101 iif lo to "$SR_A_IP" lookup 101
    run ip rule add pref 102 oif sra lookup 100
    run ip rule add pref 103 oif srb lookup 101
    run ip route add "$SR_B_IP/32" dev sra src "$SR_A_IP" table 100
    run ip route add "$SR_A_IP/32" dev srb src "$SR_B_IP" table 101
    run ip rule add pref 200 lookup local
    run ip rule del pref 0 lookup local
    run ip neigh replace "$SR_B_IP" lladdr "$(cat /sys/class/net/srb/address)" dev sra nud permanent
    run ip neigh replace "$SR_A_IP" lladdr "$(cat /sys/class/net/sra/address)" dev srb nud permanent
    run rdma link add rxe_a type rxe netdev sra || die "rdma link add rxe_a"
    run rdma link add rxe_b type rxe netdev srb || die "rdma link add rxe_b"
    wait_active rxe_a || die "rxe_a never became ACTIVE"
    wait_active rxe_b || die "rxe_b never became ACTIVE"
fi

run rdma link show
run ip -br addr
log "setup done at uptime $(cut -d' ' -f1 /proc/uptime)s"
echo "softroce-guest: ready after $(cut -d' ' -f1 /proc/uptime)s of guest uptime; rdma links: $(rdma link show | awk '{print $2"("$NF")"}' | tr '\n' ' ')"

# --- the command ----------------------------------------------------------
cd "$SR_CWD" 2>/dev/null || cd /
export SOFTROCE_OUT="$OUT" SOFTROCE_DEV=rxe0 SOFTROCE_IP="$SR_IP" SOFTROCE_NETDEV=sr0
if [ "$SR_PAIR" = 1 ]; then
    export SOFTROCE_A_DEV=rxe_a SOFTROCE_A_IP="$SR_A_IP" SOFTROCE_A_NETDEV=sra
    export SOFTROCE_B_DEV=rxe_b SOFTROCE_B_IP="$SR_B_IP" SOFTROCE_B_NETDEV=srb
fi
echo "softroce-guest: running command (timeout ${SR_TIMEOUT}s) in $(pwd)"
timeout --kill-after=10 "$SR_TIMEOUT" bash "$SHARE/cmd.sh" </dev/null 2>&1 | tee "$OUT/cmd.log"
rc=${PIPESTATUS[0]}
echo "$rc" > "$OUT/rc"
[ "$rc" = 124 ] && echo "softroce-guest: command TIMED OUT after ${SR_TIMEOUT}s"
echo "softroce-guest: command exited with status $rc"
dmesg > "$OUT/dmesg.log" 2>/dev/null
poweroff_now
