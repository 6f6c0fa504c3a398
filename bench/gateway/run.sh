#!/usr/bin/env bash
# `make bench-gateway`: what lupin serve adds to a request, against wrk straight
# to the simulator (the floor) and against nginx as a reverse proxy over the
# same endpoints (see lib.sh for both set-ups).  Non-streaming and streaming
# (16-token SSE) completions, ~1 KB prompt, at full load and at half load.
#
# Pinning (2 cores): the proxy under test (lupin or nginx) runs on PROXY_CPU,
# wrk and lupin-sim share LOAD_CPU; the floor runs wrk and lupin-sim on
# LOAD_CPU alone.  Both proxies run all the time (idle when not measured;
# lupin keeps scraping the simulator's /metrics every 50 ms in every run).
# Full load: wrk -t1 -cCONNS, closed loop, as fast as answers come.  Half load:
# the same connections paced by post.lua's delay() hook to HALF x lupin's
# full-load rate (per mode), the same offered rate for all three targets.
#
# Environment: DURATION (s per run, 10), WARMUP (s, 2), CONNS (64), HALF (0.5),
# PROXY_CPU (0), LOAD_CPU (1), B (build dir), PERF=1 (perf record -g lupin
# during an extra full-load non-streaming run; report in $PERF_OUT), STRACE=1
# (strace -c lupin during an extra such run: system calls per request).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}; WARMUP=${WARMUP:-2}; CONNS=${CONNS:-64}; HALF=${HALF:-0.5}
PROXY_CPU=${PROXY_CPU:-0}; LOAD_CPU=${LOAD_CPU:-1}
PERF=${PERF:-0}; PERF_OUT=${PERF_OUT:-/tmp/lupin-gateway-perf.txt}; STRACE=${STRACE:-0}
source bench/gateway/lib.sh
HZ=$(getconf CLK_TCK)

for t in wrk nginx curl python3 taskset; do
  command -v "$t" >/dev/null || { echo "bench-gateway: $t not found (make deps)" >&2; exit 1; }
done

start_sim "$LOAD_CPU"
start_lupin "$PROXY_CPU"
start_nginx "$PROXY_CPU"

# sanity: one request through each, 200 and a body
for port in "$SIM_PORT" "$NGINX_PORT" "$LUPIN_PORT"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
    -H 'content-type: application/json' -d "{\"model\":\"$MODEL\",\"prompt\":\"hi\",\"max_tokens\":4}")
  [ "$code" = 200 ] || { echo "bench-gateway: port $port answered $code" >&2; exit 1; }
done

sched_sum_count() {  # lupin_scheduling_seconds sum and count from the admin /metrics
  curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" |
    awk '/^lupin_scheduling_seconds_sum/ {s=$2} /^lupin_scheduling_seconds_count/ {c=$2} END {print s+0, c+0}'
}

# run TARGET MODE RATE SECONDS -> sets R_RPS R_P50 R_P99 R_BAD R_CPU
run() {
  local target=$1 mode=$2 rate=$3 secs=$4 port pids=() out t0 t1
  case $target in
    floor) port=$SIM_PORT ;;       # wrk spreads nothing: the floor is endpoint 0
    nginx) port=$NGINX_PORT; pids=("$NGINX_PID") ;;
    lupin) port=$LUPIN_PORT; pids=("$LUPIN_PID") ;;
  esac
  t0=$(cpu_ticks "${pids[@]}")
  out=$(LUPIN_BENCH_STREAM=$([ "$mode" = stream ] && echo 1 || echo 0) LUPIN_BENCH_RATE=$rate \
        LUPIN_BENCH_MODEL=$MODEL \
        taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${secs}s" --timeout 10s \
        -s bench/gateway/post.lua "http://127.0.0.1:$port")
  t1=$(cpu_ticks "${pids[@]}")
  read -r _ n s p50 p99 _ non2xx errs <<<"$(grep '^RESULT' <<<"$out")"
  R_RPS=$(awk -v n="$n" -v s="$s" 'BEGIN {printf "%.0f", n / s}')
  R_P50=$p50; R_P99=$p99; R_BAD=$((non2xx + errs))
  if [ ${#pids[@]} -gt 0 ]; then
    R_CPU=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v s="$s" 'BEGIN {printf "%.0f%%", 100 * d / hz / s}')
    R_EFF=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v n="$n" 'BEGIN {if (d > 0) printf "%.0f", n / (d / hz); else print 0}')
  else R_CPU="-"; R_EFF=0; fi
}

us() { awk -v u="$1" 'BEGIN { if (u >= 1000) printf "%.2f ms", u / 1000; else printf "%d µs", u }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
added() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d >= 1000 || d <= -1000) printf "%+.2f ms", d / 1000; else printf "%+d µs", d }'; }

