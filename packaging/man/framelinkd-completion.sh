#!/usr/bin/env bash
# Writes the bash completion of framelinkd from its own --help, so that it offers the flags
# the daemon has:   framelinkd-completion.sh FRAMELINKD OUTPUT
set -euo pipefail
daemon=$1 out=$2
# Every -x / --long name in the option column (aliases such as --allowed-uids,--allow-uid too).
mapfile -t opts < <("$daemon" --help | awk '/^  -/ { spec = substr($0, 3); sub(/  .*/, "", spec); split(spec, w, " ")
  n = split(w[1], names, ","); for (i = 1; i <= n; i++) print names[i] }')
((${#opts[@]} > 0)) || { echo "$daemon --help lists no options" >&2; exit 1; }
# Flags whose value is one of a few words: their placeholder is word|word|... (--log-level).
mapfile -t choice_opts < <("$daemon" --help | awk '/^  -/ { spec = substr($0, 3); sub(/  .*/, "", spec); split(spec, w, " ")
  if (w[2] ~ /^[a-z]+(\|[a-z]+)+$/) { gsub(/\|/, " ", w[2]); n = split(w[1], names, ","); for (i = 1; i <= n; i++) print names[i] "\t" w[2] } }')
# Flags that take a file: their placeholder is FILE or PATH.
mapfile -t file_opts < <("$daemon" --help | awk '/^  -/ { spec = substr($0, 3); sub(/  .*/, "", spec); split(spec, w, " ")
  if (w[2] == "FILE" || w[2] == "PATH") { n = split(w[1], names, ","); for (i = 1; i <= n; i++) print names[i] } }')
{
  cat <<HEAD
# bash completion of framelinkd, generated from \`framelinkd --help\` at build time.
_framelinkd() {
  local cur prev words cword
  _init_completion || return
  case \$prev in
HEAD
  ((${#file_opts[@]} == 0)) || printf '    %s) _filedir; return ;;\n' "$(IFS='|'; echo "${file_opts[*]}")"
  for c in "${choice_opts[@]}"; do
    printf '    %s) mapfile -t COMPREPLY < <(compgen -W "%s" -- "$cur"); return ;;\n' "${c%%$'\t'*}" "${c#*$'\t'}"
  done
  cat <<TAIL
  esac
  if [[ \$cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "${opts[*]}" -- "\$cur")
  fi
}
complete -F _framelinkd framelinkd
TAIL
} >"$out.tmp"
mv "$out.tmp" "$out"
