#!/usr/bin/python3
"""Every command line the documentation gives, checked against the binaries' --help.

In README.md and docs/**/*.md, each use of `framelink`, `framelink-bench` or `framelinkd` in a
code block or a code span is read as a command line: its subcommand (for the two tools) must be
one the tool's --help lists, and each --option after it one that the subcommand's (or the
daemon's) --help lists, with its aliases. Words after a shell separator (| && ; # > < `) end a
command line. docs/internals/benchmark-history.md keeps the commands of the releases it records,
so it is not read.

  scripts/check-doc-commands.py BUILD_DIR     exit 0 when every command is known, 1 naming
                                             each file:line that is not, 2 on a bad build dir
"""
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIPPED = {"docs/internals/benchmark-history.md"}
SEPARATORS = {"|", "||", "&&", ";", "#", ">", ">>", "<", "2>&1", "&", ")", "`"}


def run_help(argv):
    out = subprocess.run(argv + ["--help"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        sys.exit(f"check-doc-commands: {' '.join(argv)} --help exited {out.returncode}: {out.stderr[:300]}")
    return out.stdout


def options(help_text):
    """Every --long option a CLI11 help lists, aliases included (--a,--b)."""
    return set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", help_text))


def subcommands(help_text):
    part = help_text.split("Subcommands:", 1)
    return set(re.findall(r"^  ([a-z][a-z0-9-]*) ", part[1], re.M)) if len(part) == 2 else set()


def tool_table(binary):
    top = run_help([binary])
    table = {"": options(top)}
    for sub in subcommands(top):
        table[sub] = options(run_help([binary, sub])) | table[""]
    return table


def code_lines(text):
    """(line number, text) of each line of a fenced block, and of each inline code span elsewhere."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            yield number, line
        else:
            for span in re.findall(r"`([^`]+)`", line):
                yield number, span


def words(line):
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;<>()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        return list(lexer)
    except ValueError:  # an unbalanced quote in prose: split on blanks
        return line.split()


def check_line(where, line, tools, findings):
    toks = words(line)
    for i, tok in enumerate(toks):
        # A path names the binary only as one of ours would be run (/usr/bin/..., build/...,
        # ./..., $VAR/...): localhost/framelinkd is an image. An option's value (--name
        # framelinkd, -aG framelink) or a package, page or unit name is no command.
        name = tok.rsplit("/", 1)[-1]
        if name not in tools or ("/" in tok and not re.match(r"[/.$~]|build", tok)):
            continue
        if i > 0 and (toks[i - 1].startswith("-") or toks[i - 1] in ("apt", "install", "man", "systemctl")):
            continue
        table = tools[name]
        rest = []
        for t in toks[i + 1:]:
            if t in SEPARATORS or t in tools:
                break
            rest.append(t)
        sub = ""
        if "" in table and len(table) > 1 and rest and not rest[0].startswith("-"):
            if rest[0] not in table:
                if re.fullmatch(r"[a-z][a-z-]*", rest[0]) and rest[0] not in ("is", "and", "or", "the", "as"):
                    findings.append(f"{where}: {name} {rest[0]}: no such subcommand ({', '.join(sorted(k for k in table if k))})")
                continue
            sub = rest[0]
            rest = rest[1:]
        known = table[sub]
        for t in rest:
            opt = t.split("=", 1)[0]
            if re.fullmatch(r"--[a-z0-9][a-z0-9-]*", opt) and opt not in known:
                findings.append(f"{where}: {name}{' ' + sub if sub else ''} {opt}: no such option")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    build = pathlib.Path(sys.argv[1])
    binaries = {"framelink": build / "client/cli/framelink", "framelink-bench": build / "client/bench/framelink-bench",
                "framelinkd": build / "proxy/framelinkd"}
    for path in binaries.values():
        if not path.is_file():
            print(f"check-doc-commands: {path} is missing: build first", file=sys.stderr)
            return 2
    tools = {name: tool_table(str(path)) for name, path in binaries.items() if name != "framelinkd"}
    tools["framelinkd"] = {"": options(run_help([str(binaries["framelinkd"])]))}
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    findings, commands = [], 0
    for f in files:
        rel = str(f.relative_to(ROOT))
        if rel in SKIPPED:
            continue
        for number, line in code_lines(f.read_text()):
            before = len(findings)
            check_line(f"{rel}:{number}", line, tools, findings)
            commands += any(w.rsplit("/", 1)[-1] in tools for w in words(line)) and len(findings) == before
    for finding in findings:
        print("check-doc-commands: " + finding)
    if findings:
        return 1
    print(f"check-doc-commands: {commands} command lines in README.md and docs/ name only subcommands and options "
          "that framelink, framelink-bench and framelinkd --help list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