echo "bench-gateway: lupin-sim --instant x$SIM_ENDPOINTS on :$SIM_PORT, lupin :$LUPIN_PORT, nginx :$NGINX_PORT;" >&2
echo "  wrk -t1 -c$CONNS -d${DURATION}s; proxy on CPU $PROXY_CPU, wrk + lupin-sim on CPU $LOAD_CPU" >&2
rows=()
bad_total=0
for mode in plain stream; do
  declare -A RPS P50 P99 CPU EFF
  for load in full half; do
    for target in floor nginx lupin; do
      if [ "$load" = full ]; then rate=0; run "$target" "$mode" 0 "$WARMUP"; else rate=$HALF_RATE; fi
      run "$target" "$mode" "$rate" "$DURATION"
      bad_total=$((bad_total + R_BAD))
      RPS[$load$target]=$R_RPS; P50[$load$target]=$R_P50; P99[$load$target]=$R_P99; CPU[$load$target]=$R_CPU; EFF[$load$target]=$R_EFF
      printf '  %-6s %-4s %-5s %7s req/s  p50 %-9s p99 %-9s proxy CPU %-5s non-2xx/errors %d\n' \
        "$mode" "$load" "$target" "$R_RPS" "$(us "$R_P50")" "$(us "$R_P99")" "$R_CPU" "$R_BAD" >&2
    done
    [ "$load" = full ] && HALF_RATE=$(awk -v r="${RPS[fulllupin]}" -v h="$HALF" 'BEGIN {printf "%.0f", r * h}')
    label=$load; [ "$load" = half ] && label="half ($HALF_RATE/s offered)"
    rows+=("| $mode | $label | ${RPS[${load}floor]} | $(us "${P50[${load}floor]}") | $(us "${P99[${load}floor]}") \
| ${RPS[${load}nginx]} | $(us "${P50[${load}nginx]}") | $(us "${P99[${load}nginx]}") | ${CPU[${load}nginx]}, ${EFF[${load}nginx]} \
| ${RPS[${load}lupin]} | $(us "${P50[${load}lupin]}") | $(us "${P99[${load}lupin]}") | ${CPU[${load}lupin]}, ${EFF[${load}lupin]} \
| $(ratio "${RPS[${load}lupin]}" "${RPS[${load}nginx]}") | $(ratio "${EFF[${load}lupin]}" "${EFF[${load}nginx]}") | $(ratio "${RPS[${load}lupin]}" "${RPS[${load}floor]}") \
| $(added "${P99[${load}lupin]}" "${P99[${load}floor]}") | $(added "${P99[${load}nginx]}" "${P99[${load}floor]}") |")
  done
  unset RPS P50 P99 CPU EFF
done

read -r ssum scount <<<"$(sched_sum_count)"
echo
echo "| mode | load | floor req/s | floor p50 | floor p99 | nginx req/s | nginx p50 | nginx p99 | nginx CPU, req/CPU-s | lupin req/s | lupin p50 | lupin p99 | lupin CPU, req/CPU-s | lupin/nginx req/s | lupin/nginx req/CPU-s | lupin/floor req/s | lupin p99 added | nginx p99 added |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
awk -v s="$ssum" -v c="$scount" 'BEGIN { if (c > 0) printf "lupin scheduling (lupin_scheduling_seconds): %.1f µs mean over %d requests\n", s / c * 1e6, c }'
# its histogram: the share of schedule calls by duration
curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '
  /^lupin_scheduling_seconds_bucket\{le="5e-05"\}/ { a = $2 }
  /^lupin_scheduling_seconds_bucket\{le="0.00025"\}/ { b = $2 }
  /^lupin_scheduling_seconds_count/ { n = $2 }
  END { if (n > 0) printf "  of them under 50 µs %.1f%%, 50-250 µs %.1f%%, over 250 µs %.2f%%\n",
    100 * a / n, 100 * (b - a) / n, 100 * (n - b) / n }'
echo "plain = non-streaming; stream = \"stream\": true (16 SSE tokens + [DONE]); CPU = the proxy's user+system time / wall time"
echo "(100% = one core); req/CPU-s = requests per second of the proxy's CPU time; added = p99 minus the floor's p99; non-2xx or socket errors over all runs: $bad_total"

if [ "$PERF" = 1 ]; then
  echo "perf: recording lupin during a ${DURATION}s full-load non-streaming run -> $PERF_OUT" >&2
  perf record -q -g -o "$WORK/perf.data" -p "$LUPIN_PID" -- sleep "$DURATION" >/dev/null 2>&1 &
  perf_pid=$!
  run lupin plain 0 "$DURATION"
  wait "$perf_pid" || true
  perf report -i "$WORK/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null >"$WORK/dso.txt" || true
  perf report -i "$WORK/perf.data" --no-children --sort dso,symbol --stdio -g none 2>/dev/null >"$WORK/sym.txt" || true
  { grep -v '^#' "$WORK/dso.txt" | grep -v '^$' | sed -n 1,12p
    echo; grep -v '^#' "$WORK/sym.txt" | grep -v '^$' | sed -n 1,40p; } >"$PERF_OUT"
fi
if [ "$STRACE" = 1 ]; then
  strace -c -f -p "$LUPIN_PID" -o "$WORK/strace.txt" 2>/dev/null &
  strace_pid=$!
  sleep 0.5
  run lupin plain 0 "$DURATION"
  kill -INT "$strace_pid" 2>/dev/null || true
  wait "$strace_pid" || true
  awk -v n="$(awk -v r="$R_RPS" -v d="$DURATION" 'BEGIN { print r * d }')" '
    $NF == "total" { printf "strace: %.1f system calls per proxied request (%d over ~%d requests)\n", $4 / n, $4, n }
    $NF ~ /^(read|write|writev|readv|epoll_ctl|epoll_wait)$/ { printf "  %-10s %.2f per request\n", $NF, $4 / n }' \
    "$WORK/strace.txt"
fi
[ "$bad_total" = 0 ] || { echo "bench-gateway: $bad_total non-2xx answers or socket errors" >&2; exit 1; }
