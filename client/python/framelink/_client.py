"""Producer and consumer over libframelink.

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
import warnings
import weakref
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, AsyncIterator, Callable, Dict, Iterator, List, Optional, Sequence, Set,
                    TypeVar, Union)

from . import _native
from ._native import lib

if TYPE_CHECKING:
    import numpy.typing as npt

try:  # optional: numpy views and the GIL-free copy in write()
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is a Debian package here
    _np = None  # type: ignore[assignment]

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
# How often an asyncio waiter checks that the daemon is still there while
# the doorbell stays quiet (the doorbell does not ring when the daemon dies).
_LIVENESS_S = 1.0


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
    ERR_DAEMON_UNREACHABLE = 200
    ERR_ATTACH_REFUSED = 201
    ERR_QUOTA = 202
    ERR_VERSION = 203
    ERR_BAD_REQUEST = 204
    ERR_DAEMON_GONE = 205
    ERR_RESOURCES = 206
    ERR_RING_CORRUPT = 207
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

    @property
    def delivered(self) -> bool:
        return self.status == Status.OK

    @property
    def reason(self) -> str:
        return lib.fl_status_str(int(self.status)).decode("utf-8", "replace")


class _Client:
    _role = 0
    _role_name = ""

    def __init__(
        self,
        stream: str,
        *,
        socket_path: Optional[str] = None,
        slot_count: int = 0,
        slot_size: int = 0,
        client_name: Optional[str] = None,
        auto_reattach: bool = False,
        attach_timeout_ms: int = 0,
    ):
        """auto_reattach: when the daemon goes away, attach again by itself once it is back (see reattach());
        until then calls find no slot / no frame instead of raising ERR_DAEMON_GONE.
        attach_timeout_ms: bounds connecting and the daemon's answer (0: 10 s); past it ERR_DAEMON_UNREACHABLE."""
        if not isinstance(stream, str) or not stream:
            raise ValueError("stream must be a non-empty name, [A-Za-z0-9._-]{1,63}")
        opts = _native.ClientOptions()
        lib.fl_client_options_init(ctypes.byref(opts))
        opts.role = self._role
        # Keep the encoded strings alive for the call.
        self._keep = [stream.encode(), socket_path.encode() if socket_path else None,
                      client_name.encode() if client_name else None]
        opts.stream, opts.socket_path, opts.client_name = self._keep
        opts.slot_count = slot_count
        opts.slot_size = slot_size
        opts.attach_timeout_ms = attach_timeout_ms
        handle = ctypes.c_void_p()
        rc = lib.fl_attach(ctypes.byref(opts), ctypes.byref(handle))
        if rc != 0:
            raise _error(rc, f"cannot attach {self._role_name} to stream '{stream}'")
        self._h: Optional[ctypes.c_void_p] = handle
        self.stream = stream
        self.auto_reattach = auto_reattach
        self._read_info()
        self._fd = lib.fl_doorbell_fd(self._h)
        self._waiters: Set["asyncio.Future[None]"] = set()
        self._reader_loop: Optional[asyncio.AbstractEventLoop] = None

    def _read_info(self) -> None:
        info = _native.ClientInfo()
        _check(lib.fl_client_get_info(self._h, ctypes.byref(info)), "fl_client_get_info")
        self.info = ClientInfo(info.client_id, info.slot_size, info.slot_count, info.role, info.daemon_pid,
                               bool(info.data_on_hugepages), info.generation)

    @property
    def generation(self) -> int:
        """Reattachments so far; loans and frames belong to the generation they were made in."""
        return self.info.generation

    def reattach(self) -> None:
        """Attach again after the daemon restarted; nothing happens while the daemon still serves this client.

        Raises FrameLinkError (ERR_DAEMON_UNREACHABLE ...) while no daemon accepts: call again later.
        Afterwards loans and frames from before are void, a producer's frames that were in flight complete
        with ERR_DAEMON_GONE, and `info` describes the new attachment.  Call it from one thread while no
        other thread uses this client.
        """
        _check(lib.fl_reattach(self._handle()), f"cannot reattach to the daemon of stream '{self.stream}'")
        self._after_reattach()

    def _after_reattach(self) -> None:
        before = self.info.generation
        self._read_info()
        if self.info.generation != before and self._reader_loop is not None:
            # Same fd number, new file: the event loop's registration went with the old one.
            self._reader_loop.remove_reader(self._fd)
            self._reader_loop.add_reader(self._fd, self._ring)

    def _auto_reattached(self, rc: int) -> bool:
        """With auto_reattach, after a call failed with rc: True when attached again (retry the call)."""
        if not self.auto_reattach or rc != Status.ERR_DAEMON_GONE:
            return False
        if lib.fl_reattach(self._handle()) != 0:
            return False
        self._after_reattach()
        return True

    def _awaiting_daemon(self, rc: int, ms: int) -> bool:
        """With auto_reattach, a DAEMON_GONE not mended yet is "nothing now" (after sleeping ms)."""
        if not self.auto_reattach or rc != Status.ERR_DAEMON_GONE:
            return False
        if ms > 0:
            time.sleep(min(ms, _WAIT_SLICE_MS) / 1000)
        return True

    @property
    def slot_size(self) -> int:
        return self.info.slot_size

    @property
    def slot_count(self) -> int:
        return self.info.slot_count

    def _handle(self) -> ctypes.c_void_p:
        h = self._h
        if h is None:
            raise ValueError(f"this {self._role_name} is closed")
        return h

    def fileno(self) -> int:
        """The doorbell fd: readable when a non-blocking call that found nothing may now succeed."""
        self._handle()
        return self._fd

    def check_daemon(self) -> None:
        """Raise FrameLinkError(ERR_DAEMON_GONE) when the daemon that served the attach is gone."""
        _check(lib.fl_check_daemon(self._handle()), "framelinkd")

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            lib.fl_detach(h)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
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
        """Wait until the doorbell fd is readable (or a liveness interval passes)."""
        loop = asyncio.get_running_loop()
        fut: "asyncio.Future[None]" = loop.create_future()
        if not self._waiters:
            loop.add_reader(self._fd, self._ring)
            self._reader_loop = loop
        self._waiters.add(fut)
        try:
            done, _ = await asyncio.wait({fut}, timeout=_LIVENESS_S)
            if not done:
                rc = lib.fl_check_daemon(self._handle())
                if rc != 0 and not self._auto_reattached(rc) and not self.auto_reattach:
                    raise _error(rc, "framelinkd")
        finally:
            self._waiters.discard(fut)
            if not self._waiters and self._reader_loop is not None:
                self._reader_loop.remove_reader(self._fd)
                self._reader_loop = None

    def _ring(self) -> None:
        for fut in list(self._waiters):
            if not fut.done():
                fut.set_result(None)


