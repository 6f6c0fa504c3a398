#!/usr/bin/env bash
# Replays each target's committed corpus (spec/fuzz/corpus/<target>/) and the
# crashes `make fuzz` saved (build-fuzz/crashes/<target>/) through the
# harnesses built with replay.c under ASan/UBSan, and ends with one line
# "N passed, N failed": one test per input.  An input that crashes its
# harness counts as failed, its report is shown, and the replay goes on
# with the inputs after it in a fresh process.
set -u
cd "$(dirname "$0")/../.."
B=${B:-build-asan}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=23}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
passed=0
failed=0
for t in "$@"; do
  mapfile -t files < <(find "spec/fuzz/corpus/$t" "build-fuzz/crashes/$t" -type f \
    ! -name '.*' 2>/dev/null | LC_ALL=C sort)
  ok=0
  bad=0
  while [ "${#files[@]}" -gt 0 ]; do
    log=$(mktemp)
    timeout 300 "$B/replay-$t" "${files[@]}" >"$log" 2>&1
    status=$?
    ok=$((ok + $(grep -ac '^ok ' "$log")))
    if [ "$status" -eq 0 ]; then
      rm -f "$log"
      break
    fi
    bad=$((bad + 1))
    last=$(grep -a '^running ' "$log" | tail -n 1 | cut -d' ' -f2-)
    grep -av '^running \|^ok ' "$log" # the sanitizer's or the harness's report
    echo "not ok $t: $last (exit $status)"
    rm -f "$log"
    # go on after the input that failed (all done if none was running)
    rest=()
    seen=0
    for f in "${files[@]}"; do
      [ "$seen" -eq 1 ] && rest+=("$f")
      [ "$f" = "$last" ] && seen=1
    done
    files=("${rest[@]}")
  done
  echo "fuzz-replay $t: $ok passed, $bad failed"
  passed=$((passed + ok))
  failed=$((failed + bad))
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
