"""The synthetic frame pattern of `framelink send/recv` (client/cli/frame_pattern.h), in numpy.

word i (8 bytes, little-endian) = splitmix64(frame_id * 0x9E3779B97F4A7C15 + i), the last
partial word truncated; group_id = frame_id // 25; attributes = b"frame=<id>;wafer=<wafer>".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

GOLDEN = 0x9E3779B97F4A7C15
FRAMES_PER_WAFER = 25
_M = (1 << 64) - 1


def wafer_of(frame_id: int) -> int:
    return frame_id // FRAMES_PER_WAFER


def attributes(frame_id: int) -> bytes:
    return f"frame={frame_id};wafer={wafer_of(frame_id)}".encode()


def payload(frame_id: int, length: int) -> npt.NDArray[np.uint8]:
    """The payload of `frame_id` as a uint8 array of `length` bytes."""
    words = (length + 7) // 8
    with np.errstate(over="ignore"):
        z = np.arange(words, dtype=np.uint64)
        z += np.uint64((frame_id * GOLDEN + GOLDEN) & _M)
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z.astype("<u8", copy=False).view(np.uint8)[:length]


def mismatch(frame_id: int, data: Any) -> int:
    """Index of the first byte of `data` that differs from the pattern, or -1."""
    got = np.frombuffer(data, dtype=np.uint8)
    want = payload(frame_id, got.size)
    diff = np.flatnonzero(got != want)
    return int(diff[0]) if diff.size else -1
