#!/usr/bin/env bash
# `make bench-nginx`: lupin inside nginx (ngx_http_lupin_module) against
# `lupin serve`, the OpenResty peer (bench/openresty) and plain nginx
# round-robin, per CPU second, with one worker and with two, plain and
# streaming (bench/nginx/README.md; issue 42's goal: lupin-in-nginx at least
# 0.9x plain nginx round-robin in requests per CPU second).
#
# Per worker count: one lupin-sim --instant (SIM_ENDPOINTS, 4) and the four
# fronts over it, all running all the time (lupin serve and the peer scrape
# the simulator's /metrics every 50 ms throughout); lupin serve and the
# module read the same config (examples/configs/epp-default.json with the
# simulator's endpoints).  Then, after a WARMUP run of each, REPS rounds;
# a round is every mode and every front in turn (module, serve, peer, nginx
# plain, then the same streaming), so drift hits all alike.  Each run:
# wrk -t1 -cCONNS -dDURATION with bench/gateway/post.lua (~1 KB prompt, 16
# tokens; stream adds "stream": true), its p50 and p99 from wrk's latency
# distribution, the front's CPU from /proc/PID/stat (utime + stime; nginx:
# master and workers; lupin serve: every thread).
#
# Pinning as bench-openresty: one worker, the fronts on PROXY_CPU (0) and
# wrk + lupin-sim on LOAD_CPU (1); past one, every CPU for both.
#
# Environment: DURATION (s per run, 10), WARMUP (s, 2), REPS (3), CONNS (64),
# WORKERS ("1 2"), MODES ("plain stream"), PROXY_CPU, LOAD_CPU, B (build dir).
# The table goes to stdout, progress to stderr.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}; WARMUP=${WARMUP:-2}; REPS=${REPS:-3}; CONNS=${CONNS:-64}
WORKERS=${WORKERS:-1 2}; MODES=${MODES:-plain stream}
for v in DURATION WARMUP REPS CONNS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "bench-nginx: $v must be a whole number, not '${!v}'" >&2; exit 2; }
done
for w in $WORKERS; do
  [[ $w =~ ^[1-9][0-9]*$ ]] || { echo "bench-nginx: WORKERS lists worker counts, not '$w'" >&2; exit 2; }
done
for m in $MODES; do
  case $m in plain | stream) ;; *) echo "bench-nginx: MODES: plain or stream, not '$m'" >&2; exit 2 ;; esac
done
for t in wrk nginx curl jq python3 taskset; do
  command -v "$t" >/dev/null || { echo "bench-nginx: $t not found (make deps bench-deps)" >&2; exit 1; }
done
[ -f /usr/lib/nginx/modules/ngx_http_lua_module.so ] ||
  { echo "bench-nginx: libnginx-mod-http-lua is not installed (make bench-deps)" >&2; exit 1; }
[ -f "${B:-build}/ngx_http_lupin_module.so" ] ||
  { echo "bench-nginx: no ${B:-build}/ngx_http_lupin_module.so (make nginx-module)" >&2; exit 1; }

source bench/gateway/lib.sh # WORK, PIDS, cleanup on exit, start_sim, start_lupin, start_nginx
source bench/openresty/lib.sh # start_peer
source bench/nginx/lib.sh # start_lupin_nginx
CONFIG=examples/configs/epp-default.json
FRONTS="module serve peer nginx"
HZ=$(getconf CLK_TCK)
ALL_CPUS=0-$(($(nproc) - 1))

label() {
  case $1 in
  module) echo "lupin-in-nginx" ;; serve) echo "lupin serve" ;;
  peer) echo "OpenResty peer" ;; nginx) echo "nginx RR" ;;
  esac
}

