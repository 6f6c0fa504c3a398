#!/usr/bin/env bash
# make bench-replicas: N `lupin serve` replicas behind a random split, with
# and without sharing their prefix indexes through Redis (docs/replicas.md).
#
# For each family (bench/routing's shared-prefix and multi-turn chat shapes,
# scaled down to keep a run short) and each setup (1 replica; 2 and 3
# replicas, sync off and on): fresh simulators (cold caches), a fresh
# redis-server on loopback with no persistence, the replicas on one config,
# and build/bench-routing-client spreading its requests over the replicas at
# random (--target a,b,c).  Then the simulators' hit rate, the client's TTFT,
# the replicas' sync lag (/admin/replicas), Redis' CPU time and RSS.  Last,
# the added request latency: one replica over instant simulators, sync off
# and on.
#
#   FAMILIES="prefix" SETUPS="1 2s" bench/replicas/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
export LUPIN_HOME=$PWD
OUT=bench/replicas/out
mkdir -p "$OUT"

FAMILIES=${FAMILIES:-prefix chat}
SETUPS=${SETUPS:-1 2 2s 3 3s} # N replicas, s: with sync
SEED=${SEED:-1}
ENDPOINTS=8 BLOCKS=640 BLOCK_SIZE=16 MAX_TOKENS=16
MODEL=meta-llama/Llama-3.1-8B-Instruct
SIM_PORT=${SIM_PORT:-$((30000 + RANDOM % 20000))}
REDIS_PORT=${REDIS_PORT:-$((SIM_PORT + 100))}

family() {
  case $1 in
  prefix)
    WORKLOAD="--groups 24 --questions 6 --system-tokens 1000 --question-tokens 100"
    LOAD="--rate 30"
    DESC="24 groups x 6 questions, 1000-token system prompt per group, 30 req/s" ;;
  chat)
    WORKLOAD="--groups 1 --questions 24 --turns 4 --system-tokens 2000 --context-tokens 200
      --question-tokens 50 --answer-tokens 50"
    LOAD="--concurrency 8 --rate 1"
    DESC="24 sessions x 4 turns, one 2000-token system prompt, closed loop of 8" ;;
  *) echo "unknown family $1" >&2; exit 2 ;;
  esac
}

pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2> /dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2> /dev/null || true; done
  pids=()
}
trap stop EXIT

start_sims() { # extra args
  "$B/lupin-sim" --endpoints $ENDPOINTS --port "$SIM_PORT" --num-gpu-blocks $BLOCKS \
    --model "$MODEL" --block-size $BLOCK_SIZE --prefill-serial --prefill-ms-per-token 0.1 \
    --itl-ms 10 --max-num-seqs 64 --seed "$SEED" "$@" > "$OUT/sim.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    [ "$(grep -c listening "$OUT/sim.log" 2> /dev/null)" -ge $ENDPOINTS ] && return
    sleep 0.05
  done
  echo "lupin-sim did not start:" >&2
  cat "$OUT/sim.log" >&2
  exit 1
}

start_redis() {
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    > "$OUT/redis.log" 2>&1 &
  REDIS_PID=$!
  pids+=($REDIS_PID)
  for _ in $(seq 100); do
    grep -q "Ready to accept" "$OUT/redis.log" 2> /dev/null && return
    sleep 0.05
  done
  echo "redis-server did not start:" >&2
  cat "$OUT/redis.log" >&2
  exit 1
}

config() { # sync(0/1) -> config file
  local f="$OUT/config-$1.json"
  {
    printf '{"kind":"EndpointPickerConfig","plugins":[{"type":"prefix-cache-scorer"},'
    printf '{"type":"queue-scorer"},{"type":"kv-cache-utilization-scorer"},{"type":"max-score-picker"}],'
    printf '"schedulingProfiles":[{"name":"default","plugins":[{"pluginRef":"prefix-cache-scorer","weight":3},'
    printf '{"pluginRef":"queue-scorer","weight":2},{"pluginRef":"kv-cache-utilization-scorer","weight":2},'
    printf '{"pluginRef":"max-score-picker"}]}],"endpoints":['
    for ((i = 0; i < ENDPOINTS; i++)); do
      [ "$i" -gt 0 ] && printf ','
      printf '{"name":"sim-%d","address":"127.0.0.1","port":%d}' "$i" $((SIM_PORT + i))
    done
    printf '],"gateway":{"refreshIntervalMs":50}'
    [ "$1" = 1 ] && printf ',"replicas":{"enabled":1,"address":"127.0.0.1:%d"}' "$REDIS_PORT"
    printf '}\n'
  } > "$f"
  echo "$f"
}

# Starts n replicas; sets TARGETS (a,b,c) and ADMINS (space-separated).
start_replicas() { # n sync
  TARGETS="" ADMINS=""
  local cfg i
  cfg=$(config "$2")
  for ((i = 0; i < $1; i++)); do
    "$B/lupin" serve --config "$cfg" --listen 127.0.0.1:0 --admin 127.0.0.1:0 --workers 1 \
      --log-level warn > "$OUT/replica-$i.out" 2> "$OUT/replica-$i.err" &
    pids+=($!)
  done
  for ((i = 0; i < $1; i++)); do
    local line=""
    for _ in $(seq 200); do
      line=$(grep -o 'listening on http://[^ ]* admin http://[^ ]*' "$OUT/replica-$i.out" || true)
      [ -n "$line" ] && break
      sleep 0.05
    done
    [ -n "$line" ] || { echo "replica $i did not start:" >&2; cat "$OUT/replica-$i.err" >&2; exit 1; }
    local t a
    t=$(echo "$line" | sed 's|listening on http://\([^ ]*\) admin.*|\1|')
    a=$(echo "$line" | sed 's|.*admin http://||')
    TARGETS="$TARGETS${TARGETS:+,}$t" ADMINS="$ADMINS $a"
  done
  sleep 0.3 # a scrape of every endpoint, the sync connected
}

