# Shared by the scripts that build a Debian 12 root file system for the debs with debootstrap
# (tests/service/run-guest.sh, packaging/container/build-image.sh).  Source it; it defines:
#
#   debs_root_packages FIELDS DEB...
#       prints, one a line and sorted, the packages a root file system must hold so that the
#       debs install with no network: the first alternative of each relation in FIELDS (e.g.
#       "Pre-Depends Depends Recommends"), versions and architectures dropped, less the debs'
#       own packages; a virtual name (libspdlog1.10-fmt9) becomes the package that provides it
#       here (installed, else the first apt knows).  Returns 2 with a message on stderr when a
#       file is not a deb or nothing provides a dependency.
#   debian_mirror
#       prints the Debian mirror to debootstrap from: $FRAMELINK_DEBIAN_MIRROR, else the first
#       URI of a bookworm source of apt here, else http://deb.debian.org/debian.
#   unmount_under DIR
#       unmounts, deepest first, whatever is mounted under DIR: debootstrap mounts proc and sys
#       in its tree while it works (and may bind /dev), and a failed run leaves them there.
#   remove_scratch DIR
#       unmount_under DIR, then removes DIR without crossing a mount: never deletes through one.

debs_root_packages() {
  local fields=$1
  shift
  local -A ours=() provider=()
  local f n d p pkg provides v
  local -a deps=() out=()
  for f in "$@"; do
    n=$(dpkg-deb -f "$f" Package) || { echo "debian-root: $f is not a deb" >&2; return 2; }
    ours[$n]=1
  done
  # shellcheck disable=SC2086  # FIELDS is a list of field names
  mapfile -t deps < <(for f in "$@"; do
    dpkg-deb -f "$f" $fields | sed -E 's/^[A-Za-z-]+: //'
  done | tr ',' '\n' | sed -E 's/\|.*//; s/\(.*\)//; s/:[a-z0-9]+//; s/[[:space:]]//g' | grep -v '^$' | sort -u)
  # debootstrap takes real packages only.
  while read -r pkg provides; do
    for v in $(echo "$provides" | tr ',' '\n' | sed -E 's/\(.*\)//; s/[[:space:]]//g'); do provider[$v]=${provider[$v]:-$pkg}; done
  done < <(dpkg-query -W -f='${Package} ${Provides}\n' 2>/dev/null | awk 'NF > 1')
  for d in "${deps[@]}"; do
    [[ -n "${ours[$d]:-}" ]] && continue
    if [[ -z "$(dpkg-query -W -f='${Version}' "$d" 2>/dev/null)" ]] && ! apt-cache show "$d" 2>/dev/null | grep -q '^Version:'; then
      p=${provider[$d]:-$(apt-cache showpkg "$d" 2>/dev/null | sed -n '/^Reverse Provides:/{n;p;q}' | cut -d' ' -f1)}
      [[ -n "$p" ]] || { echo "debian-root: nothing provides $d (a dependency of the debs)" >&2; return 2; }
      d=$p
    fi
    out+=("$d")
  done
  ((${#out[@]} == 0)) || printf '%s\n' "${out[@]}" | sort -u
}

debian_mirror() {
  local mirror=${FRAMELINK_DEBIAN_MIRROR:-}
  if [[ -z "$mirror" ]]; then
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '/^deb[ \t]/ && / bookworm[ \t]/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }
           /^URIs:/ { uri = $2 } /^Suites:/ && / bookworm( |$)/ && uri ~ /^https?:/ { print uri; exit }')
  fi
  echo "${mirror:-http://deb.debian.org/debian}"
}

unmount_under() {
  local m
  findmnt -rn -o TARGET | { grep -E "^$1/" || true; } | sort -r | while read -r m; do umount -l "$m" || true; done
}

remove_scratch() {
  unmount_under "$1"
  rm -rf --one-file-system "$1"
}
