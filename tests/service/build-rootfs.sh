#!/usr/bin/env bash
# Builds the clean Debian 12 guest of the service test as an ext4 image, without loop mounts:
# debootstrap (minbase) + systemd-sysv + dbus + the given packages into a directory, a little
# configuration (the oneshot unit that runs the test, masked timers and gettys), then
# `mke2fs -d DIR`.  Called by run-guest.sh, which caches the image; not meant to be run by hand.
#
#   tests/service/build-rootfs.sh IMAGE MIRROR PACKAGE...
#
# The packages are the run-time dependencies (and recommends) of the debs under test, installed
# here so that `apt install ./*.deb` in the guest finds every dependency already installed and
# needs no network and no package lists.  The guest keeps no lists: its apt knows only what is
# installed and the local debs.
set -euo pipefail
# shellcheck source=../../scripts/debian-root.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/debian-root.sh"

if (($# < 2)); then
  echo "usage: $0 IMAGE MIRROR [PACKAGE...]" >&2
  exit 2
fi
image=$1
mirror=$2
shift 2
include=systemd-sysv,dbus
for p in "$@"; do include+=",$p"; done

work=$(mktemp -d "${image%/*}/rootfs-build.XXXXXX")
# debootstrap's mounts in the tree, whatever state a failed run left them in, are never deleted through.
trap 'remove_scratch "$work"' EXIT
trap 'echo "build-rootfs: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
root=$work/root

echo "build-rootfs: debootstrap bookworm from $mirror (minbase, --include=$include)"
debootstrap --variant=minbase --include="$include" --components=main bookworm "$root" "$mirror" \
  >"$work/debootstrap.log" 2>&1 || {
  echo "build-rootfs: debootstrap failed; its log ends with:" >&2
  tail -n 30 "$work/debootstrap.log" >&2
  # debootstrap's own log names the package that failed.
  tail -n 30 "$root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
  exit 1
}

# ---- configuration of the guest
echo service-guest >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 service-guest\n::1 localhost\n' >"$root/etc/hosts"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$root/etc/fstab"
printf 'deb %s bookworm main\n' "$mirror" >"$root/etc/apt/sources.list"
# An empty machine-id: systemd makes one at first boot (every boot, as the disk is a snapshot).
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
# No package lists: apt in the guest resolves against what is installed plus the local debs.
rm -rf "$root/var/lib/apt/lists/"* "$root/var/cache/apt/"*.bin "$root/var/cache/apt/archives/"*.deb

# The test runner: once the system is up, mount the payload disk /dev/vdb (the debs, the test
# and guest-runner.sh, which the host writes for every run, so the image need not change with
# them) and run its guest-runner.sh, which has its own time limit; power off either way.
mkdir -p "$root/mnt/ci"
cat >"$root/etc/systemd/system/framelink-ci.service" <<'EOF'
[Unit]
Description=framelink service test (payload disk /dev/vdb)
After=basic.target dbus.service systemd-user-sessions.service
Wants=dbus.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'mount -o ro /dev/vdb /mnt/ci && exec /bin/bash /mnt/ci/guest-runner.sh'
TimeoutStartSec=infinity
StandardOutput=journal+console
StandardError=journal+console
SuccessAction=poweroff
FailureAction=poweroff

[Install]
WantedBy=multi-user.target
EOF
ln -sf /etc/systemd/system/framelink-ci.service "$root/etc/systemd/system/multi-user.target.wants/framelink-ci.service"
# Nothing else runs: no timers (apt-daily would want the network), no getty on the console.
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
  serial-getty@ttyS0.service getty@tty1.service systemd-networkd-wait-online.service; do
  ln -sf /dev/null "$root/etc/systemd/system/$u"
done

unmount_under "$work"
# ---- the image: the tree's size plus room for the debs, logs and the journal
mb=$(du -sxm "$root" | cut -f1)
size=$((mb + 768))
echo "build-rootfs: tree ${mb} MiB -> ext4 image ${size} MiB"
truncate -s "${size}M" "$work/root.img"
mke2fs -q -t ext4 -L fl-guest-root -E root_owner=0:0 -d "$root" "$work/root.img"
chmod 0444 "$work/root.img"
mv -f "$work/root.img" "$image"
echo "build-rootfs: wrote $image"
