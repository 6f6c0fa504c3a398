#!/usr/bin/env bash
# `make bench-openresty`: lupin serve (examples/configs/epp-default.yaml)
# against the OpenResty peer (peer.lua: the same routing in nginx +
# lua-nginx-module) and plain nginx round-robin, per CPU second
# (docs/performance.md).  First routing.sh checks that the peer routes like
# lupin; then full-load runs, non-streaming and streaming (16 SSE tokens),
# ~1 KB prompt, interleaved (lupin, peer, nginx, lupin, ...) REPS times.
#
# Pinning as bench-gateway: the proxies on PROXY_CPU, wrk and lupin-sim
# --instant on LOAD_CPU.  All three proxies run all the time (lupin and the
# peer scrape the simulator's /metrics every 50 ms in every run).
#
# WORKERS=N (1) runs each proxy with N workers (lupin --workers N, nginx
# worker_processes N); past one, every process may use every CPU (the
# defaults of PROXY_CPU and LOAD_CPU become all of them).
#
# Environment: DURATION (s per run, 10), WARMUP (s, 2), CONNS (64), REPS (3),
# PROXY_CPU (0), LOAD_CPU (1), B (build dir), CHECK=0 skips the routing check,
# PERF=1 (perf record -g of each proxy during an extra plain run; reports by
# DSO and symbol in $PERF_OUT.<target>).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}; WARMUP=${WARMUP:-2}; CONNS=${CONNS:-64}; REPS=${REPS:-3}
WORKERS=${WORKERS:-1}; ALL_CPUS=0-$(($(nproc) - 1))
if [ "$WORKERS" -gt 1 ]; then
  PROXY_CPU=${PROXY_CPU:-$ALL_CPUS}; LOAD_CPU=${LOAD_CPU:-$ALL_CPUS}
fi
PROXY_CPU=${PROXY_CPU:-0}; LOAD_CPU=${LOAD_CPU:-1}; CHECK=${CHECK:-1}
export LUPIN_WORKERS=$WORKERS PEER_WORKERS=$WORKERS NGINX_WORKERS=$WORKERS
PERF=${PERF:-0}; PERF_OUT=${PERF_OUT:-/tmp/lupin-openresty-perf}
for t in wrk nginx curl python3 taskset; do
  command -v "$t" >/dev/null || { echo "bench-openresty: $t not found (make deps bench-deps)" >&2; exit 1; }
done
[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] ||
  { echo "bench-openresty: libnginx-mod-http-lua is not installed (make bench-deps)" >&2; exit 1; }

if [ "$CHECK" = 1 ]; then
  echo "routing check (bench/openresty/routing.sh): shared-prefix workload, 4 endpoints" >&2
  B=${B:-build} bash bench/openresty/routing.sh >&2
fi

source bench/gateway/lib.sh
source bench/openresty/lib.sh
LUPIN_CONFIG=examples/configs/epp-default.yaml
HZ=$(getconf CLK_TCK)
start_sim "$LOAD_CPU"
start_lupin "$PROXY_CPU"
start_peer "$PROXY_CPU"
start_nginx "$PROXY_CPU"
for port in "$LUPIN_PORT" "$PEER_PORT" "$NGINX_PORT"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
    -H 'content-type: application/json' -d "{\"model\":\"$MODEL\",\"prompt\":\"hi\",\"max_tokens\":4}")
  [ "$code" = 200 ] || { echo "bench-openresty: port $port answered $code" >&2; exit 1; }
done

# run TARGET MODE SECONDS -> R_N requests, R_S seconds, R_TICKS proxy CPU ticks (R_UTICKS of
# them user time), R_P50, R_P99, R_BAD
run() {
  local target=$1 mode=$2 secs=$3 port pid out t0 t1 u0 u1 n s p50 p99 non2xx errs
  case $target in
    lupin) port=$LUPIN_PORT; pid=$LUPIN_PID ;;
    peer)  port=$PEER_PORT; pid=$PEER_PID ;;
    nginx) port=$NGINX_PORT; pid=$NGINX_PID ;;
  esac
  t0=$(cpu_ticks "$pid"); u0=$(user_ticks "$pid")
  out=$(LUPIN_BENCH_STREAM=$([ "$mode" = stream ] && echo 1 || echo 0) LUPIN_BENCH_RATE=0 \
        LUPIN_BENCH_MODEL=$MODEL taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${secs}s" \
        --timeout 10s -s bench/gateway/post.lua "http://127.0.0.1:$port")
  t1=$(cpu_ticks "$pid"); u1=$(user_ticks "$pid")
  read -r _ n s p50 p99 _ non2xx errs <<<"$(grep '^RESULT' <<<"$out")"
  R_N=$n; R_S=$s; R_TICKS=$((t1 - t0)); R_UTICKS=$((u1 - u0)); R_P50=$p50; R_P99=$p99
  R_BAD=$((non2xx + errs))
}

