#!/usr/bin/env bash
# Makes the source tarball the packages are built from, without CMake:
#   scripts/dist-tarball.sh OUTPUT_DIR     -> OUTPUT_DIR/framelink-<version>.tar.gz
# The files git knows in the working tree (tracked, and new ones not ignored), as they are now
# -- uncommitted edits included, so that the packages of a work in progress build what is in
# the tree -- under framelink-<version>/, less debian/: that is the Debian packaging, which
# dpkg-source keeps apart from the upstream tarball (framelink_<version>.debian.tar.xz).  The version is project(framelink VERSION ...) of
# CMakeLists.txt.  Reproducible: sorted, owned by root, dated by the last commit.
# Prints the tarball's path.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:?usage: scripts/dist-tarball.sh OUTPUT_DIR}
version=$(sed -nE 's/^project\(framelink VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
[[ -n "$version" ]] || { echo "dist-tarball: no project(framelink VERSION ...) in CMakeLists.txt" >&2; exit 1; }
mkdir -p "$out"
tarball=$(cd "$out" && pwd)/framelink-$version.tar.gz
mtime=$(git -C "$root" log -1 --format=%cI 2>/dev/null || date -u +%FT%TZ)

# Deleted but not yet committed files are listed by git and absent: skip them.
(cd "$root" && git ls-files -z --cached --others --exclude-standard -- . ':!debian' |
  while IFS= read -r -d '' f; do [[ -e "$f" || -L "$f" ]] && printf '%s\0' "$f"; done) |
  tar -C "$root" --null -T - --sort=name --owner=0 --group=0 --numeric-owner --mtime="$mtime" \
    --transform "s|^|framelink-$version/|S" -cf - |
  gzip -9n >"$tarball"
echo "$tarball"
