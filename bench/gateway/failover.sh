#!/usr/bin/env bash
# bench/gateway/failover.sh: what failing endpoints cost clients of lupin serve.
#
# 1. kill: four lupin-sim processes (one endpoint each, --itl-ms 2, so
#    requests are in flight) behind lupin serve (KILL_CONFIG: by default a
#    random-picker config, so every request has a 1 in 4 chance of the killed
#    endpoint until it is ejected; the default config's scorers would decide
#    from its frozen metrics; default gateway settings), wrk -c16 for
#    DURATION s (10); at KILL_AT s (3)
#    endpoint 2's process is killed (SIGKILL).  The access log gives each
#    request's time, status and attempts; /admin/endpoints gives the moment
#    the gateway ejected the endpoint.  Prints the requests failed (any status
#    but 200 and 499: wrk cuts its last requests short) before and after.
# 2. drop: one lupin-sim with four endpoints dropping DROP_RATE (0.05) of
#    connections mid-response (non-streamed: closed before any response
#    byte), under wrk -c32 for DURATION s.  Compares the generation requests
#    the endpoints received (lupin_sim_requests_total) with the attempts the
#    gateway made and the requests it answered: by default they must match.
#
# LUPIN=path/to/lupin (and LUPIN_HOME=its tree) measures another build (an
# older one logs no attempts: the answered count stands in).  Exits 1 if the
# endpoints received more requests than the gateway's attempts.  Attempts
# cut short when wrk stops (cancelled) may or may not have reached an
# endpoint: received lies between sent - cancelled and sent.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}; KILL_AT=${KILL_AT:-3}; DROP_RATE=${DROP_RATE:-0.05}
LUPIN=${LUPIN:-build/lupin}
source bench/gateway/lib.sh

# start_gw ENDPOINTS_JSON [CONFIG]: lupin serve at info level (the access log)
start_gw() {
  LUPIN_PORT=$(free_ports 1); ADMIN_PORT=$(free_ports 1)
  LUPIN_HOME=${LUPIN_HOME:-$PWD} "$LUPIN" serve --config "${2:-examples/configs/default.json}" \
    --endpoints "$1" \
    --listen "127.0.0.1:$LUPIN_PORT" --admin "127.0.0.1:$ADMIN_PORT" --no-watch \
    >"$WORK/access.log" 2>"$WORK/lupin.err" &
  LUPIN_PID=$!; PIDS+=("$LUPIN_PID")
  local _
  for _ in $(seq 200); do
    curl -sf -o /dev/null "http://127.0.0.1:$ADMIN_PORT/readyz" && return 0; sleep 0.05
  done
  echo "lupin serve did not get ready:" >&2; cat "$WORK/lupin.err" >&2; return 1
}

stop_gw() {
  kill -TERM "$LUPIN_PID"; wait "$LUPIN_PID" || true; LUPIN_PID=
}

# --- 1. one endpoint of four killed under load --------------------------------
SIM_PIDS=(); sep=""; printf '[' >"$WORK/kill.json"
for i in 0 1 2 3; do
  port=$(free_ports 1)
  "$B/lupin-sim" --itl-ms 2 --max-num-seqs 256 --endpoints 1 --port "$port" --model "$MODEL" \
    >"$WORK/sim$i.log" 2>&1 &
  SIM_PIDS+=($!); PIDS+=($!)
  wait_http "http://127.0.0.1:$port/metrics"
  printf '%s{"name":"e%d","address":"127.0.0.1","port":%d}' "$sep" "$i" "$port" >>"$WORK/kill.json"
  sep=","
done
printf ']\n' >>"$WORK/kill.json"
if [ -z "${KILL_CONFIG:-}" ]; then
  KILL_CONFIG=$WORK/random.json
  echo '{"plugins": [{"type": "random-picker"}]}' >"$KILL_CONFIG"
fi
start_gw "$WORK/kill.json" "$KILL_CONFIG"
echo "kill: wrk -t1 -c16 -d${DURATION}s through $LUPIN, e1's lupin-sim killed at ${KILL_AT}s" >&2
LUPIN_BENCH_MODEL=$MODEL wrk -t1 -c16 -d"${DURATION}s" --timeout 10s -s bench/gateway/failover.lua \
  "http://127.0.0.1:$LUPIN_PORT" >"$WORK/wrk-kill.out" 2>&1 &
