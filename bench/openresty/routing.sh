#!/usr/bin/env bash
# The routing check behind bench/openresty/run.sh: does the OpenResty peer
# route like `lupin serve` with examples/configs/epp-default.yaml?  The same
# shared-prefix workload through each, each against a fresh lupin-sim (4
# endpoints, --instant): NGROUPS groups of completions sharing a ~3,000-
# character system prompt, QUESTIONS each, CONCURRENCY at a time (the first
# question of every group first).  Prints per target: requests per endpoint,
# the simulators' prefix-cache hit rate, and how concentrated the groups are
# (the share of a group's requests on its most used endpoint, mean over groups).
# Fails when a request fails or the peer's hit rate or concentration falls
# more than 5 points below lupin's (ties are broken at random in both).
set -euo pipefail
cd "$(dirname "$0")/../.."
NGROUPS=${NGROUPS:-8}; QUESTIONS=${QUESTIONS:-10}; CONCURRENCY=${CONCURRENCY:-8}
source bench/gateway/lib.sh
source bench/openresty/lib.sh
LUPIN_CONFIG=examples/configs/epp-default.yaml

system_prompt() { # ~3,000 characters, one per group
  local g=$1 s="" k
  for ((k = 0; k < 40; k++)); do
    s+="Group $g rule $k: answer as the keeper of lighthouse number $g would, plainly. "
  done
  printf '%s' "$s"
}
requests() { # "group json" lines, question by question
  local q g
  for ((q = 0; q < QUESTIONS; q++)); do
    for ((g = 0; g < NGROUPS; g++)); do
      printf '%d {"model":"%s","max_tokens":16,"prompt":"%s Question %d: how high is the tide today?"}\n' \
        "$g" "$MODEL" "$(system_prompt "$g")" "$q"
    done
  done
}
one() { # "group json" -> "group endpoint status"
  local g=${1%% *} body=${1#* }
  curl -s -o /dev/null -w "$g %header{x-sim-endpoint} %{http_code}\n" \
    -H 'content-type: application/json' -d "$body" "$URL/v1/completions"
}
export -f one
counter() { # a counter summed over the endpoints
  local i v total=0
  for ((i = 0; i < SIM_ENDPOINTS; i++)); do
    v=$(curl -sf "http://127.0.0.1:$((SIM_PORT + i))/metrics" |
      awk -v m="$1" '$1 ~ "^"m"({|$)" { s += $2 } END { printf "%d", s }')
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

requests >"$WORK/requests"
bad=0
declare -A RATE CONC
printf '%-8s %-20s %-9s %s\n' target "requests/endpoint" "hit rate" "group concentration"
for target in lupin peer; do
  start_sim 1
  if [ "$target" = lupin ]; then start_lupin 0; export URL=http://127.0.0.1:$LUPIN_PORT
  else start_peer 0; export URL=http://127.0.0.1:$PEER_PORT; fi
  h0=$(counter vllm:prefix_cache_hits_total); q0=$(counter vllm:prefix_cache_queries_total)
  { head -n "$NGROUPS" "$WORK/requests" | xargs -d '\n' -P "$CONCURRENCY" -I{} bash -c 'one "$1"' _ {}
    tail -n +"$((NGROUPS + 1))" "$WORK/requests" | xargs -d '\n' -P "$CONCURRENCY" -I{} bash -c 'one "$1"' _ {}
  } >"$WORK/$target.results"
  h=$(($(counter vllm:prefix_cache_hits_total) - h0)); q=$(($(counter vllm:prefix_cache_queries_total) - q0))
  per=$(awk '{ n[$2]++ } END { for (e in n) print n[e] }' "$WORK/$target.results" | sort -rn | paste -sd/)
  conc=$(awk '{ n[$1 " " $2]++; t[$1]++ } END {
      for (k in n) { split(k, a, " "); if (n[k] > m[a[1]]) m[a[1]] = n[k] }
      for (g in t) s += m[g] / t[g]; printf "%.0f%%", 100 * s / length(t) }' "$WORK/$target.results")
  bad=$((bad + $(awk '$3 != 200' "$WORK/$target.results" | wc -l)))
  rate=$(awk -v h="$h" -v q="$q" 'BEGIN { printf "%.1f", q ? 100 * h / q : 0 }')
  printf '%-8s %-20s %-9s %s\n' "$target" "$per" "$rate%" "$conc"
  RATE[$target]=$rate; CONC[$target]=${conc%\%}
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  PIDS=(); LUPIN_PID=""
done
[ "$bad" = 0 ] || { echo "routing check: $bad requests failed" >&2; exit 1; }
awk -v a="${RATE[lupin]}" -v b="${RATE[peer]}" -v c="${CONC[lupin]}" -v d="${CONC[peer]}" \
  'BEGIN { exit !(b >= a - 5 && d >= c - 5) }' ||
  { echo "routing check: the peer does not route like lupin" >&2; exit 1; }
