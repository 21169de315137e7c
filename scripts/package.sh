#!/usr/bin/env bash
# Builds the deb and rpm packages from a source tarball and checks them.
#   scripts/package.sh [OUTPUT_DIR]      default OUTPUT_DIR: <build>/packages
# Environment:
#   FRAMELINK_BUILD_DIR  build tree (default: build/ at the top of the repository)
#   FRAMELINK_PKGWORK    where the packages are built (default: ${TMPDIR:-/var/tmp}/framelink-pkgwork-UID),
#                        the same path on every run and in every clone, so that ccache finds the
#                        same compiler arguments again (dpkg-buildflags names the source directory
#                        in -ffile-prefix-map); a lock beside it lets one run at a time use it
#   FRAMELINK_JOBS       parallel compile jobs of each package build (default 2)
#
# Packages (packaging/CMakeLists.txt): framelinkd, libframelink0, libframelink-dev,
# framelink-tools, framelink-bench, each as .deb and .rpm in OUTPUT_DIR (the debs there are the ones to install:
# `apt install ./*.deb`), their -dbgsym debs and -debuginfo rpms in OUTPUT_DIR/debug,
# the source package (.dsc, tarballs, .changes) and the source rpm in OUTPUT_DIR/source.
# Made the way a distribution makes them:
#   * scripts/dist-tarball.sh: the source tarball (framelink-<version>.tar.gz);
#   * dpkg-buildpackage -us -uc with debian/ (debhelper) in the unpacked tarball: source package
#     and debs (dh_missing fails on a file installed into no package);
#   * rpmbuild -ba with packaging/rpm/framelink.spec and the same tarball (rpmbuild fails on a
#     file installed into no package).
# Both build the daemon, the library and the CLI only (FRAMELINK_BUILD_TESTS=OFF), through
# ccache when it is installed.  Then the checks:
#   * the manual pages (framelink.1, framelink-bench.1, framelinkd.8, framelinkd.toml.5) and the
#     bash completions are in their packages; framelink (framelink-tools) links no gRPC and list every option and key of the packaged binaries;
#   * framelinkd ships packaging/grafana/framelink.json and packaging/prometheus/framelink-alerts.yml;
#   * libframelink0 + libframelink-dev, unpacked, build and run examples/c (find_package, pkg-config);
#   * the debs installed, reinstalled, removed and purged with dpkg in a chroot over a throw-away
#     overlay of this system (root only): user, token, enabled unit, ldconfig trigger, conffile
#     kept on remove, nothing left after the purge;
#   * the -dbgsym packages hold the debug files of the packaged binaries (by build id);
#   * lintian on the source package and the debs: no error or warning (the overridden tags are
#     explained in debian/*.lintian-overrides);
#   * rpmlint on the spec and the rpms: no error (what it warns about here: packaging/rpm/framelink.rpmlintrc);
#   * the rpms against the debs: the same files with the same modes per package (modulo the
#     differences listed at the top of packaging/CMakeLists.txt), the same conffiles, a
#     requirement for every shared library the binaries need, the provides and the scriptlets
#     (parsed with sh -n).  No Fedora/Rocky root can be fetched here, so the rpms are never
#     installed: these checks are all the proof they get.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(realpath -m "${FRAMELINK_BUILD_DIR:-$root/build}")
out=$(realpath -m "${1:-$build/packages}")
jobs=${FRAMELINK_JOBS:-2}
packages=(framelinkd libframelink0 libframelink-dev framelink-tools framelink-bench)
# Debian only: the Python client as Debian's Python policy packages it (dh-python); the rpm spec has
# no python3 subpackage yet (pip users take the wheel).  The documentation site, whose theme's
# libraries and fonts are links to Debian's packages of them (packaging/doc/link-assets.sh).
deb_only_packages=(python3-framelink framelink-nuget framelink-doc)
# The packages with ELF files, which get -dbgsym / -debuginfo packages.
with_debug=(framelinkd libframelink0 framelink-tools framelink-bench)

fail() {
  echo "scripts/package.sh: FAILED: $*" >&2
  exit 1
}
step() { printf '\n---- [%3ds] %s\n' $((SECONDS - start)) "$*"; }
start=$SECONDS

for tool in dpkg-buildpackage dpkg-checkbuilddeps dh dpkg-deb lintian rpmbuild rpmlint rpm readelf help2man pkg-config dotnet "${CC:-cc}"; do
  command -v "$tool" >/dev/null ||
    fail "$tool is not installed: scripts/setup-deps.sh installs it (packages debhelper, rpm, rpmlint, lintian, help2man, dpkg-dev, binutils; dotnet: the .NET SDK, which packs framelink-nuget)"
done

# One version everywhere: CMakeLists.txt's, debian/changelog's upstream part, the spec's.
version_cmake=$(sed -nE 's/^project\(framelink VERSION ([0-9.]+).*/\1/p' "$root/CMakeLists.txt")
version_deb=$(cd "$root" && dpkg-parsechangelog -S Version)  # 0.1.0-1
version_spec=$(sed -nE 's/^Version:[[:space:]]+//p' "$root/packaging/rpm/framelink.spec")
release_spec=$(sed -nE 's/^Release:[[:space:]]+([0-9]+).*/\1/p' "$root/packaging/rpm/framelink.spec")
[[ "${version_deb%-*}" == "$version_cmake" && "$version_spec" == "$version_cmake" ]] ||
  fail "versions differ: CMakeLists.txt $version_cmake, debian/changelog $version_deb, packaging/rpm/framelink.spec $version_spec"
