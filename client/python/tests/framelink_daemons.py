"""Two real framelinkd processes on loopback for the tests and benchmarks (not part of the installed package).

    with DaemonPair() as pair:          # daemon "a" (producer side) dials daemon "b"
        Producer("s", socket_path=pair.a.socket) ...
        Consumer("s", socket_path=pair.b.socket) ...

The daemon binary is $FRAMELINKD, else `framelinkd` on PATH.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from typing import List, Optional


def daemon_binary() -> str:
    path = os.environ.get("FRAMELINKD") or shutil.which("framelinkd")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("framelinkd not found: set FRAMELINKD to the daemon binary "
                           "(e.g. build/proxy/framelinkd) or put it on PATH")
    return path


class Daemon:
    def __init__(self, directory: str, name: str, args: List[str], ready_timeout: float = 15.0):
        self.name = name
        self.socket = os.path.join(directory, name + ".sock")
        self.ready_file = os.path.join(directory, name + ".ready")
        self.log_file = os.path.join(directory, name + ".log")
        argv = [daemon_binary(), "--id", name, "--socket", self.socket, "--listen", "127.0.0.1:0",
                "--data-listen", "127.0.0.1:0", "--ready-file", self.ready_file] + args
        if os.path.exists(self.ready_file):  # from an earlier run under this name (a restart)
            os.unlink(self.ready_file)
        self._log = open(self.log_file, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + ready_timeout
        self.ready = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"framelinkd {name} exited with {self.proc.returncode} before it was ready:\n"
                                   + self.log())
            if os.path.exists(self.ready_file):
                with open(self.ready_file) as f:
                    kv = dict(line.strip().split("=", 1) for line in f if "=" in line)
                if kv.get("grpc_port"):
                    self.ready = kv
                    return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"framelinkd {name} did not write {self.ready_file} within {ready_timeout} s:\n"
                           + self.log())

    @property
    def grpc_port(self) -> int:
        return int(self.ready["grpc_port"])

    def log(self) -> str:
        try:
            with open(self.log_file, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """kill -9, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()

    def stop(self) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


class DaemonPair:
    """Daemon b, then daemon a with b as its only peer (so every stream of a goes to b)."""

    def __init__(self, transport: str = "tcp", extra_args: Optional[List[str]] = None, keep_dir: bool = False):
        self.dir = tempfile.mkdtemp(prefix="fl-py.")
        self.keep_dir = keep_dir
        token = secrets.token_hex(16)
        common = ["--transports", transport, "--token", token, "--log-level", "warn"] + (extra_args or [])
        self.a = None
        self.b = Daemon(self.dir, "b", common)
        self._args_a = common + ["--peer", f"b=127.0.0.1:{self.b.grpc_port}"]
        try:
            self.a = Daemon(self.dir, "a", self._args_a)
        except Exception:
            self.b.stop()
            raise

    def restart_a(self, extra_args: Optional[List[str]] = None) -> None:
        """Start a again (after a.kill()) with the same socket and arguments, and `extra_args` after them."""
        self.a = Daemon(self.dir, "a", self._args_a + (extra_args or []))

    def stop(self) -> List[Optional[int]]:
        codes = [d.stop() for d in (self.a, self.b) if d is not None]
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        return codes

    def __enter__(self) -> "DaemonPair":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
