#!/usr/bin/env bash
# make demo: a shared-prefix workload through the running gateway (make run),
# then the same workload through a second gateway that routes at random, so
# the figures have a baseline.  Groups of requests share a long system prompt;
# each group asks several questions, streamed.  Each pass uses prompts of its
# own, so neither finds the other's cache warm.  Prints, side by side,
# requests per endpoint, the prefix-cache hit rate the simulator reports and
# TTFT.
#
#   GATEWAY=http://127.0.0.1:8080 SIM=127.0.0.1:8001 ENDPOINTS=4 examples/demo/demo.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

GATEWAY=${GATEWAY:-http://127.0.0.1:8080}
SIM=${SIM:-127.0.0.1:8001}             # first simulated endpoint; the others follow
ENDPOINTS=${ENDPOINTS:-4}
NGROUPS=${NGROUPS:-8}
QUESTIONS=${QUESTIONS:-10}
CONCURRENCY=${CONCURRENCY:-8}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
BASELINE_PORT=${BASELINE_PORT:-8090} # the random gateway; its admin port is +1
B=${B:-build}
export LUPIN_HOME=$PWD

work=$(mktemp -d)
baseline=""
cleanup() {
  [ -z "$baseline" ] || { kill -TERM "$baseline" 2>/dev/null; wait "$baseline" 2>/dev/null || true; }
  rm -rf "$work"
}
trap cleanup EXIT

sim_host=${SIM%:*}
sim_port=${SIM##*:}

curl -sf "$GATEWAY/v1/models" >/dev/null ||
  { echo "make demo: no gateway answers at $GATEWAY; start it with make run first" >&2; exit 1; }

# Sum of a counter over the simulated endpoints.
counter() {
  local total=0 v
  for ((i = 0; i < ENDPOINTS; i++)); do
    v=$(curl -sf "http://$sim_host:$((sim_port + i))/metrics" |
      awk -v m="$1" '$1 ~ "^"m"({|$)" { s += $2 } END { printf "%d", s }')
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

# The simulators' TTFT histogram, summed over endpoints: "le count" lines.
ttft_buckets() {
  for ((i = 0; i < ENDPOINTS; i++)); do
    curl -sf "http://$sim_host:$((sim_port + i))/metrics" |
      awk '/^vllm:time_to_first_token_seconds_bucket/ {
        match($0, /le="[^"]+"/); print substr($0, RSTART + 4, RLENGTH - 5), $2 }'
  done | awk '{ n[$1] += $2 } END { for (le in n) print le, n[le] }' | sort -g
}

system_prompt() { # ~3,000 characters, different per group and per pass
  local g=$1 pass=$2 s=""
  for ((k = 0; k < 40; k++)); do
    s+="Group $g rule $k: answer as the keeper of $pass lighthouse number $g would, plainly. "
  done
  printf '%s' "$s"
}

requests() { # one request body per line: "group question json"
  for ((q = 0; q < QUESTIONS; q++)); do
    for ((g = 0; g < NGROUPS; g++)); do
      printf '%d %d {"model":"%s","stream":true,"max_tokens":16,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"Question %d: how high is the tide today?"}]}\n' \
        "$g" "$q" "$MODEL" "$(system_prompt "$g" "$1")" "$q"
    done
  done
}

one() { # one streamed request: prints "endpoint ttft status"; TTFT is taken at
         # the first SSE data line, as a client sees it (headers come earlier)
  local body=${1#* * } h start first="" line code ep
  h=$(mktemp "$work/headers.XXXXXX")
  start=$EPOCHREALTIME
  while IFS= read -r line; do
    if [ -z "$first" ] && [[ $line == data:* ]]; then first=$EPOCHREALTIME; fi
  done < <(curl -s -N -D "$h" -H 'content-type: application/json' -d "$body" \
    "$target/v1/chat/completions")
  code=$(awk 'NR == 1 { print $2 }' "$h")
  ep=$(awk -F': ' 'tolower($1) == "x-sim-endpoint" { gsub("\r", "", $2); print $2 }' "$h")
  rm -f "$h"
  awk -v e="${ep:-none}" -v s="$start" -v f="${first:-$EPOCHREALTIME}" -v c="${code:-000}" \
    'BEGIN { printf "%s %.6f %s\n", e, f - s, c }'
}
export -f one
export work

# One pass through gateway $2 with prompts named $1; leaves $work/$1.* behind:
# results (endpoint ttft status), hits, queries, ttft0/ttft1.
pass() {
  local name=$1 h0 q0
  export target=$2
  requests "$name" >"$work/$name.requests"
  ttft_buckets >"$work/$name.ttft0"
  h0=$(counter vllm:prefix_cache_hits_total)
  q0=$(counter vllm:prefix_cache_queries_total)
  # the first question of each group warms a cache; the rest should follow it
  head -n "$NGROUPS" "$work/$name.requests" |
    xargs -d '\n' -P "$CONCURRENCY" -I{} bash -c 'one "$1"' _ {} >"$work/$name.results"
  tail -n +"$((NGROUPS + 1))" "$work/$name.requests" |
    xargs -d '\n' -P "$CONCURRENCY" -I{} bash -c 'one "$1"' _ {} >>"$work/$name.results"
  ttft_buckets >"$work/$name.ttft1"
  echo $(($(counter vllm:prefix_cache_hits_total) - h0)) >"$work/$name.hits"
  echo $(($(counter vllm:prefix_cache_queries_total) - q0)) >"$work/$name.queries"
}

# The figures of one pass, one per line, in the order of the table's rows.
figures() {
  local n=$1
  awk '{ n[$1]++ } END { s = ""; for (e in n) s = s " " n[e]; print substr(s, 2) }' "$work/$n.results" |
    tr ' ' '\n' | sort -rn | paste -sd/
  awk '$3 != 200 { bad++ } END { print bad + 0 }' "$work/$n.results"
  awk -v h="$(cat "$work/$n.hits")" -v q="$(cat "$work/$n.queries")" \
    'BEGIN { if (q > 0) printf "%.1f%%\n", 100 * h / q; else print "-" }'
  # at the model servers: the simulators' histogram, so a bucket's upper bound
  join "$work/$n.ttft0" "$work/$n.ttft1" 2>/dev/null | sort -g | awk '{ le[NR] = $1; c[NR] = $3 - $2 } END {
    n = c[NR]
    for (k = 1; k <= 2; k++) { p = k == 1 ? 0.5 : 0.9; v = "-"
      for (i = 1; i <= NR && n; i++) if (c[i] >= p * n) { v = sprintf("<= %g ms", le[i] * 1000); break }
      print v } }'
  # at the client, including curl and bash starting up for each request
  sort -n -k2 "$work/$n.results" | awk '{ t[NR] = $2 * 1000 } END {
    printf "%.1f ms\n%.1f ms\n", t[int(NR * 0.5) + (NR * 0.5 > int(NR * 0.5))],
      t[int(NR * 0.9) + (NR * 0.9 > int(NR * 0.9))] }'
}

total=$((NGROUPS * QUESTIONS))
echo "$total streamed chat requests: $NGROUPS groups sharing a ~3,000-character system"
echo "prompt, $QUESTIONS questions each, $CONCURRENCY at a time; once through $GATEWAY, once"
echo "through a gateway routing at random (random-picker) to the same endpoints"
echo

echo "pass 1: lupin, the running gateway's config ..."
pass lupin "$GATEWAY"

config=$work/random.yaml
printf 'plugins:\n- type: random-picker\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: random-picker\n' >"$config"
endpoints=$work/endpoints.json
for ((i = 0; i < ENDPOINTS; i++)); do
  echo "{\"name\": \"sim-$i\", \"address\": \"$sim_host\", \"port\": $((sim_port + i))}"
done | paste -sd, | sed 's/^/[/; s/$/]/' >"$endpoints"
"$B/lupin" serve --config "$config" --endpoints "$endpoints" --no-watch \
  --listen "127.0.0.1:$BASELINE_PORT" --admin "127.0.0.1:$((BASELINE_PORT + 1))" \
  --log-level warn 2>"$work/baseline.log" >/dev/null &
baseline=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$((BASELINE_PORT + 1))/readyz" >/dev/null 2>&1 && break
  kill -0 "$baseline" 2>/dev/null ||
    { cat "$work/baseline.log" >&2; echo "make demo: the random gateway did not start" >&2; exit 1; }
  sleep 0.1
done
echo "pass 2: random, http://127.0.0.1:$BASELINE_PORT ..."
pass random "http://127.0.0.1:$BASELINE_PORT"

echo
figures lupin >"$work/lupin.fig"
figures random >"$work/random.fig"
printf '%s\n' "requests per endpoint" "failed requests" "prefix-cache hit rate (simulator)" \
  "TTFT p50 at the model servers" "TTFT p90 at the model servers" \
  "TTFT p50 at the client (incl. curl)" "TTFT p90 at the client (incl. curl)" >"$work/rows"
printf '%-38s %-16s %s\n' "" "lupin" "random"
paste -d'\t' "$work/rows" "$work/lupin.fig" "$work/random.fig" |
  awk -F'\t' '{ printf "%-38s %-16s %s\n", $1, $2, $3 }'
