#!/usr/bin/env bash
# The package version changes whenever a wire version does.
#
# Reads the versions the tree speaks -- the peer protocol range (proxy/link/protocol_versions.h),
# the tcp data channel's wire (tcp_wire.h), the rdma connect protocol (rdma_wire.h), the attach
# protocol (attach_proto.h) and the shared-memory layout (shm_layout.h) -- and the package version
# (CMakeLists.txt), and holds them against the last line of packaging/wire-versions.txt:
#   * the same: fine;
#   * other versions under the same package version: fails, saying to bump the package version;
#   * a new package version without its line: fails, printing the line to add.
#
#   scripts/check-versions.sh     exit 0 when they agree, 1 when they do not
set -euo pipefail

cd "$(dirname "$0")/.."
table=packaging/wire-versions.txt

fail() {
  echo "check-versions: $*" >&2
  exit 1
}
# The first match of the sed pattern's group \1 in a file; fails naming it when there is none.
read_version() {
  local file=$1 what=$2 pattern=$3 v
  v=$(sed -nE "s/${pattern}/\\1/p" "$file" | head -1)
  [[ -n "$v" ]] || fail "cannot read the $what from $file (pattern: $pattern): update this script with it"
  printf '%s' "$v"
}

package=$(read_version CMakeLists.txt "package version" '^project\(framelink VERSION ([0-9.]+).*')
peer=$(read_version proxy/link/protocol_versions.h "peer protocol version" \
  '^inline constexpr uint32_t kProtocolVersion = ([0-9]+);.*')
peer_min=$(read_version proxy/link/protocol_versions.h "oldest peer protocol version" \
  '^inline constexpr uint32_t kMinProtocolVersion = ([0-9]+);.*')
tcp=$(read_version proxy/transport/tcp/tcp_wire.h "tcp wire version" \
  '^inline constexpr uint32_t kTcpWireVersion = ([0-9]+);.*')
rdma=$(read_version proxy/transport/rdma/rdma_wire.h "rdma protocol version" \
  '^inline constexpr uint16_t kRdmaProtocolVersion = ([0-9]+);.*')
attach=$(read_version include/framelink/attach_proto.h "attach version" '^#define FL_ATTACH_VERSION ([0-9]+)u.*')
layout=$(read_version include/framelink/shm_layout.h "layout version" '^#define FL_LAYOUT_VERSION ([0-9]+)u.*')

current="$package $peer_min-$peer $tcp $rdma $attach $layout"
last=$(grep -vE '^[[:space:]]*(#|$)' "$table" | tail -1 | tr -s ' \t' ' ' | sed -E 's/ $//')
[[ -n "$last" ]] || fail "$table has no release line; add: $current"
if [[ "$last" == "$current" ]]; then
  echo "VERSIONS AGREE: package $package speaks peer protocol $peer_min-$peer, tcp wire $tcp, rdma $rdma, attach $attach, layout $layout ($table)"
  exit 0
fi
if [[ "${last%% *}" == "$package" ]]; then
  fail "the tree speaks '$current' but $table says package $package speaks '$last':
  a wire version changed, so the package version must too -- bump it in CMakeLists.txt,
  debian/changelog and packaging/rpm/framelink.spec, and add the new line to $table"
fi
fail "package version $package has no line in $table (its last is '$last'); add: $current"
