#!/usr/bin/env bash
# The latency reloads add to requests: wrk through lupin serve (default config,
# 4 lupin-sim endpoints with --instant latencies) for D seconds without
# reloads, then for D seconds with POST /admin/reload every 100 ms.  Prints
# wrk's p50/p99/max and requests/s for both.  B: build directory; D: seconds.
set -eu
cd "$(dirname "$0")/.."
B=${B:-build}
D=${D:-10}
export LUPIN_HOME=$PWD
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] && echo "kept $tmp" || rm -rf "$tmp"
}
trap cleanup EXIT

# below the ephemeral port range; another range if one is taken
for _ in 1 2 3 4 5; do
  base=$((20000 + RANDOM % 10000))
  "$B/lupin-sim" --endpoints 4 --port $base --model m --instant >"$tmp/sim.err" 2>&1 &
  sim=$!
  for _ in $(seq 100); do
    grep -q "endpoint 3 listening" "$tmp/sim.err" && break
    kill -0 $sim 2>/dev/null || break
    sleep 0.05
  done
  grep -q "endpoint 3 listening" "$tmp/sim.err" && break
  kill $sim 2>/dev/null || true
done
pids+=($sim)
python3 - "$base" > "$tmp/config.json" <<'PY'
import json, sys
c = json.load(open("examples/configs/default.json"))
b = int(sys.argv[1])
c["endpoints"] = [{"name": f"e{i}", "address": "127.0.0.1", "port": b + i} for i in range(4)]
print(json.dumps(c))
PY
"$B/lupin" serve --config "$tmp/config.json" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
  --no-watch --log-level warn >"$tmp/gw.out" 2>"$tmp/gw.err" &
pids+=($!)
for _ in $(seq 200); do
  grep -q "listening on" "$tmp/gw.out" 2>/dev/null && break
  sleep 0.05
done
read -r url admin < <(sed -n 's/.*listening on \(http:[^ ]*\) admin \(http:[^ ]*\).*/\1 \2/p' "$tmp/gw.out")
for _ in $(seq 100); do curl -sf "$admin/readyz" >/dev/null && break; sleep 0.1; done

cat > "$tmp/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"model":"m","prompt":"You are a helpful assistant. Answer briefly: what is 2+2?","max_tokens":4}'
LUA

run() {
  wrk -t2 -c32 -d"${D}s" --latency -s "$tmp/post.lua" "$url/v1/completions" > "$tmp/wrk.out"
  local p50 p99 max rps errs
  p50=$(awk '$1=="50%"{print $2}' "$tmp/wrk.out")
  p99=$(awk '$1=="99%"{print $2}' "$tmp/wrk.out")
  max=$(awk '$1=="Latency"{print $4; exit}' "$tmp/wrk.out")
  rps=$(awk '$1=="Requests/sec:"{print $2}' "$tmp/wrk.out")
  errs=$(grep -E "Non-2xx|Socket errors" "$tmp/wrk.out" | tr '\n' ' ' || true)
  printf '%-34s p50 %-8s p99 %-8s max %-8s %s req/s %s\n' "$1" "$p50" "$p99" "$max" "$rps" "$errs"
}

curl -s "$url/v1/completions" -H 'content-type: application/json' \
  -d '{"model":"m","prompt":"warm","max_tokens":1}' >/dev/null
run "wrk -t2 -c32, no reload:"
(
  while :; do
    curl -s -XPOST "$admin/admin/reload" >/dev/null
    sleep 0.1
  done
) &
loop=$!
pids+=($loop)
run "wrk -t2 -c32, reload every 100 ms:"
kill $loop 2>/dev/null || true
reloads=$(curl -s "$admin/metrics" | awk '/^lupin_reloads_total\{result="ok"\}/{print $2}')
sum=$(curl -s "$admin/metrics" | awk '/^lupin_reload_duration_seconds_sum/{print $2}')
awk -v n="$reloads" -v s="$sum" 'BEGIN{printf "%d reloads during the run, mean %.2f ms each (gateway-measured)\n", n, n ? s/n*1000 : 0}'
curl -s "$admin/metrics" | grep -E '^lupin_requests_total|^lupin_request_outcomes_total' | grep -v ' 0$' |
  tr '\n' ' ' | sed 's/^/gateway: /'; echo
