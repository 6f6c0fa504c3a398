#!/usr/bin/env bash
# `make fuzz`: runs each target's libFuzzer binary for FUZZ_SECONDS, one at a
# time, niced.  New inputs go to build-fuzz/corpus/<target>/ (the committed
# seeds in spec/fuzz/corpus/<target>/ are read, never written), crashes to
# build-fuzz/crashes/<target>/ (replayed by `make fuzz-replay`; copy one into
# spec/fuzz/corpus/<target>/ to keep it as a regression input).  Each run's
# last status line (executions, coverage) is printed at the end.
set -u
cd "$(dirname "$0")/../.."
B=${B:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
status=0
summary=$(mktemp)
for t in "$@"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  dict=()
  [ -f "spec/fuzz/$t.dict" ] && dict=(-dict="spec/fuzz/$t.dict")
  log="build-fuzz/$t.log"
  echo "fuzz $t for ${seconds}s (log: $log)"
  nice -n 10 "$B/fuzz-$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="build-fuzz/crashes/$t/" \
    "${dict[@]}" ${FUZZ_FLAGS:-} "build-fuzz/corpus/$t" "spec/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && status=1
  {
    echo "$t: exit $rc; $(grep -E '^#[0-9]+' "$log" | tail -n 1)"
    grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$log"
    grep -E 'ERROR: |fuzz invariant broken|Test unit written to' "$log"
  } >>"$summary"
done
cat "$summary"
rm -f "$summary"
exit "$status"