class Loan:
    """A producer slot, held from acquire() until submit() or abandon().

    Write the payload through buffer()/ndarray() (zero copies) or write() (one
    copy), then submit().  Used as a context manager, a loan that was not
    submitted is abandoned on exit.
    """

    def __init__(self, producer: "Producer", slot: _native.Slot):
        self._producer = producer  # keeps the attachment (and the mapping) alive
        self._generation = producer.generation
        self.slot = slot.index
        self.capacity = slot.capacity
        self.address = slot.data
        self._guard = _ViewGuard(slot.data, slot.capacity)
        self._written = 0
        self._done = False

    def buffer(self) -> memoryview:
        """A writable memoryview of the whole slot (capacity bytes), no copy."""
        self._check_open()
        return memoryview(self._guard.exporter()).cast("B")

    def ndarray(self, shape: Union[int, Sequence[int], None] = None, dtype: DTypeLike = "uint8") -> npt.NDArray[Any]:
        """A writable numpy array over the slot, no copy; shape defaults to as many items as fit."""
        if _np is None:
            raise RuntimeError("numpy is not installed: apt-get install python3-numpy, or use buffer()")
        self._check_open()
        dt = _np.dtype(dtype)
        if shape is None:
            return _np.frombuffer(self._guard.exporter(), dtype=dt, count=self.capacity // dt.itemsize)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for s in shape:
            count *= s
        if count * dt.itemsize > self.capacity:
            raise ValueError(f"shape {shape} of {dt} needs {count * dt.itemsize} bytes, the slot holds {self.capacity}")
        return _np.frombuffer(self._guard.exporter(), dtype=dt, count=count).reshape(shape)

    def write(self, data: Buffer, offset: int = 0) -> int:
        """Copy `data` (any contiguous bytes-like or numpy array) into the slot at `offset`: exactly one copy.

        Returns the end offset, which submit() uses as the length unless told otherwise.
        """
        self._check_open()
        if _np is not None and isinstance(data, _np.ndarray):
            n = data.nbytes
            self._check_fits(offset, n)
            dst = _np.frombuffer(self._guard.exporter(), dtype=data.dtype, count=data.size,
                                 offset=offset).reshape(data.shape)
            _np.copyto(dst, data)  # releases the GIL
            del dst
        else:
            src = memoryview(data)
            if not src.c_contiguous:
                raise ValueError("write() needs a contiguous buffer; pass a numpy array for strided data")
            n = src.nbytes
            self._check_fits(offset, n)
            if _np is not None:
                dst = _np.frombuffer(self._guard.exporter(), dtype=_np.uint8, count=n, offset=offset)
                _np.copyto(dst, _np.frombuffer(src.cast("B"), dtype=_np.uint8))
                del dst
            else:
                memoryview(self._guard.exporter()).cast("B")[offset:offset + n] = src.cast("B")
            src.release()
        self._written = max(self._written, offset + n)
        return offset + n

    def submit(
        self,
        length: Optional[int] = None,
        *,
        frame_id: int,
        wafer_id: int = 0,
        timestamp_ns: Optional[int] = None,
        attributes: Union[bytes, str, None] = None,
        crc: bool = False,
    ) -> None:
        """Send the first `length` bytes (default: what write() wrote) with this metadata.

        Raises BufferError while a view of the slot is alive; the loan is then still held.
        """
        self._check_open()
        if length is None:
            if self._written == 0:
                raise ValueError("submit() needs length= when the payload was written through a view")
            length = self._written
        if not 0 <= length <= self.capacity:
            raise ValueError(f"length {length} is outside the slot (0..{self.capacity} bytes)")
        attrs = _attrs_bytes(attributes)
        self._check_current()
        self._guard.retire("submit the frame")
        h = self._producer._handle()
        meta = _native.FrameMeta(frame_id, wafer_id, time.time_ns() if timestamp_ns is None else timestamp_ns,
                                 _native.META_CRC32C if crc else 0, len(attrs), None)
        abuf = ctypes.create_string_buffer(attrs, len(attrs)) if attrs else None
        if abuf is not None:
            meta.attrs = ctypes.addressof(abuf)
        _check(lib.fl_set_meta(h, self.slot, ctypes.byref(meta)), f"cannot set the metadata of frame {frame_id}")
        _check(lib.fl_submit(h, self.slot, length), f"cannot submit frame {frame_id}")
        self._done = True

    def abandon(self) -> None:
        """Give the slot back without sending it (BufferError while a view is alive)."""
        if self._done:
            return
        self._guard.retire("abandon the loan")
        self._done = True
        h = self._producer._h
        if h is not None and self._generation == self._producer.generation:
            _check(lib.fl_abandon(h, self.slot), "fl_abandon")

    @property
    def submitted_or_abandoned(self) -> bool:
        return self._done

    def _check_open(self) -> None:
        if self._done:
            raise ValueError(f"slot {self.slot} was already submitted or abandoned; acquire a new loan")
        self._check_current()

    def _check_current(self) -> None:
        if self._generation != self._producer.generation:
            raise FrameLinkError(Status.ERR_DAEMON_GONE,
                                 f"slot {self.slot} belonged to the attachment before the producer reattached to a "
                                 "restarted daemon; acquire a new loan")

    def _check_fits(self, offset: int, n: int) -> None:
        if offset < 0 or offset + n > self.capacity:
            raise ValueError(f"{n} bytes at offset {offset} do not fit the slot ({self.capacity} bytes); "
                             "attach with a larger slot_size")

    def __enter__(self) -> "Loan":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: object) -> None:
        if self._done:
            return
        try:
            self.abandon()
        except BufferError:
            if exc_type is None:
                raise
            warnings.warn(f"slot {self.slot} stays held: a view of it outlived the failed block",
                          ResourceWarning, stacklevel=2)


