"""MkDocs hooks of the documentation site (mkdocs.yml: hooks).

GitHub shows `a\\|b` in a table cell's code span as `a|b`; Python-Markdown keeps the backslash.
The configuration table (framelinkd --print-config-reference) escapes its pipes that way, so the
site drops the backslash inside code spans.
"""
import re

_CODE = re.compile(r"<code>.*?</code>", re.S)


def on_page_content(html, **kwargs):
    return _CODE.sub(lambda m: m.group(0).replace("\\|", "|"), html)
