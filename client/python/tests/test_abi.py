"""The ctypes declarations match include/framelink/framelink.h, as a C compiler sees it."""

import ctypes
import os
import re
import shutil
import subprocess

import pytest

from framelink import Status, _native

from conftest import ROOT

HEADER = os.path.join(ROOT, "include", "framelink", "framelink.h")
STRUCTS = {
    "fl_client_options": _native.ClientOptions,
    "fl_client_info": _native.ClientInfo,
    "fl_slot": _native.Slot,
    "fl_frame_meta": _native.FrameMeta,
    "fl_completion": _native.CompletionStruct,
    "fl_frame": _native.FrameStruct,
}

DEFINES = ["FL_WAIT_SPIN_OFF"]


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc): apt-get install build-essential")
    with open(HEADER) as f:
        names = re.findall(r"^\s*(FL_[A-Z0-9_]+)\s*=", f.read(), re.M)
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "framelink/framelink.h"', "int main(void) {"]
    for cname, cls in STRUCTS.items():
        lines.append(f'printf("size {cname} %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            lines.append(f'printf("offset {cname}.{field} %zu\\n", offsetof({cname}, {field}));')
    for n in names:
        lines.append(f'printf("enum {n} %d\\n", (int)({n}));')
    for n in DEFINES:
        lines.append(f'printf("define {n} %lld\\n", (long long)({n}));')
    lines += ["return 0; }"]
    d = tmp_path_factory.mktemp("abi")
    src, exe = d / "probe.c", d / "probe"
    src.write_text("\n".join(lines))
    subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return dict((k, int(v)) for k, v in (line.rsplit(" ", 1) for line in out.splitlines()))


@pytest.mark.parametrize("cname", sorted(STRUCTS))
def test_struct_layout_matches_header(c_layout, cname):
    cls = STRUCTS[cname]
    assert ctypes.sizeof(cls) == c_layout[f"size {cname}"]
    for field, _ in cls._fields_:
        assert getattr(cls, field).offset == c_layout[f"offset {cname}.{field}"], field


def test_every_status_in_header_is_known(c_layout):
    statuses = {k.split(" ")[1]: v for k, v in c_layout.items()
                if k.startswith("enum FL_") and not k.startswith(("enum FL_PRODUCER", "enum FL_CONSUMER",
                                                                   "enum FL_META_"))}
    assert len(statuses) > 30
    for cname, value in statuses.items():
        assert Status[cname[3:]] == value, cname
    assert len(Status) == len(statuses), "Status has members the header does not define"


def test_other_constants(c_layout):
    assert c_layout["enum FL_PRODUCER"] == _native.PRODUCER
    assert c_layout["enum FL_CONSUMER"] == _native.CONSUMER
    assert c_layout["enum FL_META_CRC32C"] == _native.META_CRC32C
    assert c_layout["define FL_WAIT_SPIN_OFF"] == _native.WAIT_SPIN_OFF
