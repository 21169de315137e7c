#!/usr/bin/env bash
# Checks the documentation: the MkDocs site (mkdocs.yml, docs/) and the README.
#
#   * `mkdocs build --strict` into a temporary directory: a link to a page or file that does not
#     exist, or a nav entry without its page, fails it;
#   * every page under docs/ is in mkdocs.yml's nav (MkDocs itself only mentions the others);
#   * README.md has at most 200 lines;
#   * every relative link in README.md points to an existing file, and every #anchor of a link
#     in README.md or docs/ (to the same page or to another .md file) names a heading there.
#
#   scripts/check-docs.sh     exit 0 when all hold, 1 when one does not, 2 without mkdocs
#
# Needs mkdocs (Debian package `mkdocs`; scripts/setup-deps.sh installs it) and /usr/bin/python3.
set -euo pipefail

cd "$(dirname "$0")/.."

readme_limit=200

if ! command -v mkdocs >/dev/null 2>&1; then
  echo "check-docs: needs mkdocs (apt-get install mkdocs; scripts/setup-deps.sh installs it)" >&2
  exit 2
fi

failed=0
fail() {
  echo "check-docs: FAIL: $*" >&2
  failed=1
}

site=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$site" "$log"' EXIT

if mkdocs build --strict --clean --site-dir "$site" >"$log" 2>&1; then
  echo "check-docs: mkdocs build --strict: ok ($(find "$site" -name index.html | wc -l) pages)"
else
  grep -E 'WARNING|ERROR|Error|Aborted' "$log" >&2 || cat "$log" >&2
  fail "mkdocs build --strict failed (a broken link, or a nav entry without its page; see above)"
fi

lines=$(wc -l <README.md)
if ((lines > readme_limit)); then
  fail "README.md has $lines lines, more than $readme_limit: move the detail into a page under docs/"
else
  echo "check-docs: README.md: $lines lines (limit $readme_limit)"
fi

python3 - <<'EOF' || failed=1
import os, re, sys, unicodedata

def slug(text):
    # Python-Markdown's toc slugify, which MkDocs uses, after the inline markup is dropped.
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', text)
    text = re.sub(r'[`*]', '', text)
    text = unicodedata.normalize('NFKD', text).encode('ascii', 'ignore').decode('ascii')
    text = re.sub(r'[^\w\s-]', '', text).strip().lower()
    return re.sub(r'[-\s]+', '-', text)

def outside_fences(path):
    fence = False
    for n, line in enumerate(open(path, encoding='utf-8'), 1):
        if line.lstrip().startswith('```'):
            fence = not fence
            continue
        if not fence:
            yield n, line

anchors = {}
def anchors_of(path):
    if path not in anchors:
        seen = set()
        for _, line in outside_fences(path):
            m = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
            if m:
                base = s = slug(m.group(1))
                i = 0
                while s in seen:
                    i += 1
                    s = '%s_%d' % (base, i)
                seen.add(s)
        anchors[path] = seen
    return anchors[path]

link = re.compile(r'\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
problems = []
files = ['README.md'] + sorted(os.path.join(d, f) for d, _, fs in os.walk('docs') for f in fs if f.endswith('.md'))
for path in files:
    for n, line in outside_fences(path):
        line = re.sub(r'`[^`]*`', '', line)
        for target in link.findall(line):
            if re.match(r'^[a-z][a-z0-9+.-]*:', target):
                continue  # http:, https:, mailto: ...
            file, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            where = '%s:%d: %s' % (path, n, target)
            if not os.path.exists(dest):
                problems.append(where + ' -> no file ' + dest)
            elif anchor and dest.endswith('.md') and anchor not in anchors_of(dest):
                problems.append(where + ' -> ' + dest + ' has no heading #' + anchor)

nav = set(re.findall(r'([\w./-]+\.md)\s*$', open('mkdocs.yml', encoding='utf-8').read(), re.M))
for path in files[1:]:
    if os.path.relpath(path, 'docs') not in nav:
        problems.append(path + ': not in the nav of mkdocs.yml')

for p in problems:
    print('check-docs: FAIL: ' + p, file=sys.stderr)
if problems:
    sys.exit(1)
print('check-docs: links and anchors in README.md and docs/: ok (%d files)' % len(files))
EOF

if ((failed)); then
  echo "check-docs: FAILED" >&2
  exit 1
fi
echo "check-docs: ok"
