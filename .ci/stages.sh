# shellcheck shell=bash
# The stage runner of .ci/run (sourced): serial stages, lanes of stages run side by side, the
# waits between them, and the summary with the time budget.  The state of every stage is in
# files under $logs, so that the lanes (subshells) and the summary share it:
#   <slug>.log      everything the stage printed
#   <slug>.status   its exit status (written last: its presence means the stage has ended);
#                   "skip" when a stage it needs failed
#   <slug>.times    its start and end, in seconds since the run began, and its name
#   <slug>.summary  the line the summary prints for it (a test count, a PASSED line, ...)
#   <slug>.cpu      the CPU time its processes used (bash's `times`: its own, then that of the
#                   children it waited for -- compilers, tests, guests -- user and system)
# Needs: $logs, $start_all, $budget_min, $limit_min, and expected_stages (every stage's name).

# What the summary line of a stage is: a pattern its log's last matching line is taken from.
declare -A summary_pattern=(
  [tests]='tests passed, [0-9]+ tests failed out of [0-9]+'
  ["asan+ubsan tests"]='tests passed, [0-9]+ tests failed out of [0-9]+'
  ["tsan tests"]='tests passed, [0-9]+ tests failed out of [0-9]+'
  [simulation]='^SIMULATION (PASSED|FAILED)'
  [fuzz]='^FUZZ (PASSED|FAILED)'
  [tidy]='^TIDY (PASSED|FAILED)'
  [soft-roce]='^SOFT-ROCE LANE'
  ["container image"]='^CONTAINER IMAGE:'
  ["service guest"]='^SERVICE GUEST:'
  [house]='^HOUSE (PASSED|FAILED)'
  ["previous release"]='^PREVIOUS RELEASE:'
  [fleet]='^FLEET:'
)
# The stages whose summaries make the closing line, in this order.
summary_order=(tests simulation "asan+ubsan tests" "tsan tests" fuzz tidy soft-roce "service guest"
  "container image" fleet "previous release" house)

