#!/usr/bin/env bash
# `make bench-workers` (also the last part of `make bench-gateway`): lupin
# serve with W workers against nginx with W worker processes, in the same run,
# for each W of WORKERS (default "1 2"; up to the core count on a bigger
# machine).  Non-streaming and streaming completions, full load (wrk -t2
# -cCONNS, closed loop).  Nothing is pinned: the proxy under test, wrk and
# lupin-sim share every core, as they would on a host that runs the proxy
# beside its clients; with few cores the load generators take a share the
# proxy would otherwise get (the table's CPU column says how much it had).
#
# Environment: WORKERS ("1 2"), DURATION (s per run, 10), WARMUP (2), CONNS (64), B.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORKERS=${WORKERS:-1 2}; DURATION=${DURATION:-10}; WARMUP=${WARMUP:-2}; CONNS=${CONNS:-64}
source bench/gateway/lib.sh
HZ=$(getconf CLK_TCK)
ALL=0-$(($(nproc) - 1))

start_sim "$ALL"

# one_run TARGET PORT PID MODE SECONDS -> R_RPS R_P99 R_CPU R_EFF R_BAD
one_run() {
  local port=$2 pid=$3 mode=$4 secs=$5 out t0 t1
  t0=$(cpu_ticks "$pid")
  out=$(LUPIN_BENCH_STREAM=$([ "$mode" = stream ] && echo 1 || echo 0) LUPIN_BENCH_RATE=0 \
        LUPIN_BENCH_MODEL=$MODEL wrk -t2 -c"$CONNS" -d"${secs}s" --timeout 10s \
        -s bench/gateway/post.lua "http://127.0.0.1:$port")
  t1=$(cpu_ticks "$pid")
  read -r _ n s _ p99 _ non2xx errs <<<"$(grep '^RESULT' <<<"$out")"
  R_RPS=$(awk -v n="$n" -v s="$s" 'BEGIN {printf "%.0f", n / s}')
  R_P99=$p99; R_BAD=$((non2xx + errs))
  R_CPU=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v s="$s" 'BEGIN {printf "%.0f%%", 100 * d / hz / s}')
  R_EFF=$(awk -v d=$((t1 - t0)) -v hz="$HZ" -v n="$n" 'BEGIN {if (d > 0) printf "%.0f", n / (d / hz); else print 0}')
}

ms() { awk -v u="$1" 'BEGIN { printf "%.2f ms", u / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

rows=(); bad=0
for w in $WORKERS; do
  LUPIN_WORKERS=$w start_lupin "$ALL"
  NGINX_WORKERS=$w start_nginx "$ALL"
  for mode in plain stream; do
    one_run lupin "$LUPIN_PORT" "$LUPIN_PID" "$mode" "$WARMUP"
    one_run lupin "$LUPIN_PORT" "$LUPIN_PID" "$mode" "$DURATION"
    l=("$R_RPS" "$R_P99" "$R_CPU" "$R_EFF"); bad=$((bad + R_BAD))
    one_run nginx "$NGINX_PORT" "$NGINX_PID" "$mode" "$WARMUP"
    one_run nginx "$NGINX_PORT" "$NGINX_PID" "$mode" "$DURATION"
    n=("$R_RPS" "$R_P99" "$R_CPU" "$R_EFF"); bad=$((bad + R_BAD))
    echo "  workers $w $mode: lupin ${l[0]} req/s (CPU ${l[2]}), nginx ${n[0]} req/s (CPU ${n[2]})" >&2
    rows+=("| $w | $mode | ${l[0]} | $(ms "${l[1]}") | ${l[2]}, ${l[3]} | ${n[0]} | $(ms "${n[1]}") | ${n[2]}, ${n[3]} | $(ratio "${l[0]}" "${n[0]}") | $(ratio "${l[3]}" "${n[3]}") |")
  done
  # scheduling time over every run of W workers: mean, and the bucket that
  # holds the 99th percentile (lupin_scheduling_seconds)
  curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v w="$w" '
    /^lupin_scheduling_seconds_bucket/ { split($1, a, "\""); le[++n] = a[2]; c[n] = $2 }
    /^lupin_scheduling_seconds_sum/ { s = $2 } /^lupin_scheduling_seconds_count/ { t = $2 }
    END { if (!t) exit; for (i = 1; i <= n && c[i] < 0.99 * t; i++);
      printf "  workers %d: scheduling mean %.1f µs, p99 at most %s s (%d cycles)\n", w, s / t * 1e6, le[i], t }' >&2
  echo "  workers $w: lupin RSS $(awk '/^VmRSS/ {printf "%.1f MiB", $2 / 1024}' /proc/"$LUPIN_PID"/status)" >&2
  # the spread of the connections over lupin's workers
  curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v w="$w" '
    /^lupin_worker_requests_total/ { split($1, a, "\""); v[a[2]] = $2; t += $2 }
    END { if (w > 1) { printf "  workers %d: share of requests by worker:", w
      for (k in v) printf " %s %.1f%%", k, 100 * v[k] / t; print "" } }' >&2
  kill "$LUPIN_PID" "$NGINX_PID" 2>/dev/null || true
  wait "$LUPIN_PID" "$NGINX_PID" 2>/dev/null || true
  LUPIN_PID= # stopped on purpose: cleanup must not report it
done

echo
echo "| workers | mode | lupin req/s | lupin p99 | lupin CPU, req/CPU-s | nginx req/s | nginx p99 | nginx CPU, req/CPU-s | lupin/nginx req/s | lupin/nginx req/CPU-s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo "wrk -t2 -c$CONNS -d${DURATION}s, nothing pinned ($(nproc) cores shared by wrk, lupin-sim --instant and the proxy);"
echo "CPU = the proxy's user+system time / wall time (100% = one core); non-2xx or socket errors: $bad"
[ "$bad" = 0 ]
