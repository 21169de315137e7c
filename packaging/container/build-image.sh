#!/usr/bin/env bash
# Builds the OCI image of framelinkd from the debs, offline and from scratch (no base image from a
# registry): a Debian 12 root made by debootstrap (minbase + the run-time dependencies of the
# debs, cached), the debs installed in it with dpkg, secrets, package lists and documentation
# removed, then `podman import` of the tree.  Run as root.
#
#   packaging/container/build-image.sh --debs DIR [--tag NAME] [--uid N] [--cache DIR] [--rebuild]
#                                      [--oci-archive FILE]
#
# --debs DIR: framelinkd_*.deb, libframelink0_*.deb and framelink-tools_*.deb are installed (any
#   other deb in DIR is ignored), whoever made them (scripts/package.sh or dpkg-buildpackage).
# --tag NAME: the image's name (default framelinkd); it is tagged NAME:<the deb's version> and
#   NAME:latest.
# --uid N: uid and gid of the image's user and group framelink (default 7700).  They must be
#   fixed: the attach socket's group is a number shared with the application containers
#   (supplementalGroups / group_add).
# --cache DIR (or $FRAMELINK_CI_CACHE/container-base): where the debootstrap root is kept as a
#   tar, keyed by its packages, the mirror and this script (default
#   /var/cache/framelink-ci/container-base); --rebuild makes it anew.
# --oci-archive FILE: also write the image to FILE (podman save --format oci-archive).
#
# The image: ENTRYPOINT framelinkd-entrypoint (packaging/container/framelinkd-entrypoint), USER
# framelink, /run/framelink for the attach socket (mount the host's directory there), no secret
# (the entry point makes a token and a certificate when none is mounted).  The Recommends of
# framelinkd are left out but ibverbs-providers (the user-space RDMA drivers): rdma-core's
# services belong to the host.  Prints the image's name and size last.
# Exit status: 0 built; 1 failed; 2 usage; 3 a tool is missing (podman, debootstrap).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
debs=""
tag=framelinkd
uid=7700
cache=${FRAMELINK_CI_CACHE:-/var/cache/framelink-ci}/container-base
rebuild=0
archive=""
usage() { sed -n '2,27s/^# \{0,1\}//p' "$0"; }
while (($#)); do
  case "$1" in
    --debs) debs=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --uid) uid=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --rebuild) rebuild=1; shift ;;
    --oci-archive) archive=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build-image: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
say() { printf 'build-image: [%3ds] %s\n' $((SECONDS - t_start)) "$*"; }
t_start=$SECONDS

[[ -n "$debs" && -d "$debs" ]] || { echo "build-image: give --debs DIR with the debs (scripts/package.sh makes them)" >&2; exit 2; }
[[ "$uid" =~ ^[0-9]+$ ]] || { echo "build-image: --uid takes a number" >&2; exit 2; }
((EUID == 0)) || { echo "build-image: run as root (debootstrap, chroot, podman import)" >&2; exit 2; }
for t in podman:podman debootstrap:debootstrap dpkg-deb:dpkg flock:util-linux; do
  command -v "${t%%:*}" >/dev/null 2>&1 || {
    echo "build-image: ${t%%:*} is not installed (package ${t#*:}; scripts/setup-deps.sh --softroce installs it)" >&2
    exit 3
  }
