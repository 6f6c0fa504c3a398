#!/usr/bin/env bash
# make bench-routing: routing quality.  For each routing config and request
# rate: fresh simulators (cold caches), a fresh `lupin serve`, the same seeded
# shared-prefix workload from build/bench-routing-client, then the simulators'
# counters.  Prints one table per rate and writes bench/routing/out/results.tsv
# and a plot of TTFT against request rate (out/ttft.png, with gnuplot);
# PLOT_ONLY=1 redraws it from the last results.tsv.
#
#   RATES="20 40 60 80" CONFIGS="random round-robin ..." bench/routing/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-build}
export LUPIN_HOME=$PWD
OUT=bench/routing/out
mkdir -p "$OUT"

# The workload (inference-perf's shared_prefix shape, scaled down): 32 groups
# x 10 questions, a 1000-token system prompt, 100-token questions, 32 output
# tokens; TURNS > 1 makes each question a chat that grows.
RATES=${RATES:-20 40 60 80}
CONFIGS=${CONFIGS:-random round-robin queue prefix default oracle}
SEED=${SEED:-1}
GROUPS_=${GROUPS_:-32}
QUESTIONS=${QUESTIONS:-10}
TURNS=${TURNS:-1}
SYSTEM_TOKENS=${SYSTEM_TOKENS:-1000}
QUESTION_TOKENS=${QUESTION_TOKENS:-100}
MAX_TOKENS=${MAX_TOKENS:-32}
# 8 endpoints; 640 blocks of 16 tokens each hold ~10 of the 32 system prompts
# (63 blocks each) when idle: all 32 cannot be cached everywhere, 4 per
# endpoint (the oracle's share) fit with room for the running requests.
ENDPOINTS=8
BLOCKS=${BLOCKS:-640}
BLOCK_SIZE=16
PREFILL_MS_PER_TOKEN=${PREFILL_MS_PER_TOKEN:-0.1} # ~10k prefill tokens/s, an 8B model on one GPU
ITL_MS=${ITL_MS:-10}
# running requests per endpoint; lower it to make the simulators queue
# (num_requests_waiting > 0 is what queue-scorer reads)
MAX_NUM_SEQS=${MAX_NUM_SEQS:-64}
SIM_PORT=${SIM_PORT:-18101}
GW_PORT=${GW_PORT:-18180}
ADMIN_PORT=${ADMIN_PORT:-18190}
MODEL=meta-llama/Llama-3.1-8B-Instruct

config_file() {
  case $1 in
  default) echo examples/configs/default.json ;;
  *) echo "bench/routing/configs/$1.json" ;;
  esac
}

{
  printf '['
  for ((i = 0; i < ENDPOINTS; i++)); do
    [ "$i" -gt 0 ] && printf ','
    printf '{"name":"sim-%d","address":"127.0.0.1","port":%d}' "$i" $((SIM_PORT + i))
  done
  printf ']\n'
} > "$OUT/endpoints.json"

pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop EXIT

# Sums of the simulators' counters: hits queries ttft_sum ttft_count, then
# requests per endpoint.
scrape() {
  for ((i = 0; i < ENDPOINTS; i++)); do
    curl -sf "http://127.0.0.1:$((SIM_PORT + i))/metrics"
  done | awk '
    $1 ~ /^vllm:prefix_cache_hits_total/ { h += $2 }
    $1 ~ /^vllm:prefix_cache_queries_total/ { q += $2 }
    $1 ~ /^vllm:time_to_first_token_seconds_sum/ { ts += $2 }
    $1 ~ /^vllm:time_to_first_token_seconds_count/ { tc += $2 }
    $1 ~ /^lupin_sim_requests_total/ { n[++k] = $2 }
    END { printf "%d %d %.6f %d", h, q, ts, tc; for (i = 1; i <= k; i++) printf " %d", n[i]; print "" }'
}

