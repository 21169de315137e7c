"""What producer and consumer share over libframelink (see _producer.py, _consumer.py).

Frames live in shared memory that the daemon hands out.  A producer loan
(`Producer.acquire`) and a received frame (`Consumer.receive`) give Python
views of that memory without copying it.  Each loan or frame has its own
exporter object; every memoryview or numpy array made from it keeps that
exporter alive, so submit(), abandon() and release() can tell whether a view
is still around and refuse (BufferError) instead of handing memory back that
Python code can still reach.
"""

from __future__ import annotations

import asyncio
import ctypes
import enum
import gc
import os
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Set, TypeVar, Union

from . import _native
from ._native import lib

_T = TypeVar("_T")
_Self = TypeVar("_Self", bound="_Client")
# What a write() or crc32c() accepts: any object with the buffer protocol (bytes, bytearray,
# memoryview, array.array, a numpy array, ...).
Buffer = Any
# A numpy dtype or anything numpy.dtype() takes ("uint8", numpy.float32, ...).
DTypeLike = Any

# Blocking calls wait in slices of this many milliseconds, so that Ctrl-C
# (KeyboardInterrupt) is seen within a slice even if the C wait is not
# interrupted by the signal itself.
_WAIT_SLICE_MS = 100


class Status(enum.IntEnum):
    """fl_status from framelink.h, without the FL_ prefix."""

    OK = 0
    EAGAIN = 1
    ETIMEDOUT = 2
    EINVAL = 3
    EINTR = 4
    EBUSY = 5
    ERR_BAD_SLOT = 100
    ERR_SLOT_NOT_OWNED = 101
    ERR_TOO_LARGE = 102
    ERR_BAD_METADATA = 103
    ERR_BAD_DESCRIPTOR = 104
    ERR_DOUBLE_RELEASE = 105
    ERR_NO_CONSUMER = 106
    ERR_TIMEOUT = 107
    ERR_PEER_REJECTED = 108
    ERR_CRC_MISMATCH = 109
    ERR_NO_ROUTE = 110
    ERR_LINK_LOST = 111
    ERR_SHUTDOWN = 112
    ERR_NO_LINK = 113
    ERR_DAEMON_UNREACHABLE = 200
    ERR_ATTACH_REFUSED = 201
    ERR_QUOTA = 202
    ERR_VERSION = 203
    ERR_BAD_REQUEST = 204
    ERR_DAEMON_GONE = 205
    ERR_RESOURCES = 206
    ERR_RING_CORRUPT = 207
    ERR_LIMIT = 208
    ERR_AUTH = 300
    ERR_PEER_VERSION = 301
    ERR_PROTOCOL = 302
    ERR_UNKNOWN_STREAM = 303
    ERR_UNKNOWN_CREDIT = 304
    ERR_TRANSPORT = 400
    ERR_DEVICE = 401

    @classmethod
    def of(cls, code: int) -> Union["Status", int]:
        try:
            return cls(code)
        except ValueError:
            return code

    def describe(self) -> str:
        return lib.fl_status_str(int(self)).decode("utf-8", "replace")


class FrameLinkError(Exception):
    """A libframelink call failed; `status` is the fl_status, the message says what to do."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = Status.of(status)


class FrameLinkTimeout(FrameLinkError, TimeoutError):
    """A blocking call's timeout expired."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise _error(rc, what)


def _error(rc: int, what: str) -> FrameLinkError:
    detail = lib.fl_last_error().decode("utf-8", "replace")
    cls = FrameLinkTimeout if rc == Status.ETIMEDOUT else FrameLinkError
    return cls(rc, f"{what}: {detail}")


def _attrs_bytes(attributes: Union[bytes, bytearray, memoryview, str, None]) -> bytes:
    if attributes is None:
        return b""
    if isinstance(attributes, str):
        attributes = attributes.encode("utf-8")
    data = bytes(attributes)
    if len(data) > _native.MAX_ATTR_BYTES:
        raise ValueError(
            f"attributes are {len(data)} bytes, at most {_native.MAX_ATTR_BYTES} fit in a frame header; "
            "send larger metadata inside the payload"
        )
    return data


