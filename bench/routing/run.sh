#!/usr/bin/env bash
# make bench-routing: the routing evaluation matrix (bench/routing/README.md).
# For each workload family, load level and routing config: fresh simulators
# (cold caches), a fresh `lupin serve`, the family's seeded workload from
# build/bench-routing-client, then the simulators' counters.  Prints one table
# per family, writes bench/routing/out/results.tsv and one plot per family
# (out/routing-FAMILY.png, with gnuplot; PLOT_ONLY=1 redraws them).
# The objectives family (latency objectives per request class) also writes
# out/objectives.tsv and its own table: attainment, TTFT and TPOT per class,
# sheds, and the latency predictor's error from the gateway's /metrics.
#
#   FAMILIES="prefix chat" CONFIGS="random default" QUICK=1 bench/routing/run.sh
#   WORKERS=2: the gateway with two event loops (one prefix index all the same)
#   FRONT=epp: `lupin epp` behind spec/fixtures/epp/envoy.py's proxy (Envoy's
#     ext_proc filter played in Python) instead of `lupin serve`; configs are
#     named CONFIG@epp in the results
#   FRONT=nginx: Debian's nginx with ngx_http_lupin_module (docs/nginx.md)
#     instead of `lupin serve`, WORKERS worker processes (1; more share their
#     prefix records through lupin_prefix_zone, connections spread by
#     reuseport); the config with the endpoints in it (bench/nginx/lib.sh);
#     CONFIG@nginx
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
export LUPIN_HOME=$PWD
OUT=bench/routing/out
mkdir -p "$OUT"

ALL_FAMILIES="prefix chat docqa nosharing bursty hetero lora pd tenants objectives"
FAMILIES=${FAMILIES:-$ALL_FAMILIES}
CONFIGS_GIVEN=${CONFIGS+1} # a family's own configs run only when CONFIGS is not given
CONFIGS=${CONFIGS:-random round-robin load-only epp default}
SEED=${SEED:-1}
# 8 endpoints of 640 blocks x 16 tokens: a family's shared prefixes cannot all
# be cached everywhere.  Serial prefill at 0.1 ms per uncached token (~10k
# tokens/s, an 8B model on one GPU), 10 ms per output token.
ENDPOINTS=8
BLOCKS=${BLOCKS:-640}
BLOCK_SIZE=16
PREFILL_MS_PER_TOKEN=${PREFILL_MS_PER_TOKEN:-0.1}
ITL_MS=${ITL_MS:-10}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-64}
MAX_TOKENS=${MAX_TOKENS:-32}
SIM_PORT=${SIM_PORT:-18101}
GW_PORT=${GW_PORT:-18180}
ADMIN_PORT=${ADMIN_PORT:-18190}
MODEL=meta-llama/Llama-3.1-8B-Instruct
# the simulators' KV events (vLLM's ZMQ publisher) and replay sockets: endpoint
# i publishes on EVENTS_PORT + i, answers replays on REPLAY_PORT + i
EVENTS_PORT=${EVENTS_PORT:-18201}
REPLAY_PORT=${REPLAY_PORT:-18221}
FRONT=${FRONT:-serve}
PYTHON=${PYTHON:-/usr/bin/python3} # Debian's: python3-grpcio, python3-protobuf
case $FRONT in
serve) AT="" ;;
epp) AT=@epp ;;
nginx)
  AT=@nginx
  for t in nginx jq; do
    command -v "$t" > /dev/null || { echo "FRONT=nginx: $t not found (make deps)" >&2; exit 1; }
  done
  [ -f "$B/ngx_http_lupin_module.so" ] || { echo "FRONT=nginx: no $B/ngx_http_lupin_module.so (make nginx-module)" >&2; exit 1; }
  source bench/nginx/lib.sh # start_lupin_nginx
  ;;
*) echo "FRONT=$FRONT: serve, epp or nginx" >&2; exit 2 ;;
esac
LORAS=lora-0,lora-1,lora-2,lora-3