run_one() { # config rate -> one results line
  local cfg=$1 rate=$2
  "$B/lupin-sim" --endpoints "$ENDPOINTS" --port "$SIM_PORT" --model "$MODEL" \
    --num-gpu-blocks "$BLOCKS" --block-size "$BLOCK_SIZE" --prefill-serial \
    --prefill-ms-per-token "$PREFILL_MS_PER_TOKEN" --itl-ms "$ITL_MS" --max-num-seqs "$MAX_NUM_SEQS" \
    --seed "$SEED" > "$OUT/sim.log" 2>&1 &
  pids+=($!)
  "$B/lupin" serve --config "$(config_file "$cfg")" --endpoints "$OUT/endpoints.json" \
    --listen "127.0.0.1:$GW_PORT" --admin "127.0.0.1:$ADMIN_PORT" --log-level warn \
    > "$OUT/gateway-$cfg.log" 2>&1 &
  pids+=($!)
  local ready=
  for _ in $(seq 200); do
    if curl -sf "http://127.0.0.1:$ADMIN_PORT/readyz" > /dev/null 2>&1; then ready=1; break; fi
    sleep 0.05
  done
  [ -n "$ready" ] || { echo "gateway not ready ($cfg); see $OUT/gateway-$cfg.log" >&2; exit 1; }
  # our simulators, not something else already on these ports (SIM_PORT moves them)
  for _ in $(seq 100); do
    [ "$(grep -c listening "$OUT/sim.log")" -ge "$ENDPOINTS" ] && break
    kill -0 "${pids[0]}" 2> /dev/null || break
    sleep 0.05
  done
  if ! kill -0 "${pids[0]}" 2> /dev/null; then
    echo "lupin-sim did not start:" >&2; cat "$OUT/sim.log" >&2; exit 1
  fi
  sleep 0.3 # a scrape of every endpoint (the picker sees all 8 from the first request)
  local summary
  summary=$("$B/bench-routing-client" --target "127.0.0.1:$GW_PORT" --rate "$rate" \
    --groups "$GROUPS_" --questions "$QUESTIONS" --turns "$TURNS" \
    --system-tokens "$SYSTEM_TOKENS" --question-tokens "$QUESTION_TOKENS" \
    --max-tokens "$MAX_TOKENS" --block-size "$BLOCK_SIZE" --seed "$SEED" --model "$MODEL" \
    --out "$OUT/requests-$cfg-$rate.txt") || echo "warning: $cfg at $rate req/s: some requests failed" >&2
  local counters
  counters=$(scrape)
  stop
  # config rate hit bound ttft_p50 ttft_p90 sim_ttft_mean rps imbalance ok requests
  echo "$summary $counters" | awk -v c="$cfg" -v r="$rate" '{
    for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) v[kv[1]] = kv[2]; else num[++m] = $i
    h = num[1]; q = num[2]; ts = num[3]; tc = num[4]; max = 0; sum = 0
    for (i = 5; i <= m; i++) { sum += num[i]; if (num[i] > max) max = num[i] }
    printf "%s\t%s\t%.4f\t%.4f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%d\t%d\n", c, r, q ? h / q : 0,
      v["bound_hit"], v["ttft_p50_ms"], v["ttft_p90_ms"], tc ? 1000 * ts / tc : 0,
      v["throughput_rps"], sum ? max / (sum / (m - 4)) : 0, v["ok"], v["requests"] }'
}

plot() {
  if ! command -v gnuplot > /dev/null; then
    echo "no gnuplot: no plot (make deps installs gnuplot-nox)"
    return
  fi
  local cfgs
  cfgs=$(awk -F'\t' 'NR > 1 && !seen[$1]++ { printf "%s ", $1 }' "$results")
  gnuplot <<GP && echo "plot: $OUT/ttft.png"
set terminal pngcairo size 1200,420 font ",10"
set output "$OUT/ttft.png"
set key top left
set xlabel "offered load (req/s)"
series(c) = "< awk -F'\t' '\$1 == \"" . c . "\"' $results"
set multiplot layout 1,3 title "lupin routing: 8 simulated endpoints, shared-prefix workload (seed $SEED)"
set logscale y
set ylabel "TTFT p50 (ms, client)"
plot for [c in "$cfgs"] series(c) using 2:5 with linespoints title c
set ylabel "TTFT p90 (ms, client)"
plot for [c in "$cfgs"] series(c) using 2:6 with linespoints title c
unset logscale y
set ylabel "prefix-cache hit rate"
set yrange [0:1]
set key right center
plot for [c in "$cfgs"] series(c) using 2:3 with linespoints title c
unset multiplot
GP
}

results="$OUT/results.tsv"
# PLOT_ONLY=1: redraw the plot from an earlier results.tsv
if [ -n "${PLOT_ONLY:-}" ]; then
  plot
  exit
fi
printf 'config\trate\thit\tbound\tttft_p50_ms\tttft_p90_ms\tsim_ttft_mean_ms\trps\timbalance\tok\trequests\n' > "$results"
echo "routing quality: $ENDPOINTS simulated endpoints ($BLOCKS blocks of $BLOCK_SIZE tokens each," \
  "serial prefill ${PREFILL_MS_PER_TOKEN} ms/token, ${ITL_MS} ms/token decode);"
echo "workload: $GROUPS_ groups x $QUESTIONS questions x $TURNS turn(s), system prompt $SYSTEM_TOKENS tokens," \
  "question $QUESTION_TOKENS, output $MAX_TOKENS; Poisson arrivals, seed $SEED"
for rate in $RATES; do
  for cfg in $CONFIGS; do
    run_one "$cfg" "$rate" >> "$results"
  done
  echo
  echo "at $rate req/s offered:"
  awk -F'\t' -v r="$rate" 'NR == 1 { next } $2 == r {
    if (!hdr++) printf "  %-12s %8s %10s %10s %10s %9s %9s %6s\n", "config", "hit rate", "TTFT p50", "TTFT p90",
      "sim mean", "req/s", "max/mean", "ok"
    printf "  %-12s %7.1f%% %8.1fms %8.1fms %8.1fms %9.1f %9.2f %6s\n", $1, 100 * $3, $5, $6, $7, $8, $9,
      $10 "/" $11; bound = $4 }
    END { printf "  %-12s %7.1f%%   (no eviction, perfect routing; the first request of each group misses)\n",
      "bound", 100 * bound }' "$results"
done
echo
echo "TTFT: client, from sending the request to the first SSE data line (C client, libuv);"
echo "sim mean: the simulators' vllm:time_to_first_token_seconds sum/count.  hit rate: the"
echo "simulators' prefix_cache_hits/queries (tokens).  max/mean: lupin_sim_requests_total."
echo "results: $results"
plot
