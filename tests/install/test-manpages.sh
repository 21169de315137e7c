#!/usr/bin/env bash
# The manual pages and the bash completions against the binaries they describe:
#   test-manpages.sh FRAMELINK FRAMELINKD DIR FRAMELINK_BENCH
# DIR holds framelink.1, framelink-bench.1, framelinkd.8, framelinkd.toml.5 (each may be gzipped)
# and the completions (framelink.bash, framelink-bench.bash and framelinkd.bash, or framelink,
# framelink-bench and framelinkd), as the target framelink_manpages writes them
# (build/packaging/man) or as the packages install them.  Fails when
#   * framelink.1 or framelink-bench.1 lacks a subcommand of the tool's --help, or an option of
#     a subcommand's --help in that subcommand's part, or one of its sections (ENVIRONMENT,
#     EXIT STATUS, SEE ALSO; framelink.1 also FILES);
#   * framelinkd.8 lacks an option of `framelinkd --help` or FILES, EXIT STATUS, SEE ALSO;
#   * framelinkd.toml.5 lacks a key of `framelinkd --print-config-reference` in its section,
#     or one of its flags;
#   * a tool's completion words for a subcommand are not the options of its --help, or
#     completing `TOOL <sub> --` does not offer them; completing `framelinkd --` does not offer
#     every option of `framelinkd --help`.
set -euo pipefail
cli=$1 daemon=$2 dir=$3 bench=${4:?usage: test-manpages.sh FRAMELINK FRAMELINKD DIR FRAMELINK_BENCH}
failures=0
bad() { echo "FAILED: $*" >&2; failures=$((failures + 1)); }

# A page as plain text for grep: without font changes, roff's \- as -; one page from DIR/NAME or DIR/NAME.gz.
page() {
  local f=$dir/$1
  if [[ -f $f ]]; then cat "$f"; elif [[ -f $f.gz ]]; then zcat "$f.gz"; else echo "no $f(.gz)" >&2; return 1; fi |
    sed -e 's/\\f[BIRP]//g' -e 's/\\-/-/g' -e 's/\\(en/-/g'
}
# Every -x / --long name in the option column of a CLI11 --help (text before the description).
help_options() {
  awk '/^  -/ { spec = substr($0, 3); sub(/  .*/, "", spec); print spec }' | grep -oE -- '(^|[ ,])--?[A-Za-z][-A-Za-z0-9]*' |
    sed 's/^[ ,]//' | sort -u
}

