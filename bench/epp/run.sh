#!/usr/bin/env bash
# `make bench-epp`: lupin epp, the ext_proc endpoint picker, alone: requests/s,
# its CPU per request and the scheduling latency an Envoy would see, at 16 and
# 100 lupin-sim endpoints (scraped by the picker as in production) with 4 KB
# and 345 KB prompts.
#
# The client is spec/fixtures/epp/envoy.py load: grpc.aio streams in PROCS
# processes, CONC streams in flight each, closed loop.  Each stream plays
# Envoy's ext_proc filter without an endpoint: request headers, the body in
# CHUNK-byte chunks, the pick and the replayed body read, then at once a
# synthetic response (200 headers with the served-endpoint metadata, one
# small JSON body chunk; RESPONSE=none half-closes after the replay instead,
# which ends the request as cancelled).  So every request runs the picker's
# whole lifecycle (pick, pre_request, response, complete) but no model server
# time: what is measured is the picker.
#
# Scheduling latency: from the last request body chunk written to the header
# response (the pick) read, as the client sees it.  Picker CPU: lupin epp's
# utime+stime (/proc/PID/stat, every thread) over the measured window,
# divided by the requests answered in it.  Client CPU is reported too: on a
# small machine the Python client can be the bottleneck -- a row whose client
# CPU is at 90% or more of the CPUs it may use is marked "client-bound".
#
# Environment: DURATION (s per run, 10), WARMUP (s, 2), ENDPOINTS ("16 100"),
# PROMPTS (bytes, "4096 353280"), PROCS (client processes, 2), CONC (streams
# per process, 16), CHUNK (request body chunk bytes, 16384), WORKERS (lupin
# epp --workers, 1), PICKER_CPU (0), LOAD_CPU (1: the clients and lupin-sim;
# a list such as 0-1 is taskset's), LUPIN_CONFIG (examples/configs/
# epp-default.yaml), RESPONSE (synthetic|none), B (build dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}; WARMUP=${WARMUP:-2}
ENDPOINTS=${ENDPOINTS:-16 100}; PROMPTS=${PROMPTS:-4096 353280}
PROCS=${PROCS:-2}; CONC=${CONC:-16}; CHUNK=${CHUNK:-16384}; WORKERS=${WORKERS:-1}
PICKER_CPU=${PICKER_CPU:-0}; LOAD_CPU=${LOAD_CPU:-1}; RESPONSE=${RESPONSE:-synthetic}
LUPIN_CONFIG=${LUPIN_CONFIG:-examples/configs/epp-default.yaml}
PY=/usr/bin/python3 # Debian's, with python3-grpcio (a python3 earlier on PATH may lack it)
ENVOY="$PY spec/fixtures/epp/envoy.py"

for t in taskset curl protoc; do
  command -v "$t" >/dev/null || { echo "bench-epp: $t not found (make deps)" >&2; exit 1; }
done
$PY -c 'import grpc' 2>/dev/null || { echo "bench-epp: $PY has no grpc (apt-get install python3-grpcio)" >&2; exit 1; }
for v in DURATION WARMUP PROCS CONC CHUNK WORKERS; do
  [[ ${!v} =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "bench-epp: $v must be a number, not '${!v}'" >&2; exit 2; }
done
case $RESPONSE in synthetic | none) ;; *) echo "bench-epp: RESPONSE is synthetic or none" >&2; exit 2 ;; esac
source bench/gateway/lib.sh  # its temp dir and cleanup; after the checks, so a usage error leaves none

