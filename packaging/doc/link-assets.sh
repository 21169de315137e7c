#!/usr/bin/env bash
# The documentation site as Debian ships web pages: the theme's libraries and fonts that Debian
# packages (jQuery, Modernizr, lunr, Font Awesome, the Read the Docs theme's CSS, scripts and
# fonts) are links to those packages' files, not copies (framelink-doc depends on them).
#
#   packaging/doc/link-assets.sh SITE_DIR
#
# MkDocs copies every file of its theme into the site, following the links Debian's mkdocs
# package made from its theme to those packages.  Each such copy that is still identical to the
# file its link names becomes a link to it (absolute here; dh_link makes it relative).  A copy
# that differs is an error: the site would no longer match the library it claims to be.
set -euo pipefail

site=${1:?usage: $0 SITE_DIR}
[[ -f "$site/index.html" ]] || { echo "link-assets: $site has no index.html (run mkdocs build first)" >&2; exit 2; }
mkdocs_dir=$(/usr/bin/python3 -c 'import mkdocs, os; print(os.path.dirname(mkdocs.__file__))')
theme=$(sed -nE 's/^\s*name:\s*([a-z_]+)\s*$/\1/p' "$(dirname "$0")/../../mkdocs.yml" | head -1)
[[ -d "$mkdocs_dir/themes/$theme" ]] || { echo "link-assets: no theme '$theme' in $mkdocs_dir/themes" >&2; exit 2; }

linked=0
# Theme files land at their path in the theme; the search plugin's at search/<name>.
while IFS= read -r -d '' link; do
  case "$link" in
    "$mkdocs_dir/themes/$theme/"*) rel=${link#"$mkdocs_dir/themes/$theme/"} ;;
    "$mkdocs_dir/contrib/search/templates/"*) rel=${link#"$mkdocs_dir/contrib/search/templates/"} ;;
  esac
  copy=$site/$rel
  [[ -f "$copy" && ! -L "$copy" ]] || continue
  # The path the theme names (/usr/share/javascript/jquery/jquery.min.js), not where that path
  # leads in turn: it is the one its package promises.
  target=$(realpath -s -m "$(dirname "$link")/$(readlink "$link")")
  [[ -f "$target" ]] || { echo "link-assets: $link points at a missing $target" >&2; exit 1; }
  cmp -s "$copy" "$target" || { echo "link-assets: $copy differs from $target, which the theme links" >&2; exit 1; }
  ln -sf "$target" "$copy"
  linked=$((linked + 1))
done < <(find "$mkdocs_dir/themes/$theme" "$mkdocs_dir/contrib/search/templates" -type l -print0)
echo "link-assets: $linked files of $site are links to Debian's packages now"
