#!/usr/bin/env bash
# The one table of `make bench`: the headline figure of every section, read
# from the log of the whole run (each section also prints its full tables).
#   bash bench/summary.sh build/bench.log
set -u
log=${1:?usage: bench/summary.sh LOG}

row() { printf '| %-22s | %-46s | %s |\n' "$1" "$2" "${3:-(not in the log)}"; }

echo
echo "## make bench: summary ($(date -u +%Y-%m-%d), $(nproc) cores)"
echo
echo "| section | figure | value |"
echo "|---|---|---|"

# bench-lifecycle: "config X, N endpoints, M lifecycles, P-byte prompt", then
# "lifecycle  median A us  p99 B us ..." and "host-paced median C us  p99 D us ..."
awk '/^config .*lifecycles, .*-byte prompt/ { c = $2; sub(",", "", c); n = $3; p = $(NF - 1) }
  /^lifecycle  median/ { m = $3; q = $6 }
  /^host-paced median/ { printf "| lifecycle (bench-lifecycle) | %s, %s endpoints, %s prompt | median %s µs, p99 %s µs; collector between requests: p99 %s µs |\n",
    c, n, p, m, q, $6 }' "$log"

# bench-prefix: "    16KB   hash  insert  evict  lookup"
v=$(awk '$1 == "16KB" && NF == 5 { printf "%s GB/s hashing, %s ns/block insert, %s ns/block lookup", $2, $3, $5 }' "$log" | head -n 1)
row "prefix primitives" "16 KB prompt, 16 endpoints" "$v"

# bench-core summary rows: "|  16 |   4 KB | lupin median | p99 | /s | native median | p99 | /s | ratio |"
awk -F'|' '/^\| +(16|256) +\| +(4|1) KB/ && !seen[$2 $3]++ { gsub(/ /, "", $2); gsub(/^ +| +$/, "", $3)
  printf "| lupin vs native C (bench-core) | %s endpoints, %s | lupin %s µs, native %s µs median (ratio %s) |\n",
    $2, $3, $4 + 0, $7 + 0, $10 + 0 }' "$log"

v=$(grep -m1 '^  requests begun' "$log" | sed 's/^ *//')
row "soak (bench-soak)" "10M lifecycles with failures at every stage" "$v"
v=$(grep -m1 -E '^  (every request finished once|FAILED)' "$log" | sed 's/^ *//')
row "soak (bench-soak)" "verdict" "$v"

# bench-gateway: "| plain | full | floor req/s | ... | lupin/nginx req/s | lupin/nginx req/CPU-s | lupin/floor |"
awk -F'|' '/^\| (plain|stream) \| (full|half)/ { gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $3)
  printf "| gateway (bench-gateway) | %s, %s load | lupin %s req/s, nginx %s req/s, floor %s req/s; lupin/nginx %s |\n",
    $2, $3, $11 + 0, $7 + 0, $4 + 0, $15 + 0 }' "$log"

# bench-openresty: "| plain | lupin | req/s | CPU | req per CPU-s | ..." per target
awk -F'|' '/^\| (plain|stream) \| (lupin|peer|nginx) \|/ { gsub(/ /, "", $2); gsub(/ /, "", $3); e[$2, $3] = $6 + 0 }
  END { for (m = 1; m <= 2; m++) { k = m == 1 ? "plain" : "stream"; if (!((k, "lupin") in e)) continue
    printf "| OpenResty peer (bench-openresty) | %s, req per CPU-s | lupin %d, peer %d, nginx %d; lupin/peer %.2f |\n",
      k, e[k, "lupin"], e[k, "peer"], e[k, "nginx"], e[k, "peer"] ? e[k, "lupin"] / e[k, "peer"] : 0 } }' "$log"

v=$(grep -m1 -E 'first vs last third after' "$log")
row "gateway soak" "RSS and Lua heap after warm-up" "$v"
v=$(grep -m1 -E '^after a full collection' "$log" | sed 's/^after a full collection (POST \/admin\/leaks): //')
row "gateway soak" "after the load, a full collection" "$v"

# bench-routing: its markdown matrix, "| family | load | p50s | p90s | ..."; each
# family's TTFT p50 at its saturating (last) load
awk -F' *[|] *' '/^[|] [a-z]+ [|] (rate|conc):/ { last[$2] = sprintf("| routing (bench-routing) | %s at %s |" \
  " TTFT p50 ms random / RR / load-only / EPP / default: %s; hit EPP / default / ideal: %s |", $2, $3, $4, $8) }
  END { for (k in last) print last[k] }' "$log" | sort

grep -E '^reload .* endpoints: median' "$log" | awk '{ sub(/^reload +/, ""); printf "| reload (bench-reload) | %s |\n", $0 }' |
  sed -E 's/ +([0-9]+ endpoints): / \1 | /'
