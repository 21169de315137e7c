"""pytest fixtures: real framelinkd daemons from the build tree.

FRAMELINK_BUILD_DIR (default <repo>/build) names the build tree; FRAMELINKD and
FRAMELINK_LIBRARY, when set, override the daemon binary and the library.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
BUILD = os.environ.get("FRAMELINK_BUILD_DIR") or os.path.join(ROOT, "build")
os.environ.setdefault("FRAMELINKD", os.path.join(BUILD, "proxy", "framelinkd"))
os.environ.setdefault("FRAMELINK_LIBRARY", os.path.join(BUILD, "client", "libframelink.so.0"))
sys.path.insert(0, os.path.dirname(HERE))

from framelink.testing import DaemonPair  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    p = DaemonPair()
    yield p
    codes = p.stop()
    assert codes == [0, 0], f"daemons must exit 0 on SIGTERM, got {codes}"


@pytest.fixture
def stream(request):
    return "py-" + request.node.name.replace("[", "-").replace("]", "")[:50]
