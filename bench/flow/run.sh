#!/usr/bin/env bash
# make bench-flow: flow control under overload (docs/flow-control.md).
# lupin-sim (2 endpoints x --max-num-seqs 4, 20 ms a token, 16 tokens: about
# 24 requests/s in all), a fresh `lupin serve` per scenario, open-loop Poisson
# arrivals at about 2x that from bench/flow/client.py:
#   fairness: a light tenant (4.5/s) and a heavy one (45/s): the light one's
#             TTFT alone, then loaded with flow control off, on with
#             global-strict (no fairness), on with round-robin;
#   priority: a high band (objective "critical", 12.5/s) and a sheddable low
#             band (37.5/s): the high one's TTFT alone, then loaded;
# and every request accounted for: 200, or 429/503 with the queue's reason.
# Writes bench/flow/out/{summary.tsv,queue-*.tsv} and, with gnuplot,
# bench/flow/out/flow-queues.png.   DURATION=20 SEED=1 bench/flow/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
export LUPIN_HOME=$PWD
OUT=bench/flow/out
mkdir -p "$OUT"
DURATION=${DURATION:-20}
SEED=${SEED:-1}
SIM_ENDPOINTS=2
source bench/gateway/lib.sh

SIM_PORT=$(free_ports $SIM_ENDPOINTS)
"$B/lupin-sim" --port "$SIM_PORT" --endpoints $SIM_ENDPOINTS --model m --max-num-seqs 4 \
  --itl-ms 20 --prefill-overhead-ms 2 --seed "$SEED" >"$WORK/sim.log" 2>&1 &
PIDS+=($!)
for i in $(seq 0 $((SIM_ENDPOINTS - 1))); do wait_http "http://127.0.0.1:$((SIM_PORT + i))/metrics"; done

# config FLOW(on|off) FAIRNESS -> JSON on stdout
config() {
  python3 - "$1" "$2" "$SIM_PORT" "$SIM_ENDPOINTS" <<'PY'
import json, sys
flow, fairness, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cfg = {
  "plugins": [{"type": "active-request-scorer"}, {"type": "max-score-picker"},
              {"type": "concurrency-detector", "parameters": {"maxConcurrency": 4}},
              {"type": fairness}],
  "schedulingProfiles": [{"name": "default", "plugins": [
      {"pluginRef": "active-request-scorer"}, {"pluginRef": "max-score-picker"}]}],
  "objectives": [{"name": "critical", "priority": 10}, {"name": "batch", "priority": -1}],
  "endpoints": [{"name": "e%d" % i, "address": "127.0.0.1", "port": port + i} for i in range(n)],
}
if flow == "on":
    cfg["saturationDetector"] = {"pluginRef": "concurrency-detector"}
    cfg["flowControl"] = {"maxBytes": "48Ki", "defaultRequestTTL": "5s",
                          "defaultPriorityBand": {"fairnessPolicyRef": fairness}}
print(json.dumps(cfg, indent=1))
PY
}

# metric NAME{labels}: one sample of the admin /metrics
metric() {
  curl -s "http://127.0.0.1:$ADMIN_PORT/metrics" | awk -v s="$1" '$1 == s { print $2; f=1 } END { if (!f) print 0 }'
}

