"""framelink: move large frames between hosts through the local framelinkd.

    import framelink
    with framelink.Producer("cam0") as p:
        with p.acquire() as loan:
            loan.ndarray((1024, 1024))[:] = image      # write in place: zero copies
            loan.submit(1024 * 1024, frame_id=42, group_id=1)
        done = p.wait_completions(timeout=30)          # done[0].delivered

A thin layer over libframelink (ctypes): views of shared memory, lifetime
checks, asyncio.  The protocol itself lives in the C library.
"""

# The package's version: project(framelink VERSION ...) in the top-level CMakeLists.txt, whose
# configure stops while this differs (pyproject.toml reads it from here); version() is the version
# of the libframelink that was loaded.
__version__ = "0.2.0"

from ._client import (
    ClientInfo,
    Completion,
    FrameLinkError,
    FrameLinkTimeout,
    Status,
    crc32c,
    version,
)
from ._consumer import Consumer, Frame
from ._producer import Loan, Producer

__all__ = [
    "__version__",
    "ClientInfo",
    "Completion",
    "Consumer",
    "Frame",
    "FrameLinkError",
    "FrameLinkTimeout",
    "Loan",
    "Producer",
    "Status",
    "crc32c",
    "version",
]
