#!/usr/bin/env bash
# The service guest's C# producer, made as a user makes one: a new console project, the packaged feed
# (framelink-nuget's /usr/share/framelink/nuget, unpacked from the deb) added as a source,
# `dotnet add package FrameLink`, producer/Program.cs, and a native AOT publish. The guest has no .NET:
# the executable needs only libc and the system's libframelink.so.0. Called by run-guest.sh.
#
#   tests/service/build-producer.sh FRAMELINK_NUGET_DEB OUTPUT_FILE NUGET_CACHE_DIR
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deb=$1
out=$2
export NUGET_PACKAGES=$3 DOTNET_CLI_TELEMETRY_OPTOUT=1 DOTNET_NOLOGO=1 DOTNET_SKIP_FIRST_TIME_EXPERIENCE=1
# Every build of a version has the same number: never take FrameLink from the cache of an older run.
rm -rf "$NUGET_PACKAGES/framelink"
work=$(mktemp -d "${TMPDIR:-/tmp}/fl-producer.XXXXXX")
trap 'rm -rf "$work"' EXIT
dpkg-deb -x "$deb" "$work/root"
feed=$work/root/usr/share/framelink/nuget
cd "$work"
{
  dotnet new console -n Producer -o app
  cd app
  dotnet new nugetconfig
  dotnet nuget add source "$feed" --name framelink --configfile nuget.config
  dotnet add package FrameLink
  cp "$here/producer/Program.cs" Program.cs
  # clang-14: Debian's clang, the linker driver native AOT wants; no ICU in the guest.
  dotnet publish -c Release -r linux-x64 -p:PublishAot=true -p:InvariantGlobalization=true \
    -p:CppCompilerAndLinker=clang-14 -o "$work/out" -nologo -v q
} >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; echo "build-producer: the build failed" >&2; exit 1; }
grep -q 'PackageReference Include="FrameLink"' "$work/app/Producer.csproj" ||
  { echo "build-producer: dotnet add package FrameLink left no reference" >&2; exit 1; }
install -m 0755 "$work/out/Producer" "$out"
echo "build-producer: $out ($(du -k "$out" | cut -f1) KiB, native AOT) from FrameLink $(sed -nE 's/.*Include="FrameLink" Version="([^"]+)".*/\1/p' "$work/app/Producer.csproj") of ${deb##*/}"
