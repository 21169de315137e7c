"""The consumer side: received frames in read-only shared memory, release."""

from __future__ import annotations

import ctypes
import warnings
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Optional, Sequence, Union

from . import _native
from ._client import DTypeLike, FrameLinkError, Status, _check, _Client, _error, _ViewGuard
from ._native import lib

if TYPE_CHECKING:
    import numpy.typing as npt

try:  # optional: numpy views
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is a Debian package here
    _np = None  # type: ignore[assignment]


class Frame:
    """A received frame in read-only shared memory, valid until release()."""

    def __init__(self, consumer: "Consumer", f: _native.FrameStruct):
        self._consumer = consumer
        self._generation = consumer.generation
        self.slot = f.slot
        self.sequence = f.sequence
        self.length = f.length
        self.frame_id = f.frame_id
        self.group_id = f.group_id
        self.timestamp_ns = f.timestamp_ns
        self.has_crc32c = bool(f.flags & _native.SLOT_HAS_CRC32C)
        # Sent again after the receiving daemon restarted: the consumer before it may have seen this frame.
        self.maybe_redelivered = bool(f.flags & _native.SLOT_MAYBE_REDELIVERED)
        # A subscriber: a member of the stream's queue group on another host got this frame.
        self.group_elsewhere = bool(f.flags & _native.SLOT_GROUP_ELSEWHERE)
        # A subscriber of a drop stream: the frames it missed just before this one (it was too far behind).
        self.gap = lib.fl_frame_gap(consumer._handle(), f.slot) if f.flags & _native.SLOT_GAP else 0
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
    """Attach to the local framelinkd as the consumer of `stream`.

    subscribe=True: get every frame of the stream; False (the default): join the stream's queue group, whose
    members share the frames (each frame to one of them).  A frame of a producer on the same host is not
    copied either way: its data is the producer's slot, read-only.

    pull=True: frames of the stream from other hosts are pulled to this host while this consumer is
    attached (the sender offers each, this host's daemon reads it when a slot is free: RDMA READ on rdma),
    as if the daemon's pull_streams listed the stream; False (the default): as the daemon is configured."""

    _role = _native.CONSUMER
    _role_name = "consumer"

    def __init__(self, stream: str, *, subscribe: bool = False, pull: bool = False, **options: Any):
        self._subscribe = bool(subscribe)
        self._pull = bool(pull)
        super().__init__(stream, **options)

    def _try_receive(self, ms: int) -> Optional[Frame]:
        f = _native.FrameStruct()
        rc = lib.fl_receive(self._handle(), ctypes.byref(f), ms)
        if rc == 0:
            return Frame(self, f)
        if rc in (Status.EAGAIN, Status.ETIMEDOUT, Status.EINTR):  # with auto_reattach: also "daemon not back"
            return None
        raise _error(rc, "cannot receive a frame")

    def try_receive(self) -> Optional[Frame]:
        return self._try_receive(0)

    def receive(self, timeout: Optional[float] = None) -> Optional[Frame]:
        """The next frame, or None when `timeout` seconds pass first (GIL released, Ctrl-C honoured)."""
        return self._blocking(self._try_receive, timeout, "frame")

    async def receive_async(self) -> Frame:
        """The next frame: one there, or one that comes within wait_spin_us, without awaiting; else the
        doorbell is awaited in the running event loop."""
        frame = self._try_receive(0)
        if frame is None:
            frame = self._spin(lambda: self._try_receive(0))
        while frame is None:
            await self._doorbell()
            frame = self._try_receive(0)
        return frame

    async def frames(self) -> AsyncIterator[Frame]:
        """Every frame, forever; release each one."""
        while True:
            yield await self.receive_async()

    def __iter__(self) -> Iterator[Frame]:
        while True:
            frame = self.receive()  # no timeout: waits until there is one
            if frame is not None:
                yield frame
