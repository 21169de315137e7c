"""C# producer (examples/dotnet/InspectionProducer) -> framelinkd a -> tcp -> framelinkd b -> Python
ingestor (examples/python/ingestor.py), which checks every byte and field and stores every frame.

Needs FRAMELINK_BUILD_DIR (default <repo>/build) with framelinkd and libframelink, the framelink package
installed (not the source tree), and the C# example built: FRAMELINK_DOTNET_EXAMPLE names its
InspectionProducer.dll (scripts/test-clients.sh installs the wheel in a venv and builds the example).
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
# The daemons for tests (framelink_daemons.DaemonPair) live beside the client's tests, not in the package.
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))
BUILD = os.environ.get("FRAMELINK_BUILD_DIR") or os.path.join(ROOT, "build")
os.environ.setdefault("FRAMELINKD", os.path.join(BUILD, "proxy", "framelinkd"))
os.environ.setdefault("FRAMELINK_LIBRARY", os.path.join(BUILD, "client", "libframelink.so.0"))

import framelink  # noqa: E402
from framelink import pattern  # noqa: E402
from framelink_daemons import DaemonPair  # noqa: E402

assert os.path.abspath(framelink.__file__).startswith(sys.prefix + os.sep), (
    f"framelink was imported from {framelink.__file__}, not from an installed package under {sys.prefix}: "
    "install it (pip install client/python, or run scripts/test-clients.sh)")

EXAMPLE = os.environ.get("FRAMELINK_DOTNET_EXAMPLE") or os.path.join(
    ROOT, "examples", "dotnet", "InspectionProducer", "bin", "Release", "net10.0", "InspectionProducer.dll")
INGESTOR = os.path.join(ROOT, "examples", "python", "ingestor.py")
COUNT = 40
SIZE = 1 << 20


def counters(socket):
    """The daemon's counters, from `framelink stats --json`."""
    cli = os.path.join(BUILD, "client", "cli", "framelink")
    out = subprocess.run([cli, "stats", "--json", "--once", "--socket", socket],
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["counters"]


# Pushed (daemon a writes each frame into the ingestor's slot), or pulled (daemon b reads each frame
# a offers) because b lists the stream in pull_streams or because the ingestor attached with pull:
# the producer does not change.
@pytest.mark.parametrize("delivery", ["push", "pull", "pull-option"])
def test_csharp_producer_to_python_ingestor_through_two_daemons(tmp_path, delivery):
    if not os.path.exists(EXAMPLE):
        pytest.fail(f"{EXAMPLE} is missing: build it with "
                    "dotnet build examples/dotnet/InspectionProducer -c Release (scripts/test-clients.sh does)")
    out = tmp_path / "frames"
    ready = tmp_path / "ingestor.ready"
    env = dict(os.environ, DOTNET_CLI_TELEMETRY_OPTOUT="1", DOTNET_NOLOGO="1")
    with DaemonPair(extra_args=["--pull-stream", "inspect"] if delivery == "pull" else []) as pair:
        ingestor = subprocess.Popen(
            [sys.executable, INGESTOR, "--stream", "inspect", "--socket", pair.b.socket, "--out", str(out),
             "--count", str(COUNT), "--verify", "--timeout", "60", "--slots", "4", "--slot-size", str(SIZE),
             "--ready-file", str(ready)] + (["--pull"] if delivery == "pull-option" else []),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            for _ in range(1000):
                if ready.exists() or ingestor.poll() is not None:
                    break
                subprocess.run(["sleep", "0.01"])
            assert ready.exists(), ingestor.communicate()[1]
            producer = subprocess.run(
                ["dotnet", EXAMPLE, "--stream", "inspect", "--socket", pair.a.socket, "--count", str(COUNT),
                 "--size", "1M", "--slots", "4", "--json"],
                capture_output=True, text=True, timeout=120, env=env)
            ing_out, ing_err = ingestor.communicate(timeout=60)
            pulled = counters(pair.b.socket).get("frames_pulled")
        finally:
            if ingestor.poll() is None:
                ingestor.kill()
    assert producer.returncode == 0, producer.stdout + producer.stderr
    sent = json.loads(producer.stdout.strip().splitlines()[-1])
    assert sent["delivered"] == COUNT and sent["failed"] == 0
    assert pulled == (0 if delivery == "push" else COUNT)
    assert ingestor.returncode == 0, ing_err
    assert "framelink from the source tree" not in ing_err  # the ingestor used the installed package
    got = json.loads(ing_out.strip().splitlines()[-1])
    assert got == {"stored": COUNT, "bad": 0, "seconds": got["seconds"]}
    # What the ingestor stored is the frame, byte for byte, with its metadata next to it.
    names = sorted(os.listdir(out))
    assert names == sorted([f"{i}.bin" for i in range(COUNT)] + [f"{i}.json" for i in range(COUNT)])
    for i in (0, 1, COUNT // 2, COUNT - 1):
        data = (out / f"{i}.bin").read_bytes()
        assert len(data) == SIZE and pattern.mismatch(i, data) == -1
        meta = json.loads((out / f"{i}.json").read_text())
        assert (meta["frame_id"], meta["group_id"], meta["length"], meta["attributes"]) == (
            i, pattern.wafer_of(i), SIZE, pattern.attributes(i).decode())
        assert meta["timestamp_ns"] <= meta["received_ns"]
