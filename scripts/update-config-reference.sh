#!/usr/bin/env bash
# Rewrites the configuration table in docs/reference/configuration.md (between the config-reference
# markers) from the daemon's option table:
#   scripts/update-config-reference.sh [path/to/framelinkd]   (default: build/proxy/framelinkd)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
framelinkd=${1:-$root/build/proxy/framelinkd}
page=$root/docs/reference/configuration.md

table=$(mktemp)
trap 'rm -f "$table"' EXIT
"$framelinkd" --print-config-reference >"$table"
grep -q '^<!-- BEGIN config-reference' "$page" || {
  echo "docs/reference/configuration.md has no '<!-- BEGIN config-reference' marker" >&2
  exit 1
}
awk -v table="$table" '
  /^<!-- BEGIN config-reference/ { print; while ((getline line < table) > 0) print line; skip = 1; next }
  /^<!-- END config-reference -->/ { skip = 0 }
  !skip { print }
' "$page" >"$page.new"
mv "$page.new" "$page"
echo "updated $page"