WRK=$!; PIDS+=("$WRK")
sleep "$KILL_AT"
killed=$(date +%s.%N) # before the kill: the gateway may eject within a millisecond
kill -KILL "${SIM_PIDS[1]}"
wait "$WRK" || true
ejected=$(curl -s "http://127.0.0.1:$ADMIN_PORT/admin/endpoints" | python3 -c 'import json,sys
print(next((e.get("health", {}).get("last_ejection_unix", 0) for e in json.load(sys.stdin)["endpoints"]
            if e["name"] == "e1"), 0))' 2>/dev/null || echo 0)
stop_gw
python3 - "$WORK/access.log" "$killed" "${ejected:-0}" <<'PY'
import json, sys
log, killed, ejected = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
recs = [json.loads(l) for l in open(log) if l.startswith("{")]
def failed(r): return r["status"] not in (200, 499)
# a request belongs to the moment it started (ts is its end)
start = lambda r: r["ts"] - r["total_ms"] / 1000
before = [r for r in recs if start(r) < killed]
between = [r for r in recs if killed <= start(r) and (not ejected or start(r) < ejected)]
ejected = ejected if ejected > killed else 0
after = [r for r in recs if ejected and start(r) >= ejected]
retried = sum(1 for r in recs if len(r.get("attempts", [])) > 1)
print("| requests | started before the kill, failed | between kill and ejection, failed | after ejection, failed | ejected after | retried on another endpoint |")
print("|---|---|---|---|---|---|")
print("| %d | %d of %d | %d of %d | %s | %s | %d |" % (
    len(recs), sum(map(failed, before)), len(before), sum(map(failed, between)), len(between),
    "%d of %d" % (sum(map(failed, after)), len(after)) if ejected else "(never ejected)",
    "%.0f ms" % ((ejected - killed) * 1000) if ejected > killed else "-", retried))
kinds = {}
for r in recs:
    if failed(r):
        a = (r.get("attempts") or [{}])[-1]
        k = "%d %s" % (r["status"], a.get("reason", a.get("status", "")))
        kinds[k] = kinds.get(k, 0) + 1
print("failures by status and last attempt:", kinds or "none")
PY
for p in "${SIM_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done

# --- 2. endpoints dropping connections: proxied vs received -------------------
SIM_ENDPOINTS=4
SIM_PORT=$(free_ports 4)
"$B/lupin-sim" --instant --max-num-seqs 4096 --endpoints 4 --port "$SIM_PORT" --model "$MODEL" \
  --drop-rate "$DROP_RATE" --seed 7 >"$WORK/sim-drop.log" 2>&1 &
PIDS+=($!)
sep=""; printf '[' >"$WORK/drop.json"
for ((i = 0; i < 4; i++)); do
  wait_http "http://127.0.0.1:$((SIM_PORT + i))/metrics"
  printf '%s{"name":"sim-%d","address":"127.0.0.1","port":%d}' "$sep" "$i" $((SIM_PORT + i)) \
    >>"$WORK/drop.json"
  sep=","
done
printf ']\n' >>"$WORK/drop.json"
start_gw "$WORK/drop.json"
echo "drop: wrk -t1 -c32 -d${DURATION}s, lupin-sim --drop-rate $DROP_RATE" >&2
LUPIN_BENCH_MODEL=$MODEL wrk -t1 -c32 -d"${DURATION}s" --timeout 10s -s bench/gateway/failover.lua \
  "http://127.0.0.1:$LUPIN_PORT" >"$WORK/wrk-drop.out" 2>&1 || true
sleep 0.5
received=0
for ((i = 0; i < 4; i++)); do
  n=$(curl -s "http://127.0.0.1:$((SIM_PORT + i))/metrics" |
    awk '/^lupin_sim_requests_total/ {print $2; exit}')
  received=$(python3 -c "print(int($received + ${n:-0}))")
done
stop_gw
python3 - "$WORK/access.log" "$received" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
received = int(sys.argv[2])
has = any("attempts" in r for r in recs)
NEVER_LEFT = ("connect_failed", "connect_timeout", "stale_connection")
attempts = [a for r in recs for a in r.get("attempts", []) if a.get("reason") not in NEVER_LEFT]
sent = len(attempts) if has else len(recs)
cancelled = sum(1 for a in attempts if a.get("reason") == "cancelled")
bad = sum(1 for r in recs if r["status"] not in (200, 499))
print("| answered | of them failed | attempts the gateway sent (cut short by wrk's end) | requests the endpoints received | received - sent |")
print("|---|---|---|---|---|")
print("| %d | %d | %s | %d | %+d |" % (len(recs), bad,
      "%d (%d)" % (sent, cancelled) if has else "(no attempts logged) %d answered" % sent,
      received, received - sent))
sys.exit(1 if has and received != sent else 0)
PY