_array_types: Dict[int, Any] = {}


def _exporter(address: int, length: int) -> Any:
    """A fresh ctypes array over [address, address+length).

    A Python subclass so it can be weakly referenced: every buffer made from
    it (memoryview, numpy array, slices of those) holds a strong reference.
    """
    cls: Any = _array_types.get(length)
    if cls is None:
        cls = type("SlotMemory", (ctypes.c_uint8 * length,), {})
        if len(_array_types) < 64:
            _array_types[length] = cls
    return cls.from_address(address)


class _ViewGuard:
    """Owns one exporter and knows whether views of it are still alive."""

    __slots__ = ("_exporter", "_ref")

    def __init__(self, address: int, length: int):
        self._exporter = _exporter(address, length)
        self._ref = None

    def exporter(self) -> Any:
        if self._exporter is None:
            raise ValueError("this frame's memory was already handed back; views of it are no longer available")
        return self._exporter

    def retire(self, action: str) -> None:
        """Drop our reference; raise BufferError (and keep it) if any view still holds it."""
        exp = self._exporter
        if exp is None:
            return
        ref = weakref.ref(exp)
        self._exporter = exp = None
        if ref() is not None:
            gc.collect()  # views kept only by reference cycles
        alive = ref()
        if alive is not None:
            self._exporter = alive
            raise BufferError(
                f"cannot {action}: a memoryview or numpy array of this frame is still alive; "
                "delete it (del view) or copy what you need first, then call again"
            )

    @property
    def retired(self) -> bool:
        return self._exporter is None


@dataclass(frozen=True)
class ClientInfo:
    client_id: int
    slot_size: int
    slot_count: int
    role: int
    daemon_pid: int
    data_on_hugepages: bool
    generation: int = 0  # reattachments so far


@dataclass(frozen=True)
class Completion:
    """One per submitted frame: DELIVERED (status OK) or why it failed."""

    slot: int
    status: Union[Status, int]
    sequence: int
    frame_id: int
    length: int
    readers: int = 0  # the readers the frame was meant for, on every host
    released: int = 0  # of those, how many released it (all of them when delivered, but for `skipped`)

    @property
    def delivered(self) -> bool:
        return self.status == Status.OK

    @property
    def skipped(self) -> int:
        """Delivered: the subscribers of a drop stream skipped for this frame (each is told the gap)."""
        return self.readers - self.released if self.delivered else 0

    @property
    def reason(self) -> str:
        return lib.fl_status_str(int(self.status)).decode("utf-8", "replace")


