#!/usr/bin/env bash
# The house's size limits, checked over the tracked sources (git ls-files, so build trees and
# untracked files never count):
#
#   * a source file (*.c *.h *.cpp *.hpp *.cs *.py) has at most 600 lines;
#   * a function has at most 80 lines, from the line its definition starts on to the line of
#     its closing brace, both included (ctags' line and end fields). Counted are C and C++
#     functions and methods (ctags kind f), lambdas among them (ctags names them __anon...),
#     C# methods (kind m) and Python functions and methods (kinds f and m).
#
# Scope: the whole tree, tests/ included. Test helpers, fakes and fixtures are functions like any
# other; Catch2's TEST_CASE / SECTION bodies are macro invocations that ctags does not tag as
# functions, so they are counted only by the file limit (a lambda inside one is still counted).
#
# scripts/house-allow.txt lists what is exempt, one entry a line with its reason, and is meant
# for generated code only. Offenders are printed as `path:line: NNN lines (limit 600|80)`.
#
#   scripts/check-house.sh     exit 0 when the tree is within the limits, 1 when it is not
#
# Needs universal-ctags with JSON output (scripts/setup-deps.sh installs it) and /usr/bin/python3.
set -euo pipefail

cd "$(dirname "$0")/.."

file_limit=600
function_limit=80

if ! ctags --list-features 2>/dev/null | grep '^json' >/dev/null; then
  echo "check-house: needs universal-ctags with JSON output (scripts/setup-deps.sh installs it)" >&2
  exit 2
fi

mapfile -d '' files < <(git ls-files -z -- '*.c' '*.h' '*.cpp' '*.hpp' '*.cs' '*.py')

# The measuring and the report, in Python; it reads ctags' tags (JSON, one a line) on stdin.
read -r -d '' report <<'EOF' || true
import json
import sys

file_limit, function_limit, allow_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
files = sys.argv[4:]

# Allow-list entries: `path` (the whole file) or `path:name` (one function), then `#` and the
# reason. An entry without a reason is an error, so that none is added in passing.
allowed = set()
with open(allow_path, encoding="utf-8") as allow:
    for number, raw in enumerate(allow, 1):
        entry, _, reason = raw.partition("#")
        entry = entry.strip()
        if not entry:
            continue
        if not reason.strip():
            sys.exit(f"{allow_path}:{number}: '{entry}' has no reason (write it after a '#')")
        allowed.add(entry)

long_files = []
for path in files:
    if path in allowed:
        continue
    with open(path, "rb") as source:
        lines = source.read().count(b"\n")
    if lines > file_limit:
        long_files.append((path, 1, lines))

long_functions = []
for line in sys.stdin:
    tag = json.loads(line)
    if tag.get("_type") != "tag" or "end" not in tag:
        continue
    path, name = tag["path"], tag["name"]
    if path in allowed or f"{path}:{name}" in allowed:
        continue
    lines = tag["end"] - tag["line"] + 1
    if lines > function_limit:
        scope = tag.get("scope")
        shown = "a lambda" if name.startswith("__anon") else name
        if scope and not scope.startswith("__anon"):
            shown = f"{scope}::{shown}" if not name.startswith("__anon") else f"{shown} in {scope}"
        long_functions.append((path, tag["line"], lines, shown))

for path, first, lines in sorted(long_files):
    print(f"{path}:{first}: {lines} lines (limit {file_limit})")
for path, first, lines, shown in sorted(long_functions):
    print(f"{path}:{first}: {lines} lines (limit {function_limit}) {shown}")

if long_files or long_functions:
    print(f"HOUSE FAILED: {len(long_files)} files over {file_limit} lines, "
          f"{len(long_functions)} functions over {function_limit} lines")
    sys.exit(1)
print(f"HOUSE PASSED: {len(files)} files within {file_limit} lines, "
      f"every function within {function_limit} lines")
EOF

# ctags reads the file list on stdin; .h files are read as C++ (ctags' default map), which also
# parses the C headers.
printf '%s\n' "${files[@]}" |
  ctags -L - --fields=+ne --output-format=json -o - --kinds-C=f --kinds-C++=f --kinds-C#=m \
    --kinds-Python=fm |
  /usr/bin/python3 -c "$report" "$file_limit" "$function_limit" scripts/house-allow.txt "${files[@]}"