class Producer(_Client):
    """Attach to the local framelinkd as the producer of `stream`."""

    _role = _native.PRODUCER
    _role_name = "producer"

    def __init__(self, stream: str, **kwargs: Any):
        super().__init__(stream, **kwargs)
        self._comps = (_native.CompletionStruct * 64)()
        self._count = ctypes.c_size_t()

    def _try_acquire(self, ms: int) -> Optional[Loan]:
        slot = _native.Slot()
        rc = lib.fl_acquire(self._handle(), ms, ctypes.byref(slot))
        if rc != 0 and self._auto_reattached(rc):
            rc = lib.fl_acquire(self._handle(), ms, ctypes.byref(slot))
        if rc == 0:
            return Loan(self, slot)
        if rc in (Status.EAGAIN, Status.ETIMEDOUT, Status.EINTR) or self._awaiting_daemon(rc, ms):
            return None
        raise _error(rc, "cannot acquire a slot")

    def try_acquire(self) -> Optional[Loan]:
        """A free slot now, or None."""
        return self._try_acquire(0)

    def acquire(self, timeout: Optional[float] = None) -> Loan:
        """Wait (GIL released, Ctrl-C honoured) for a free slot; FrameLinkTimeout after `timeout` seconds."""
        loan = self._blocking(self._try_acquire, timeout, "slot")
        if loan is None:
            raise FrameLinkTimeout(Status.ETIMEDOUT, f"no free slot within {timeout} s: every slot is held "
                                   "or in flight; poll completions or submit the loans you hold")
        return loan

    async def acquire_async(self) -> Loan:
        while True:
            loan = self._try_acquire(0)
            if loan is not None:
                return loan
            await self._doorbell()

    def _take(self, ms: Optional[int], max_count: int) -> Optional[List[Completion]]:
        max_count = max(1, min(max_count, len(self._comps)))

        def call(wait_ms: Optional[int]) -> int:
            if wait_ms is None:
                return lib.fl_poll_completions(self._handle(), self._comps, max_count, ctypes.byref(self._count))
            return lib.fl_wait_completions(self._handle(), self._comps, max_count, ctypes.byref(self._count),
                                           wait_ms)

        rc = call(ms)
        if rc != 0 and self._auto_reattached(rc):
            rc = call(None)
        if rc in (Status.EAGAIN, Status.ETIMEDOUT, Status.EINTR) or self._awaiting_daemon(rc, ms or 0):
            return None
        _check(rc, "cannot read completions")
        n = self._count.value
        if n == 0:
            return None
        return [Completion(c.slot, Status.of(c.status), c.sequence, c.frame_id, c.length) for c in self._comps[:n]]

    def poll_completions(self, max_count: int = 64) -> List[Completion]:
        """Completions available now (possibly none)."""
        return self._take(None, max_count) or []

    def wait_completions(self, timeout: Optional[float] = None, max_count: int = 64) -> List[Completion]:
        """At least one completion, or [] when `timeout` seconds pass first."""
        return self._blocking(lambda ms: self._take(ms, max_count), timeout, "completion") or []

    async def completions_async(self, max_count: int = 64) -> List[Completion]:
        """At least one completion, waiting on the doorbell in the running event loop."""
        while True:
            got = self._take(None, max_count)
            if got:
                return got
            await self._doorbell()

    async def completions(self) -> AsyncIterator[Completion]:
        """Every completion, forever (break out or cancel the task to stop)."""
        while True:
            for c in await self.completions_async():
                yield c

    @property
    def in_flight(self) -> int:
        n = ctypes.c_uint32()
        _check(lib.fl_in_flight(self._handle(), ctypes.byref(n)), "fl_in_flight")
        return n.value