# family -> what it runs.  LEVELS: light then saturating, rate:R (open-loop
# Poisson, req/s) or conc:C (closed loop, C in flight); QUICK=1 keeps the last.
family() {
  SIM_EXTRA="" SPLIT="" PD="" ORACLE="" EXTRA_CONFIGS="" OWN_CONFIGS="" OBJECTIVES=""
  case $1 in
  prefix) # inference-perf's shared_prefix shape, scaled down
    WORKLOAD="--groups 24 --questions 8 --system-tokens 1000 --question-tokens 100"
    LEVELS="rate:30 rate:70" ORACLE=1
    DESC="24 groups x 8 questions, 1000-token system prompt per group, 100-token questions" ;;
  chat) # every session shares one long global system prompt; turns grow
    WORKLOAD="--groups 1 --questions 64 --turns 5 --system-tokens 2000 --context-tokens 200
      --question-tokens 50 --answer-tokens 50"
    LEVELS="conc:8 conc:24"
    DESC="64 sessions x 5 turns, one 2000-token global system prompt, 200-token session context, closed loop" ;;
  docqa) # a few long documents, many short questions on each
    WORKLOAD="--groups 4 --questions 48 --system-tokens 3000 --question-tokens 30"
    LEVELS="rate:20 rate:50"
    DESC="4 documents of 3000 tokens x 48 questions of 30 tokens" ;;
  nosharing) # random prompts: prefix awareness must cost nothing
    WORKLOAD="--groups 192 --questions 1 --system-tokens 0 --question-tokens 600"
    LEVELS="rate:30 rate:70"
    DESC="192 unrelated 600-token prompts" ;;
  bursty) # on/off arrivals: 500 ms at 3x the mean rate, 1 s of silence
    WORKLOAD="--groups 24 --questions 8 --system-tokens 1000 --question-tokens 100 --burst 500,1000"
    LEVELS="rate:60 rate:150"
    DESC="the prefix workload in bursts: 500 ms at the rate, 1000 ms silent" ;;
  hetero) # endpoint 0 three times slower, endpoint 7 with a quarter of the KV cache
    WORKLOAD="--groups 24 --questions 8 --system-tokens 1000 --question-tokens 100"
    LEVELS="rate:30 rate:60" SIM_EXTRA="--slow-endpoints 0 --slow-factor 3" SPLIT=$((BLOCKS / 4))
    DESC="the prefix workload; endpoint 0 3x slower, endpoint 7 with $((BLOCKS / 4)) blocks" ;;
  lora) # 4 adapters, one adapter at a time in an endpoint's batch
    WORKLOAD="--groups 16 --questions 12 --system-tokens 1000 --question-tokens 100 --loras $LORAS"
    LEVELS="rate:20 rate:50" SIM_EXTRA="--lora $LORAS --max-loras 1"
    DESC="16 groups x 12 questions over 4 LoRA adapters (group g: adapter g mod 4), --max-loras 1" ;;
  pd) # 4 prefill + 4 decode endpoints, pd-profile-handler
    WORKLOAD="--groups 24 --questions 8 --system-tokens 1000 --question-tokens 100"
    LEVELS="rate:15 rate:35" PD=1
    DESC="the prefix workload; endpoints 0-3 prefill, 4-7 decode (imbalance over decode)" ;;
  tenants) # private long contexts whose total exceeds the fleet's cache
    WORKLOAD="--groups ${TENANTS:-48} --questions 6 --turns 2 --system-tokens ${CONTEXT_TOKENS:-3000}
      --question-tokens 100 --answer-tokens 32"
    LEVELS="rate:8 rate:16" EXTRA_CONFIGS="precise precise-bounded resident-oracle"
    DESC="${TENANTS:-48} tenants x 6 users x 2 turns, a ${CONTEXT_TOKENS:-3000}-token private context per tenant ($((${TENANTS:-48} * ${CONTEXT_TOKENS:-3000})) tokens; the fleet caches $((ENDPOINTS * BLOCKS * BLOCK_SIZE)))" ;;
  objectives) # two objective classes on a fleet of fast and slow endpoints
    # interactive: short prompts (4 system prompts of 200 tokens + 20-800 of
    # their own), tight TTFT and TPOT; batch: long documents (6 of 1500 tokens
    # + 100-2500), loose TTFT, sheddable.  640 blocks hold ~3 batch prompts, so
    # a busy endpoint runs ~8-14 requests (KV-bound, not --max-num-seqs):
    # decode steps of 10 + 1 ms x running double from idle (11 ms) to busy
    # (20 ms at 10); x2.5 on endpoints 0-2, where TPOT <= 40 ms holds up to 6.
    WORKLOAD="--requests ${OBJ_REQUESTS:-480}
      --class interactive:share=0.6,ttft=300,tpot=40,prefixes=4,prefix-tokens=200,tail=20-800,output=16-64
      --class batch:share=0.4,ttft=5000,objective=-1,prefixes=6,prefix-tokens=1500,tail=100-2500,output=64-128"
    LEVELS="${OBJ_LEVELS:-rate:10 rate:30}" OBJECTIVES=1
    SIM_EXTRA="--slow-endpoints 0,1,2 --slow-factor 2.5 --itl-ms-per-seq 1 --max-num-seqs 32"
    OWN_CONFIGS="random load-only default predicted-latency"
    DESC="${OBJ_REQUESTS:-480} requests: 60% interactive (220-1000-token prompts, 16-64 tokens out; TTFT <= 300 ms, TPOT <= 40 ms), 40% batch (1600-4000 tokens, 64-128 out; TTFT <= 5000 ms, sheddable); endpoints 0-2 2.5x slower; decode step 10 + 1 ms x running" ;;
  *) echo "unknown family $1 (known: $ALL_FAMILIES)" >&2; exit 2 ;;
  esac
  if [ -n "${QUICK:-}" ]; then LEVELS=${LEVELS##* }; fi
}