version=$version_deb
[[ "$version_spec-$release_spec" == "$version" ]] ||
  fail "the rpm would be $version_spec-$release_spec, the deb $version: keep the spec's Release and debian/changelog's revision equal"
upstream=$version_cmake

(cd "$root" && dpkg-checkbuilddeps) || fail "debian/control's Build-Depends are not installed (above): scripts/setup-deps.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/fl-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
# The compiles go through ccache (top CMakeLists.txt); debhelper sets HOME to an empty
# directory, so name the cache this user has.
if command -v ccache >/dev/null && [[ -z "${CCACHE_DIR:-}" ]]; then
  CCACHE_DIR=$(ccache -k cache_dir)
  export CCACHE_DIR
fi
pw=${FRAMELINK_PKGWORK:-${TMPDIR:-/var/tmp}/framelink-pkgwork-$(id -u)}
mkdir -p "$(dirname "$pw")"
exec 9>"$pw.lock"
flock -w 3600 9 || fail "$pw is in use by another scripts/package.sh for an hour (lock $pw.lock)"
rm -rf "$pw"
mkdir -p "$pw/rpm/SOURCES"

step "source tarball (scripts/dist-tarball.sh)"
tarball=$("$root/scripts/dist-tarball.sh" "$pw")
echo "$tarball ($(du -k "$tarball" | cut -f1) KiB)"

step "debs: dpkg-buildpackage -us -uc (log: $pw/dpkg-buildpackage.log)"
cp "$tarball" "$pw/framelink_$upstream.orig.tar.gz"
tar -C "$pw" -xzf "$tarball"
cp -a "$root/debian" "$pw/framelink-$upstream/"  # not in the upstream tarball
status=0
# The system's PATH, as a build root has it: pybuild runs the python3.X first on PATH, which must be
# Debian's (with its setuptools and build modules), never a user's own interpreter.
(cd "$pw/framelink-$upstream" && PATH=/usr/sbin:/usr/bin:/sbin:/bin DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}" \
  LANG=C dpkg-buildpackage -us -uc) >"$pw/dpkg-buildpackage.log" 2>&1 || status=$?
if ((status != 0)); then
  tail -n 60 "$pw/dpkg-buildpackage.log"
  fail "dpkg-buildpackage (the last lines of $pw/dpkg-buildpackage.log above)"
fi
echo "ok: $(cd "$pw" && ls -- *.dsc *.deb | tr '\n' ' ')"

step "framelink-nuget: packaging/nuget/build-feed-deb.sh (dotnet pack of the same source)"
"$root/packaging/nuget/build-feed-deb.sh" "$pw/framelink-$upstream" "$pw" || fail "packaging/nuget/build-feed-deb.sh"

step "rpms: rpmbuild -ba packaging/rpm/framelink.spec (log: $pw/rpmbuild.log)"
# --nodeps: BuildRequires names Fedora's packages and the rpm database here is empty;
# dpkg-checkbuilddeps above checked the same needs by their Debian names.
cp "$tarball" "$root/packaging/systemd/sysusers.d/framelinkd.conf" "$root/packaging/scripts/framelinkd-secrets.sh" "$pw/rpm/SOURCES/"
# The same sources as the debs, compiled with the same flags (dpkg-buildflags, read in the deb's
# source directory: they name it) in the same directory (_builddir: the source unpacks where the
# deb's did, which goes first): ccache answers this compile from the debs' instead of compiling
# everything a second time.  The spec's own default (Fedora's %optflags plus -DNDEBUG) is for
# rpmbuild anywhere else.
deb_flag() { (cd "$pw/framelink-$upstream" && DEB_BUILD_MAINT_OPTIONS=hardening=+all dpkg-buildflags --get "$1"); }
optflags="$(deb_flag CXXFLAGS) $(deb_flag CPPFLAGS)"
ldflags=$(deb_flag LDFLAGS)
rm -rf "$pw/framelink-$upstream"
status=0
# The locale the debs were compiled in: ccache hashes LANG and LC_ALL, and in another locale every
# compile of the rpms missed the debs' objects (4 minutes on a cold cache).  debhelper (compat 13)
# sets LC_ALL=C.UTF-8 for its builds, rpmbuild sets LANG=C; the debs get LANG=C above.
LC_ALL=C.UTF-8 rpmbuild -ba --nodeps --define "_topdir $pw/rpm" --define "_builddir $pw" --define "_smp_mflags -j$jobs" \
  --define "optflags $optflags" --define "build_ldflags $ldflags" --define "fl_config_flags %{nil}" \
  "$root/packaging/rpm/framelink.spec" >"$pw/rpmbuild.log" 2>&1 || status=$?
if ((status != 0)); then
  tail -n 60 "$pw/rpmbuild.log"
  fail "rpmbuild (the last lines of $pw/rpmbuild.log above)"
fi
echo "ok: $(cd "$pw/rpm" && find RPMS SRPMS -name '*.rpm' -printf '%f ')"