class Frame:
    """A received frame in read-only shared memory, valid until release()."""

    def __init__(self, consumer: "Consumer", f: _native.FrameStruct):
        self._consumer = consumer
        self._generation = consumer.generation
        self.slot = f.slot
        self.sequence = f.sequence
        self.length = f.length
        self.frame_id = f.frame_id
        self.wafer_id = f.wafer_id
        self.timestamp_ns = f.timestamp_ns
        self.has_crc32c = bool(f.flags & _native.SLOT_HAS_CRC32C)
        # Sent again after the receiving daemon restarted: the consumer before it may have seen this frame.
        self.maybe_redelivered = bool(f.flags & _native.SLOT_MAYBE_REDELIVERED)
        self.crc32c = f.crc32c
        self.attributes = ctypes.string_at(f.attrs, f.attr_length) if f.attr_length else b""
        self.address = f.data
        self._guard = _ViewGuard(f.data, f.length) if f.length else None
        self._released = False

    def buffer(self) -> memoryview:
        """A read-only memoryview of the payload, no copy."""
        self._check_open()
        if self._guard is None:
            return memoryview(b"")
        return memoryview(self._guard.exporter()).cast("B").toreadonly()

    def ndarray(self, shape: Union[int, Sequence[int], None] = None, dtype: DTypeLike = "uint8") -> npt.NDArray[Any]:
        """A read-only numpy array over the payload, no copy."""
        if _np is None:
            raise RuntimeError("numpy is not installed: apt-get install python3-numpy, or use buffer()")
        dt = _np.dtype(dtype)
        arr = _np.frombuffer(self.buffer(), dtype=dt, count=self.length // dt.itemsize)
        return arr if shape is None else arr.reshape(shape)

    def release(self) -> None:
        """Hand the slot back: this is the ACK, the producer sees DELIVERED.

        Raises BufferError while a view of the payload is alive.
        """
        if self._released:
            return
        if self._guard is not None:
            self._guard.retire("release the frame")
        self._released = True
        if self._generation != self._consumer.generation:
            return  # its attachment, and the slot, are gone
        _check(lib.fl_release(self._consumer._handle(), self.slot), f"cannot release frame {self.frame_id}")

    @property
    def released(self) -> bool:
        return self._released

    def _check_open(self) -> None:
        if self._released:
            raise ValueError(f"frame {self.frame_id} was already released; its memory may hold another frame now")
        if self._generation != self._consumer.generation:
            raise FrameLinkError(Status.ERR_DAEMON_GONE,
                                 f"frame {self.frame_id} belonged to the attachment before the consumer reattached "
                                 "to a restarted daemon; its memory is gone")

    def __enter__(self) -> "Frame":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: object) -> None:
        if self._released:
            return
        try:
            self.release()
        except BufferError:
            if exc_type is None:
                raise
            warnings.warn(f"frame {self.frame_id} stays held: a view of it outlived the failed block",
                          ResourceWarning, stacklevel=2)


