#!/usr/bin/env bash
# make demo: a shared-prefix workload through the running gateway, so a
# newcomer sees the routing work.  Groups of requests share a long system
# prompt; each group asks several questions, streamed.  Prints requests per
# endpoint, the prefix-cache hit rate the simulator reports, and TTFT.
#
#   GATEWAY=http://127.0.0.1:8080 SIM=127.0.0.1:8001 ENDPOINTS=4 examples/demo/demo.sh
set -euo pipefail

GATEWAY=${GATEWAY:-http://127.0.0.1:8080}
SIM=${SIM:-127.0.0.1:8001}             # first simulated endpoint; the others follow
ENDPOINTS=${ENDPOINTS:-4}
NGROUPS=${NGROUPS:-8}
QUESTIONS=${QUESTIONS:-10}
CONCURRENCY=${CONCURRENCY:-8}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

sim_host=${SIM%:*}
sim_port=${SIM##*:}

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

# One request body per line: "group question json".
system_prompt() { # ~3,000 characters, different per group
  local g=$1 s=""
  for ((k = 0; k < 40; k++)); do
    s+="Group $g rule $k: answer as the keeper of lighthouse number $g would, plainly. "
  done
  printf '%s' "$s"
}
for ((q = 0; q < QUESTIONS; q++)); do
  for ((g = 0; g < NGROUPS; g++)); do
    printf '%d %d {"model":"%s","stream":true,"max_tokens":16,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"Question %d: how high is the tide today?"}]}\n' \
      "$g" "$q" "$MODEL" "$(system_prompt "$g")" "$q" >> "$work/requests"
  done
done

one() { # one streamed request: prints "endpoint ttft status"; TTFT is taken at
         # the first SSE data line, as a client sees it (headers come earlier)
  local body=${1#* * } h start first="" line code ep
  h=$(mktemp "$work/headers.XXXXXX")
  start=$EPOCHREALTIME
  while IFS= read -r line; do
    if [ -z "$first" ] && [[ $line == data:* ]]; then first=$EPOCHREALTIME; fi
  done < <(curl -s -N -D "$h" -H 'content-type: application/json' -d "$body" \
    "$GATEWAY/v1/chat/completions")
  code=$(awk 'NR == 1 { print $2 }' "$h")
  ep=$(awk -F': ' 'tolower($1) == "x-sim-endpoint" { gsub("\r", "", $2); print $2 }' "$h")
  rm -f "$h"
  awk -v e="${ep:-none}" -v s="$start" -v f="${first:-$EPOCHREALTIME}" -v c="${code:-000}" \
    'BEGIN { printf "%s %.6f %s\n", e, f - s, c }'
}
export -f one
export GATEWAY work

ttft_buckets > "$work/ttft0"
hits0=$(counter vllm:prefix_cache_hits_total)
queries0=$(counter vllm:prefix_cache_queries_total)

echo "sending $((NGROUPS * QUESTIONS)) streamed chat requests: $NGROUPS groups sharing a"
echo "~3,000-character system prompt, $QUESTIONS questions each, $CONCURRENCY at a time, to $GATEWAY"
# the first question of each group warms a cache; the rest should follow it
head -n "$NGROUPS" "$work/requests" | xargs -d '\n' -P "$CONCURRENCY" -I{} bash -c 'one "$1"' _ {} > "$work/results"
tail -n +"$((NGROUPS + 1))" "$work/requests" | xargs -d '\n' -P "$CONCURRENCY" -I{} bash -c 'one "$1"' _ {} >> "$work/results"

ttft_buckets > "$work/ttft1"
hits=$(( $(counter vllm:prefix_cache_hits_total) - hits0 ))
queries=$(( $(counter vllm:prefix_cache_queries_total) - queries0 ))

echo
echo "requests per endpoint:"
awk '{ n[$1]++ } END { for (e in n) printf "  %-24s %d\n", e, n[e] }' "$work/results" | sort
awk '$3 != 200 { bad++ } END { if (bad) printf "  (%d requests failed)\n", bad }' "$work/results"
if [ "$queries" -gt 0 ]; then
  awk -v h="$hits" -v q="$queries" 'BEGIN { printf "prefix-cache hit rate (simulator): %.1f%% of %d prompt tokens\n", 100 * h / q, q }'
fi
# at the model servers: the simulators' histogram, so a bucket's upper bound
join "$work/ttft0" "$work/ttft1" 2>/dev/null | sort -g | awk '{ le[NR] = $1; c[NR] = $3 - $2 } END {
  n = c[NR]; if (!n) exit
  split("0.5 0.9 0.99", ps, " "); out = ""
  for (k = 1; k <= 3; k++) for (i = 1; i <= NR; i++) if (c[i] >= ps[k] * n) {
    out = out sprintf(" p%g ≤ %g ms,", ps[k] * 100, le[i] * 1000); break }
  printf "TTFT at the model servers (simulator histogram):%s over %d requests\n", substr(out, 1, length(out) - 1), n }'
# at the client, including curl and bash starting up for each request
sort -n -k2 "$work/results" | awk '{ t[NR] = $2 * 1000 } END {
  if (NR) printf "TTFT at the client (incl. starting curl): p50 %.1f ms, p90 %.1f ms\n",
    t[int(NR * 0.5) + (NR * 0.5 > int(NR * 0.5))], t[int(NR * 0.9) + (NR * 0.9 > int(NR * 0.9))] }'