config_file() { # family config -> file
  local f
  case $2 in
  default) f=examples/configs/default.json ;;
  epp) f=examples/configs/epp-default.json ;;
  *) f=bench/routing/configs/$2.json ;;
  esac
  if [ -n "$PD" ]; then
    luajit bench/routing/pd.lua "$f" 256 > "$OUT/pd-$2.json"
    f=$OUT/pd-$2.json
  fi
  echo "$f"
}

endpoints_file() {
  {
    printf '['
    for ((i = 0; i < ENDPOINTS; i++)); do
      [ "$i" -gt 0 ] && printf ','
      # every endpoint's own KV events and replay sockets (they share 127.0.0.1)
      local labels="\"lupin.io/kv-events\":\"tcp://127.0.0.1:$((EVENTS_PORT + i))\""
      labels="$labels,\"lupin.io/kv-replay\":\"tcp://127.0.0.1:$((REPLAY_PORT + i))\""
      if [ -n "$PD" ]; then
        local role
        role=$([ "$i" -lt $((ENDPOINTS / 2)) ] && echo prefill || echo decode)
        labels="\"llm-d.ai/role\":\"$role\",$labels"
      fi
      printf '{"name":"sim-%d","address":"127.0.0.1","port":%d,"labels":{%s}}' "$i" \
        $((SIM_PORT + i)) "$labels"
    done
    printf ']\n'
  } > "$OUT/endpoints.json"
}

pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop EXIT

# Sums of the simulators' counters: hits queries, then requests per endpoint
# (the decode endpoints only in the pd family).
scrape() {
  local first=0
  [ -n "$PD" ] && first=$((ENDPOINTS / 2))
  for ((i = 0; i < ENDPOINTS; i++)); do
    curl -sf "http://127.0.0.1:$((SIM_PORT + i))/metrics" | sed "s/^/$i /"
  done | awk -v first="$first" '
    $2 ~ /^vllm:prefix_cache_hits_total/ { h += $3 }
    $2 ~ /^vllm:prefix_cache_queries_total/ { q += $3 }
    $2 ~ /^lupin_sim_requests_total/ && $1 >= first { n[++k] = $3 }
    END { printf "%d %d", h, q; for (i = 1; i <= k; i++) printf " %d", n[i]; print "" }'
}

start_sims() {
  local n=$ENDPOINTS
  [ -n "$SPLIT" ] && n=$((ENDPOINTS - 1))
  local common=(--model "$MODEL" --block-size "$BLOCK_SIZE" --prefill-serial
    --prefill-ms-per-token "$PREFILL_MS_PER_TOKEN" --itl-ms "$ITL_MS"
    --max-num-seqs "$MAX_NUM_SEQS" --seed "$SEED")
  # shellcheck disable=SC2086
  "$B/lupin-sim" --endpoints "$n" --port "$SIM_PORT" --num-gpu-blocks "$BLOCKS" "${common[@]}" \
    --kv-events-port "$EVENTS_PORT" --kv-replay-port "$REPLAY_PORT" \
    $SIM_EXTRA > "$OUT/sim.log" 2>&1 &
  pids+=($!)
  if [ -n "$SPLIT" ]; then # the last endpoint, with a small KV cache
    "$B/lupin-sim" --endpoints 1 --port $((SIM_PORT + n)) --num-gpu-blocks "$SPLIT" "${common[@]}" \
      --kv-events-port $((EVENTS_PORT + n)) --kv-replay-port $((REPLAY_PORT + n)) \
      > "$OUT/sim2.log" 2>&1 &
    pids+=($!)
  fi
  for _ in $(seq 100); do
    [ "$(cat "$OUT"/sim*.log 2> /dev/null | grep -c listening)" -ge "$ENDPOINTS" ] && return
    sleep 0.05
  done
  echo "lupin-sim did not start:" >&2
  cat "$OUT"/sim*.log >&2
  exit 1
}

