#!/usr/bin/env bash
# libframelink's ABI against the last release's, with libabigail's abidiff (Debian's abigail-tools),
# as distributions guard a soname: a change that breaks applications built against the release
# (a function removed, a struct's layout or a parameter changed) fails unless the soname changed
# with it.  Additions are compatible: they are listed, and debian/libframelink0.symbols must give
# each new symbol the version it first appears in (dpkg-gensymbols -c4 checks that).
#
#   scripts/check-abi.sh LIBRARY [BASELINE]   compare LIBRARY (built with debug info) with BASELINE
#                                             (default client/abi/libframelink.so.0.abi)
#   scripts/check-abi.sh --dump LIBRARY OUT   write LIBRARY's ABI to OUT: at a release, the new baseline
#   scripts/check-abi.sh --self-test LIBRARY  prove the verdicts on LIBRARY: its own ABI is unchanged,
#                                             and the same ABI without fl_release is an incompatible change
#
# Only what include/framelink/ declares counts (--headers-dir, --drop-private-types).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
headers=$root/include/framelink
usage() { sed -n '2,13s/^# \{0,1\}//p' "$0"; }
command -v abidiff >/dev/null && command -v abidw >/dev/null || {
  echo "check-abi: abidiff and abidw are missing: apt-get install abigail-tools (scripts/setup-deps.sh)" >&2
  exit 2
}

dump() { abidw --headers-dir "$headers" --drop-private-types --no-corpus-path --out-file "$2" "$1"; }
soname_of() { sed -nE "1,3s/.*<abi-corpus [^>]*soname='([^']*)'.*/\1/p" "$1"; }

# compare OLD NEW (each an .abi file or a library); prints the report and the verdict.
compare() {
  local old=$1 new=$2 rc=0 old_so new_so
  # Headers and private types matter only for a library; an .abi corpus was written with them already
  # (abidiff asserts when given headers for one).
  local opts=()
  [[ "$old" == *.abi ]] || opts+=(--headers-dir1 "$headers")
  [[ "$new" == *.abi ]] || opts+=(--headers-dir2 "$headers")
  ((${#opts[@]} == 0)) || opts+=(--drop-private-types)
  abidiff "${opts[@]}" "$old" "$new" || rc=$?
  if ((rc & 3)); then
    echo "check-abi: abidiff failed (exit $rc): see its message above" >&2
    return 2
  fi
  if ((rc & 8)); then
    old_so=$(soname_of "$old")
    new_so=$(objdump -p "$new" 2>/dev/null | awk '$1 == "SONAME" { print $2 }')
    [[ -n "$new_so" ]] || new_so=$(soname_of "$new")
    if [[ -n "$old_so" && "$new_so" != "$old_so" ]]; then
      echo "check-abi: incompatible with ${old##*/}, and the soname says so: $old_so -> $new_so"
      return 0
    fi
    echo "check-abi: FAILED: an incompatible change to libframelink's ABI under the same soname $old_so (above)." >&2
    echo "  Undo it, or bump the soname (SOVERSION in client/CMakeLists.txt, the libframelink<N> package and" >&2
    echo "  debian/libframelink<N>.symbols) and say so in debian/changelog; then write the new baseline:" >&2
    echo "  scripts/check-abi.sh --dump LIBRARY client/abi/libframelink.so.<N>.abi" >&2
    return 1
  fi
  if ((rc & 4)); then
    echo "check-abi: compatible changes only (above): debian/libframelink0.symbols names each new symbol"
    return 0
  fi
  echo "check-abi: the ABI is the baseline's: $(grep -c '<elf-symbol ' "$old" 2>/dev/null || echo '?') symbols, no change"
}

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  --dump)
    (($# == 3)) || { usage >&2; exit 2; }
    dump "$2" "$3"
    echo "check-abi: wrote $3 ($(grep -c '<elf-symbol ' "$3") symbols, soname $(soname_of "$3"))"
    ;;
  --self-test)
    (($# == 2)) || { usage >&2; exit 2; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    dump "$2" "$work/now.abi"
    compare "$work/now.abi" "$2" >"$work/same.log" 2>&1 || { cat "$work/same.log"; echo "self-test: its own ABI differs" >&2; exit 1; }
    # The same corpus without fl_release (its symbol and its declaration): what removing it would be.
    python3 - "$work/now.abi" "$work/removed.abi" <<'EOF'
import re, sys
s = open(sys.argv[1]).read()
s, n1 = re.subn(r"\n *<elf-symbol name='fl_release'[^\n]*/>", "", s)
s, n2 = re.subn(r"\n *<function-decl name='fl_release'.*?</function-decl>", "", s, flags=re.S)
assert n1 == 1 and n2 == 1, (n1, n2)
open(sys.argv[2], "w").write(s)
EOF
    rc=0
    compare "$work/now.abi" "$work/removed.abi" >"$work/removed.log" 2>&1 || rc=$?
    if ((rc != 1)) || ! grep -q "fl_release" "$work/removed.log"; then
      cat "$work/removed.log"
      echo "self-test: removing fl_release was not reported as an incompatible change (exit $rc)" >&2
      exit 1
    fi
    echo "check-abi: self-test passed: no change against itself; removing fl_release fails the check"
    ;;
  -*) echo "check-abi: unknown option $1" >&2; usage >&2; exit 2 ;;
  "") usage >&2; exit 2 ;;
  *)
    library=$1
    baseline=${2:-$root/client/abi/libframelink.so.0.abi}
    [[ -f "$library" ]] || { echo "check-abi: no library $library: build it first" >&2; exit 2; }
    [[ -f "$baseline" ]] || { echo "check-abi: no baseline $baseline" >&2; exit 2; }
    # grep reads to the end (no -q): with pipefail, grep -q quitting at the first match could leave
    # readelf writing to a closed pipe (SIGPIPE), and the check failed on a library with debug information.
    readelf -S "$library" | grep '\.debug_info' >/dev/null ||
      { echo "check-abi: $library has no debug information: build with -g (RelWithDebInfo or Debug)" >&2; exit 2; }
    echo "check-abi: $library against ${baseline#"$root"/}"
    compare "$baseline" "$library"
    ;;
esac