# tool_page TOOL MIN_SUBCOMMANDS SECTIONS...: the page NAME.1 of TOOL (NAME its file name) has a
# part for each subcommand of `TOOL --help` with each option of the subcommand's --help, and the
# sections named.
tool_page() {
  local tool=$1 least=$2 name text part s opt section checked=0
  name=$(basename "$tool")
  shift 2
  text=$(page "$name.1") || { bad "no $name.1"; return; }
  mapfile -t subs < <("$tool" --help | awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }')
  ((${#subs[@]} >= least)) || bad "$name --help lists ${#subs[@]} subcommands (${subs[*]}), expected $least or more"
  for s in "${subs[@]}"; do
    # The subcommand's part: from its .SS to the next .SS or .SH.
    part=$(awk -v h=".SS \"$name $s\"" '$0 == h { on = 1; next } on && /^\.S[SH] / { on = 0 } on' <<<"$text")
    [[ -n "$part" ]] || { bad "$name.1 has no part for '$name $s'"; continue; }
    while read -r opt; do
      grep -qE -- "(^|[^-A-Za-z0-9])$opt([^-A-Za-z0-9]|\$)" <<<"$part" || bad "$name.1: '$name $s' lacks $opt (in '$name $s --help')"
      checked=$((checked + 1))
    done < <("$tool" "$s" --help | help_options)
  done
  for section in "$@"; do
    grep -qE "^\.SH \"?$section\"?\$" <<<"$text" || bad "$name.1 has no $section section"
  done
  echo "$name.1: ${#subs[@]} subcommands, $checked options checked"
  page_text=$text
}

# framelink: send, recv, stats, clients, links, reload, doctor; framelink-bench: demo, run.
tool_page "$cli" 7 ENVIRONMENT 'EXIT STATUS' FILES 'SEE ALSO'
cli_subs=("${subs[@]}")
for word in FRAMELINK_SOCKET /etc/framelink/framelinkd.toml /etc/framelink/peer.token /etc/framelink/tls/ /run/framelink/framelinkd.sock 'framelinkd.toml (5)' 'framelink-bench (1)'; do
  grep -qF -- "$word" <<<"$page_text" || bad "framelink.1 does not mention $word"
done
tool_page "$bench" 2 ENVIRONMENT 'EXIT STATUS' 'SEE ALSO'
bench_subs=("${subs[@]}")

daemon_page=$(page framelinkd.8)
n=0
while read -r opt; do
  grep -qE -- "(^|[^-A-Za-z0-9])$opt([^-A-Za-z0-9]|\$)" <<<"$daemon_page" || bad "framelinkd.8 lacks $opt (in framelinkd --help)"
  n=$((n + 1))
done < <("$daemon" --help | help_options)
for section in 'EXIT STATUS' FILES SIGNALS 'SEE ALSO'; do
  grep -qE "^\.SH \"?$section\"?\$" <<<"$daemon_page" || bad "framelinkd.8 has no $section section"
done
grep -qF 'framelinkd.toml (5)' <<<"$daemon_page" || bad "framelinkd.8 does not refer to framelinkd.toml(5)"
echo "framelinkd.8: $n options checked"

conf_page=$(page framelinkd.toml.5)
keys=0
while IFS= read -r row; do
  key=$(cut -d'|' -f2 <<<"${row//\\|/}" | tr -d '`' | sed 's/^ *//; s/ *$//')
  flag=$(cut -d'|' -f3 <<<"${row//\\|/}" | grep -oE -- '--[a-z][-a-z0-9]*' | head -1 || true)
  if [[ $key =~ ^\[([a-z_]+)\]\ ([a-z_]+)$ ]]; then
    sec=${BASH_REMATCH[1]} name=${BASH_REMATCH[2]}
    part=$(awk -v h=".SH SECTION [$sec]" '$0 == h { on = 1; next } on && /^\.SH / { on = 0 } on' <<<"$conf_page")
    grep -qxF ".B $name" <<<"$part" || bad "framelinkd.toml.5: section [$sec] lacks the key $name"
    keys=$((keys + 1))
  elif [[ $key == '[[peer]]'* ]]; then
    part=$(awk '$0 == ".SH [[peer]] TABLES" { on = 1; next } on && /^\.SH / { on = 0 } on' <<<"$conf_page")
    for k in $(sed 's/^\[\[peer\]\]//; s/,/ /g' <<<"$key"); do
      grep -qE -- "^\.B (.*[ ,])?$k(,|\$)" <<<"$part" || bad "framelinkd.toml.5: [[peer]] lacks the key $k"
      keys=$((keys + 1))
    done
  fi
  [[ -z "$flag" ]] || grep -qF -- "$flag" <<<"$conf_page" || bad "framelinkd.toml.5 lacks the flag $flag (key '$key')"
done < <("$daemon" --print-config-reference | grep -E '^\| ' | grep -vE '^\| key \|')
((keys >= 40)) || bad "framelinkd --print-config-reference gave $keys keys; the table's format changed?"
echo "framelinkd.toml.5: $keys keys checked"

# tool_completion TOOL SUBCOMMAND...: the completion of TOOL offers each subcommand's options and,
# with no subcommand yet, the subcommands.
tool_completion() {
  local tool=$1 name func completion s want words offered want_long
  shift
  name=$(basename "$tool")
  func=_${name//-/_}
  completion=$dir/$name.bash
  [[ -f $completion ]] || completion=$dir/$name
  [[ -f $completion ]] || { bad "no completion ($name.bash or $name) in $dir"; return; }
  bash -n "$completion" || bad "the completion of $name does not parse"
  for s in "$@"; do
    want=$("$tool" "$s" --help | help_options | tr '\n' ' ')
    words=$(sed -nE "s/^ +$s\) opts=\"([^\"]*)\" ;;\$/\1/p" "$completion" | tr ' ' '\n' | sort -u | tr '\n' ' ')
    [[ "$words" == "$want" ]] || bad "completion of '$name $s': '$words', its --help: '$want'"
    # Completing `TOOL <sub> --` offers every long option (bash-completion's helpers stubbed).
    offered=$(COMPLETION=$completion NAME=$name FUNC=$func SUB=$s bash -c '
      _init_completion() { words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; cur=${words[cword]}; prev=${words[cword-1]}; }
      _filedir() { :; }
      source "$COMPLETION"
      COMP_WORDS=("$NAME" "$SUB" --); COMP_CWORD=2
      "$FUNC"
      printf "%s\n" "${COMPREPLY[@]}"' | sort -u | tr '\n' ' ')
    want_long=$(tr ' ' '\n' <<<"$want" | grep -E '^--' | sort -u | tr '\n' ' ')
    [[ "$offered" == "$want_long" ]] || bad "completing '$name $s --' offers '$offered', expected '$want_long'"
  done
  offered=$(COMPLETION=$completion NAME=$name FUNC=$func bash -c '
    _init_completion() { words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; cur=${words[cword]}; prev=${words[cword-1]}; }
    source "$COMPLETION"; COMP_WORDS=("$NAME" ""); COMP_CWORD=1; "$FUNC"; printf "%s\n" "${COMPREPLY[@]}"' | sort | tr '\n' ' ')
  [[ "$offered" == "$(printf '%s\n' "$@" | sort | tr '\n' ' ')" ]] || bad "completing '$name ' offers '$offered', not the subcommands $*"
  echo "completion of $name: the options of $# subcommands"
}

tool_completion "$cli" "${cli_subs[@]}"
tool_completion "$bench" "${bench_subs[@]}"

# framelinkd's completion: every option of its --help, offered when completing `framelinkd --`.
completion=$dir/framelinkd.bash
[[ -f $completion ]] || completion=$dir/framelinkd
if [[ ! -f $completion ]]; then
  bad "no completion of framelinkd (framelinkd.bash or framelinkd) in $dir"
else
  bash -n "$completion" || bad "the completion of framelinkd does not parse"
  want_long=$("$daemon" --help | help_options | grep -E '^--' | tr '\n' ' ')
  offered=$(COMPLETION=$completion bash -c '
    _init_completion() { words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; cur=${words[cword]}; prev=${words[cword-1]}; }
    source "$COMPLETION"; COMP_WORDS=(framelinkd --); COMP_CWORD=1; _framelinkd; printf "%s\n" "${COMPREPLY[@]}"' | sort -u | tr '\n' ' ')
  [[ "$offered" == "$want_long" ]] || bad "completing 'framelinkd --' offers '$offered', its --help: '$want_long'"
  offered=$(COMPLETION=$completion bash -c '
    _init_completion() { words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; cur=${words[cword]}; prev=${words[cword-1]}; }
    source "$COMPLETION"; COMP_WORDS=(framelinkd --log-level ""); COMP_CWORD=2; _framelinkd; printf "%s\n" "${COMPREPLY[@]}"' | tr '\n' ' ')
  [[ "$offered" == "trace debug info warn error " ]] || bad "completing 'framelinkd --log-level ' offers '$offered'"
  echo "completion of framelinkd: $(wc -w <<<"$want_long") options"
fi

((failures == 0)) || { echo "$failures failures" >&2; exit 1; }
echo "ok"
