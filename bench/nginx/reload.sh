#!/usr/bin/env bash
# Reloads under load through lupin inside nginx (issue 42's goal: 0 failed
# requests): wrk (bench/gateway/post.lua, plain, or streamed with STREAM=1)
# through the module with WORKERS (2) worker processes over lupin-sim
# --instant, DURATION (10) seconds each:
#   none        no reload, the baseline
#   admin       POST /lupin/reload every 100 ms (lupin's generations, inside
#               the running workers; each reload reaches every worker)
#   nginx -s    `nginx -s reload` every second (new workers with new
#               runtimes; the old ones drain)
# Prints one markdown row per phase: requests, non-2xx answers, socket
# errors, p50 and p99, reloads asked and reloads that failed.  `nginx -s
# reload` closes the old workers' idle keep-alive connections, which wrk
# counts as socket errors between requests: plain nginx does the same.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}; WORKERS=${WORKERS:-2}; CONNS=${CONNS:-32}
source bench/gateway/lib.sh   # WORK, PIDS, cleanup, free_ports, start_sim
source bench/nginx/lib.sh     # start_lupin_nginx
export LUPIN_BENCH_STREAM=${STREAM:-0}

start_sim "0-$(($(nproc) - 1))"
PORT=$(free_ports 1)
start_lupin_nginx "$WORK/nginx" "$PORT" "$WORKERS" "0-$(($(nproc) - 1))" \
  examples/configs/epp-default.json "$WORK/endpoints.json"
URL=http://127.0.0.1:$PORT

# reloader KIND SECONDS: reloads until told to stop; counts in $WORK/KIND.*
reloader() {
  local kind=$1 asked=0 failed=0 end=$((SECONDS + $2))
  while [ $SECONDS -lt $end ]; do
    if [ "$kind" = admin ]; then
      [ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL/lupin/reload")" = 200 ] ||
        failed=$((failed + 1))
      sleep 0.1
    else
      nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" -s reload 2>>"$WORK/reload.err" ||
        failed=$((failed + 1))
      sleep 1
    fi
    asked=$((asked + 1))
  done
  echo "$asked $failed" >"$WORK/$kind.count"
}

echo "| reloads | requests | non-2xx | socket errors | p50 ms | p99 ms | reloads asked / failed |"
echo "|---|---|---|---|---|---|---|"
for kind in none admin nginx; do
  rpid=""
  if [ "$kind" != none ]; then
    reloader "$kind" "$DURATION" &
    rpid=$!
  fi
  read -r _ n _ p50 p99 _ non2xx sockerr < <(wrk -t1 -c"$CONNS" -d"${DURATION}s" \
    -s bench/gateway/post.lua "$URL/v1/completions" | grep '^RESULT')
  counts="-"
  if [ -n "$rpid" ]; then
    wait "$rpid"
    read -r asked failed <"$WORK/$kind.count"
    counts="$asked / $failed"
  fi
  label=$kind
  case $kind in admin) label="POST /lupin/reload every 100 ms" ;; nginx) label="nginx -s reload every 1 s" ;; esac
  printf '| %s | %s | %s | %s | %.2f | %.2f | %s |\n' "$label" "$n" "$non2xx" "$sockerr" \
    "$(echo "$p50 / 1000" | bc -l)" "$(echo "$p99 / 1000" | bc -l)" "$counts"
done
