#!/usr/bin/env python3
"""Receive frames of a stream and persist each to a directory.

    ingestor.py --stream inspect --out /data/frames [--socket PATH] [--count N] [--verify] [--timeout S]

Each frame becomes <out>/<frame_id>.bin plus a metadata sidecar <out>/<frame_id>.json, both written
to a temporary name, fsynced and renamed, so a reader never sees a partial file. The payload goes
from the read-only shared-memory view straight to the file (no copy in Python). The frame is
released -- the producer's DELIVERED -- only after both files are in place.
With --verify, every payload is checked against the deterministic pattern of `framelink send`
(frame_pattern.h) before it is stored; a mismatch is reported and the ingestor exits 1.
"""

import argparse
import json
import os
import sys
import time

try:
    import framelink
except ImportError:  # not installed (pip install client/python): use the source tree next to this file
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
    import framelink

    print(f"ingestor: using framelink from the source tree ({framelink.__file__})", file=sys.stderr)


def write_atomically(path: str, data) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        view.release()
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)


def store(out_dir: str, frame: framelink.Frame) -> None:
    base = os.path.join(out_dir, str(frame.frame_id))
    payload = frame.buffer()
    write_atomically(base + ".bin", payload)
    payload.release()
    meta = {
        "frame_id": frame.frame_id,
        "group_id": frame.group_id,
        "timestamp_ns": frame.timestamp_ns,
        "length": frame.length,
        "sequence": frame.sequence,
        "attributes": frame.attributes.decode("utf-8", "backslashreplace"),
        "crc32c": frame.crc32c if frame.has_crc32c else None,
        "received_ns": time.time_ns(),
    }
    write_atomically(base + ".json", (json.dumps(meta, sort_keys=True) + "\n").encode())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stream", required=True)
    ap.add_argument("--out", required=True, help="directory for <frame_id>.bin and <frame_id>.json")
    ap.add_argument("--socket", help="framelinkd socket (default: $FRAMELINK_SOCKET or the system socket)")
    ap.add_argument("--count", type=int, default=0, help="frames to store before exiting (0: until Ctrl-C)")
    ap.add_argument("--verify", action="store_true", help="check payload, wafer id and attributes against the pattern")
    ap.add_argument("--timeout", type=float, default=0, help="give up after this many idle seconds (0: never)")
    ap.add_argument("--slots", type=int, default=0)
    ap.add_argument("--slot-size", type=int, default=0)
    ap.add_argument("--ready-file", help="create this file once attached")
    ap.add_argument("--pull", action="store_true",
                    help="have this host's daemon pull the stream's frames from other hosts (RDMA READ on rdma)")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    if a.verify:
        from framelink import pattern
    stored = bad = 0
    t0 = None
    with framelink.Consumer(a.stream, socket_path=a.socket, slot_count=a.slots, slot_size=a.slot_size,
                            pull=a.pull, client_name="ingestor") as consumer:
        if a.ready_file:
            open(a.ready_file, "w").close()
        try:
            while a.count == 0 or stored + bad < a.count:
                frame = consumer.receive(timeout=a.timeout or None)
                if frame is None:
                    print(f"ingestor: no frame within {a.timeout} s; stored {stored}", file=sys.stderr)
                    return 1
                t0 = t0 or time.monotonic()
                with frame:
                    if a.verify:
                        problems = []
                        at = pattern.mismatch(frame.frame_id, frame.buffer())
                        if at >= 0:
                            problems.append(f"payload differs at byte {at}")
                        if frame.group_id != pattern.wafer_of(frame.frame_id):
                            problems.append(f"group_id {frame.group_id}")
                        if frame.attributes != pattern.attributes(frame.frame_id):
                            problems.append(f"attributes {frame.attributes!r}")
                        if not 0 < frame.timestamp_ns <= time.time_ns():
                            problems.append(f"timestamp_ns {frame.timestamp_ns}")
                        if problems:
                            bad += 1
                            print(f"ingestor: frame {frame.frame_id}: " + "; ".join(problems), file=sys.stderr)
                            continue
                    store(a.out, frame)
                    stored += 1
        except KeyboardInterrupt:
            pass
    secs = time.monotonic() - t0 if t0 else 0.0
    print(json.dumps({"stored": stored, "bad": bad, "seconds": round(secs, 6)}))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