class Consumer(_Client):
    """Attach to the local framelinkd as the consumer of `stream`."""

    _role = _native.CONSUMER
    _role_name = "consumer"

    def _try_receive(self, ms: int) -> Optional[Frame]:
        f = _native.FrameStruct()
        rc = lib.fl_receive(self._handle(), ctypes.byref(f), ms)
        if rc != 0 and self._auto_reattached(rc):
            rc = lib.fl_receive(self._handle(), ctypes.byref(f), ms)
        if rc == 0:
            return Frame(self, f)
        if rc in (Status.EAGAIN, Status.ETIMEDOUT, Status.EINTR) or self._awaiting_daemon(rc, ms):
            return None
        raise _error(rc, "cannot receive a frame")

    def try_receive(self) -> Optional[Frame]:
        return self._try_receive(0)

    def receive(self, timeout: Optional[float] = None) -> Optional[Frame]:
        """The next frame, or None when `timeout` seconds pass first (GIL released, Ctrl-C honoured)."""
        return self._blocking(self._try_receive, timeout, "frame")

    async def receive_async(self) -> Frame:
        while True:
            frame = self._try_receive(0)
            if frame is not None:
                return frame
            await self._doorbell()

    async def frames(self) -> AsyncIterator[Frame]:
        """Every frame, forever; release each one."""
        while True:
            yield await self.receive_async()

    def __iter__(self) -> Iterator[Frame]:
        while True:
            frame = self.receive()  # no timeout: waits until there is one
            if frame is not None:
                yield frame


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