# lupin epp (ext_proc on a free port, its admin listener on ADMIN_PORT) and
# envoy.py's proxy on GW_PORT sending every request through it
start_epp() { # config-file log
  local cfgfile=$1 log=$2 target="" proxy_log=${2%.log}.proxy.log
  "$B/lupin" epp --config-file "$cfgfile" --endpoints "$OUT/endpoints.json" \
    --bind-address 127.0.0.1 --grpc-port 0 --grpc-health-port 0 --metrics-port "$ADMIN_PORT" \
    --log-level warn > "$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do
    target=$(sed -n '1s|^lupin epp: listening on grpc://\([^ ]*\) .*|\1|p' "$log")
    [ -n "$target" ] && break
    sleep 0.05
  done
  [ -n "$target" ] || { echo "lupin epp did not start; see $log" >&2; exit 1; }
  "$PYTHON" spec/fixtures/epp/envoy.py --target "$target" --timeout 120 proxy \
    --listen "127.0.0.1:$GW_PORT" > "$proxy_log" 2>&1 &
  pids+=($!)
  for _ in $(seq 200); do
    grep -q '"listening"' "$proxy_log" && return
    sleep 0.05
  done
  echo "envoy.py proxy did not start; see $proxy_log" >&2
  exit 1
}

run_one() { # family level config -> one results line
  local fam=$1 level=$2 cfg=$3 cfgfile
  cfgfile=$(config_file "$fam" "$cfg")
  cfg=$cfg$AT
  # one log a run: a failed request's record outlives the rest of the matrix
  local log="$OUT/gateway-$fam-${level#*:}-$cfg.log"
  rm -f "$OUT"/sim*.log
  start_sims
  local ready_url="http://127.0.0.1:$ADMIN_PORT/readyz"
  if [ "$FRONT" = epp ]; then
    start_epp "$cfgfile" "$log"
  elif [ "$FRONT" = nginx ]; then
    # its prefix dir (conf, lupin.json, error.log) beside the run's other files
    rm -rf "${log%.log}.nginx"
    LUPIN_NGINX_LISTEN=reuseport start_lupin_nginx "${log%.log}.nginx" "$GW_PORT" \
      "${WORKERS:-1}" "0-$(($(nproc) - 1))" "$cfgfile" "$OUT/endpoints.json" pids || exit 1
    ready_url="http://127.0.0.1:$GW_PORT/lupin_status"
    log=${log%.log}.nginx/error.log
  else
    "$B/lupin" serve --config "$cfgfile" --endpoints "$OUT/endpoints.json" \
      --listen "127.0.0.1:$GW_PORT" --admin "127.0.0.1:$ADMIN_PORT" --log-level warn \
      --workers "${WORKERS:-1}" > "$log" 2>&1 &
    pids+=($!)
  fi
  local ready=
  for _ in $(seq 200); do
    if curl -sf "$ready_url" > /dev/null 2>&1; then ready=1; break; fi
    sleep 0.05
  done
  [ -n "$ready" ] || { echo "gateway not ready ($cfg); see $log" >&2; exit 1; }
  sleep 0.2 # a scrape of every endpoint: the picker sees all 8 from the first request
  local load summary
  case $level in
  rate:*) load="--rate ${level#rate:}" ;;
  conc:*) load="--concurrency ${level#conc:} --rate 1" ;;
  esac
  # shellcheck disable=SC2086
  local oracle="" # the simulator's knowledge of every cache, asked before each send
  [ "$3" = resident-oracle ] && oracle="--oracle 127.0.0.1:$SIM_PORT"
  # shellcheck disable=SC2086
  summary=$("$B/bench-routing-client" --target "127.0.0.1:$GW_PORT" $load $WORKLOAD $oracle \
    --max-tokens "$MAX_TOKENS" --block-size "$BLOCK_SIZE" --seed "$SEED" --model "$MODEL" \
    --out "$OUT/requests-$fam-${level#*:}-$cfg.txt") ||
    echo "warning: $fam $level $cfg: some requests failed (see $log)" >&2
  local counters
  counters=$(scrape)
  [ -n "$OBJECTIVES" ] && objectives_line "$fam" "$level" "$cfg" "$summary" >> "$objectives"
  stop
  echo "$summary $counters" | awk -v f="$fam" -v l="$level" -v c="$cfg" '{
    for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) v[kv[1]] = kv[2]; else num[++m] = $i
    h = num[1]; q = num[2]; max = 0; sum = 0
    for (i = 3; i <= m; i++) { sum += num[i]; if (num[i] > max) max = num[i] }
    printf "%s\t%s\t%s\t%.4f\t%.4f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.3f\t%d\t%d\n", f, l, c,
      q ? h / q : 0, v["bound_hit"], v["ttft_p50_ms"], v["ttft_p90_ms"], v["ttft_p99_ms"],
      v["latency_p50_ms"], v["latency_p90_ms"], v["throughput_rps"],
      sum ? max / (sum / (m - 2)) : 0, v["ok"], v["requests"] }'
}

