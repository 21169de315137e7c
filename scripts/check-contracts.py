#!/usr/bin/python3
"""Facts written in more than one language, checked against their one source.

include/framelink/framelink.h is the source of each:

  * fl_status: every code has its line in client/libframelink/error.c's table ("FL_X: what
    happened"), and proto/framelink/v1/link.proto's ErrorCode (what a peer daemon sends) names
    only codes of fl_status, with their numbers (ERROR_CODE_X = N for FL_ERR_X = N).  The .NET
    and Python mirrors are checked by their own tests (AbiTests.cs, test_abi.py), against a C
    compiler's view of the header;
  * fl_client_options: the C++ wrapper (framelink.hpp) sets every field an application chooses;
  * FL_DEFAULT_SOCKET_PATH: no source outside framelink.h (tests aside) spells its path as a
    string literal.

debian/control is the source of the build dependencies: scripts/setup-deps.sh installs them from
there (apt-get build-dep), and its own list (the test and CI tools) repeats none of them.

  scripts/check-contracts.py     exit 0 when all hold, 1 naming each that does not
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
HEADER = ROOT / "include/framelink/framelink.h"
failures = []


def block(text, start, end):
    i = text.index(start)
    return text[i:text.index(end, i)]


def statuses(header):
    body = block(header, "typedef enum fl_status {", "} fl_status;")
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(FL_\w+)\s*=\s*(\d+)", body, re.M)}


def check_status_table(codes):
    table = (ROOT / "client/libframelink/error.c").read_text()
    for name in codes:
        if not re.search(r"\{%s,\s*\"%s: " % (name, name), table):
            failures.append(f"client/libframelink/error.c: {name} has no line \"{name}: ...\" in the status table")


def check_proto(codes):
    proto = (ROOT / "proto/framelink/v1/link.proto").read_text()
    body = block(proto, "enum ErrorCode {", "}")
    for m in re.finditer(r"ERROR_CODE_(\w+)\s*=\s*(\d+);", body):
        name, number = m.group(1), int(m.group(2))
        c_name = "FL_OK" if name == "OK" else "FL_ERR_" + name
        if c_name not in codes:
            failures.append(f"link.proto: ERROR_CODE_{name} = {number} has no {c_name} in framelink.h")
        elif codes[c_name] != number:
            failures.append(f"link.proto: ERROR_CODE_{name} = {number}, but {c_name} = {codes[c_name]}")


def check_cpp_options(header):
    body = block(header, "typedef struct fl_client_options {", "} fl_client_options;")
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    fields = re.findall(r"\b(\w+);", body)
    chosen_by_the_wrapper = {"struct_size", "role", "completion_size"}  # fl_client_options_init, the class
    wrapper = (ROOT / "include/framelink/framelink.hpp").read_text()
    for field in fields:
        if field not in chosen_by_the_wrapper and not re.search(r"\bo\.%s\s*=" % field, wrapper):
            failures.append(f"framelink.hpp: framelink::Options does not set fl_client_options.{field}")
    if len(fields) < 10:
        failures.append(f"framelink.h: read only {len(fields)} fields of fl_client_options: is the parse stale?")


def check_socket_path(header):
    m = re.search(r'#define FL_DEFAULT_SOCKET_PATH ("[^"]+")', header)
    if not m:
        failures.append("framelink.h: no #define FL_DEFAULT_SOCKET_PATH \"...\"")
        return
    literal = m.group(1)
    files = subprocess.run(["git", "ls-files", "--", "*.c", "*.h", "*.cpp", "*.hpp", "*.cs", "*.py"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if f.startswith("tests/") or "/tests/" in f or f == "include/framelink/framelink.h":
            continue
        for number, line in enumerate((ROOT / f).read_text(errors="replace").splitlines(), 1):
            if literal in line:
                failures.append(f"{f}:{number}: spells the default socket; use FL_DEFAULT_SOCKET_PATH")


def check_setup_deps():
    control = (ROOT / "debian/control").read_text()
    field = re.search(r"^Build-Depends:(.*?)^\S", control, re.S | re.M).group(1)
    build = {re.sub(r"\s*[(\[].*", "", dep).strip() for dep in field.split(",") if dep.strip()}
    script = (ROOT / "scripts/setup-deps.sh").read_text()
    listed = block(script, "\npackages=(", "\n)\n")
    words = set()
    for line in listed.splitlines()[1:]:
        words.update(line.split("#", 1)[0].split())
    for name in sorted(words & build):
        failures.append(f"scripts/setup-deps.sh: lists {name}, which debian/control's Build-Depends has already")
    if len(build) < 10 or len(words) < 10:
        failures.append(f"read {len(build)} build dependencies and {len(words)} tools: is the parse stale?")


def main():
    header = HEADER.read_text()
    codes = statuses(header)
    if len(codes) < 30:
        failures.append(f"framelink.h: read only {len(codes)} fl_status codes: is the parse stale?")
    check_status_table(codes)
    check_proto(codes)
    check_cpp_options(header)
    check_socket_path(header)
    check_setup_deps()
    for f in failures:
        print("check-contracts: " + f)
    if failures:
        return 1
    print(f"check-contracts: {len(codes)} status codes, the proto's ErrorCode, the C++ options and the "
          "default socket agree with framelink.h; setup-deps.sh repeats no build dependency")
    return 0


if __name__ == "__main__":
    sys.exit(main())