echo "bench-openresty: $WORKERS worker(s) each, lupin-sim --instant x$SIM_ENDPOINTS, wrk -t1 -c$CONNS -d${DURATION}s x$REPS interleaved;" >&2
echo "  proxies on CPU $PROXY_CPU, wrk + lupin-sim on CPU $LOAD_CPU" >&2
declare -A N S T U P50 P99
bad_total=0
for mode in plain stream; do
  for target in lupin peer nginx; do run "$target" "$mode" "$WARMUP"; done
  for ((r = 1; r <= REPS; r++)); do
    for target in lupin peer nginx; do
      run "$target" "$mode" "$DURATION"
      k=$mode$target
      N[$k]=$(( ${N[$k]:-0} + R_N )); T[$k]=$(( ${T[$k]:-0} + R_TICKS ))
      U[$k]=$(( ${U[$k]:-0} + R_UTICKS ))
      S[$k]=$(awk -v a="${S[$k]:-0}" -v b="$R_S" 'BEGIN { print a + b }')
      P50[$k]="${P50[$k]:+${P50[$k]} }$R_P50"
      P99[$k]="${P99[$k]:+${P99[$k]} }$R_P99"
      bad_total=$((bad_total + R_BAD))
      printf '  %-6s %-5s rep %d: %6.0f req/s, proxy CPU %3.0f%%, %6.0f req/CPU-s, p99 %d µs\n' \
        "$mode" "$target" "$r" "$(awk -v n="$R_N" -v s="$R_S" 'BEGIN { print n / s }')" \
        "$(awk -v t="$R_TICKS" -v h="$HZ" -v s="$R_S" 'BEGIN { print 100 * t / h / s }')" \
        "$(awk -v t="$R_TICKS" -v h="$HZ" -v n="$R_N" 'BEGIN { print t ? n / (t / h) : 0 }')" "$R_P99" >&2
    done
  done
done

eff() { awk -v t="${T[$1]}" -v h="$HZ" -v n="${N[$1]}" 'BEGIN { printf "%.0f", t ? n / (t / h) : 0 }'; }
rps() { awk -v n="${N[$1]}" -v s="${S[$1]}" 'BEGIN { printf "%.0f", n / s }'; }
cpu() { awk -v t="${T[$1]}" -v h="$HZ" -v s="${S[$1]}" 'BEGIN { printf "%.0f%%", 100 * t / h / s }'; }
med() { tr ' ' '\n' <<<"$1" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# µs of user and of system time a request: "user / system"
user_sys() {
  awk -v t="${T[$1]}" -v u="${U[$1]}" -v h="$HZ" -v n="${N[$1]}" \
    'BEGIN { if (n) printf "%.1f / %.1f", 1e6 * u / h / n, 1e6 * (t - u) / h / n }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
echo
echo "| mode | target | req/s | proxy CPU | req per CPU-s | µs CPU per req | of which user / system | p50, p99 (medians of reps) | lupin ÷ target, req per CPU-s |"
echo "|---|---|---|---|---|---|---|---|---|"
for mode in plain stream; do
  for target in lupin peer nginx; do
    k=$mode$target; e=$(eff "$k")
    echo "| $mode | $target | $(rps "$k") | $(cpu "$k") | $e | $(awk -v e="$e" 'BEGIN { printf "%.1f", e ? 1e6 / e : 0 }') \
| $(user_sys "$k") | $(med "${P50[$k]}"), $(med "${P99[$k]}") µs | $(ratio "$(eff "${mode}lupin")" "$e") |"
  done
done
echo
echo "lupin: serve --config examples/configs/epp-default.yaml; peer: bench/openresty/peer.lua in nginx"
echo "1.22 + lua-nginx-module; nginx: proxy_pass round-robin.  $WORKERS worker(s) each; sums over $REPS interleaved"
echo "${DURATION} s runs; CPU = the proxy's user+system time; non-2xx or socket errors: $bad_total"
curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk '
  /^lupin_scheduling_seconds_sum/ { s = $2 } /^lupin_scheduling_seconds_count/ { c = $2 }
  END { if (c > 0) printf "lupin_scheduling_seconds: %.1f µs mean over %d requests\n", s / c * 1e6, c }'

if [ "$PERF" = 1 ]; then
  for target in lupin peer nginx; do
    case $target in lupin) pid=$LUPIN_PID ;; peer) pid=$PEER_PID ;; nginx) pid=$NGINX_PID ;; esac
    [ "$target" = lupin ] || pid=$(cat /proc/"$pid"/task/*/children | awk '{ print $1 }')
    perf record -q -g -o "$WORK/perf.$target" -p "$pid" -- sleep "$DURATION" >/dev/null 2>&1 &
    perf_pid=$!
    run "$target" plain "$DURATION"
    wait "$perf_pid" || true
    { echo "$target: $R_N requests"
      perf report -i "$WORK/perf.$target" --no-children --sort dso --stdio -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$' | sed -n 1,12p
      echo
      perf report -i "$WORK/perf.$target" --no-children --sort dso,symbol --stdio -g none 2>/dev/null |
        grep -v '^#' | grep -v '^$' | sed -n 1,40p; } >"$PERF_OUT.$target"
    echo "perf: $PERF_OUT.$target" >&2
  done
fi
[ "$bad_total" = 0 ] || { echo "bench-openresty: $bad_total non-2xx answers or socket errors" >&2; exit 1; }
