"""The installed package: its version and metadata, and how it finds libframelink at run time."""

import ctypes.util
import importlib.metadata
import os
import re
import subprocess
import sys

import framelink

from conftest import INSTALLED, ROOT

LOADED_LIBRARY = r"""
import framelink
maps = [line.split()[-1] for line in open("/proc/self/maps") if "libframelink" in line]
print(maps[0])
"""


def project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(framelink VERSION ([0-9.]+)", f.read()).group(1)


def run_child(env_changes):
    env = {k: v for k, v in os.environ.items() if k not in ("FRAMELINK_LIBRARY", "LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", LOADED_LIBRARY], env=env, capture_output=True, text=True, timeout=60)


def test_installed_version_metadata_and_type_marker_match_the_project():
    assert framelink.__version__ == project_version()
    assert importlib.metadata.version("framelink") == project_version()
    files = [str(f) for f in importlib.metadata.files("framelink")]
    assert "framelink/py.typed" in files
    # The package is what an application needs: the daemons for tests stay beside the tests.
    assert not [f for f in files if "testing" in f or "daemons" in f], files
    assert os.path.isfile(os.path.join(INSTALLED, "py.typed"))


def test_the_library_is_the_one_framelink_library_names():
    r = run_child({"FRAMELINK_LIBRARY": os.environ["FRAMELINK_LIBRARY"]})
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(r.stdout.strip()) == os.path.realpath(os.environ["FRAMELINK_LIBRARY"])
    assert r.stderr == ""


def test_without_framelink_library_the_loader_finds_the_soname():
    # LD_LIBRARY_PATH stands in for the system's library directories (the ld.so cache) here.
    build_lib = os.path.dirname(os.environ["FRAMELINK_LIBRARY"])
    r = run_child({"LD_LIBRARY_PATH": build_lib})
    assert r.returncode == 0, r.stderr
    assert os.path.realpath(r.stdout.strip()) == os.path.realpath(os.environ["FRAMELINK_LIBRARY"])


def test_a_framelink_library_that_does_not_load_is_reported_before_the_fallback():
    build_lib = os.path.dirname(os.environ["FRAMELINK_LIBRARY"])
    r = run_child({"FRAMELINK_LIBRARY": "/nonexistent/libframelink.so.0", "LD_LIBRARY_PATH": build_lib})
    assert r.returncode == 0, r.stderr
    assert "RuntimeWarning" in r.stderr and "$FRAMELINK_LIBRARY=/nonexistent/libframelink.so.0" in r.stderr
    assert "using the system's libframelink.so.0 instead" in r.stderr


def test_when_nothing_loads_the_error_names_both_places():
    r = run_child({"FRAMELINK_LIBRARY": "/nonexistent/libframelink.so.0"})
    if ctypes.util.find_library("framelink"):  # installed system-wide (libframelink0): that one is taken
        assert r.returncode == 0, r.stderr
        assert "using the system's libframelink.so.0 instead" in r.stderr
    else:
        assert r.returncode != 0
        assert "ImportError: framelink: cannot load libframelink" in r.stderr
        assert "$FRAMELINK_LIBRARY=/nonexistent/libframelink.so.0" in r.stderr
        assert "the system's libframelink.so.0" in r.stderr and "apt install libframelink0" in r.stderr
    r = run_child({})
    if not ctypes.util.find_library("framelink"):
        assert "$FRAMELINK_LIBRARY: not set; the system's libframelink.so.0: " in r.stderr


def test_the_metadata_names_the_terms_and_carries_the_readme():
    meta = importlib.metadata.metadata("framelink").json
    assert meta["license"].startswith("Proprietary"), meta.get("license")
    assert "License :: Other/Proprietary License" in meta["classifier"]
    assert meta["description_content_type"] == "text/markdown"
    assert "apt install python3-framelink" in meta["description"]
    assert meta["author"] == "framelink maintainers"