done
shopt -s nullglob
deb_files=()
for p in framelinkd libframelink0 framelink-tools; do
  f=("$debs"/"${p}"_*.deb)
  ((${#f[@]} == 1)) || { echo "build-image: expected one ${p}_*.deb in $debs, found ${#f[@]}" >&2; exit 2; }
  deb_files+=("$(cd "$(dirname "${f[0]}")" && pwd)/$(basename "${f[0]}")")
done
shopt -u nullglob
version=$(dpkg-deb -f "${deb_files[0]}" Version)

# shellcheck source=../../scripts/debian-root.sh
source "$root/scripts/debian-root.sh"
list=$(debs_root_packages "Pre-Depends Depends" "${deb_files[@]}") || exit 2
mapfile -t pkgs <<<"$list"
pkgs+=(ibverbs-providers)
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | grep -v '^$' | sort -u)
mirror=$(debian_mirror)

# ---- the base: debootstrap minbase + the dependencies, as a tar (built once per key)
key=$({ printf '%s\n' "${pkgs[@]}"; echo "$mirror"; sed -n '/^# ---- the base/,/^# ---- end of the base/p' "$0"; } | sha256sum | cut -c1-16)
base=$cache/base-$key.tar
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
((rebuild)) && rm -f "$base"
work=$(mktemp -d "${TMPDIR:-/tmp}/fl-image.XXXXXX")
trap 'remove_scratch "$work"' EXIT
tree=$work/root
if [[ -s "$base" ]]; then
  say "base $base (cached: minbase + ${#pkgs[@]} packages)"
else
  say "base: debootstrap bookworm from $mirror (minbase + ${pkgs[*]})"
  inc=$(printf '%s,' "${pkgs[@]}")
  debootstrap --variant=minbase --include="${inc%,}" --components=main bookworm "$tree" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    tail -n 30 "$tree/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    echo "build-image: debootstrap failed" >&2
    exit 1
  }
  unmount_under "$work"
  printf 'deb %s bookworm main\n' "$mirror" >"$tree/etc/apt/sources.list"
  # What a container does not use: package lists and caches, documentation (copyrights kept),
  # manual pages, translations, logs.
  rm -rf "$tree"/var/lib/apt/lists/* "$tree"/var/cache/apt/* "$tree"/var/cache/debconf/*-old \
    "$tree"/usr/share/man/* "$tree"/usr/share/info/* "$tree"/usr/share/locale/* "$tree"/var/log/* \
    "$tree"/debootstrap
  find "$tree/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$tree/usr/share/doc" -mindepth 1 -type d -empty -delete
  # Later dpkg runs in the image leave them out too.
  printf '%s\n' 'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/locale/*' \
    'path-exclude=/usr/share/info/*' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
    >"$tree/etc/dpkg/dpkg.cfg.d/framelink-container"
  : >"$tree/etc/machine-id"
  tar --numeric-owner --xattrs -C "$tree" -cf "$base.tmp" .
  mv -f "$base.tmp" "$base"
  ls -1t "$cache"/base-*.tar 2>/dev/null | tail -n +3 | xargs -r rm -f
  say "base built: $(du -m "$base" | cut -f1) MiB tar in $base"
  rm -rf --one-file-system "$tree"
fi
# ---- end of the base
flock -u 9

# ---- the image's tree: the base, the user and group framelink with a fixed id, the debs
mkdir -p "$tree"
tar --numeric-owner --xattrs -C "$tree" -xf "$base"
# -K: a fixed id above the system range is what is wanted, no warning for it.
chroot "$tree" groupadd --system -K SYS_GID_MAX=65533 --gid "$uid" framelink
chroot "$tree" useradd --system -K SYS_UID_MAX=65533 --uid "$uid" --gid framelink --no-create-home --home-dir /var/lib/framelink \
  --shell /usr/sbin/nologin --comment "framelink daemon" framelink
mkdir -p "$tree/tmp/debs"
cp "${deb_files[@]}" "$tree/tmp/debs/"
# No service is started in the chroot (the postinst starts one only under systemd anyway).
printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
chmod 0755 "$tree/usr/sbin/policy-rc.d"
say "installing ${deb_files[*]##*/}"
in_tree=()
for f in "${deb_files[@]}"; do in_tree+=("/tmp/debs/${f##*/}"); done
chroot "$tree" dpkg -i "${in_tree[@]}" \
  >"$work/dpkg.log" 2>&1 || {
  cat "$work/dpkg.log" >&2
  echo "build-image: dpkg -i of the debs failed in the image's tree" >&2
  exit 1
}
rm -rf "$tree/tmp/debs" "$tree/usr/sbin/policy-rc.d"
# The postinst made this tree's peer token and TLS key: an image must not carry them (every
# container would share them); the entry point makes a container's own, or they are mounted.
rm -f "$tree/etc/framelink/peer.token" "$tree/etc/framelink/tls/host.key" "$tree/etc/framelink/tls/host.crt"
install -d -m 0700 -o "$uid" -g "$uid" "$tree/var/lib/framelink"
install -d -m 0750 -o "$uid" -g "$uid" "$tree/run/framelink"
install -m 0755 "$here/framelinkd-entrypoint" "$tree/usr/local/sbin/framelinkd-entrypoint"
rm -rf "$tree"/var/log/* "$tree"/var/cache/debconf/*-old "$tree"/var/lib/dpkg/*-old
# The systemd unit is of no use in a container; kept, it costs nothing.
[[ -x "$tree/usr/sbin/framelinkd" && -x "$tree/usr/bin/framelink" ]] ||
  { echo "build-image: the debs did not install /usr/sbin/framelinkd and /usr/bin/framelink" >&2; exit 1; }

# ---- the image
name=$tag:$version
say "podman import -> $name"
# The images these names point at now: removed once the names point at the new one (unless
# another name or a container still uses them), so that rebuilds leave no untagged images.
old_ids=$(podman image inspect --format '{{.Id}}' "$name" "$tag:latest" 2>/dev/null | sort -u || true)
tar --numeric-owner --xattrs -C "$tree" -c . | podman import \
  --change 'ENTRYPOINT ["/usr/local/sbin/framelinkd-entrypoint"]' \
  --change 'CMD []' \
  --change "USER $uid:$uid" \
  --change 'WORKDIR /var/lib/framelink' \
  --change 'VOLUME /run/framelink' \
  --change 'EXPOSE 7700/tcp' --change 'EXPOSE 7701/tcp' \
  --change "LABEL org.opencontainers.image.title=framelinkd org.opencontainers.image.version=$version org.framelink.uid=$uid" \
  --message "framelinkd $version: debootstrap bookworm minbase + the debs" \
  --quiet - "$name" >/dev/null
podman tag "$name" "$tag:latest"
for id in $old_ids; do podman rmi "$id" >/dev/null 2>&1 || true; done
if [[ -n "$archive" ]]; then
  rm -f "$archive"
  podman save --format oci-archive -o "$archive" "$name" >/dev/null
  say "wrote $archive ($(du -m "$archive" | cut -f1) MiB)"
fi
size=$(podman image inspect --format '{{.Size}}' "$name")
say "image $name: $((size / 1024 / 1024)) MiB uncompressed ($size bytes), user framelink = $uid:$uid"