# CPUs taskset's list names (0-1,3 -> 3)
ncpus() { $PY -c 'import sys
n = 0
for part in sys.argv[1].split(","):
    a, _, b = part.partition("-")
    n += int(b or a) - int(a) + 1
print(n)' "$1"; }
LOAD_CPUS=$(ncpus "$LOAD_CPU")

# start_epp: lupin epp over $WORK/endpoints.json; sets EPP_PID, GRPC, HEALTH, ADMIN.
# --log-level warn: no access-log line per request (as bench-gateway's lupin serve)
start_epp() {
  : >"$WORK/epp.out"
  LUPIN_HOME=$PWD taskset -c "$PICKER_CPU" "$B/lupin" epp --config-file "$LUPIN_CONFIG" \
    --endpoints "$WORK/endpoints.json" --bind-address 127.0.0.1 --grpc-port 0 \
    --grpc-health-port 0 --metrics-port 0 --workers "$WORKERS" --log-level warn \
    >"$WORK/epp.out" 2>"$WORK/epp.err" &
  EPP_PID=$!; PIDS+=("$EPP_PID")
  local _ line
  for _ in $(seq 200); do
    line=$(head -1 "$WORK/epp.out")
    if [[ $line =~ listening\ on\ grpc://([^ ]+)\ health\ grpc://([^ ]+)\ admin\ (http://[^ ]+) ]]; then
      GRPC=${BASH_REMATCH[1]}; HEALTH=${BASH_REMATCH[2]}; ADMIN=${BASH_REMATCH[3]}
      break
    fi
    kill -0 "$EPP_PID" 2>/dev/null || break
    sleep 0.05
  done
  [ -n "${GRPC:-}" ] || { echo "bench-epp: lupin epp did not start:" >&2; cat "$WORK/epp.err" >&2; return 1; }
  for _ in $(seq 200); do  # ready: endpoints known and scraped
    $ENVOY --target "$HEALTH" health readiness 2>/dev/null | grep -q '"SERVING"' && return 0
    sleep 0.05
  done
  echo "bench-epp: lupin epp not ready:" >&2; cat "$WORK/epp.err" >&2; return 1
}

stop() {  # stop PID: one process this script started (and no more its cleanup's)
  local p keep=()
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

echo "bench-epp: lupin epp (--workers $WORKERS) on CPU $PICKER_CPU; envoy.py load $PROCS x $CONC streams" \
  "and lupin-sim on CPU $LOAD_CPU; ${DURATION}s per run after ${WARMUP}s warm-up; response: $RESPONSE" >&2
rows=()
for n in $ENDPOINTS; do
  SIM_ENDPOINTS=$n
  start_sim "$LOAD_CPU"
  GRPC=""
  start_epp
  for bytes in $PROMPTS; do
    out=$(taskset -c "$LOAD_CPU" $ENVOY --target "$GRPC" load --duration "$DURATION" \
      --warmup "$WARMUP" --procs "$PROCS" --concurrency "$CONC" --chunk-size "$CHUNK" \
      --prompt-bytes "$bytes" --model "$MODEL" --response "$RESPONSE" --server-pid "$EPP_PID")
    row=$($PY -c 'import json, sys
r = json.loads(sys.argv[1]); n, b, cpus = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
size = "%d KB" % round(b / 1024) if b >= 1024 else "%d B" % b
bound = " (client-bound)" if r["client_cpu_pct"] >= 90 * cpus else ""
err = sum(r["errors"].values())
us = r.get("server_cpu_us_per_request")
print("| %s | %s | %.0f | %.0f%% | %s | %.2f ms | %.2f ms | %.0f%%%s | %d |" % (
    n, size, r["rps"], r.get("server_cpu_pct", 0), "%.0f µs" % us if us else "-",
    r["p50_ms"], r["p99_ms"], r["client_cpu_pct"], bound, err))
print(err, file=sys.stderr)' "$out" "$n" "$bytes" "$LOAD_CPUS" 2>"$WORK/err.count")
    rows+=("$row")
    echo "  $row" >&2
    BAD=$(( ${BAD:-0} + $(cat "$WORK/err.count") ))
  done
  stop "$EPP_PID"; stop "$SIM_PID"
done

echo
echo "| endpoints | prompt | req/s | picker CPU | picker CPU per request | sched p50 | sched p99 | client CPU | errors |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "picker CPU = lupin epp's user+system time / wall time (100% = one core); sched = last request body"
echo "chunk written -> the pick (header response) read, at the client; client CPU = the envoy.py load"
echo "processes' own (100% = one core; $LOAD_CPUS CPU(s) given to them and lupin-sim)."
[ "${BAD:-0}" = 0 ] || { echo "bench-epp: $BAD streams failed" >&2; exit 1; }
