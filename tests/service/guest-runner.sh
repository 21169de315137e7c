#!/bin/bash
# Inside the service-test guest, from the payload disk (mounted at /mnt/ci by
# framelink-ci.service once the system is up):
# runs guest-test.sh with a time limit and sends its output and exit status to the second serial
# port, which is the host's result file; then powers the guest off (the host stops QEMU itself
# if that takes too long).
out=/dev/ttyS1
stty -F "$out" raw -echo 2>/dev/null
say() { echo "$*" >"$out"; echo "$*"; }

limit=$(cat /mnt/ci/timeout 2>/dev/null || echo 600)
say "guest-runner: system up after $(cut -d' ' -f1 /proc/uptime) s of uptime; running the test (limit ${limit} s)"
timeout --kill-after=10 "$limit" bash /mnt/ci/guest-test.sh /mnt/ci 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
sync
say "FRAMELINK-GUEST-RC=$rc"
systemctl poweroff --no-block
exit 0