class _Client:
    _role = 0
    _role_name = ""
    _subscribe = False
    _pull = False

    def __init__(
        self,
        stream: str,
        *,
        socket_path: Optional[str] = None,
        slot_count: int = 0,
        slot_size: int = 0,
        client_name: Optional[str] = None,
        auto_reattach: bool = True,
        attach_timeout_ms: int = 0,
        reattach_interval_ms: int = 0,
        wait_spin_us: int = 0,
    ):
        """auto_reattach (on by default, unless $FRAMELINK_AUTO_REATTACH is 0/off): when the daemon goes away,
        attach again by itself once it is back (libframelink's auto_reattach option, tried at most every
        reattach_interval_ms, 0: 200 ms); until then calls find no slot / no frame instead of raising
        ERR_DAEMON_GONE, so a daemon restart is a pause.  False: raise ERR_DAEMON_GONE and let the caller
        reattach().
        attach_timeout_ms: bounds connecting and the daemon's answer (0: 10 s); past it ERR_DAEMON_UNREACHABLE.
        wait_spin_us: how long a blocking or async call that finds nothing keeps looking before it sleeps,
        yielding the CPU between looks (0: $FRAMELINK_WAIT_SPIN_US when set, else what the daemon advises for
        its host -- its client_wait_spin_us --, else 20 us; -1: sleep at once; at most 1000000).  The resolved
        value is the wait_spin_us property."""
        if not isinstance(stream, str) or not stream:
            raise ValueError("stream must be a non-empty name, [A-Za-z0-9._-]{1,63}")
        opts = _native.ClientOptions()
        lib.fl_client_options_init_size(ctypes.byref(opts), ctypes.sizeof(opts))
        opts.completion_size = ctypes.sizeof(_native.CompletionStruct)  # the readers fields are filled
        opts.role = self._role
        # Keep the encoded strings alive for the call.
        self._keep = [stream.encode(), socket_path.encode() if socket_path else None,
                      client_name.encode() if client_name else None]
        opts.stream, opts.socket_path, opts.client_name = self._keep
        opts.slot_count = slot_count
        opts.slot_size = slot_size
        opts.attach_timeout_ms = attach_timeout_ms
        if not auto_reattach:
            opts.auto_reattach = 0  # else as fl_client_options_init_size set it: on unless the environment says off
        opts.reattach_interval_ms = reattach_interval_ms
        opts.subscribe = 1 if self._subscribe else 0
        opts.pull = 1 if self._pull else 0
        if wait_spin_us < -1:
            raise ValueError("wait_spin_us must be >= -1 (0: the default, -1: no spin)")
        opts.wait_spin_us = _native.WAIT_SPIN_OFF if wait_spin_us < 0 else wait_spin_us
        handle = ctypes.c_void_p()
        rc = lib.fl_attach(ctypes.byref(opts), ctypes.byref(handle))
        if rc != 0:
            raise _error(rc, f"cannot attach {self._role_name} to stream '{stream}'")
        self._h: Optional[ctypes.c_void_p] = handle
        self.stream = stream
        self.auto_reattach = bool(opts.auto_reattach)
        self._fd = lib.fl_doorbell_fd(self._h)
        self._waiters: Set["asyncio.Future[None]"] = set()
        self._doorbell_waits = 0  # how often an *_async call awaited the doorbell (the tests look)
        self._reader_loop: Optional[asyncio.AbstractEventLoop] = None

    @property
    def info(self) -> ClientInfo:
        """The current attachment (a reattach, by reattach() or auto_reattach, changes it)."""
        info = _native.ClientInfo()
        _check(lib.fl_client_get_info(self._handle(), ctypes.byref(info)), "fl_client_get_info")
        return ClientInfo(info.client_id, info.slot_size, info.slot_count, info.role, info.daemon_pid,
                          bool(info.data_on_hugepages), info.generation)

    @property
    def generation(self) -> int:
        """Reattachments so far; loans and frames belong to the generation they were made in."""
        return self.info.generation

    def reattach(self) -> None:
        """Attach again after the daemon restarted; nothing happens while the daemon still serves this client.

        Raises FrameLinkError (ERR_DAEMON_UNREACHABLE ...) while no daemon accepts: call again later.
        Afterwards loans and frames from before are void, a producer's frames that were in flight complete
        with ERR_DAEMON_GONE, and `info` describes the new attachment.  fileno() stays the same fd, watching
        the new attachment.
        """
        _check(lib.fl_reattach(self._handle()), f"cannot reattach to the daemon of stream '{self.stream}'")

    @property
    def slot_size(self) -> int:
        return self.info.slot_size

    @property
    def slot_count(self) -> int:
        return self.info.slot_count

    @property
    def wait_spin_us(self) -> int:
        """How long, in microseconds, a call that finds nothing looks again before it sleeps (0: not at all):
        the wait_spin_us argument, else $FRAMELINK_WAIT_SPIN_US, else the daemon's advice, else 20; after a
        reattach, the new daemon's.  The *_async calls spin on the event loop's thread before they await the
        doorbell, as the blocking calls do.  0 with a libframelink older than 0.2, which cannot say."""
        fn = getattr(lib, "fl_wait_spin_us", None)
        return 0 if fn is None else int(fn(self._handle()))

    def _spin(self, attempt: Callable[[], Optional[_T]]) -> Optional[_T]:
        """After a try found nothing: try again for wait_spin_us, yielding the CPU between tries, so that
        what comes meanwhile is taken without the daemon ringing the doorbell and the event loop waking up
        (most of a small frame's cost).  None when the spin ran out or is 0."""
        us = self.wait_spin_us
        if us <= 0:
            return None
        until = time.perf_counter_ns() + us * 1000
        while True:
            os.sched_yield()
            result = attempt()
            if result is not None:
                return result
            if time.perf_counter_ns() >= until:
                return None

    def _handle(self) -> ctypes.c_void_p:
        h = self._h
        if h is None:
            raise ValueError(f"this {self._role_name} is closed")
        return h

    def fileno(self) -> int:
        """The doorbell fd (fl_doorbell_fd): readable when a non-blocking call that found nothing may now
        succeed, and when the daemon goes away; the same fd across reattachments."""
        self._handle()
        return self._fd

    def check_daemon(self) -> None:
        """Raise FrameLinkError(ERR_DAEMON_GONE) when the daemon that served the attach is gone."""
        _check(lib.fl_check_daemon(self._handle()), "framelinkd")

    def close(self) -> None:
        """Detach.  Tasks waiting in an *_async call wake and raise ValueError (closed); the event loop stops
        watching the doorbell fd before it is closed."""
        h, self._h = self._h, None
        if h is None:
            return
        loop = self._reader_loop
        if loop is not None:
            try:
                on_loop = asyncio.get_running_loop() is loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                loop.remove_reader(self._fd)
                self._reader_loop = None
                self._ring()
            else:  # another thread: the waiters find the client closed when the loop runs them
                try:
                    loop.call_soon_threadsafe(self._ring)
                except RuntimeError:  # that loop is closed: nothing waits any more
                    pass
        lib.fl_detach(h)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            self.close()

    # --- waiting -------------------------------------------------------
    def _blocking(self, attempt: Callable[[int], Optional[_T]], timeout: Optional[float], what: str) -> Optional[_T]:
        """Call attempt(ms) in bounded slices until it returns non-None or the timeout expires."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while True:
            if deadline is None:
                ms = _WAIT_SLICE_MS
            else:
                left = deadline - time.monotonic()
                ms = 0 if left <= 0 else min(_WAIT_SLICE_MS, int(left * 1000) + 1)
            result = attempt(ms)  # KeyboardInterrupt surfaces right after this returns
            if result is not None:
                return result
            if deadline is not None and time.monotonic() >= deadline:
                return None

    async def _doorbell(self) -> None:
        """Wait until the doorbell fd is readable: work, or the daemon's loss (then the next call says so)."""
        loop = asyncio.get_running_loop()
        self._doorbell_waits += 1
        fut: "asyncio.Future[None]" = loop.create_future()
        if not self._waiters:
            loop.add_reader(self._fd, self._ring)
            self._reader_loop = loop
        self._waiters.add(fut)
        try:
            await fut
        finally:
            self._waiters.discard(fut)
            if not self._waiters and self._reader_loop is not None:
                self._reader_loop.remove_reader(self._fd)
                self._reader_loop = None

    def _ring(self) -> None:
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_result(None)


def version() -> str:
    return lib.fl_version().decode()


def crc32c(data: Buffer, seed: int = 0) -> int:
    """CRC32C (Castagnoli) as the daemon computes it."""
    mv = memoryview(data).cast("B")
    if mv.readonly:
        buf = ctypes.c_char_p(bytes(mv))
        return lib.fl_crc32c(seed, buf, mv.nbytes)
    arr = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return lib.fl_crc32c(seed, arr, mv.nbytes)