slug() { local s=${1// /-}; echo "${s//+/}"; }
now() { echo $((SECONDS - start_all)); }
clock() { local t; t=$(now); printf '%02d:%02d' $((t / 60)) $((t % 60)); }
mmss() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

stage_passed() { [[ "$(cat "$logs/$(slug "$1").status" 2>/dev/null)" == 0 ]]; }

# Runs stage function FN as stage NAME at niceness NICE, its output into the stage's log;
# prints one line when it starts and one when it ends.  Never fails itself.
run_stage() {
  local name=$1 nice=$2 fn=$3 show=${4:-0} s rc=0 begin
  s=$logs/$(slug "$name")
  begin=$(now)
  printf '[%s] %s: started\n' "$(clock)" "$name"
  # The stage's CPU time, however it ends: `times`' second line, its children's user and system.
  local cpu_trap="times >'$s.cpu'"
  if ((show)); then
    set +e +o pipefail
    (set -Eeuo pipefail; trap "$cpu_trap" EXIT; "$fn") 2>&1 | tee "$s.log"
    rc=${PIPESTATUS[0]}
    set -e -o pipefail
  else
    # A negative niceness needs root (CI runs as root); elsewhere the stage keeps its parent's.
    (set -Eeuo pipefail; trap "$cpu_trap" EXIT; renice -n "$nice" -p "$BASHPID" >/dev/null 2>&1 || true; "$fn") >"$s.log" 2>&1 &
    wait $! || rc=$?
  fi
  local pattern=${summary_pattern[$name]:-}
  if [[ -n "$pattern" ]]; then
    { grep -E "$pattern" "$s.log" || true; } | tail -1 | cut -c1-160 >"$s.summary"
    # ctest's list of the tests that failed, so that the closing line names them.
    local failed
    failed=$(sed -n '/^The following tests FAILED:/,/^[^[:space:]]/s/^[[:space:]]*[0-9]* - \([^ ]*\).*/\1/p' \
      "$s.log" | sort -u | paste -sd, - | cut -c1-200)
    [[ -z "$failed" ]] || sed -i "s|\$| (failed: ${failed//,/, })|" "$s.summary"
  fi
  echo "$begin $(now) $name" >"$s.times"
  echo "$rc" >"$s.status"
  local took=$(($(now) - begin)) line
  line=$(cat "$s.summary" 2>/dev/null || true)
  if ((rc == 0)); then
    printf '[%s] %s: passed in %s%s\n' "$(clock)" "$name" "$(mmss "$took")" "${line:+ -- $line}"
  else
    printf '[%s] %s: FAILED (exit %d) after %s%s; the last lines of %s:\n' "$(clock)" "$name" "$rc" \
      "$(mmss "$took")" "${line:+ -- $line}" "${s#"$root"/}.log"
    tail -n 80 "$s.log" | sed 's/^/    | /'
  fi
}

# A stage of the serial prefix: its output is shown as it comes; a failure ends the run.
serial_stage() {
  printf '\n==================== %s ====================\n' "$1"
  run_stage "$1" 0 "$2" 1
  stage_passed "$1" || exit 1
}

# Waits until stage NAME has ended, whatever its result.  Bounded: a lane that died without ending
# its stage must not hold another up past the limit.
wait_stage_end() {
  local p=$logs/$(slug "$1").status
  while [[ ! -s "$p" ]] && (($(now) < limit_min * 60)); do sleep 2; done
}

# A stage of a lane: waits for the stage PREREQ (when given) and is not run when that failed.
lane_stage() {
  local name=$1 nice=$2 prereq=$3 fn=$4 p
  if [[ -n "$prereq" ]]; then
    p=$logs/$(slug "$prereq").status
    wait_stage_end "$prereq"
    if ! stage_passed "$prereq"; then
      local why="$prereq failed"
      [[ -s "$p" ]] || why="$prereq did not end within ${limit_min} minutes"
      printf '[%s] %s: not run (%s)\n' "$(clock)" "$name" "$why"
      echo "$(now) $(now) $name" >"$logs/$(slug "$name").times"
      echo "not run: $why" >"$logs/$(slug "$name").summary"
      echo skip >"$logs/$(slug "$name").status"
      return 0
    fi
  fi
  run_stage "$name" "$nice" "$fn"
}

# Runs the lane functions side by side and waits for all of them.
run_lanes() {
  printf '\n==================== lanes: %s ====================\n' "$*"
  local pids=() lane
  for lane in "$@"; do
    "$lane" &
    pids+=($!)
  done
  wait "${pids[@]}" || true
}

# Seconds of CPU in a <slug>.cpu file (`times`: "0m0.01s 0m0.00s" then "12m3.40s 0m20.10s"): the
# children's user and system time; "-" without the file.
cpu_of() {
  [[ -s "$1" ]] || { echo -; return; }
  tail -1 "$1" | awk '{ t = 0; for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] } printf "%dm%02ds", t / 60, t % 60 }'
}

# The summary: every stage with its start, its time, its CPU time and its result; the total against the
# budget; the closing line.  Exits non-zero when a stage failed or the run passed the limit.
finish() {
  local status=$? total b e f name rc result failed=() rows=() slowest
  total=$(now)
  trap - EXIT
  printf '\n==================== summary ====================\n'
  printf '%-18s %6s %8s %8s  %s\n' stage start took cpu result
  while read -r b e name; do
    rc=$(cat "$logs/$(slug "$name").status" 2>/dev/null || echo "?")
    case "$rc" in 0) result=passed ;; skip) result="not run" ;; *) result="FAILED ($rc)"; failed+=("$name") ;; esac
    [[ "$rc" == skip ]] && failed+=("$name")
    printf '%-18s %6s %8s %8s  %s\n' "$name" "$(mmss "$b")" "$(mmss $((e - b)))" "$(cpu_of "$logs/$(slug "$name").cpu")" "$result"
    rows+=("$((e - b)) $name")
  done < <(cat "$logs"/*.times 2>/dev/null | sort -n)
  # A stage that never ran (its lane died, or the run stopped before it) fails the run too.
  local st
  for st in "${expected_stages[@]}"; do
    [[ -s "$logs/$(slug "$st").status" ]] && continue
    printf '%-18s %6s %8s %8s  %s\n' "$st" - - - "never ran"
    failed+=("$st")
  done
  printf '%-18s %6s %8s\n' total "" "$(mmss "$total")"
  slowest=$(printf '%s\n' "${rows[@]}" | sort -rn | head -3 |
    awk '{t=$1; $1=""; sub(/^ /, ""); printf "%s%s %dm%02ds", (NR>1?", ":""), $0, t/60, t%60}')
  if ((total <= budget_min * 60)); then
    echo "time: $(mmss "$total") of the ${budget_min}-minute budget ($((total * 100 / (budget_min * 60)))%)"
  else
    echo "time: $(mmss "$total") is OVER the ${budget_min}-minute budget; the slowest stages: $slowest"
  fi
  if ((total > limit_min * 60)); then
    echo "CI FAILED: the run took $(mmss "$total"), past the ${limit_min}-minute limit (CI stops at 90)."
    echo "  The slowest stages: $slowest -- make them faster or run them side by side (.ci/run's lanes)."
    failed+=("time limit")
  fi
  ((status == 0)) || [[ ${#failed[@]} -gt 0 ]] || failed+=("the script itself (exit $status)")
  local parts=() s line
  for s in "${summary_order[@]}"; do
    line=$(cat "$logs/$(slug "$s").summary" 2>/dev/null || true)
    parts+=("$s: ${line:-not run}")
  done
  if ((${#failed[@]} == 0)); then
    echo "CI PASSED -- $(IFS=';'; echo "${parts[*]}" | sed 's/;/; /g')"
    exit 0
  fi
  echo "CI FAILED in: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g') -- $(IFS=';'; echo "${parts[*]}" | sed 's/;/; /g')"
  exit 1
}
