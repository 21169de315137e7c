#!/usr/bin/env bash
# softroce-vm.sh - run a command inside a throw-away QEMU guest that has real
# RDMA verbs over Soft-RoCE (rdma_rxe), using only Debian packages.
#
#   ./softroce-vm.sh [options] -- COMMAND [ARGS...]
#
# The guest boots Debian's linux-image-amd64 kernel with a tiny busybox
# initramfs, mounts the host's / read-only over 9p (with a tmpfs overlay on top,
# so everything looks writable but nothing reaches the host), loads rdma_rxe,
# creates rxe0 over a dummy netdev (and, with --pair, rxe_a/rxe_b over a veth
# pair), runs COMMAND in the host's current directory, copies results back and
# powers off.  Exit status = COMMAND's exit status (124 = timed out,
# 125 = VM/infrastructure failure, 126 = guest setup failed).
# See tests/softroce/README.md (the recipe and its pitfalls).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PROG=softroce-vm

TIMEOUT=900          # seconds for COMMAND inside the guest
BOOT_ALLOWANCE=""    # seconds for boot+setup+poweroff (default depends on accel)
MEM=2048
CPUS=$(nproc); [ "$CPUS" -gt 4 ] && CPUS=4
OUTDIR=""
KVER="${SOFTROCE_KVER:-}"
ACCEL="${SOFTROCE_ACCEL:-auto}"
MTU=9000
PAIR=0
HUGEPAGES=0
KEEP=0
VERBOSE=0
RW_DIRS=()
ENV_VARS=()
CACHE_DIR="${SOFTROCE_CACHE:-/tmp/softroce-vm-cache}"

usage() {
    cat <<EOF
usage: $0 [options] -- COMMAND [ARGS...]
  -t, --timeout SEC     time limit for COMMAND inside the guest (default $TIMEOUT)
  -m, --mem MiB         guest memory (default $MEM)
  -c, --cpus N          guest vCPUs (default $CPUS)
  -o, --out DIR         host directory that receives the guest's results
                        (cmd.log, rc, setup.log, dmesg.log, console.log and
                        anything COMMAND writes to \$SOFTROCE_OUT); created if missing
  -w, --rw DIR          share host DIR read-write at the same path (repeatable);
                        everything else of the host is visible read-only
  -e, --env VAR=VALUE   export VAR for COMMAND (repeatable)
      --pair            also create rxe_a/rxe_b over a veth pair (two "hosts")
      --mtu N           MTU of the netdevs under rxe (default $MTU => RoCE MTU 4096; 1500 => 1024)
      --hugepages N     reserve N 2 MiB hugepages in the guest (mounted at /dev/hugepages)
      --accel A         auto|kvm|tcg (default auto: kvm only if a hardware KVM module is loaded)
      --kernel VER      guest kernel version (default: newest with rdma_rxe.ko)
      --keep            keep the run directory under /tmp
  -v, --verbose         show the whole kernel console
  -h, --help
Inside the guest: \$SOFTROCE_DEV=rxe0 \$SOFTROCE_IP (its IPv4), \$SOFTROCE_OUT (results dir),
with --pair also \$SOFTROCE_A_DEV/\$SOFTROCE_A_IP and \$SOFTROCE_B_DEV/\$SOFTROCE_B_IP.
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        -t|--timeout) TIMEOUT=$2; shift 2 ;;
        -m|--mem) MEM=$2; shift 2 ;;
        -c|--cpus) CPUS=$2; shift 2 ;;
        -o|--out) OUTDIR=$2; shift 2 ;;
        -w|--rw) RW_DIRS+=("$(realpath -m "$2")"); shift 2 ;;
        -e|--env) ENV_VARS+=("$2"); shift 2 ;;
        --pair) PAIR=1; shift ;;
        --mtu) MTU=$2; shift 2 ;;
        --hugepages) HUGEPAGES=$2; shift 2 ;;
        --accel) ACCEL=$2; shift 2 ;;
        --kernel) KVER=$2; shift 2 ;;
        --boot-allowance) BOOT_ALLOWANCE=$2; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -v|--verbose) VERBOSE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        *) echo "$PROG: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || { echo "$PROG: no command given" >&2; usage >&2; exit 2; }