# start_fronts W: lupin-sim and the four fronts with W workers each
start_fronts() {
  local w=$1 port mode code
  PROXY=${PROXY_CPU:-$([ "$w" -gt 1 ] && echo "$ALL_CPUS" || echo 0)}
  LOAD=${LOAD_CPU:-$([ "$w" -gt 1 ] && echo "$ALL_CPUS" || echo 1)}
  start_sim "$LOAD"
  lupin_nginx_config "$CONFIG" "$WORK/endpoints.json" "$WORK/lupin.json"
  LUPIN_CONFIG=$WORK/lupin.json LUPIN_WORKERS=$w start_lupin "$PROXY"
  PEER_WORKERS=$w start_peer "$PROXY"
  NGINX_WORKERS=$w start_nginx "$PROXY"
  MODULE_PORT=$(free_ports 1)
  start_lupin_nginx "$WORK/module" "$MODULE_PORT" "$w" "$PROXY" "$CONFIG" "$WORK/endpoints.json"
  for port in "$MODULE_PORT" "$LUPIN_PORT" "$PEER_PORT" "$NGINX_PORT"; do
    for mode in false true; do
      code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
        -H 'content-type: application/json' \
        -d "{\"model\":\"$MODEL\",\"prompt\":\"hi\",\"max_tokens\":4,\"stream\":$mode}")
      [ "$code" = 200 ] || { echo "bench-nginx: port $port answered $code (stream $mode)" >&2; return 1; }
    done
  done
}

# stop_fronts: everything start_fronts started
stop_fronts() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=(); LUPIN_PID=""
}

# run FRONT MODE SECONDS -> R_N requests, R_S seconds, R_TICKS front CPU
# ticks (R_UTICKS of them user time), R_P50 and R_P99 (µs), R_BAD
run() {
  local front=$1 mode=$2 secs=$3 port pid out t0 t1 u0 u1 n s p50 p99 non2xx errs
  case $front in
  module) port=$MODULE_PORT; pid=$LUPIN_NGINX_PID ;;
  serve) port=$LUPIN_PORT; pid=$LUPIN_PID ;;
  peer) port=$PEER_PORT; pid=$PEER_PID ;;
  nginx) port=$NGINX_PORT; pid=$NGINX_PID ;;
  esac
  t0=$(cpu_ticks "$pid"); u0=$(user_ticks "$pid")
  out=$(LUPIN_BENCH_STREAM=$([ "$mode" = stream ] && echo 1 || echo 0) LUPIN_BENCH_RATE=0 \
    LUPIN_BENCH_MODEL=$MODEL taskset -c "$LOAD" wrk -t1 -c"$CONNS" -d"${secs}s" --latency \
    --timeout 10s -s bench/gateway/post.lua "http://127.0.0.1:$port")
  t1=$(cpu_ticks "$pid"); u1=$(user_ticks "$pid")
  # post.lua's done(): RESULT requests seconds p50_us p99_us mean_us non2xx socket_errors
  read -r _ n s p50 p99 _ non2xx errs <<<"$(grep '^RESULT' <<<"$out")"
  R_N=$n; R_S=$s; R_TICKS=$((t1 - t0)); R_UTICKS=$((u1 - u0)); R_P50=$p50; R_P99=$p99
  R_BAD=$((non2xx + errs))
}

declare -A N S T U P50 P99
bad_total=0
for w in $WORKERS; do
  start_fronts "$w"
  echo "bench-nginx: $w worker(s) each, lupin-sim --instant x$SIM_ENDPOINTS, wrk -t1 -c$CONNS" \
    "-d${DURATION}s, $REPS round(s); fronts on CPU $PROXY, wrk + lupin-sim on CPU $LOAD" >&2
  for mode in $MODES; do
    for front in $FRONTS; do run "$front" "$mode" "$WARMUP"; done
  done
  for ((r = 1; r <= REPS; r++)); do
    for mode in $MODES; do
      for front in $FRONTS; do
        run "$front" "$mode" "$DURATION"
        k=$w/$mode/$front
        N[$k]=$((${N[$k]:-0} + R_N)); T[$k]=$((${T[$k]:-0} + R_TICKS))
        U[$k]=$((${U[$k]:-0} + R_UTICKS))
        S[$k]=$(awk -v a="${S[$k]:-0}" -v b="$R_S" 'BEGIN { print a + b }')
        P50[$k]="${P50[$k]:+${P50[$k]} }$R_P50"; P99[$k]="${P99[$k]:+${P99[$k]} }$R_P99"
        bad_total=$((bad_total + R_BAD))
        printf '  %d worker(s) %-6s %-14s round %d: %6.0f req/s, front CPU %3.0f%%, %6.0f req/CPU-s, p50 %d µs, p99 %d µs\n' \
          "$w" "$mode" "$(label "$front")" "$r" "$(awk -v n="$R_N" -v s="$R_S" 'BEGIN { print n / s }')" \
          "$(awk -v t="$R_TICKS" -v h="$HZ" -v s="$R_S" 'BEGIN { print 100 * t / h / s }')" \
          "$(awk -v t="$R_TICKS" -v h="$HZ" -v n="$R_N" 'BEGIN { print t ? n / (t / h) : 0 }')" \
          "$R_P50" "$R_P99" >&2
      done
    done
  done
  # the module answered them itself (the worker that took this scrape, at least)
  scheduled=$(curl -sf "http://127.0.0.1:$MODULE_PORT/lupin_status" |
    awk '/^lupin_requests_total\{status="200"\}/ { n += $2 } END { printf "%d", n }')
  [ "$scheduled" -gt 0 ] || { echo "bench-nginx: the module scheduled no request" >&2; exit 1; }
  stop_fronts
