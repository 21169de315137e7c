"""ctypes declarations of libframelink's C ABI (include/framelink/framelink.h).

Nothing here knows the shared-memory protocol: every ring index, atomic and
system call stays in the C library.  This module only loads it and declares
the fl_* functions and structs, which tests/test_abi.py checks against the
header with a C compiler.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from ctypes import POINTER, c_char_p, c_int, c_int32, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p
from typing import List, Tuple

SONAME = "libframelink.so.0"
MAX_ATTR_BYTES = 192
META_CRC32C = 1
SLOT_HAS_CRC32C = 1
SLOT_MAYBE_REDELIVERED = 2
SLOT_GAP = 8
SLOT_GROUP_ELSEWHERE = 16
PRODUCER = 1
CONSUMER = 2
WAIT_SPIN_OFF = 0xFFFFFFFF  # FL_WAIT_SPIN_OFF


class ClientOptions(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("role", c_uint32),
        ("socket_path", c_char_p),
        ("stream", c_char_p),
        ("client_name", c_char_p),
        ("slot_count", c_uint32),
        ("attach_timeout_ms", c_uint32),
        ("slot_size", c_uint64),
        ("auto_reattach", c_uint32),
        ("reattach_interval_ms", c_uint32),
        ("subscribe", c_uint32),
        ("completion_size", c_uint32),
        ("pull", c_uint32),
        ("wait_spin_us", c_uint32),
    ]


class ClientInfo(ctypes.Structure):
    _fields_ = [
        ("client_id", c_uint64),
        ("slot_size", c_uint64),
        ("slot_count", c_uint32),
        ("role", c_uint32),
        ("daemon_pid", c_uint64),
        ("daemon_start_ns", c_uint64),
        ("data_on_hugepages", c_uint32),
        ("generation", c_uint32),
    ]


class Slot(ctypes.Structure):
    _fields_ = [
        ("index", c_uint32),
        ("reserved", c_uint32),
        ("data", c_void_p),
        ("capacity", c_uint64),
    ]


class FrameMeta(ctypes.Structure):
    _fields_ = [
        ("frame_id", c_uint64),
        ("group_id", c_uint64),
        ("timestamp_ns", c_uint64),
        ("flags", c_uint32),
        ("attr_length", c_uint32),
        ("attrs", c_void_p),
    ]


class CompletionStruct(ctypes.Structure):
    _fields_ = [
        ("slot", c_uint32),
        ("status", c_int32),
        ("sequence", c_uint64),
        ("frame_id", c_uint64),
        ("length", c_uint64),
        ("readers", c_uint32),
        ("released", c_uint32),
    ]


class FrameStruct(ctypes.Structure):
    _fields_ = [
        ("slot", c_uint32),
        ("flags", c_uint32),
        ("sequence", c_uint64),
        ("data", c_void_p),
        ("length", c_uint64),
        ("frame_id", c_uint64),
        ("group_id", c_uint64),
        ("timestamp_ns", c_uint64),
        ("crc32c", c_uint32),
        ("attr_length", c_uint32),
        ("attrs", c_void_p),
    ]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    h = c_void_p  # fl_client*
    sig = {
        "fl_version": (c_char_p, []),
        "fl_last_error": (c_char_p, []),
        "fl_status_str": (c_char_p, [c_int]),
        "fl_client_options_init_size": (None, [POINTER(ClientOptions), c_size_t]),
        "fl_attach": (c_int, [POINTER(ClientOptions), POINTER(c_void_p)]),
        "fl_detach": (None, [h]),
        "fl_client_get_info": (c_int, [h, POINTER(ClientInfo)]),
        "fl_check_daemon": (c_int, [h]),
        "fl_reattach": (c_int, [h]),
        "fl_doorbell_fd": (c_int, [h]),
        "fl_acquire": (c_int, [h, c_int, POINTER(Slot)]),
        "fl_set_meta": (c_int, [h, c_uint32, POINTER(FrameMeta)]),
        "fl_submit": (c_int, [h, c_uint32, c_uint64]),
        "fl_abandon": (c_int, [h, c_uint32]),
        "fl_poll_completions": (c_int, [h, POINTER(CompletionStruct), c_size_t, POINTER(c_size_t)]),
        "fl_wait_completions": (c_int, [h, POINTER(CompletionStruct), c_size_t, POINTER(c_size_t), c_int]),
        "fl_in_flight": (c_int, [h, POINTER(c_uint32)]),
        "fl_receive": (c_int, [h, POINTER(FrameStruct), c_int]),
        "fl_release": (c_int, [h, c_uint32]),
        "fl_frame_gap": (c_uint32, [h, c_uint32]),
        "fl_crc32c": (c_uint32, [c_uint32, c_void_p, c_size_t]),
    }
    # Functions a library older than this package may lack (fl_wait_spin_us: 0.2): declared when present.
    optional = {
        "fl_wait_spin_us": (c_uint32, [h]),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    for name, (restype, argtypes) in optional.items():
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes
    return lib


def _load() -> ctypes.CDLL:
    """$FRAMELINK_LIBRARY when set, then the system's libframelink.so.0 (the dynamic loader's search:
    LD_LIBRARY_PATH, then the ld.so cache, where the libframelink0 package puts it)."""
    tried: List[str] = []
    candidates: List[Tuple[str, str]] = []
    env = os.environ.get("FRAMELINK_LIBRARY")
    if env:
        candidates.append(("$FRAMELINK_LIBRARY=" + env, env))
    candidates.append(("the system's " + SONAME, SONAME))
    for label, path in candidates:
        try:
            # CDLL (not PyDLL): every call releases the GIL while it runs.
            loaded = _declare(ctypes.CDLL(path))
        except OSError as e:
            tried.append(f"{label}: {e}")
            continue
        if tried:  # $FRAMELINK_LIBRARY was set and did not load: say so rather than hide it
            warnings.warn(f"framelink: {tried[0]}; using {label} instead", RuntimeWarning, stacklevel=2)
        return loaded
    if not env:
        tried.insert(0, "$FRAMELINK_LIBRARY: not set")
    raise ImportError(
        "framelink: cannot load libframelink; tried " + "; ".join(tried) + ". Install the system library "
        "(apt install libframelink0: the package that provides " + SONAME + ") or set FRAMELINK_LIBRARY "
        "to the path of " + SONAME + " (in a build tree: build/client/" + SONAME + ")"
    )


lib = _load()
