"""pytest fixtures: real framelinkd daemons from the build tree, and the installed framelink package.

The tests import framelink as an application would: the installed package (scripts/test-clients.sh
builds the wheel and installs it into a venv), never the source tree next to them.
FRAMELINK_BUILD_DIR (default <repo>/build) names the build tree; FRAMELINKD and FRAMELINK_LIBRARY,
when set, override the daemon binary and the library (default: the build tree's).
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BUILD = os.environ.get("FRAMELINK_BUILD_DIR") or os.path.join(ROOT, "build")
os.environ.setdefault("FRAMELINKD", os.path.join(BUILD, "proxy", "framelinkd"))
os.environ.setdefault("FRAMELINK_LIBRARY", os.path.join(BUILD, "client", "libframelink.so.0"))

import framelink  # noqa: E402
from framelink_daemons import DaemonPair  # noqa: E402

INSTALLED = os.path.dirname(os.path.abspath(framelink.__file__))
SOURCE_PACKAGE = os.path.join(ROOT, "client", "python", "framelink")
assert INSTALLED != SOURCE_PACKAGE and INSTALLED.startswith(sys.prefix + os.sep), (
    f"framelink was imported from {INSTALLED}, not from an installed package under {sys.prefix}: "
    "install it (pip install client/python, or run scripts/test-clients.sh, which tests the wheel in a "
    "venv) and run pytest from a directory that has no framelink/ in it")


@pytest.fixture(scope="module")
def pair():
    p = DaemonPair()
    yield p
    codes = p.stop()
    assert codes == [0, 0], f"daemons must exit 0 on SIGTERM, got {codes}"


@pytest.fixture
def stream(request):
    return "py-" + request.node.name.replace("[", "-").replace("]", "")[:50]