done

eff() { awk -v t="${T[$1]}" -v h="$HZ" -v n="${N[$1]}" 'BEGIN { printf "%.0f", t ? n / (t / h) : 0 }'; }
rps() { awk -v n="${N[$1]}" -v s="${S[$1]}" 'BEGIN { printf "%.0f", n / s }'; }
cpu() { awk -v t="${T[$1]}" -v h="$HZ" -v s="${S[$1]}" 'BEGIN { printf "%.0f%%", 100 * t / h / s }'; }
# µs of CPU a request, "total (user / system)"
us() {
  awk -v t="${T[$1]}" -v u="${U[$1]}" -v h="$HZ" -v n="${N[$1]}" \
    'BEGIN { if (n) printf "%.1f (%.1f / %.1f)", 1e6 * t / h / n, 1e6 * u / h / n, 1e6 * (t - u) / h / n }'
}
# the median over the rounds of a percentile, in ms
med() { tr ' ' '\n' <<<"$1" | sort -n | awk '{ v[NR] = $1 } END { printf "%.2f", v[int((NR + 1) / 2)] / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b ? a / b : 0 }'; }
join() { local out="$1" x; shift; for x in "$@"; do out+=" / $x"; done; echo "$out"; }

echo "per front (sums over the rounds):" >&2
echo "| workers | mode | front | req/s | front CPU | req per CPU-s | µs CPU a request (user / system) |" >&2
echo "|---|---|---|---|---|---|---|" >&2
for w in $WORKERS; do
  for mode in $MODES; do
    for front in $FRONTS; do
      k=$w/$mode/$front
      echo "| $w | $mode | $(label "$front") | $(rps "$k") | $(cpu "$k") | $(eff "$k") | $(us "$k") |" >&2
    done
  done
done
echo >&2

echo "| workers | mode | req per CPU-s: lupin-in-nginx / lupin serve / OpenResty peer / nginx RR | p50 ms: same order | p99 ms: same order | in-nginx ÷ nginx RR | in-nginx ÷ peer | goal ≥ 0.9× nginx RR |"
echo "|---|---|---|---|---|---|---|---|"
for w in $WORKERS; do
  for mode in $MODES; do
    e=() p50=() p99=()
    for front in $FRONTS; do
      k=$w/$mode/$front
      e+=("$(eff "$k")"); p50+=("$(med "${P50[$k]}")"); p99+=("$(med "${P99[$k]}")")
    done
    vs_nginx=$(ratio "${e[0]}" "${e[3]}")
    verdict=$(awk -v r="$vs_nginx" 'BEGIN { print (r >= 0.9 ? "met" : "missed") }')
    echo "| $w | $mode | $(join "${e[@]}") | $(join "${p50[@]}") | $(join "${p99[@]}") | **$vs_nginx** | $(ratio "${e[0]}" "${e[2]}") | $verdict |"
  done
done
echo
echo "wrk -t1 -c$CONNS, bench/gateway/post.lua (~1 KB prompt, 16 tokens), lupin-sim --instant x$SIM_ENDPOINTS;"
echo "$REPS interleaved round(s) of ${DURATION} s runs; req per CPU-s = requests / the front's user+system"
echo "time (nginx: master and workers), sums over the rounds; p50, p99: medians over the rounds;"
echo "lupin-in-nginx and lupin serve: $CONFIG; non-2xx or socket errors: $bad_total"
[ "$bad_total" = 0 ] || { echo "bench-nginx: $bad_total non-2xx answers or socket errors" >&2; exit 1; }
