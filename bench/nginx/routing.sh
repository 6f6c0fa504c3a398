#!/usr/bin/env bash
# The routing half of `make bench-nginx`: does lupin inside nginx route as
# `lupin serve` does?  bench/routing/run.sh with FRONT=serve, then FRONT=nginx
# (the module; WORKERS worker processes each, 1), RUNS times alternated, on the same seeded
# workloads; each run's results.tsv is kept in bench/routing/out/fronts/.
# Prints per family, load and config the means over the runs of each front
# (hit rate, max/mean requests per endpoint, TTFT p50 and p90) and the runs'
# spread, to judge "within noise" by; each run's output (tables, plots'
# messages, warnings) is in its run-FRONT-I.txt there.
#
# Environment: RUNS (2), FAMILIES ("prefix chat"), CONFIGS ("default"),
# QUICK=1 (the saturating load only), B (build dir).  The oracle config is
# left out (NO_ORACLE=1).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-2}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "bench-nginx routing: RUNS must be a count, not '$RUNS'" >&2; exit 2; }
export FAMILIES=${FAMILIES:-prefix chat} CONFIGS=${CONFIGS:-default} NO_ORACLE=1 B=${B:-build}
OUT=bench/routing/out/fronts
rm -rf "$OUT"
mkdir -p "$OUT"

for ((i = 1; i <= RUNS; i++)); do
  for front in serve nginx; do
    echo "routing run $i/$RUNS, FRONT=$front: FAMILIES=\"$FAMILIES\" CONFIGS=\"$CONFIGS\"${QUICK:+ QUICK=1}" >&2
    FRONT=$front bash bench/routing/run.sh > "$OUT/run-$front-$i.txt" 2>&1 ||
      { cat "$OUT/run-$front-$i.txt" >&2; exit 1; }
    cp bench/routing/out/results.tsv "$OUT/results-$front-$i.tsv"
  done
done

# results.tsv: family load config hit ideal ttft_p50 ttft_p90 ttft_p99 lat_p50
# lat_p90 rps imbalance ok requests; config is CONFIG or CONFIG@nginx
echo "| family, load | config | hit rate serve / nginx | max/mean load serve / nginx | TTFT p50 ms serve / nginx | TTFT p90 ms serve / nginx | failed serve / nginx |"
echo "|---|---|---|---|---|---|---|"
for f in "$OUT"/results-*.tsv; do
  front=${f##*/results-}; front=${front%%-*}
  awk -F'\t' -v front="$front" 'NR > 1 { c = $3; sub(/@.*/, "", c); print front "\t" $0 "\t" c }' "$f"
done | awk -F'\t' '
  { k = $2 SUBSEP $3 SUBSEP $16; f = $1
    if (!seen[k]++) keys[++n] = k
    cnt[k, f]++; hit[k, f] += $5; imb[k, f] += $13; p50[k, f] += $7; p90[k, f] += $8
    bad[k, f] += $15 - $14
    if (!((k, f) in lo) || $5 < lo[k, f]) lo[k, f] = $5
    if (!((k, f) in hi) || $5 > hi[k, f]) hi[k, f] = $5 }
  function m(a, k, f) { return cnt[k, f] ? a[k, f] / cnt[k, f] : 0 }
  function spread(k, f) { return cnt[k, f] > 1 ? sprintf(" (%.1f–%.1f)", 100 * lo[k, f], 100 * hi[k, f]) : "" }
  END {
    for (j = 1; j <= n; j++) { k = keys[j]; split(k, a, SUBSEP)
      printf "| %s %s | %s | %.1f%%%s / %.1f%%%s | %.2f / %.2f | %.1f / %.1f | %.1f / %.1f | %d / %d |\n",
        a[1], a[2], a[3], 100 * m(hit, k, "serve"), spread(k, "serve"), 100 * m(hit, k, "nginx"),
        spread(k, "nginx"), m(imb, k, "serve"), m(imb, k, "nginx"), m(p50, k, "serve"),
        m(p50, k, "nginx"), m(p90, k, "serve"), m(p90, k, "nginx"), bad[k, "serve"], bad[k, "nginx"] } }'
echo
echo "bench/routing/run.sh, FRONT=serve then FRONT=nginx (ngx_http_lupin_module), ${WORKERS:-1} worker(s) each,, $RUNS time(s)"
echo "alternated; means over the runs, hit rate's range in brackets; each run: $OUT/"