mkdir -p "$out"
rm -rf "$out"/*.deb "$out"/*.rpm "$out/debug" "$out/source"
mkdir -p "$out/debug" "$out/source"
declare -A deb=() rpmf=() ddeb=() rpmdbg=()
for p in "${packages[@]}"; do
  d=("$pw/${p}_${version}_"*.deb)
  r=("$pw/rpm/RPMS/"*/"$p-$version."*.rpm)
  [[ -f "${d[0]}" && -f "${r[0]}" && ${#d[@]} == 1 && ${#r[@]} == 1 ]] ||
    fail "expected one deb and one rpm of $p, got: ${d[*]} ${r[*]}"
  cp "${d[0]}" "${r[0]}" "$out/"
  deb[$p]=$out/$(basename "${d[0]}")
  rpmf[$p]=$out/$(basename "${r[0]}")
done
for p in "${deb_only_packages[@]}"; do
  d=("$pw/${p}_${version}_"*.deb)
  [[ -f "${d[0]}" && ${#d[@]} == 1 ]] || fail "expected one deb of $p, got: ${d[*]}"
  cp "${d[0]}" "$out/"
  deb[$p]=$out/$(basename "${d[0]}")
done
for p in "${with_debug[@]}"; do
  d=("$pw/${p}-dbgsym_${version}_"*.deb)
  [[ -f "${d[0]}" ]] || fail "no ${p}-dbgsym package: dh_strip made none"
  cp "${d[0]}" "$out/debug/"
  ddeb[$p]=$out/debug/$(basename "${d[0]}")
done
cp "$pw/"*.dsc "$pw/"*.orig.tar.gz "$pw/"*.debian.tar.* "$pw/"*.changes "$pw/"*.buildinfo "$pw/rpm/SRPMS/"*.src.rpm "$out/source/"
mapfile -t rpm_debuginfo < <(find "$pw/rpm/RPMS" -name '*-debuginfo-*.rpm' -o -name '*-debugsource-*.rpm')
((${#rpm_debuginfo[@]} > 0)) || fail "rpmbuild made no -debuginfo package"
cp "${rpm_debuginfo[@]}" "$out/debug/"
extra=$({ find "$pw" -maxdepth 1 -name '*.deb' -printf '%f\n'
  find "$pw/rpm/RPMS" -name '*.rpm' -printf '%f\n'; } | grep -vxF -f <(find "$out" -maxdepth 2 -type f -printf "%f\n") || true)
[[ -z "$extra" ]] || fail "packages nobody asked for: $extra"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)

step "debs"
for p in "${packages[@]}" "${deb_only_packages[@]}"; do
  echo "== $(basename "${deb[$p]}") ($(du -k "${deb[$p]}" | cut -f1) KiB)"
  dpkg-deb -f "${deb[$p]}" Package Version Section Depends Recommends Suggests | sed 's/^/  /'
  dpkg-deb -c "${deb[$p]}" | awk '$1 !~ /^d/ { print "  " $1, $6, $7, $8 }'
done

step "the -dbgsym packages"
for p in "${with_debug[@]}"; do
  ids=$(dpkg-deb -f "${ddeb[$p]}" Build-Ids)
  mkdir -p "$work/bin-$p"
  dpkg-deb -x "${deb[$p]}" "$work/bin-$p"
  while read -r elf; do
    id=$(readelf -n "$elf" | sed -nE 's/.*Build ID: ([0-9a-f]+)/\1/p')
    [[ -n "$id" && " $ids " == *" $id "* ]] || fail "$p: ${elf#"$work/bin-$p"} (build id ${id:-none}) has no debug file in ${ddeb[$p]##*/}"
    # Captured first: grep -q stopping early would fail the pipeline (pipefail).
    listing=$(dpkg-deb -c "${ddeb[$p]}")
    grep -q "/usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug" <<<"$listing" ||
      fail "$p: ${ddeb[$p]##*/} lacks /usr/lib/debug/.build-id/${id:0:2}/${id:2}.debug"
  done < <(find "$work/bin-$p" -type f -exec sh -c 'readelf -h "$1" >/dev/null 2>&1 && ! case "$1" in *.a) true;; *) false;; esac' _ {} \; -print)
  echo "ok: ${ddeb[$p]##*/}: Build-Ids $ids"
done

step "the packaged manual pages and bash completion"
# Each in its package, and, unpacked, against the packaged binaries (tests/install/test-manpages.sh).
declare -A doc_files=(
  [framelinkd]="./usr/share/man/man8/framelinkd.8.gz ./usr/share/man/man5/framelinkd.toml.5.gz ./usr/share/bash-completion/completions/framelinkd"
  [framelink-tools]="./usr/share/man/man1/framelink.1.gz ./usr/share/bash-completion/completions/framelink"
  [framelink-bench]="./usr/share/man/man1/framelink-bench.1.gz ./usr/share/bash-completion/completions/framelink-bench")
mkdir -p "$work/docs"
for p in "${!doc_files[@]}"; do
  for f in ${doc_files[$p]}; do
    dpkg-deb -c "${deb[$p]}" | awk '{ print $6 }' | grep -xF "$f" >/dev/null || fail "$p: the deb lacks ${f#.}"
    dpkg-deb --fsys-tarfile "${deb[$p]}" | tar -xO "$f" >"$work/docs/$(basename "$f")"
  done
done
LD_LIBRARY_PATH=$work/bin-libframelink0/usr/lib/$multiarch \
  bash "$root/tests/install/test-manpages.sh" "$work/bin-framelink-tools/usr/bin/framelink" \
  "$work/bin-framelinkd/usr/sbin/framelinkd" "$work/docs" "$work/bin-framelink-bench/usr/bin/framelink-bench" ||
  fail "the packaged manual pages or completion do not match the packaged binaries (above)"
# The operator's tool links libframelink and the C++ runtime, not gRPC: the benchmark, which
# measures plain gRPC, is framelink-bench.
tool_needs=$(readelf -d "$work/bin-framelink-tools/usr/bin/framelink" | sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | tr '\n' ' ')
[[ "$tool_needs" != *grpc* && "$tool_needs" != *protobuf* ]] || fail "/usr/bin/framelink links gRPC or protobuf: $tool_needs"
echo "ok: /usr/bin/framelink needs only: $tool_needs"

step "the packaged Grafana dashboard and Prometheus alert rules"
for f in grafana/framelink.json prometheus/framelink-alerts.yml; do
  dpkg-deb --fsys-tarfile "${deb[framelinkd]}" | tar -xO "./usr/share/framelink/$f" 2>/dev/null |
    cmp -s - "$root/packaging/$f" || fail "framelinkd: the deb lacks /usr/share/framelink/$f or it differs from packaging/$f"
done
echo "ok: framelinkd ships /usr/share/framelink/grafana/framelink.json and prometheus/framelink-alerts.yml as in packaging/"
dpkg-deb --fsys-tarfile "${deb[framelinkd]}" | tar -xO ./usr/share/framelink/framelink-site-ca.sh 2>/dev/null |
  cmp -s - "$root/packaging/scripts/framelink-site-ca.sh" ||
  fail "framelinkd: the deb lacks /usr/share/framelink/framelink-site-ca.sh or it differs from packaging/scripts/"
# Captured first: grep -q stopping early would fail the pipeline (pipefail).
listing=$(dpkg-deb -c "${deb[framelinkd]}")
grep -qE '^-rwxr-xr-x .* \./usr/share/framelink/framelink-site-ca\.sh$' <<<"$listing" ||
  fail "framelinkd: /usr/share/framelink/framelink-site-ca.sh is not 0755 in the deb"
echo "ok: framelinkd ships the site CA script /usr/share/framelink/framelink-site-ca.sh (0755)"

step "the packaged libframelink-dev builds examples/c and examples/cpp"
# Unpacked, not installed: find_package through CMAKE_PREFIX_PATH (the CMake package is
# relocatable), pkg-config through PKG_CONFIG_SYSROOT_DIR (framelink.pc says prefix=/usr).
sysroot=$work/sysroot
libpath=$sysroot/usr/lib/$multiarch
for p in libframelink0 libframelink-dev; do dpkg-deb -x "${deb[$p]}" "$sysroot"; done
cmake -S "$root/examples/c" -B "$work/example" -DCMAKE_PREFIX_PATH="$sysroot/usr" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/example.log" 2>&1 &&
  cmake --build "$work/example" >>"$work/example.log" 2>&1 ||
  { cat "$work/example.log"; fail "examples/c does not build against the unpacked libframelink-dev"; }
grep -qxF "framelink_DIR:PATH=$libpath/cmake/framelink" "$work/example/CMakeCache.txt" ||
  fail "examples/c found another framelink package than the unpacked one"
cmake -S "$root/examples/cpp" -B "$work/example-cpp" -DCMAKE_PREFIX_PATH="$sysroot/usr" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/example-cpp.log" 2>&1 &&
  cmake --build "$work/example-cpp" >>"$work/example-cpp.log" 2>&1 ||
  { cat "$work/example-cpp.log"; fail "examples/cpp does not build against the unpacked libframelink-dev"; }
pc_flags=$(PKG_CONFIG_SYSROOT_DIR=$sysroot PKG_CONFIG_LIBDIR=$libpath/pkgconfig pkg-config --cflags --libs framelink)
# shellcheck disable=SC2086  # a list of compiler arguments
"${CC:-cc}" -std=c11 -Wall -Werror -o "$work/example/pc_attach_info" "$root/examples/c/attach_info.c" $pc_flags ||
  fail "examples/c/attach_info.c does not build with pkg-config's flags ($pc_flags)"
for bin in framelink_attach_info framelink_attach_info_static pc_attach_info; do
  status=0
  LD_LIBRARY_PATH=$libpath "$work/example/$bin" example "$work/no-daemon.sock" >/dev/null 2>"$work/err" || status=$?
  ((status == 2)) && grep -q 'cannot connect to framelinkd' "$work/err" ||
    fail "$bin (built against the package) should fail to attach with exit 2, got $status: $(cat "$work/err")"
done
echo "ok: find_package and pkg-config builds of examples/c link and run (they report the missing daemon)"

step "the debs installed, reinstalled, removed and purged with dpkg (a throw-away overlay of this system)"
# A private mount namespace: an overlay of / (writes go to a tmpfs and vanish with the
# namespace), an empty /run so that no systemd is seen and no service is started (the QEMU
# guest stage does that with systemd), and dpkg in a chroot of it.  This machine's own
# /etc and dpkg database are never written.
can_overlay() {
  [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null && grep -qw overlay /proc/filesystems || return 1
  mkdir -p "$work/probe"
  unshare --mount --fork -- sh -c "mount -t tmpfs tmpfs '$work/probe' && mkdir '$work/probe/u' '$work/probe/w' '$work/probe/m' &&
    mount -t overlay overlay -o 'lowerdir=/,upperdir=$work/probe/u,workdir=$work/probe/w' '$work/probe/m'" 2>/dev/null
}
if ! can_overlay; then
  echo "NOTE: not run -- needs root and a private mount namespace with overlayfs (unshare -m), which this machine refuses"
else
  FL_WORK=$work FL_UPSTREAM=$upstream FL_MULTIARCH=$multiarch unshare --mount --fork -- bash -s "${deb[@]}" <<'IN_NAMESPACE' || fail "dpkg install/remove/purge of the debs (above)"
set -euo pipefail
ov=$FL_WORK/overlay
mkdir -p "$ov"
mount -t tmpfs tmpfs "$ov"
mkdir -p "$ov/upper" "$ov/work" "$ov/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$ov/upper,workdir=$ov/work" "$ov/root"
mount -t proc proc "$ov/root/proc"
mount --rbind /dev "$ov/root/dev"
mount -t tmpfs tmpfs "$ov/root/run"
mount -t tmpfs tmpfs "$ov/root/tmp"
mkdir "$ov/root/tmp/debs"
cp "$@" "$ov/root/tmp/debs/"
in_root() { chroot "$ov/root" /bin/sh -c "$1"; }
# The man-db trigger would rebuild the whole manual index on each dpkg call, for nothing here.
rm -f "$ov/root/var/lib/man-db/auto-update"
bad() { echo "FAILED: $*" >&2; exit 1; }
wants=/etc/systemd/system/multi-user.target.wants/framelinkd.service

in_root 'dpkg -i /tmp/debs/*.deb' >"$FL_WORK/dpkg-install.log" 2>&1 || { cat "$FL_WORK/dpkg-install.log"; bad "dpkg -i"; }
in_root 'getent passwd framelink || true' | grep -x 'framelink:x:[0-9]*:[0-9]*:framelink daemon:/nonexistent:/usr/sbin/nologin' >/dev/null ||
  bad "the postinst (systemd-sysusers) made no framelink system user: $(in_root 'getent passwd framelink' || true)"
[[ "$(in_root 'stat -c "%a %U %G" /etc/framelink/peer.token')" == "600 framelink framelink" ]] ||
  bad "peer.token is $(in_root 'stat -c "%a %U %G" /etc/framelink/peer.token'), expected 600 framelink framelink"
token=$(in_root 'cat /etc/framelink/peer.token')
[[ "$(in_root 'stat -c "%a %U %G" /etc/framelink/tls/host.key')" == "600 framelink framelink" ]] ||
  bad "tls/host.key is $(in_root 'stat -c "%a %U %G" /etc/framelink/tls/host.key'), expected 600 framelink framelink"
host_cert=$(in_root 'openssl x509 -in /etc/framelink/tls/host.crt -noout -subject -ext subjectAltName,basicConstraints' 2>&1) ||
  bad "tls/host.crt is not a certificate: $host_cert"
grep -q "CN = $(uname -n)" <<<"$host_cert" && grep -q "DNS:$(uname -n)" <<<"$host_cert" ||
  bad "tls/host.crt does not name the host $(uname -n): $host_cert"
# A peer trusts the certificate itself as its root (tls_ca_file): it must be a CA certificate.
grep -q 'CA:TRUE' <<<"$host_cert" || bad "tls/host.crt is not a CA certificate: $host_cert"
in_root 'openssl pkey -in /etc/framelink/tls/host.key -pubout' | cmp -s - <(in_root 'openssl x509 -in /etc/framelink/tls/host.crt -noout -pubkey') ||
  bad "tls/host.key is not the key of tls/host.crt"
[[ -f "$ov/root/etc/framelink/tls/peers.pem" ]] || bad "no tls/peers.pem after the install"
host_key=$(in_root 'sha256sum /etc/framelink/tls/host.key')
[[ -L "$ov/root$wants" ]] || bad "framelinkd.service is not enabled ($wants missing)"
# Captured first: grep -q stopping early would fail the pipeline (pipefail).
ld_cache=$(in_root 'ldconfig -p')
grep -q 'libframelink.so.0 ' <<<"$ld_cache" || bad "the ldconfig trigger did not register libframelink.so.0"
[[ "$(in_root 'framelink --version')" == "framelink $FL_UPSTREAM" ]] || bad "/usr/bin/framelink --version: $(in_root 'framelink --version' 2>&1)"
[[ "$(in_root 'framelink-bench --version')" == "framelink-bench $FL_UPSTREAM" ]] || bad "/usr/bin/framelink-bench --version: $(in_root 'framelink-bench --version' 2>&1)"
[[ "$(in_root 'framelinkd --version')" == "framelinkd $FL_UPSTREAM" ]] || bad "/usr/sbin/framelinkd --version: $(in_root 'framelinkd --version' 2>&1)"
in_root 'man -w framelinkd framelink framelink-bench framelinkd.toml' >/dev/null || bad "man -w framelinkd framelink framelink-bench framelinkd.toml"
# python3-framelink: the system's python3 imports it from dist-packages and loads the packaged library.
py_check='import framelink, os; print(framelink.__version__, framelink.version(), os.path.dirname(framelink.__file__))'
py_out=$(in_root "cd / && /usr/bin/python3 -c '$py_check'" 2>&1) || bad "python3 -c 'import framelink': $py_out"
[[ "$py_out" == "$FL_UPSTREAM $FL_UPSTREAM /usr/lib/python3/dist-packages/framelink" ]] ||
  bad "python3-framelink: expected '$FL_UPSTREAM $FL_UPSTREAM /usr/lib/python3/dist-packages/framelink', got: $py_out"
[[ -f "$ov/root/usr/share/framelink/nuget/FrameLink.$FL_UPSTREAM.nupkg" && -f "$ov/root/usr/share/framelink/nuget/FrameLink.$FL_UPSTREAM.snupkg" ]] ||
  bad "framelink-nuget: /usr/share/framelink/nuget lacks FrameLink.$FL_UPSTREAM.nupkg or .snupkg"
# framelink-doc: the site's start page, and every link in it resolved to a file of a package that
# framelink-doc depends on (the theme's jQuery, fonts, ...).
html=/usr/share/doc/framelink/html
[[ -f "$ov/root$html/index.html" && -f "$ov/root$html/start/install.html" ]] || bad "framelink-doc: no $html/index.html or start/install.html"
doc_depends=$(in_root "dpkg-query -W -f='\${Depends}' framelink-doc")
doc_links=0
while read -r link; do
  target=$(in_root "realpath -s -m \"\$(dirname '$link')/\$(readlink '$link')\"")
  [[ -f "$ov/root$target" ]] || bad "framelink-doc: $link points at $target, which is missing"
  owner=$(in_root "dpkg -S '$target'" 2>/dev/null | cut -d: -f1 | head -1)
  [[ -n "$owner" && ", $doc_depends," == *", $owner"[,\ ]* ]] ||
    bad "framelink-doc: $link points at $target of package '${owner:-none}', which framelink-doc does not depend on ($doc_depends)"
  doc_links=$((doc_links + 1))
done < <(in_root "find $html -type l")
((doc_links > 0)) || bad "framelink-doc: no links to Debian's packages in $html (packaging/doc/link-assets.sh did nothing?)"
echo "ok: framelink-doc: $html/index.html, $doc_links links to files of the packages it depends on"
echo "ok: installed: user framelink, peer.token 600 framelink:framelink, TLS key 600 framelink:framelink with its self-signed certificate for $(uname -n), unit enabled, libframelink.so.0 in ld.so.cache, framelink and framelinkd run"

# As older packages left it: readable by group framelink, whose members are the applications.
in_root 'chown root:framelink /etc/framelink/peer.token && chmod 0640 /etc/framelink/peer.token'
in_root 'dpkg -i /tmp/debs/*.deb' >"$FL_WORK/dpkg-reinstall.log" 2>&1 || { cat "$FL_WORK/dpkg-reinstall.log"; bad "dpkg -i again (upgrade path)"; }
[[ "$(in_root 'cat /etc/framelink/peer.token')" == "$token" ]] || bad "reinstalling replaced the peer token"
[[ "$(in_root 'sha256sum /etc/framelink/tls/host.key')" == "$host_key" ]] || bad "reinstalling replaced the TLS key"
[[ "$(in_root 'stat -c "%a %U %G" /etc/framelink/peer.token')" == "600 framelink framelink" ]] ||
  bad "reinstalling left peer.token $(in_root 'stat -c "%a %U %G" /etc/framelink/peer.token'), expected 600 framelink framelink"
echo "ok: reinstalled: the peer token and the TLS key are kept, the token taken from the group an older package gave it to"

in_root 'dpkg -r framelink-doc framelink-nuget python3-framelink framelink-bench framelink-tools libframelink-dev framelinkd libframelink0' >"$FL_WORK/dpkg-remove.log" 2>&1 ||
  { cat "$FL_WORK/dpkg-remove.log"; bad "dpkg -r"; }
# The enablement symlink stays until the purge, as with dh_installsystemd: a reinstall
# keeps the unit enabled or disabled as the admin left it.
for gone in /usr/sbin/framelinkd /usr/bin/framelink /usr/bin/framelink-bench "/usr/lib/$FL_MULTIARCH/libframelink.so.0" \
  /usr/lib/python3/dist-packages/framelink /usr/share/framelink/nuget /usr/share/doc/framelink; do
  [[ ! -e "$ov/root$gone" && ! -L "$ov/root$gone" ]] || bad "$gone is still there after dpkg -r"
done
for kept in /etc/framelink/framelinkd.toml /etc/framelink/peer.token /etc/framelink/tls/host.key /etc/framelink/tls/peers.pem; do
  [[ -e "$ov/root$kept" ]] || bad "$kept is gone after dpkg -r (only a purge removes it)"
done
echo "ok: removed: binaries and libraries gone, conffile, token and TLS files kept"

in_root 'dpkg -P framelink-doc framelink-nuget python3-framelink framelink-bench framelink-tools libframelink-dev framelinkd libframelink0' >"$FL_WORK/dpkg-purge.log" 2>&1 ||
  { cat "$FL_WORK/dpkg-purge.log"; bad "dpkg -P"; }
[[ ! -L "$ov/root$wants" ]] || bad "$wants is still there after the purge"
[[ ! -e "$ov/root/etc/framelink" ]] || bad "/etc/framelink is still there after the purge: $(ls -la "$ov/root/etc/framelink")"
left=$(cd "$ov/upper" && find . -name '*framelink*' | sort)
[[ -z "$left" ]] || bad "the purge left files behind: $left"
in_root 'getent passwd framelink' >/dev/null || bad "the purge removed the framelink user, which it should keep"
echo "ok: purged: no file named *framelink* left, /etc/framelink gone; the framelink user and group are kept (see docs/operations/service.md)"
IN_NAMESPACE
fi

step "lintian (source package and debs)"
lintian_log=$work/lintian.log
changes=$pw/framelink_${version}_$(dpkg --print-architecture).changes
status=0
# The maintainer address is a placeholder (framelink@localhost) until the packages have a
# public one: bogus-mail-host is suppressed here rather than overridden, since the -dbgsym
# packages and the .changes cannot carry overrides.
# framelink-nuget is not in the .changes (dpkg-deb made it): named beside it.
lintian --pedantic --fail-on error,warning --suppress-tags bogus-mail-host,bogus-mail-host-in-debian-changelog \
  "$changes" "${deb[framelink-nuget]}" >"$lintian_log" 2>&1 || status=$?
grep -v 'running with root privileges is not recommended' "$lintian_log" || true
overridden=$(lintian --show-overrides "$changes" "${deb[framelink-nuget]}" 2>/dev/null | grep -c '^O:' || true)
((status == 0)) || fail "lintian found errors or warnings (above)"
echo "ok: lintian --pedantic $(basename "$changes") $(basename "${deb[framelink-nuget]}") (source, debs, dbgsym): no errors or warnings ($overridden tags overridden, reasons in debian/*.lintian-overrides)"

step "rpmlint (spec and rpms)"
rpmlint_log=$work/rpmlint.log
status=0
rpmlintrc=$work/rpmlintrc
cp "$root/packaging/rpm/framelink.rpmlintrc" "$rpmlintrc"
if compgen -G "$out/debug/framelink-debuginfo-*.rpm" >/dev/null; then
  cat "$root/packaging/rpm/framelink-debuginfo.rpmlintrc" >>"$rpmlintrc"
fi
rpmlint -r "$rpmlintrc" "$root/packaging/rpm/framelink.spec" "$out"/*.rpm "$out"/debug/*.rpm "$out"/source/*.rpm >"$rpmlint_log" 2>&1 || status=$?
cat "$rpmlint_log"
((status == 0)) || fail "rpmlint found errors (above)"
echo "ok: rpmlint: no errors (filtered warnings and why: packaging/rpm/framelink.rpmlintrc)"

step "rpms, checked against the debs"
echo "NOTE: no Fedora or Rocky root is reachable from this machine (only Debian's mirrors are),"
echo "      so the rpms are not installed anywhere; the checks below are their only proof."
# "mode path" of every non-directory entry, the deb's with its paths where the rpm has them
# (the differences at the top of packaging/CMakeLists.txt): the libdir, the unit's directory.
# The CMake package's per-configuration file is named after the build type: None in debhelper's
# build, RelWithDebInfo in the spec's.
deb_files() {
  dpkg-deb -c "$1" | awk '$1 !~ /^d/ { sub(/^\./, "", $6); print $1, $6 }' |
    sed -e "s| /usr/lib/$multiarch/| /usr/lib64/|" -e 's| /lib/systemd/system/| /usr/lib/systemd/system/|' \
      -e 's|/framelinkTargets-[a-z]*\.cmake$|/framelinkTargets-CONFIG.cmake|' | sort
}
rpm_files() {
  rpm -qp --qf '[%{FILEMODES:perms} %{FILENAMES}\n]' "$1" 2>/dev/null | awk '$1 !~ /^d/' |
    sed -e 's|/framelinkTargets-[a-z]*\.cmake$|/framelinkTargets-CONFIG.cmake|' | sort
}
deb_only() {
  echo "/usr/share/lintian/overrides/$1"
  echo "/usr/share/doc/$1/changelog.Debian.gz"
  echo "/usr/share/doc/$1/copyright"
}
rpm_only() { echo "/usr/share/licenses/$1/copyright"; }
for p in "${packages[@]}"; do
  r=${rpmf[$p]}
  echo "== $(basename "$r") ($(du -k "$r" | cut -f1) KiB)"
  rpm_files "$r" | sed 's/^/  /'
  # Files: the same list with the same modes, modulo the documented differences.
  diff_out=$(diff <(deb_files "${deb[$p]}" | grep -vxF -f <(deb_only "$p" | sed 's/^/-rw-r--r-- /') || true) \
    <(rpm_files "$r" | grep -vxF -f <(rpm_only "$p" | sed 's/^/-rw-r--r-- /') || true) || true)
  [[ -z "$diff_out" ]] || { echo "$diff_out"; fail "$p: the rpm's files differ from the deb's (< deb, > rpm)"; }
  for f in $(rpm_only "$p"); do
    rpm_files "$r" | grep " $f\$" >/dev/null || fail "$p: the rpm lacks $f"
  done
  echo "  files: same as the deb (libdir /usr/lib64 for /usr/lib/$multiarch, unit in /usr/lib/systemd/system, licenses/ for doc/copyright)"
  [[ "$(rpm -qp --qf '%{NAME} %{VERSION}-%{RELEASE}' "$r" 2>/dev/null)" == "$p $version" ]] ||
    fail "$p: the rpm is $(rpm -qp --qf '%{NAME} %{VERSION}-%{RELEASE}' "$r"), the deb $p $version"

  # Conffiles.
  dpkg-deb --ctrl-tarfile "${deb[$p]}" | tar -x -C "$work" --one-top-level="ctrl-$p"
  deb_conf=$(sort "$work/ctrl-$p/conffiles" 2>/dev/null || true)
  rpm_conf=$(rpm -qp --configfiles "$r" 2>/dev/null | sort || true)
  [[ "$deb_conf" == "$rpm_conf" ]] ||
    fail "$p: conffiles differ: deb '${deb_conf//$'\n'/ }', rpm %config '${rpm_conf//$'\n'/ }'"
  [[ -z "$deb_conf" ]] || echo "  conffiles: ${deb_conf//$'\n'/ } (deb conffiles = rpm %config)"

  # Requires: every shared library a packaged ELF file needs, as the deb's shlibdeps saw them.
  requires=$(rpm -qp --requires "$r" 2>/dev/null)
  mkdir -p "$work/data-$p"
  dpkg-deb -x "${deb[$p]}" "$work/data-$p"
  mapfile -t needed < <(find "$work/data-$p" -type f -exec sh -c 'readelf -d "$1" 2>/dev/null' _ {} \; |
    sed -nE 's/.*\(NEEDED\).*\[(.*)\]/\1/p' | sort -u)
  for so in "${needed[@]}"; do
    grep -qxF "$so()(64bit)" <<<"$requires" || fail "$p: needs $so, which the rpm does not require"
  done
  echo "  requires: all ${#needed[@]} needed shared libraries (${needed[*]:-none})"
  deps=$(dpkg-deb -f "${deb[$p]}" Depends)
  case $p in
    libframelink-dev | framelink-tools | framelink-bench)
      grep -qE "^libframelink0(\(x86-64\))? = $version\$" <<<"$requires" || fail "$p: the rpm does not require libframelink0 = $version"
      [[ "$deps" == *"libframelink0 (= $version)"* ]] || fail "$p: the deb does not depend on libframelink0 (= $version)"
      echo "  requires: libframelink0 = $version (deb: libframelink0 (= $version))" ;;
    framelinkd)
      [[ "$deps" == *"systemd | systemd-standalone-sysusers"* ]] ||
        fail "$p: the deb does not depend on systemd-sysusers (the postinst runs it): $deps"
      echo "  depends: systemd-sysusers (deb: $deps)" ;;
  esac
  if [[ $p == libframelink0 ]]; then
    rpm -qp --provides "$r" 2>/dev/null | grep -xF 'libframelink.so.0()(64bit)' >/dev/null ||
      fail "libframelink0: the rpm does not provide libframelink.so.0()(64bit)"
    dpkg-deb --ctrl-tarfile "${deb[$p]}" | tar -xO ./shlibs | grep '^libframelink 0 libframelink0' >/dev/null ||
      fail "libframelink0: the deb has no shlibs entry for libframelink.so.0"
    grep -qx 'activate-noawait ldconfig' "$work/ctrl-$p/triggers" || fail "libframelink0: the deb has no ldconfig trigger"
    echo "  provides: libframelink.so.0()(64bit) (deb: shlibs 'libframelink 0 libframelink0', ldconfig trigger)"
  fi

  # Scriptlets: parse them, and see the ones that matter are there.
  for tag in PREIN POSTIN PREUN POSTUN; do
    body=$(rpm -qp --qf "%{$tag}" "$r" 2>/dev/null)
    [[ "$body" == "(none)" ]] && continue
    sh -n <(printf '%s\n' "$body") || fail "$p: the rpm's $tag scriptlet does not parse"
  done
  for s in preinst postinst prerm postrm; do
    [[ -f "$work/ctrl-$p/$s" ]] || continue
    sh -n "$work/ctrl-$p/$s" || fail "$p: the deb's $s does not parse"
  done
  if [[ $p == framelinkd ]]; then
    scripts=$(rpm -qp --scripts "$r" 2>/dev/null)
    for want in 'systemd-sysusers' 'useradd --system' 'peer.token' "stat -c '%U:%G %a'" 'tls/host.key' \
      'preset framelinkd.service' 'disable --now framelinkd.service' 'try-restart framelinkd.service'; do
      grep -qF -- "$want" <<<"$scripts" || fail "framelinkd: the rpm scriptlets lack '$want'"
    done
    grep -qF 'systemd-sysusers' "$work/ctrl-$p/postinst" || fail "framelinkd: the deb postinst creates no user"
    grep -qF 'peer.token' "$work/ctrl-$p/postinst" || fail "framelinkd: the deb postinst makes no peer token"
    grep -qF 'deb-systemd-helper' "$work/ctrl-$p/postinst" || fail "framelinkd: the deb postinst does not enable the unit"
    grep -qF 'deb-systemd-invoke stop' "$work/ctrl-$p/prerm" || fail "framelinkd: the deb prerm does not stop the service"
    echo "  scriptlets: %pre sysusers, %post secrets+preset, %preun disable --now, %postun try-restart (deb: postinst sysusers+secrets+enable+start, prerm stop, postrm purge)"
  fi
done

took=$((SECONDS - start))
echo
echo "PACKAGES OK: $((${#packages[@]} + ${#deb_only_packages[@]})) debs (+ dbgsym, source package) + ${#packages[@]} rpms (+ debuginfo, src.rpm) in $out," \
  "lintian and rpmlint clean; rpms checked against the debs by metadata only (not installed: no Fedora/Rocky root here) (${took}s)"
