#!/usr/bin/env python3
"""Throughput of the C, C# and Python producers through the same two daemons, in one run.

For each frame size, each producer sends the same number of frames with the same slot count to a
`framelink recv` consumer on the other daemon (tcp on loopback). Every producer writes the whole
frame each time: C fills the pattern (`framelink send`), C# copies a rendered image into the
lease's Span (InspectionProducer --copy), Python copies one into the loan's numpy view. Printed:
frames/s, GB/s and the ratio to the C client. A measurement, not a test.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The daemons for tests (framelink_daemons.DaemonPair) live beside the client's tests, not in the package.
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
BUILD = os.environ.get("FRAMELINK_BUILD_DIR") or os.path.join(ROOT, "build")
os.environ.setdefault("FRAMELINKD", os.path.join(BUILD, "proxy", "framelinkd"))
os.environ.setdefault("FRAMELINK_LIBRARY", os.path.join(BUILD, "client", "libframelink.so.0"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

CLI = os.path.join(BUILD, "client", "cli", "framelink")
CSHARP = os.environ.get("FRAMELINK_DOTNET_EXAMPLE") or os.path.join(
    ROOT, "examples", "dotnet", "InspectionProducer", "bin", "Release", "net10.0", "InspectionProducer.dll")


def python_producer(socket, stream, count, size, slots):
    import numpy as np

    import framelink
    from framelink import pattern

    image = pattern.payload(0, size)
    attrs = [pattern.attributes(i) for i in range(min(count, 1000))]
    delivered = failed = nbytes = submitted = 0
    with framelink.Producer(stream, socket_path=socket, slot_count=slots, slot_size=size) as p:
        t0 = time.monotonic()
        while submitted < count:
            loan = p.acquire(timeout=60)
            view = loan.ndarray(size)
            np.copyto(view, image)  # the frame is written through the numpy view
            del view
            loan.submit(size, frame_id=submitted, group_id=submitted // 25, attributes=attrs[submitted % len(attrs)])
            submitted += 1
            for c in p.poll_completions():
                delivered += c.delivered
                failed += not c.delivered
                nbytes += c.length if c.delivered else 0
        while delivered + failed < submitted:
            for c in p.wait_completions(timeout=60) or []:
                delivered += c.delivered
                failed += not c.delivered
                nbytes += c.length if c.delivered else 0
        secs = time.monotonic() - t0
    print(json.dumps({"delivered": delivered, "failed": failed, "gb_per_s": nbytes / secs / 1e9,
                      "frames_per_s": delivered / secs}))


_case = 0


def run_case(pair, client, size, count, slots):
    global _case
    _case += 1
    stream = f"bench-{client.lower().replace('#', 'sharp')}-{size}-{_case}"
    consumer = subprocess.Popen([CLI, "recv", "--socket", pair.b.socket, "--stream", stream, "--count", str(count),
                                 "--slots", str(slots), "--slot-size", str(size), "--quiet"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(0.3)  # attached before the producer starts
    common = ["--socket", pair.a.socket, "--stream", stream, "--count", str(count), "--slots", str(slots)]
    if client == "C":
        cmd = [CLI, "send", *common, "--size", str(size), "--json"]
    elif client == "C#":
        cmd = ["dotnet", CSHARP, *common, "--size", str(size), "--copy", "--json"]
    else:
        cmd = [sys.executable, __file__, "--produce", pair.a.socket, stream, str(count), str(size), str(slots)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    try:
        consumer.wait(60)
    except subprocess.TimeoutExpired:
        consumer.kill()
    if r.returncode != 0:
        raise RuntimeError(f"{client} producer failed ({r.returncode}): {r.stdout}{r.stderr}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if res["delivered"] != count:
        raise RuntimeError(f"{client}: {res['delivered']} of {count} frames delivered")
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--produce":
        socket, stream, count, size, slots = sys.argv[2:7]
        python_producer(socket, stream, int(count), int(size), int(slots))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,4M")
    ap.add_argument("--bytes", default="1G", help="bytes per case (frames = bytes / size)")
    ap.add_argument("--rounds", type=int, default=2, help="runs per case, interleaved; the best is reported")
    ap.add_argument("--slots", type=int, default=8)
    a = ap.parse_args()

    def parse(s):
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
        return int(s[:-1] if mult > 1 else s) * mult

    from framelink_daemons import DaemonPair

    rows = []
    with DaemonPair() as pair:
        run_case(pair, "C", 1 << 20, 64, a.slots)  # warm-up: the peer link and the first credits
        for label in a.sizes.split(","):
            size = parse(label)
            count = max(50, parse(a.bytes) // size)
            res = {}
            for _ in range(max(1, a.rounds)):
                for c in ("C", "C#", "Python"):
                    r = run_case(pair, c, size, count, a.slots)
                    if c not in res or r["gb_per_s"] > res[c]["gb_per_s"]:
                        res[c] = r
            rows.append((label, count, res))
            c = res["C"]
            print(f"{label}: " + ", ".join(f"{k} {v['gb_per_s']:.2f} GB/s" for k, v in res.items()), flush=True)
    print()
    print(f"| frame | client | frames/s | GB/s | ratio to C |")
    print(f"|---|---|---|---|---|")
    for label, count, res in rows:
        base = res["C"]["gb_per_s"]
        for client, v in res.items():
            print(f"| {label} ({count} frames) | {client} | {v['frames_per_s']:.0f} | {v['gb_per_s']:.2f} | "
                  f"{v['gb_per_s'] / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