# The latency predictor's absolute percentage error, group "all", from the
# gateway's /metrics while it still runs: the recent one (the gauge, an
# exponentially weighted mean) for TTFT and TPOT, then the run's mean (the
# sum of errors over the predictions counted); "-" where the gateway exports
# none (no predictor in the config, or a front without lupin's admin).
prediction_errors() {
  curl -sf "http://127.0.0.1:$ADMIN_PORT/metrics" 2> /dev/null | awk '
    function target(   t) { for (t in seen) if (index($0, "target=\"" t "\"")) return t; return "" }
    BEGIN { seen["ttft"]; seen["tpot"] }
    !/group="all"/ || !(t = target()) { next }
    /^lupin_latency_prediction_error_ratio\{/ { recent[t] = $NF }
    /^lupin_latency_prediction_ape_total\{/ { ape[t] = $NF }
    /^lupin_latency_predictions_observed_total\{/ { n[t] = $NF }
    END {
      printf "%s\t%s", ("ttft" in recent) ? recent["ttft"] : "-", ("tpot" in recent) ? recent["tpot"] : "-"
      printf "\t%s\t%s", (n["ttft"] > 0 ? ape["ttft"] / n["ttft"] : "-"),
        (n["tpot"] > 0 ? ape["tpot"] / n["tpot"] : "-") }'
}

# One line per objective class of a run of the objectives family, from the
# client's summary (NAME_requests, NAME_met, ...) and prediction_errors.
objectives_line() { # family level config summary
  local errs
  errs=$(prediction_errors)
  echo "$4" | awk -v f="$1" -v l="$2" -v c="$3" -v errs="$errs" '{
    for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) {
      v[kv[1]] = kv[2]
      if (sub(/_requests$/, "", kv[1])) cls[++n] = kv[1] }
    for (j = 1; j <= n; j++) { k = cls[j]; printf "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%s\n", f, l, c, k,
      v[k "_requests"], v[k "_ok"], v[k "_met"], v[k "_shed"], v[k "_ttft_p50_ms"], v[k "_ttft_p90_ms"],
      v[k "_tpot_p50_ms"], v[k "_tpot_p90_ms"], errs } }'
}

# The objectives family's own table: per load, config and class the share of
# requests that met their objectives, TTFT and TPOT percentiles, sheds; the
# predictor's error once per run, recent (run mean).
objectives_table() {
  awk -F'\t' -v fam="$1" 'function p(x) { return x == "-" ? "-" : sprintf("%.0f%%", 100 * x) }
    $1 == fam {
    if (!hdr++) printf "  %-9s %-18s %-12s %7s %8s %8s %8s %8s %5s  %s\n", "load", "config", "class",
      "met", "TTFT p50", "p90", "TPOT p50", "p90", "shed", "predictor error TTFT / TPOT: recent (run)"
    first = !seen[$2, $3]++
    err = !first ? "" : $13 $14 $15 $16 == "----" ? "-" : sprintf("%s / %s (%s / %s)", p($13), p($14),
      p($15), p($16))
    printf "  %-9s %-18s %-12s %6.1f%% %8.1f %8.1f %8.1f %8.1f %5d  %s\n", $2, $3, $4,
      $5 ? 100 * $7 / $5 : 0, $9, $10, $11, $12, $8, err }' "$objectives"
}

# One family's table: per level the configs' rows, then the ideal hit rate,
# then default's TTFT against random's and load-only's (CONFIG@FRONT rows are
# compared as CONFIG: results.tsv holds one front).  The config column is 12
# wide, wider when a name is longer (predicted-latency).
table() {
  local w
  w=$(awk -F'\t' -v fam="$1" '$1 == fam && length($3) > w { w = length($3) } END { print (w > 12 ? w : 12) }' \
    "$results")
  awk -F'\t' -v fam="$1" -v cf="%-${w}s" '$1 == fam { c = $3; sub(/@.*/, "", c)
    if (!hdr++) printf "  %-9s " cf " %6s %8s %8s %8s %8s %8s %7s %6s %7s\n", "load", "config",
      "hit", "TTFT p50", "p90", "p99", "e2e p50", "e2e p90", "req/s", "imbal", "ok"
    printf "  %-9s " cf " %5.1f%% %8.1f %8.1f %8.1f %8.1f %8.1f %7.1f %6.2f %7s\n", $2, $3, 100 * $4,
      $6, $7, $8, $9, $10, $11, $12, $13 "/" $14
    bound = $5; p50[$2, c] = $6; p90[$2, c] = $7; hit[$2, c] = $4
    if (!seen[$2]++) lv[++n] = $2 }
    END {
      if (!hdr) exit
      printf "  %-9s " cf " %5.1f%%   (ideal: each prompt token seen before on any endpoint)\n", "", "ideal",
        100 * bound
      for (i = 1; i <= n; i++) { l = lv[i]
        if (!((l, "default") in p50)) continue
        line = sprintf("  default at %s:", l)
        if ((l, "random") in p50 && p50[l, "random"] > 0)
          line = line sprintf(" TTFT p50 %.2fx, p90 %.2fx random;", p50[l, "default"] / p50[l, "random"],
            p90[l, "default"] / p90[l, "random"])
        if ((l, "load-only") in p50 && p50[l, "load-only"] > 0)
          line = line sprintf(" p50 %.2fx load-only;", p50[l, "default"] / p50[l, "load-only"])
        if (bound > 0) line = line sprintf(" hit %.0f%% of ideal", 100 * hit[l, "default"] / bound)
        print line } }' "$results"
}

