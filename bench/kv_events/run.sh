#!/usr/bin/env bash
# make bench-kv-events: lupin serve's subscription to the engines' KV-cache
# events (docs/kv-events.md), against issue 43's goals: publish-to-index lag
# p99 <= 5 ms, >= 50,000 events applied per CPU-second, an engine restart or
# a lost batch healed within 1 s with no request failing.
#
# bench-kv-publish stands in for vLLM (one engine, its events label on the
# one lupin-sim --instant endpoint); a fresh `lupin serve` per scenario with
# precise-prefix-cache-scorer, watched through /admin/kv-events
# (bench/kv_events/watch.py):
#   floor       the publisher against bench-kv-subscribe (wire + msgpack, no lupin)
#   throughput  THROUGHPUT_EVENTS flat out in batches of 64, array and map shapes
#   lag         LAG_RATE events/s in batches of 16 for LAG_SECONDS
#   heal        at HEAL_RATE: an in-stream restart (sequence back to 0 and
#               AllBlocksCleared), later a sequence number skipped; completions
#               through the gateway meanwhile
#   respawn     the publisher process replaced by a new one on its port
# Writes bench/kv_events/out/{results.jsonl,summary.txt,timeline-*.tsv}.
# lupin serve runs on CPU LUPIN_CPU (1), the rest on LOAD_CPU (0).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
export LUPIN_HOME=${LUPIN_HOME:-$PWD}
OUT=bench/kv_events/out
mkdir -p "$OUT"
source bench/gateway/lib.sh # WORK, PIDS, cleanup on exit, free_ports, wait_http, MODEL
LUPIN_CPU=${LUPIN_CPU:-1}
LOAD_CPU=${LOAD_CPU:-0}
THROUGHPUT_EVENTS=${THROUGHPUT_EVENTS:-500000}
LAG_RATE=${LAG_RATE:-20000}
LAG_SECONDS=${LAG_SECONDS:-10}
HEAL_RATE=${HEAL_RATE:-20000}
BLOCKS=${BLOCKS:-4}
PUB="$B/bench-kv-publish"
WATCH=(taskset -c "$LOAD_CPU" python3 bench/kv_events/watch.py)
: >"$OUT/results.jsonl"
: >"$OUT/commands.txt"

# run CMD...: the command, noted in out/commands.txt, run in this shell's
# place (exec): backgrounded as `run ... &`, $! is then the program's own pid
# (for /proc and for cleanup's kill); in the foreground, as `(run ...)`.
run() {
  echo "$*" >>"$OUT/commands.txt"
  exec "$@"
}

SIM_PORT=$(free_ports 1)
taskset -c "$LOAD_CPU" "$B/lupin-sim" --instant --endpoints 1 --port "$SIM_PORT" \
  --model "$MODEL" >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
wait_http "http://127.0.0.1:$SIM_PORT/metrics"

# config PUB_PORT: one endpoint, its engine's events at the publisher's port
config() {
  python3 - "$SIM_PORT" "$1" "${UNSURE_SECONDS:-}" <<'PY'
import json, sys
sim, pub, unsure = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
params = {"tokenProcessorConfig": {"blockSize": 16}}
if unsure:
    params["unsureSeconds"] = float(unsure)
print(json.dumps({
  "plugins": [{"type": "precise-prefix-cache-scorer", "name": "precise", "parameters": params},
              {"type": "max-score-picker"}],
  "schedulingProfiles": [{"name": "default", "plugins": [
      {"pluginRef": "precise"}, {"pluginRef": "max-score-picker"}]}],
  "endpoints": [{"name": "sim-0", "address": "127.0.0.1", "port": sim,
                 "labels": {"lupin.io/kv-events": "tcp://127.0.0.1:%d" % pub}}],
  "gateway": {"refreshIntervalMs": 50},
}, indent=1))
PY
}

# start_lupin NAME PUB_PORT: a fresh lupin serve subscribed to PUB_PORT
start_lupin() {
  config "$2" >"$WORK/$1.json"
  local ports
  ports=$(free_ports 2)
  GW_PORT=$ports ADMIN_PORT=$((ports + 1))
  LUPIN_LOG="$WORK/$1.log"
  run taskset -c "$LUPIN_CPU" "$B/lupin" serve --config "$WORK/$1.json" \
    --listen "127.0.0.1:$GW_PORT" --admin "127.0.0.1:$ADMIN_PORT" --log-level warn \
    >"$LUPIN_LOG" 2>&1 &
  LUPIN_PID=$!
  PIDS+=("$LUPIN_PID")
  wait_http "http://127.0.0.1:$ADMIN_PORT/readyz" || { cat "$LUPIN_LOG" >&2; return 1; }
  local _
  for _ in $(seq 100); do
    curl -s "http://127.0.0.1:$ADMIN_PORT/admin/kv-events" |
      grep -q '"endpoints":\[{' && return 0
    sleep 0.05
  done
  echo "lupin serve has no KV-event subscription (GET /admin/kv-events):" >&2
  curl -s "http://127.0.0.1:$ADMIN_PORT/admin/kv-events" >&2 || true
  echo "(does this build have gateway/endpoints/kv_events.c?); its log:" >&2
  cat "$LUPIN_LOG" >&2
  return 1
}

