#!/usr/bin/env bash
# Writes what the manual page and the bash completion of a tool with subcommands (framelink(1),
# framelink-bench(1)) need from the tool's own --help, so that both follow the options as they
# change:
#   framelink-commands.sh man TOOL OUTPUT          help2man include file: a COMMANDS section,
#                                                  one subsection per subcommand with every
#                                                  option of its --help
#   framelink-commands.sh completion TOOL OUTPUT   bash completion of the tool
# The subcommands are those `TOOL --help` lists (CLI11 hides the internal ones); the tool's
# name is TOOL's file name.
set -euo pipefail
mode=$1 tool=$2 out=$3
name=$(basename "$tool")
func=_${name//-/_}

# The subcommands: the "Subcommands:" block of `framelink --help`.
subcommands() {
  "$tool" --help | awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { on = 0 }'
}
# The options of one subcommand, one per line: every -x/--long name in the option column of
# its --help (aliases such as -q,--quiet give two names).
options_of() {
  "$1" "$2" --help | awk '
    /^[A-Za-z].*:$/ { opts = ($0 == "Options:"); next }
    opts && /^  -/ { spec = substr($0, 3); sub(/  .*/, "", spec); split(spec, w, " ")
                     n = split(w[1], names, ",")
                     # CLI11 writes a negated flag as --no-NAME{false}: the word is --no-NAME.
                     for (i = 1; i <= n; i++) { sub(/\{.*/, "", names[i]); print names[i] } }'
}

mapfile -t subs < <(subcommands)
((${#subs[@]} > 0)) || { echo "$tool --help lists no subcommands" >&2; exit 1; }

case $mode in
  man)
    {
      echo "[COMMANDS]"
      for s in "${subs[@]}"; do
        # CLI11's help: the description, "Usage: PATH sub [OPTIONS] ...", then blocks
        # ("Positionals:", "Options:") of "  SPEC  DESCRIPTION" lines, a SPEC longer than its
        # column alone on its line with the description on the next.
        "$tool" "$s" --help | awk -v sub_="$s" -v tool="$name" '
          function roff(t) { gsub(/\\/, "\\e", t); gsub(/-/, "\\-", t); sub(/^[.'"'"']/, "\\&&", t); return t }
          NR == 1 { desc = $0; next }
          /^Usage:/ { u = $0; sub(/^Usage: [^ ]* /, "", u)
                      printf ".SS \"%s %s\"\n%s\n.PP\n.B %s\n%s\n", tool, sub_, roff(desc), tool, roff(u); next }
          /^[A-Za-z].*:$/ { printf ".PP\n%s\n", roff($0); next }
          /^    / { t = $0; sub(/^ +/, "", t); printf "%s\n", roff(t); next }
          /^  [^ ]/ { spec = substr($0, 3); text = ""
                      if (match(spec, /   */)) { text = substr(spec, RSTART + RLENGTH); spec = substr(spec, 1, RSTART - 1) }
                      printf ".TP\n.B %s\n", roff(spec); if (text != "") printf "%s\n", roff(text); next }
        '
      done
    } >"$out.tmp" ;;
  completion)
    {
      printf '# bash completion of %s, generated from `%s <subcommand> --help` at build time.\n%s() {\n' \
        "$name" "$name" "$func"
      cat <<'HEAD'
  local cur prev words cword
  _init_completion || return
  local sub="" i
  for ((i = 1; i < cword; i++)); do
    case ${words[i]} in -*) ;; *) sub=${words[i]}; break ;; esac
  done
  local opts
  case $sub in
HEAD
      for s in "${subs[@]}"; do
        mapfile -t opts < <(options_of "$tool" "$s")
        printf '    %s) opts="%s" ;;\n' "$s" "${opts[*]}"
      done
      cat <<TAIL
    "")
      if [[ \$cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "--help --version" -- "\$cur")
      else
        mapfile -t COMPREPLY < <(compgen -W "${subs[*]}" -- "\$cur")
      fi
      return ;;
    *) return ;;
  esac
  case \$prev in
    --socket | --journal | --config | --framelinkd) _filedir; return ;;
    --out) _filedir -d; return ;;
  esac
  if [[ \$cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "\$opts" -- "\$cur")
  elif [[ \$sub == send ]]; then
    _filedir
  fi
}
complete -F $func $name
TAIL
    } >"$out.tmp" ;;
  *) echo "usage: $0 man|completion TOOL OUTPUT" >&2; exit 2 ;;
esac
mv "$out.tmp" "$out"