# The whole matrix in one markdown table: each family and load, the TTFT of
# every config side by side, then the default's other figures.
summary() {
  awk -F'\t' 'NR > 1 { k = $1 SUBSEP $2; if (!seen[k]++) keys[++n] = k
    c = $3; if (sub(/@.*/, "", c)) front = substr($3, length(c) + 1)
    p50[k, c] = $6; p90[k, c] = $7; p99[k, c] = $8; e2e[k, c] = $9; rps[k, c] = $11
    hit[k, c] = $4; imb[k, c] = $12; ideal[k] = $5 }
    function row(a, k, fmt,   out, i, c) {
      out = ""
      for (i = 1; i <= 5; i++) { c = cfg[i]
        out = out (i > 1 ? " / " : "") ((k, c) in a ? sprintf(fmt, a[k, c]) : "-") }
      return out }
    END {
      split("random round-robin load-only epp default", cfg, " ")
      if (front != "") print "configs through the front " substr(front, 2) " (" front " in results.tsv):"
      print "| family | load | TTFT p50 ms: random / RR / load-only / EPP / default | TTFT p90 ms: same |" \
        " default p99, e2e p50 (ms) | req/s random / default | hit EPP / default / ideal |" \
        " imbalance random / EPP / default |"
      print "|---|---|---|---|---|---|---|---|"
      for (j = 1; j <= n; j++) { k = keys[j]; split(k, fl, SUBSEP)
        printf "| %s | %s | %s | %s | %.0f, %.0f | %.1f / %.1f | %.0f%% / %.0f%% / %.0f%% | %.2f / %.2f / %.2f |\n",
          fl[1], fl[2], row(p50, k, "%.0f"), row(p90, k, "%.0f"), p99[k, "default"], e2e[k, "default"],
          rps[k, "random"], rps[k, "default"], 100 * hit[k, "epp"], 100 * hit[k, "default"],
          100 * ideal[k], imb[k, "random"], imb[k, "epp"], imb[k, "default"] } }' "$results"
}