err() { echo "$PROG: $*" >&2; }

# ---------------------------------------------------------------- prerequisites
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v modprobe >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
command -v rdma >/dev/null || need+=(iproute2)
command -v ibv_devinfo >/dev/null || need+=(ibverbs-utils)
[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || ls /usr/lib/*/libibverbs/librxe-* >/dev/null 2>&1 || need+=(ibverbs-providers)
if [ -z "$KVER" ]; then
    for d in $(ls -1d /lib/modules/* 2>/dev/null | sort -rV); do
        v=$(basename "$d")
        if [ -e "/boot/vmlinuz-$v" ] && find "$d" -name 'rdma_rxe.ko*' | grep . >/dev/null; then KVER=$v; break; fi
    done
    [ -n "$KVER" ] || need+=(linux-image-amd64)
fi
if [ ${#need[@]} -gt 0 ]; then
    err "missing packages: ${need[*]}"
    err "install with: apt-get update && apt-get install -y --no-install-recommends ${need[*]}"
    exit 125
fi
KERNEL=/boot/vmlinuz-$KVER
[ -r "$KERNEL" ] || { err "cannot read $KERNEL"; exit 125; }

if [ "$ACCEL" = auto ]; then
    ACCEL=tcg
    # /dev/kvm backed by a real hardware-virt module -> KVM.  On Firecracker
    # sandboxes /dev/kvm is "kvm_pvm", which only runs PVM-enabled guest
    # kernels; a stock Debian kernel hangs right after "Probing EDD".
    if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
        ACCEL=kvm
    fi
fi
case "$ACCEL" in
    kvm) ACCEL_ARGS=(-accel kvm -cpu host,-arch-capabilities); : "${BOOT_ALLOWANCE:=120}" ;;
    tcg) ACCEL_ARGS=(-accel tcg,thread=multi,tb-size=256 -cpu "${SOFTROCE_QEMU_CPU:-qemu64,+ssse3,+sse4.1,+sse4.2,+popcnt}"); : "${BOOT_ALLOWANCE:=300}" ;;
    *) err "bad --accel $ACCEL"; exit 2 ;;
esac

# ---------------------------------------------------------------- initramfs
# busybox + the modules needed to reach the 9p root; everything else
# (rdma_rxe & co) is modprobed later from the host's /lib/modules.
STAGE1=$(cat <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "softroce-initramfs: $*"; sleep 1; poweroff -f; }
for m in /lib/modules/*.ko; do insmod "$m" || echo "softroce-initramfs: insmod $m failed"; done
mkdir -p /lower /ovl /newroot
i=0
until mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose sroot /lower 2>/dev/null; do
    i=$((i+1)); [ $i -gt 100 ] && fail "cannot mount 9p root"; sleep 0.1
done
mount -t tmpfs -o mode=755 ovl /ovl || fail "tmpfs"
mkdir -p /ovl/upper /ovl/work
mount -t overlay -o lowerdir=/lower,upperdir=/ovl/upper,workdir=/ovl/work overlay /newroot || fail "overlay"
mount -t tmpfs -o mode=755 tmpfs /newroot/run || fail "tmpfs /run"
mkdir -p /newroot/run/softroce/share /newroot/run/softroce/out
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 srshare /newroot/run/softroce/share || fail "share"
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 srout /newroot/run/softroce/out || fail "out"
n=0
for p in $(cat /newroot/run/softroce/share/rw.list); do
    mkdir -p "/newroot$p"
    mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 "srrw$n" "/newroot$p" || fail "rw $p"
    n=$((n+1))
done
mount --move /dev /newroot/dev
umount /proc /sys
exec switch_root /newroot /bin/bash /run/softroce/share/guest-init.sh
EOF
)
mods=$(for m in 9p 9pnet_virtio virtio_pci overlay; do modprobe -S "$KVER" --show-depends "$m"; done |
       awk '$1=="insmod"{print $2}' | awk '!seen[$0]++')
key=$( { echo "$STAGE1"; echo "$mods"; ls -l /bin/busybox; } | sha256sum | cut -c1-16)
INITRD="$CACHE_DIR/initramfs-$KVER-$key.cpio.gz"
if [ ! -s "$INITRD" ]; then
    mkdir -p "$CACHE_DIR"
    tmp=$(mktemp -d /tmp/softroce-initramfs.XXXXXX)
    mkdir -p "$tmp"/{bin,proc,sys,dev,lib/modules}
    cp /bin/busybox "$tmp/bin/busybox"
    printf '%s\n' "$STAGE1" > "$tmp/init"; chmod 755 "$tmp/init"
    i=0
    for p in $mods; do
        i=$((i+1))
        case "$p" in
            *.ko) cp "$p" "$tmp/lib/modules/$(printf %02d $i)-$(basename "$p")" ;;
            *.ko.xz) xz -dc "$p" > "$tmp/lib/modules/$(printf %02d $i)-$(basename "$p" .xz)" ;;
            *.ko.zst) zstd -qdc "$p" > "$tmp/lib/modules/$(printf %02d $i)-$(basename "$p" .zst)" ;;
            *) err "unknown module format $p"; rm -rf "$tmp"; exit 125 ;;
        esac
    done
    (cd "$tmp" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.tmp.$$"
    mv -f "$INITRD.tmp.$$" "$INITRD"
    rm -rf "$tmp"
fi

# ---------------------------------------------------------------- run dir
QPID=""
TAILPID=""
RUN=$(mktemp -d /tmp/softroce-vm.XXXXXX)
trap 'rm -rf "$RUN"' EXIT
SHARE=$RUN/share
mkdir -p "$SHARE"
if [ -z "$OUTDIR" ]; then OUTDIR=$RUN/out; KEEP_OUT=0; else KEEP_OUT=1; fi
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
for d in "$OUTDIR" "${RW_DIRS[@]+"${RW_DIRS[@]}"}"; do
    case "$d" in *,*|*[[:space:]]*) err "$d: commas and spaces in shared paths are not supported"; exit 2 ;; esac
done
rm -f "$OUTDIR/rc" "$OUTDIR/cmd.log" "$OUTDIR/setup.log" "$OUTDIR/dmesg.log" "$OUTDIR/console.log"
CONSOLE=$RUN/console.log

cleanup() {
    local st=$?
    trap - EXIT INT TERM
    if [ -n "$QPID" ] && kill -0 "$QPID" 2>/dev/null; then
        kill -TERM "$QPID" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$QPID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$QPID" 2>/dev/null || true
        wait "$QPID" 2>/dev/null || true
    fi
    if [ -n "$TAILPID" ] && kill -0 "$TAILPID" 2>/dev/null; then kill "$TAILPID" 2>/dev/null || true; wait "$TAILPID" 2>/dev/null || true; fi
    if [ "$KEEP" = 1 ]; then err "run directory kept: $RUN"; else rm -rf "$RUN"; fi
    exit "$st"
}
trap cleanup EXIT
trap 'err "interrupted"; exit 130' INT TERM

cp "$HERE/guest-init.sh" "$SHARE/guest-init.sh"
{
    printf 'SR_TIMEOUT=%q\n' "$TIMEOUT"
    printf 'SR_CWD=%q\n' "$PWD"
    printf 'SR_MTU=%q\n' "$MTU"
    printf 'SR_PAIR=%q\n' "$PAIR"
    printf 'SR_HUGEPAGES=%q\n' "$HUGEPAGES"
    printf 'SR_VERBOSE=%q\n' "$VERBOSE"
    printf 'SR_IP=%q\nSR_A_IP=%q\nSR_B_IP=%q\n' 10.77.0.1 10.77.1.1 10.77.1.2
    printf 'export PATH=%q\n' "$PATH"
    for kv in "${ENV_VARS[@]+"${ENV_VARS[@]}"}"; do
        printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"
    done
} > "$SHARE/config.sh"
{
    printf '%q ' "$@"; echo
} > "$SHARE/cmd.sh"
printf '%s\n' "${RW_DIRS[@]+"${RW_DIRS[@]}"}" > "$SHARE/rw.list"

VIRTFS=(
    -virtfs "local,path=/,mount_tag=sroot,security_model=none,readonly=on,multidevs=remap"
    -virtfs "local,path=$SHARE,mount_tag=srshare,security_model=none"
    -virtfs "local,path=$OUTDIR,mount_tag=srout,security_model=none"
)
n=0
for d in "${RW_DIRS[@]+"${RW_DIRS[@]}"}"; do
    [ -d "$d" ] || { err "--rw $d: not a directory"; exit 2; }
    VIRTFS+=(-virtfs "local,path=$d,mount_tag=srrw$n,security_model=none")
    n=$((n+1))
done

APPEND="console=ttyS0 panic=-1 oops=panic mitigations=off random.trust_cpu=on 8250.nr_uarts=1 nokaslr"
[ "$VERBOSE" = 1 ] || APPEND="$APPEND quiet loglevel=4"
APPEND="$APPEND ${SOFTROCE_KERNEL_ARGS:-}"

: > "$CONSOLE"
start=$(date +%s.%N)
qemu-system-x86_64 -name softroce-vm "${ACCEL_ARGS[@]}" -m "$MEM" -smp "$CPUS" \
    -nodefaults -no-user-config -display none -monitor none -no-reboot \
    -serial "file:$CONSOLE" \
    -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND" \
    "${VIRTFS[@]}" ${SOFTROCE_QEMU_ARGS:-} </dev/null >"$RUN/qemu.log" 2>&1 &
QPID=$!
tail -n +1 -F "$CONSOLE" 2>/dev/null &
TAILPID=$!

deadline=$(( $(date +%s) + BOOT_ALLOWANCE + TIMEOUT + 30 ))
timed_out=0
while kill -0 "$QPID" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
        timed_out=1
        err "hard timeout ($((BOOT_ALLOWANCE + TIMEOUT + 30))s) reached, killing QEMU pid $QPID"
        kill -TERM "$QPID" 2>/dev/null || true
        sleep 3
        kill -KILL "$QPID" 2>/dev/null || true
        break
    fi
    sleep 0.5
done
qrc=0; wait "$QPID" || qrc=$?
QPID=""
end=$(date +%s.%N)
sleep 0.3
kill "$TAILPID" 2>/dev/null || true; wait "$TAILPID" 2>/dev/null || true; TAILPID=""
cp "$CONSOLE" "$OUTDIR/console.log" 2>/dev/null || true

if [ -s "$RUN/qemu.log" ]; then err "qemu said:"; sed 's/^/  /' "$RUN/qemu.log" >&2; fi
printf '%s: VM wall time %ss (accel %s, kernel %s)\n' "$PROG" "$(awk -v s="$start" -v e="$end" 'BEGIN{printf "%.1f", e-s}')" "$ACCEL" "$KVER" >&2

if [ "$timed_out" = 1 ]; then rc=124
elif [ -s "$OUTDIR/rc" ]; then rc=$(tr -dc 0-9 < "$OUTDIR/rc"); rc=${rc:-125}
else
    err "guest did not report an exit status (qemu exit $qrc); last console lines:"
    tail -n 30 "$CONSOLE" >&2 || true
    rc=125
fi
if [ "$rc" = 126 ] && [ -s "$OUTDIR/setup.log" ]; then err "guest setup log:"; cat "$OUTDIR/setup.log" >&2; fi
if [ "$KEEP_OUT" = 0 ] && [ "$KEEP" = 0 ]; then :; else err "results in $OUTDIR"; fi
exit "$rc"
