"""The producer side: loans of slots in shared memory, submit, completions."""

from __future__ import annotations

import ctypes
import time
import warnings
from typing import TYPE_CHECKING, Any, AsyncIterator, List, Optional, Sequence, Union

from . import _native
from ._client import (Buffer, Completion, DTypeLike, FrameLinkError, FrameLinkTimeout, Status, _check, _Client,
                      _error, _ViewGuard, _attrs_bytes)
from ._native import lib

if TYPE_CHECKING:
    import numpy.typing as npt

try:  # optional: numpy views and the GIL-free copy in write()
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is a Debian package here
    _np = None  # type: ignore[assignment]


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
        group_id: int = 0,
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
        meta = _native.FrameMeta(frame_id, group_id, time.time_ns() if timestamp_ns is None else timestamp_ns,
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
        if rc == 0:
            return Loan(self, slot)
        if rc in (Status.EAGAIN, Status.ETIMEDOUT, Status.EINTR):  # with auto_reattach: also "daemon not back"
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
        """A free slot: one free now, or one that frees within wait_spin_us, without awaiting; else the
        doorbell is awaited in the running event loop."""
        loan = self._try_acquire(0)
        if loan is None:
            loan = self._spin(lambda: self._try_acquire(0))
        while loan is None:
            await self._doorbell()
            loan = self._try_acquire(0)
        return loan

    def _take(self, ms: Optional[int], max_count: int) -> Optional[List[Completion]]:
        max_count = max(1, min(max_count, len(self._comps)))

        def call(wait_ms: Optional[int]) -> int:
            if wait_ms is None:
                return lib.fl_poll_completions(self._handle(), self._comps, max_count, ctypes.byref(self._count))
            return lib.fl_wait_completions(self._handle(), self._comps, max_count, ctypes.byref(self._count),
                                           wait_ms)

        rc = call(ms)
        if rc in (Status.EAGAIN, Status.ETIMEDOUT, Status.EINTR):
            return None
        _check(rc, "cannot read completions")
        n = self._count.value
        if n == 0:
            return None
        return [
            Completion(c.slot, Status.of(c.status), c.sequence, c.frame_id, c.length, c.readers, c.released)
            for c in self._comps[:n]
        ]

    def poll_completions(self, max_count: int = 64) -> List[Completion]:
        """Completions available now (possibly none)."""
        return self._take(None, max_count) or []

    def wait_completions(self, timeout: Optional[float] = None, max_count: int = 64) -> List[Completion]:
        """At least one completion, or [] when `timeout` seconds pass first."""
        return self._blocking(lambda ms: self._take(ms, max_count), timeout, "completion") or []

    async def completions_async(self, max_count: int = 64) -> List[Completion]:
        """At least one completion: those there, or those that come within wait_spin_us, without awaiting;
        else the doorbell is awaited in the running event loop."""
        got = self._take(None, max_count)  # None when there are none
        if got is None:
            got = self._spin(lambda: self._take(None, max_count))
        while got is None:
            await self._doorbell()
            got = self._take(None, max_count)
        return got

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
