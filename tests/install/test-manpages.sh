#!/usr/bin/env bash
# The manual pages and the bash completion against the binaries they describe:
#   test-manpages.sh FRAMELINK FRAMELINKD DIR
# DIR holds framelink.1, framelinkd.8, framelinkd.toml.5 (each may be gzipped) and the
# completions (framelink.bash and framelinkd.bash, or framelink and framelinkd), as the target framelink_manpages writes them
# (build/packaging/man) or as the packages install them.  Fails when
#   * framelink.1 lacks a subcommand of `framelink --help`, or an option of a subcommand's
#     --help in that subcommand's part, or ENVIRONMENT, EXIT STATUS, FILES, SEE ALSO;
#   * framelinkd.8 lacks an option of `framelinkd --help` or FILES, EXIT STATUS, SEE ALSO;
#   * framelinkd.toml.5 lacks a key of `framelinkd --print-config-reference` in its section,
#     or one of its flags;
#   * the completion's words for a subcommand are not the options of its --help, or completing
#     `framelink <sub> --` does not offer them; completing `framelinkd --` does not offer every
#     option of `framelinkd --help`.
set -euo pipefail
cli=$1 daemon=$2 dir=$3
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

cli_page=$(page framelink.1)
mapfile -t subs < <("$cli" --help | awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }')
((${#subs[@]} >= 8)) || bad "framelink --help lists ${#subs[@]} subcommands, expected send, recv, demo, bench, stats, clients, links, doctor"
checked=0
for s in "${subs[@]}"; do
  # The subcommand's part: from its .SS to the next .SS or .SH.
  part=$(awk -v h=".SS \"framelink $s\"" '$0 == h { on = 1; next } on && /^\.S[SH] / { on = 0 } on' <<<"$cli_page")
  [[ -n "$part" ]] || { bad "framelink.1 has no part for 'framelink $s'"; continue; }
  while read -r opt; do
    grep -qE -- "(^|[^-A-Za-z0-9])$opt([^-A-Za-z0-9]|\$)" <<<"$part" || bad "framelink.1: 'framelink $s' lacks $opt (in 'framelink $s --help')"
    checked=$((checked + 1))
  done < <("$cli" "$s" --help | help_options)
done
for section in ENVIRONMENT 'EXIT STATUS' FILES 'SEE ALSO'; do
  grep -qE "^\.SH \"?$section\"?\$" <<<"$cli_page" || bad "framelink.1 has no $section section"
done
for word in FRAMELINK_SOCKET /etc/framelink/framelinkd.toml /etc/framelink/peer.token /etc/framelink/tls/ /run/framelink/framelinkd.sock 'framelinkd.toml (5)'; do
  grep -qF -- "$word" <<<"$cli_page" || bad "framelink.1 does not mention $word"
done
echo "framelink.1: ${#subs[@]} subcommands, $checked options checked"

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

completion=$dir/framelink.bash
[[ -f $completion ]] || completion=$dir/framelink
[[ -f $completion ]] || { bad "no completion (framelink.bash or framelink) in $dir"; exit 1; }
bash -n "$completion" || bad "the completion does not parse"
for s in "${subs[@]}"; do
  want=$("$cli" "$s" --help | help_options | tr '\n' ' ')
  words=$(sed -nE "s/^ +$s\) opts=\"([^\"]*)\" ;;\$/\1/p" "$completion" | tr ' ' '\n' | sort -u | tr '\n' ' ')
  [[ "$words" == "$want" ]] || bad "completion of 'framelink $s': '$words', its --help: '$want'"
  # Completing `framelink <sub> --` offers every long option (bash-completion's helpers stubbed).
  offered=$(COMPLETION=$completion SUB=$s bash -c '
    _init_completion() { words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; cur=${words[cword]}; prev=${words[cword-1]}; }
    _filedir() { :; }
    source "$COMPLETION"
    COMP_WORDS=(framelink "$SUB" --); COMP_CWORD=2
    _framelink
    printf "%s\n" "${COMPREPLY[@]}"' | sort -u | tr '\n' ' ')
  want_long=$(tr ' ' '\n' <<<"$want" | grep -E '^--' | sort -u | tr '\n' ' ')
  [[ "$offered" == "$want_long" ]] || bad "completing 'framelink $s --' offers '$offered', expected '$want_long'"
done
offered=$(COMPLETION=$completion bash -c '
  _init_completion() { words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD; cur=${words[cword]}; prev=${words[cword-1]}; }
  source "$COMPLETION"; COMP_WORDS=(framelink ""); COMP_CWORD=1; _framelink; printf "%s\n" "${COMPREPLY[@]}"' | sort | tr '\n' ' ')
[[ "$offered" == "$(printf '%s\n' "${subs[@]}" | sort | tr '\n' ' ')" ]] || bad "completing 'framelink ' offers '$offered', not the subcommands ${subs[*]}"
echo "completion: the options of ${#subs[@]} subcommands"

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