plot() { # one PNG per family: TTFT p50 and p90 and hit rate per config and level
  if ! command -v gnuplot > /dev/null; then
    echo "no gnuplot: no plots (make bench-deps installs gnuplot-nox)"
    return
  fi
  local fam cfgs
  for fam in $(awk -F'\t' 'NR > 1 && !seen[$1]++ { print $1 }' "$results"); do
    cfgs=$(awk -F'\t' -v f="$fam" '$1 == f && !seen[$3]++ { printf "%s ", $3 }' "$results")
    gnuplot << GP && echo "plot: $OUT/routing-$fam.png"
set terminal pngcairo size 1200,380 font ",10"
set output "$OUT/routing-$fam.png"
set key top left
set xlabel "load"
set offsets 0.3, 0.3, 0, 0
series(c) = "< awk -F'\t' '\$1 == \"$fam\" && \$3 == \"" . c . "\"' $results"
set multiplot layout 1,3 title "lupin routing, family $fam: 8 simulated endpoints (seed $SEED)"
set logscale y
set ylabel "TTFT p50 (ms, client)"
plot for [c in "$cfgs"] series(c) using 0:6:xtic(2) with linespoints title c
set ylabel "TTFT p90 (ms, client)"
plot for [c in "$cfgs"] series(c) using 0:7:xtic(2) with linespoints title c
unset logscale y
set ylabel "prefix-cache hit rate"
set yrange [0:1]
set key bottom right
plot for [c in "$cfgs"] series(c) using 0:4:xtic(2) with linespoints title c, \
  series("${cfgs%% *}") using 0:5 with lines dashtype 2 lc rgb "black" title "ideal"
unset multiplot
GP
  done
}

results="$OUT/results.tsv"
if [ -n "${PLOT_ONLY:-}" ]; then
  summary
  plot
  exit
fi
objectives="$OUT/objectives.tsv"
printf 'family\tload\tconfig\tclass\trequests\tok\tmet\tshed\tttft_p50_ms\tttft_p90_ms\ttpot_p50_ms\ttpot_p90_ms\tpred_err_ttft\tpred_err_tpot\tpred_mean_ttft\tpred_mean_tpot\n' > "$objectives"
printf 'family\tload\tconfig\thit\tideal\tttft_p50_ms\tttft_p90_ms\tttft_p99_ms\tlat_p50_ms\tlat_p90_ms\trps\timbalance\tok\trequests\n' > "$results"
echo "routing matrix: $ENDPOINTS lupin-sim endpoints ($BLOCKS blocks of $BLOCK_SIZE tokens," \
  "serial prefill ${PREFILL_MS_PER_TOKEN} ms/token, ${ITL_MS} ms/token decode, $MAX_TOKENS output tokens);" \
  "seed $SEED; times in ms; front: $FRONT"
for fam in $FAMILIES; do
  family "$fam"
  endpoints_file
  cfgs=$CONFIGS
  [ -z "$CONFIGS_GIVEN" ] && [ -n "$OWN_CONFIGS" ] && cfgs=$OWN_CONFIGS
  [ -z "$CONFIGS_GIVEN" ] && cfgs="$cfgs ${EXTRA_CONFIGS/resident-oracle/}"
  [ -n "$ORACLE" ] && [ -z "${NO_ORACLE:-}" ] && cfgs="$cfgs oracle"
  [[ $EXTRA_CONFIGS == *resident-oracle* ]] && [ -z "$CONFIGS_GIVEN" ] && [ -z "${NO_ORACLE:-}" ] &&
    cfgs="$cfgs resident-oracle"
  for level in $LEVELS; do
    for cfg in $cfgs; do
      run_one "$fam" "$level" "$cfg" >> "$results"
    done
  done
  echo
  echo "$fam: $DESC"
  table "$fam"
  if [ -n "$OBJECTIVES" ]; then
    echo
    objectives_table "$fam"
  fi
done
echo
echo "TTFT: client, sending to the first SSE data line; e2e: to the last byte.  hit: the"
echo "simulators' prefix_cache_hits/queries (tokens).  imbal: max/mean of lupin_sim_requests_total."
echo "results: $results"
echo
summary
echo
plot
