#!/usr/bin/env bash
# Replays each target's committed corpus (spec/fuzz/corpus/<target>/) and the
# crashes `make fuzz` saved (build-fuzz/crashes/<target>/) through the
# harnesses built with replay.c under ASan/UBSan, and ends with one line
# "N passed, N failed": one test per input.  A harness that crashes counts
# its inputs so far as passed and one failure.
set -u
cd "$(dirname "$0")/../.."
B=${B:-build-asan}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:exitcode=23}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
passed=0
failed=0
for t in "$@"; do
  log=$(mktemp)
  timeout 300 "$B/replay-$t" "spec/fuzz/corpus/$t" "build-fuzz/crashes/$t" >"$log" 2>&1
  status=$?
  ok=$(grep -c '^ok ' "$log")
  bad=$(grep -c '^not ok ' "$log")
  if [ "$status" -ne 0 ] && [ "$bad" -eq 0 ]; then
    bad=1
    cat "$log" # the sanitizer's report
    echo "not ok $t: $(grep '^running ' "$log" | tail -n 1 | cut -d' ' -f2-) (exit $status)"
  fi
  echo "fuzz-replay $t: $ok passed, $bad failed"
  passed=$((passed + ok))
  failed=$((failed + bad))
  rm -f "$log"
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
