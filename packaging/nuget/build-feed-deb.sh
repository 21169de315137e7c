#!/usr/bin/env bash
# framelink-nuget_<version>_all.deb: the FrameLink NuGet package (.nupkg, and its symbols .snupkg) as a
# local feed in /usr/share/framelink/nuget, the folder `dotnet nuget add source` names.
#
#   packaging/nuget/build-feed-deb.sh SOURCE_DIR OUTPUT_DIR
#
# SOURCE_DIR is an unpacked source tree (scripts/package.sh gives the upstream tarball's, with
# debian/ beside it). The .NET SDK is no Debian package, so debian/control cannot name it as a build
# dependency and dpkg-buildpackage cannot build this one: the SDK packs FrameLink here, and dpkg-deb
# assembles the deb with what debhelper gives a deb of its kind (copyright, changelog, md5sums, the
# lintian overrides). scripts/package.sh runs lintian on it. Prints the deb's path.
set -euo pipefail

src=$(cd "${1:?usage: build-feed-deb.sh SOURCE_DIR OUTPUT_DIR}" && pwd)
out=${2:?usage: build-feed-deb.sh SOURCE_DIR OUTPUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
command -v dotnet >/dev/null || {
  echo "build-feed-deb: dotnet (the .NET SDK, 10.0 or later) is not installed: it packs FrameLink" >&2
  exit 2
}
export DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
package=framelink-nuget
version=$(cd "$src" && dpkg-parsechangelog -S Version)
upstream=${version%-*}
maintainer=$(sed -n 's/^Maintainer: //p' "$src/debian/control")
feed=/usr/share/framelink/nuget

work=$(mktemp -d "${TMPDIR:-/tmp}/fl-nuget-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
# Packed from the source tree given, deterministic (ContinuousIntegrationBuild maps the paths in the
# symbols to /_/), with no libframelink beside it: the package carries managed code only.
dotnet pack "$src/client/dotnet/src/FrameLink" -c Release -o "$work/pack" -nologo -v q -clp:ErrorsOnly \
  -p:ContinuousIntegrationBuild=true -p:FrameLinkPackaging=true >"$work/pack.log" 2>&1 ||
  { cat "$work/pack.log" >&2; echo "build-feed-deb: dotnet pack of FrameLink failed" >&2; exit 1; }
for f in "FrameLink.$upstream.nupkg" "FrameLink.$upstream.snupkg"; do
  [[ -f "$work/pack/$f" ]] || { echo "build-feed-deb: dotnet pack made no $f" >&2; exit 1; }
done

root=$work/root
install -d "$root/DEBIAN" "$root$feed" "$root/usr/share/doc/$package" "$root/usr/share/lintian/overrides"
install -m 0644 "$work/pack/FrameLink.$upstream.nupkg" "$work/pack/FrameLink.$upstream.snupkg" "$root$feed/"
install -m 0644 "$src/debian/copyright" "$root/usr/share/doc/$package/copyright"
gzip -9nc "$src/debian/changelog" >"$root/usr/share/doc/$package/changelog.Debian.gz"
chmod 0644 "$root/usr/share/doc/$package/changelog.Debian.gz"
install -m 0644 "$src/debian/$package.lintian-overrides" "$root/usr/share/lintian/overrides/$package"
(cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"
cat >"$root/DEBIAN/control" <<EOF
Package: $package
Version: $version
Architecture: all
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libframelink0 (>= $version)
Suggests: framelinkd
Section: cli-mono
Priority: optional
Description: Client library of framelinkd (.NET, as a local NuGet feed)
 The FrameLink NuGet package (net10.0, trimmable and native-AOT compatible)
 and its symbols package in $feed, a folder that
 "dotnet nuget add source $feed" makes a feed of; then
 "dotnet add package FrameLink" takes it from there. At run time FrameLink
 loads libframelink.so.0 from libframelink0.
EOF
deb=$out/${package}_${version}_all.deb
# Dated by the changelog's entry, as dpkg-buildpackage dates its debs (reproducible).
SOURCE_DATE_EPOCH=$(cd "$src" && dpkg-parsechangelog -S Timestamp) dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