hits() { # the simulators' prefix-cache hit rate
  for ((i = 0; i < ENDPOINTS; i++)); do
    curl -sf "http://127.0.0.1:$((SIM_PORT + i))/metrics"
  done | awk '/^vllm:prefix_cache_hits_total/ { h += $2 } /^vllm:prefix_cache_queries_total/ { q += $2 }
    END { printf "%.4f", q ? h / q : 0 }'
}

lag() { # p50 (median over replicas) and p99 (worst) of the sync lag, ms
  local a
  for a in $ADMINS; do curl -sf "http://$a/admin/replicas"; echo; done | python3 -c '
import json, sys
v = [json.loads(l) for l in sys.stdin if l.strip()]
v = [x["lag_seconds"] for x in v if x.get("enabled") and x["lag_seconds"]["samples"]]
if not v: print("- -"); sys.exit()
p50 = sorted(x["p50"] for x in v)[len(v) // 2]
print("%.2f %.2f" % (1e3 * p50, 1e3 * max(x["p99"] for x in v)))'
}

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

run_one() { # family setup -> a results line
  local fam=$1 setup=$2 n=${2%s} sync=0
  [ "$setup" != "$n" ] && sync=1
  start_sims
  start_redis
  start_replicas "$n" "$sync"
  local c0 summary
  c0=$(cpu_ticks "$REDIS_PID")
  # shellcheck disable=SC2086
  summary=$("$B/bench-routing-client" --target "$TARGETS" $LOAD $WORKLOAD --max-tokens $MAX_TOKENS \
    --block-size $BLOCK_SIZE --seed "$SEED" --model "$MODEL" --out "$OUT/requests-$fam-$setup.txt") ||
    echo "warning: $fam $setup: some requests failed" >&2
  local c1 rss secs hit lags
  c1=$(cpu_ticks "$REDIS_PID")
  rss=$(awk '/VmRSS/ { print $2 }' "/proc/$REDIS_PID/status")
  hit=$(hits)
  lags=$(lag)
  stop
  echo "$summary" | awk -v f="$fam" -v s="$setup" -v h="$hit" -v l="$lags" -v cpu=$((c1 - c0)) \
    -v hz="$(getconf CLK_TCK)" -v rss="$rss" -v sync="$sync" '{
    for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) v[kv[1]] = kv[2]
    split(l, lg, " ")
    printf "%s\t%s\t%.4f\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\n", f, s, h, v["ttft_p50_ms"],
      v["ttft_p90_ms"], sync ? lg[1] : "-", sync ? lg[2] : "-",
      sync ? sprintf("%.1f", 100 * cpu / hz / v["seconds"]) : "-", sync ? sprintf("%.1f", rss / 1024) : "-",
      v["ok"] "/" v["requests"], v["seconds"] }'
}

results="$OUT/results.tsv"
printf "family\tsetup\thit\tttft_p50\tttft_p90\tlag_p50_ms\tlag_p99_ms\tredis_cpu_pct\tredis_rss_mb\tok\tseconds\n" > "$results"
for fam in $FAMILIES; do
  family "$fam"
  echo "== $fam: $DESC" >&2
  for setup in $SETUPS; do
    run_one "$fam" "$setup" | tee -a "$results" >&2
  done
done

# Added latency: one replica, instant simulators (no prefill, no decode),
# 4 in flight: the gateway's own time per request, sync off then on.
added() { # sync -> latency p50 and p90, ms
  start_sims --instant
  start_redis
  start_replicas 1 "$1"
  "$B/bench-routing-client" --target "$TARGETS" --concurrency 4 --rate 1 --groups 24 --questions 25 \
    --system-tokens 1000 --question-tokens 100 --max-tokens 1 --block-size $BLOCK_SIZE --seed "$SEED" \
    --model "$MODEL" | awk '{ for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) v[kv[1]] = kv[2]
      printf "%s %s %s", v["latency_p50_ms"], v["latency_p90_ms"], v["ok"] "/" v["requests"] }'
  stop
}
off=$(added 0)
on=$(added 1)

echo
echo "replicas behind a random split; hit = simulators' prefix-cache hit rate; TTFT in ms;"
echo "lag = a record on one replica to its applying on another; Redis CPU over the run"
awk -F'\t' 'NR > 1 {
  if (!hdr++) printf "| family | replicas | sync | hit | TTFT p50 | TTFT p90 | lag p50 ms | lag p99 ms | Redis CPU %% | Redis RSS MB | ok |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
  n = $2; s = sub(/s$/, "", n) ? "on" : (n == 1 ? "-" : "off")
  printf "| %s | %s | %s | %.1f%% | %.0f | %.0f | %s | %s | %s | %s | %s |\n", $1, n, s, 100 * $3, $4, $5, $6, $7, $8, $9, $10 }' "$results"
read -r op50 op90 ook <<< "$off"
read -r np50 np90 nok <<< "$on"
echo
echo "added request latency, 1 replica over instant simulators, 4 in flight (ms):"
echo "| sync | e2e p50 | e2e p90 | ok |"
echo "|---|---|---|---|"
echo "| off | $op50 | $op90 | $ook |"
echo "| on | $np50 | $np90 | $nok |"
