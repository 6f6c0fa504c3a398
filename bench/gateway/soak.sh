#!/usr/bin/env bash
# `make bench-soak-gateway`: lupin serve (default config) in front of 4
# lupin-sim --instant endpoints under wrk for SOAK_SECONDS (600), non-streaming
# and streaming connections half and half; every SAMPLE_SECONDS (10) the
# lupin process's RSS (/proc/PID/status VmRSS), the Lua heap
# (lupin_lua_memory_bytes on the admin /metrics), live requests and request
# tables, and the requests answered so far.
#
# Verdict, "flat after warm-up": the first WARMUP_SECONDS (60, or a fifth of a
# shorter run) are warm-up; the rest is split in thirds, and memory is flat if
# the last third's peak is within 5% + 2 MiB of the first third's peak, for
# RSS and for the Lua heap each (peaks: the Lua heap is a GC sawtooth). After
# the load stops, live requests must be back to 0, and POST /admin/leaks (a
# full collection, then request state that outlived its request) must find
# no leak and no request table left.
# Exits 1 if not flat, if requests stay live, if anything leaked, or if any
# answer was not a 2xx.
set -euo pipefail
cd "$(dirname "$0")/../.."
SOAK_SECONDS=${SOAK_SECONDS:-600}; SAMPLE_SECONDS=${SAMPLE_SECONDS:-10}; CONNS=${CONNS:-64}
PROXY_CPU=${PROXY_CPU:-0}; LOAD_CPU=${LOAD_CPU:-1}
WARMUP_SECONDS=${WARMUP_SECONDS:-$((SOAK_SECONDS >= 300 ? 60 : SOAK_SECONDS / 5))}
source bench/gateway/lib.sh

start_sim "$LOAD_CPU"
start_lupin "$PROXY_CPU"

metric() {  # metric TEXT NAME: the first sample's value
  awk -v n="$2" '$1 == n {print $2; exit}' <<<"$1"
}
sample() {  # t rss_kib lua_bytes live tables answered
  local m rss
  m=$(curl -s "http://127.0.0.1:$ADMIN_PORT/metrics")
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$LUPIN_PID/status")
  echo "$1 $rss $(metric "$m" lupin_lua_memory_bytes) $(metric "$m" lupin_live_requests) \
$(metric "$m" lupin_live_request_tables) $(awk '/^lupin_requests_total/ {s += $2} END {print s + 0}' <<<"$m")"
}

echo "bench-soak-gateway: ${SOAK_SECONDS}s, wrk -t1 -c$((CONNS / 2)) plain + -c$((CONNS / 2)) streaming;" \
  "lupin on CPU $PROXY_CPU, wrk + lupin-sim on CPU $LOAD_CPU; sample every ${SAMPLE_SECONDS}s" >&2
for s in 0 1; do
  LUPIN_BENCH_STREAM=$s LUPIN_BENCH_MODEL=$MODEL taskset -c "$LOAD_CPU" wrk -t1 -c$((CONNS / 2)) \
    -d"${SOAK_SECONDS}s" --timeout 10s -s bench/gateway/post.lua "http://127.0.0.1:$LUPIN_PORT" \
    >"$WORK/wrk$s.out" 2>&1 &
  PIDS+=($!); WRK_PIDS+=($!)
done
samples=("$(sample 0)")
start=$(date +%s)
while :; do
  sleep "$SAMPLE_SECONDS"
  t=$(($(date +%s) - start))
  [ "$t" -gt "$SOAK_SECONDS" ] && break
  samples+=("$(sample "$t")")
  echo "  ${samples[-1]}" >&2
done
for p in "${WRK_PIDS[@]}"; do wait "$p"; done
sleep 1
after=$(sample "$(($(date +%s) - start))")

echo
echo "| t (s) | RSS (MiB) | Lua heap (MiB) | live requests | live request tables | answered | req/s since last |"
echo "|---|---|---|---|---|---|---|"
printf '%s\n' "${samples[@]}" | awk '{
  rate = NR > 1 && $1 > pt ? ($6 - pa) / ($1 - pt) : 0
  printf "| %d | %.1f | %.1f | %d | %d | %d | %.0f |\n", $1, $2 / 1024, $3 / 1048576, $4, $5, $6, rate
  pt = $1; pa = $6 }'
read -r _ _ _ live tables answered <<<"$after"
bad=$(cat "$WORK"/wrk*.out | awk '/^RESULT/ {b += $7 + $8} END {print b + 0}')
echo
echo "after the load: live requests $live, live request tables $tables; answered $answered; non-2xx or socket errors $bad"
read -r leaked left < <(curl -s -X POST "http://127.0.0.1:$ADMIN_PORT/admin/leaks" | python3 -c \
  'import json,sys; r = json.load(sys.stdin); print(r["leaked"], r["live_request_tables"])' \
  2>/dev/null || echo "? ?")
echo "after a full collection (POST /admin/leaks): leaked request states $leaked, request tables left $left"
verdict=$(printf '%s\n' "${samples[@]}" | awk -v w="$WARMUP_SECONDS" '
  BEGIN { n = 0 } # an unset n would index the first sample as "", not 0
  $1 >= w { t[n] = $1; r[n] = $2; l[n] = $3; n++ }
  END {
    if (n < 3) { print "too short to judge (fewer than 3 samples after warm-up)"; exit }
    k = int(n / 3)
    for (i = 0; i < k; i++) { if (r[i] > r1) r1 = r[i]; if (l[i] > l1) l1 = l[i] }
    for (i = n - k; i < n; i++) { if (r[i] > r3) r3 = r[i]; if (l[i] > l3) l3 = l[i] }
    okr = r3 <= r1 * 1.05 + 2048; okl = l3 <= l1 * 1.05 + 2 * 1048576
    printf "RSS peak %.1f -> %.1f MiB (%+.1f%%), Lua heap peak %.1f -> %.1f MiB (%+.1f%%), first vs last third after %ds warm-up: %s\n",
      r1 / 1024, r3 / 1024, 100 * (r3 - r1) / r1, l1 / 1048576, l3 / 1048576, 100 * (l3 - l1) / l1, w,
      (okr && okl) ? "FLAT" : "GROWING"
  }')
echo "$verdict"
echo "(flat: last third peak <= first third peak x 1.05 + 2 MiB, RSS and Lua heap each)"
[[ "$verdict" == *FLAT* ]] && [ "$live" = 0 ] && [ "$bad" = 0 ] && [ "$leaked" = 0 ] && [ "$left" = 0 ]