stop_lupin() {
  kill -TERM "$LUPIN_PID" 2>/dev/null || true
  wait "$LUPIN_PID" 2>/dev/null || true
  LUPIN_PID=
}

# observe NAME PUB_FILE... [-- watch.py flags]: the scenario watched, its result kept
observe() {
  local name=$1 args=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do args+=(--pub "$1"); shift; done
  [ $# -gt 0 ] && shift
  "${WATCH[@]}" --admin "http://127.0.0.1:$ADMIN_PORT" --pid "$LUPIN_PID" --name "$name" \
    --out "$OUT/timeline-$name.tsv" "${args[@]}" "$@" >>"$OUT/results.jsonl"
}

floor() {
  local port
  port=$(free_ports 1)
  run taskset -c "$LUPIN_CPU" "$B/bench-kv-subscribe" --connect "tcp://127.0.0.1:$port" \
    --idle-ms 1000 >"$OUT/floor.txt" &
  local sub=$!
  PIDS+=("$sub")
  (run taskset -c "$LOAD_CPU" "$PUB" --port "$port" --events "$THROUGHPUT_EVENTS" \
    --events-per-batch 64 --blocks-per-event "$BLOCKS" >"$WORK/floor.pub")
  wait "$sub"
}

throughput() {
  local shape=$1 port
  port=$(free_ports 1)
  start_lupin "throughput-$shape" "$port"
  run taskset -c "$LOAD_CPU" "$PUB" --port "$port" --events "$THROUGHPUT_EVENTS" \
    --events-per-batch 64 --blocks-per-event "$BLOCKS" --shape "$shape" \
    >"$WORK/throughput-$shape.pub" &
  PIDS+=($!)
  observe "throughput-$shape" "$WORK/throughput-$shape.pub"
  stop_lupin
}

lag() {
  local port
  port=$(free_ports 1)
  start_lupin lag "$port"
  run taskset -c "$LOAD_CPU" "$PUB" --port "$port" --rate "$LAG_RATE" \
    --events $((LAG_RATE * LAG_SECONDS)) --events-per-batch 16 --blocks-per-event "$BLOCKS" \
    >"$WORK/lag.pub" &
  PIDS+=($!)
  observe lag "$WORK/lag.pub" -- --every 0.1
  stop_lupin
}

heal() {
  local port
  port=$(free_ports 1)
  start_lupin heal "$port"
  run taskset -c "$LOAD_CPU" "$PUB" --port "$port" --rate "$HEAL_RATE" \
    --events $((HEAL_RATE * 5)) --events-per-batch 16 --blocks-per-event "$BLOCKS" \
    --restart-after $((HEAL_RATE * 1)) --gap-after $((HEAL_RATE * 3)) >"$WORK/heal.pub" &
  PIDS+=($!)
  observe heal "$WORK/heal.pub" -- --every 0.01 --gateway "http://127.0.0.1:$GW_PORT" \
    --model "$MODEL"
  stop_lupin
}

respawn() {
  local port
  port=$(free_ports 1)
  start_lupin respawn "$port"
  local common=(--port "$port" --rate "$HEAL_RATE" --events $((HEAL_RATE * 2))
    --events-per-batch 16 --blocks-per-event "$BLOCKS")
  (
    (run taskset -c "$LOAD_CPU" "$PUB" "${common[@]}" >"$WORK/respawn-1.pub")
    run taskset -c "$LOAD_CPU" "$PUB" "${common[@]}" --seed 2 --settle-ms 0 >"$WORK/respawn-2.pub"
  ) &
  PIDS+=($!)
  observe respawn "$WORK/respawn-1.pub" "$WORK/respawn-2.pub" -- --every 0.01 --respawn \
    --gateway "http://127.0.0.1:$GW_PORT" --model "$MODEL"
  stop_lupin
}

echo "bench-kv-events: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs," \
  "load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/summary.txt"
floor
throughput array
throughput map
lag
heal
respawn
python3 bench/kv_events/summary.py "$OUT" | tee -a "$OUT/summary.txt"
echo "commands: $OUT/commands.txt"