# scenario NAME FLOW FAIRNESS CLASS...
scenario() {
  local name=$1 flow=$2 fairness=$3
  shift 3
  config "$flow" "$fairness" >"$WORK/$name.json"
  local ports
  ports=$(free_ports 2)
  GW_PORT=$ports ADMIN_PORT=$((ports + 1))
  "$B/lupin" serve --config "$WORK/$name.json" --listen "127.0.0.1:$GW_PORT" \
    --admin "127.0.0.1:$ADMIN_PORT" --log-level warn >"$WORK/$name.log" 2>&1 &
  local gw=$!
  PIDS+=($gw)
  wait_http "http://127.0.0.1:$ADMIN_PORT/readyz"
  # the queue over time, every 250 ms: t priority flow queued bytes
  : >"$OUT/queue-$name.tsv"
  (
    t0=$(date +%s.%N)
    while kill -0 "$gw" 2>/dev/null; do
      curl -s "http://127.0.0.1:$ADMIN_PORT/admin/flows" | python3 -c '
import json, sys
t = float(sys.argv[1])
try:
    d = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
for b in d.get("bands", []):
    print("%.2f\t%d\t*\t%d\t%d" % (t, b["priority"], b["queued"], b["bytes"]))
    for f in b["flows"]:
        print("%.2f\t%d\t%s\t%d\t%d" % (t, b["priority"], f["id"] or "-", f["queued"], f["bytes"]))
' "$(echo "$(date +%s.%N) - $t0" | bc)" >>"$OUT/queue-$name.tsv" || true
      sleep 0.25
    done
  ) &
  local sampler=$!
  local args=()
  for c in "$@"; do args+=(--class "$c"); done
  python3 bench/flow/client.py --target "127.0.0.1:$GW_PORT" --duration "$DURATION" \
    --seed "$SEED" --out "$OUT/requests-$name.tsv" "${args[@]}"
  local live begun_ok
  live=$(metric lupin_live_requests)
  kill -TERM "$gw"
  wait "$gw" || true
  wait "$sampler" 2>/dev/null || true
  # per class: n 200 429 503 other ttft p50 p99, reasons
  python3 - "$name" "$OUT/requests-$name.tsv" "$live" "$OUT/queue-$name.tsv" <<'PY' >>"$OUT/summary.tsv"
import sys, collections
name, path, live, qpath = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
maxq = maxb = 0
for l in open(qpath):
    t, p, f, q, b = l.split("\t")
    if f == "*":
        maxq = max(maxq, int(q)); maxb = max(maxb, int(b))
by = collections.defaultdict(list)
for r in rows:
    by[r[0]].append(r)
def pct(v, p):
    if not v: return float("nan")
    v = sorted(v); return v[min(len(v) - 1, int(p * len(v)))]
for cls, rs in sorted(by.items()):
    st = collections.Counter(int(r[1]) for r in rs)
    ttft = [float(r[2]) for r in rs if r[1] == "200"]
    reasons = collections.Counter()
    for r in rs:
        if r[1] != "200":
            m = r[4]
            key = ("ttl" if "TTL" in m else "full" if "is full" in m else "shed" if "shed" in m
                   else m[:40] or "none")
            reasons["%s:%s" % (r[1], key)] += 1
    other = len(rs) - st[200] - st[429] - st[503]
    print("\t".join(map(str, [name, cls, len(rs), st[200], st[429], st[503], other,
        "%.0f" % pct(ttft, 0.5), "%.0f" % pct(ttft, 0.99), live, maxq, maxb,
        ",".join("%s=%d" % kv for kv in sorted(reasons.items())) or "-"])))
PY
}

printf "scenario\tclass\tsent\t200\t429\t503\tother\tttft_p50_ms\tttft_p99_ms\tlive_after\tmax_queued\tmax_queue_bytes\tanswers\n" >"$OUT/summary.tsv"
LIGHT="light:4.5:x-gateway-inference-fairness-id=light"
HEAVY="heavy:45:x-gateway-inference-fairness-id=heavy"
HIGH="high:12.5:x-gateway-inference-objective=critical"
LOW="low:37.5:x-gateway-inference-objective=batch"
scenario fair-unloaded on round-robin-fairness-policy "$LIGHT"
scenario fair-off off round-robin-fairness-policy "$LIGHT" "$HEAVY"
scenario fair-strict on global-strict-fairness-policy "$LIGHT" "$HEAVY"
scenario fair-rr on round-robin-fairness-policy "$LIGHT" "$HEAVY"
scenario prio-unloaded on round-robin-fairness-policy "$HIGH"
scenario prio-off off round-robin-fairness-policy "$HIGH" "$LOW"
scenario prio on round-robin-fairness-policy "$HIGH" "$LOW"
column -t -s $'\t' "$OUT/summary.tsv"

if command -v gnuplot >/dev/null; then
  gnuplot <<GP || true
set terminal pngcairo size 900,420
set output "$OUT/flow-queues.png"
set title "queued requests over time (maxConcurrency 4 x 2 endpoints, about 2x capacity offered)"
set xlabel "seconds"; set ylabel "queued"; set key top left
plot "< awk '\$2==0 && \$3==\"heavy\"' $OUT/queue-fair-rr.tsv" u 1:4 w l t "fair-rr: heavy tenant", \
     "< awk '\$2==0 && \$3==\"light\"' $OUT/queue-fair-rr.tsv" u 1:4 w l t "fair-rr: light tenant", \
     "< awk '\$2==10 && \$3==\"*\"' $OUT/queue-prio.tsv" u 1:4 w l t "prio: high band", \
     "< awk '\$2==-1 && \$3==\"*\"' $OUT/queue-prio.tsv" u 1:4 w l t "prio: low band"
GP
fi
