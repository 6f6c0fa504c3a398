#!/usr/bin/env python3
"""bench/kv_events/run.sh's summary: one table from out/results.jsonl and
out/floor.txt, then issue 43's three goals, each met or not."""
import json
import os
import sys

GOAL_LAG_P99 = 0.005      # seconds, publish -> index
GOAL_PER_CORE = 50000     # events applied per CPU-second
GOAL_HEAL = 1.0           # seconds


def ms(v):
    return "-" if v is None else "%.2f" % (v * 1e3)


def secs(v):
    return "-" if v is None else "%.3f" % v


def k(v):
    return "-" if not v else "%.0fk" % (v / 1e3)


def table(rows, head):
    w = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)).rstrip())


def main():
    out = sys.argv[1]
    res = [json.loads(line) for line in open(os.path.join(out, "results.jsonl")) if line.strip()]
    by = {r["name"]: r for r in res}
    print()
    floor_path = os.path.join(out, "floor.txt")
    if os.path.exists(floor_path):
        f = dict(p.split("=", 1) for p in open(floor_path).read().split() if "=" in p)
        print("floor (bench-kv-subscribe: ZMQ + msgpack, no index): %s events/s, %s per CPU-s, "
              "lag p50 %s ms p99 %s ms" % (k(float(f["events_per_s"])),
                                          k(float(f["events_per_cpu_s"])),
                                          f["lag_p50_ms"], f["lag_p99_ms"]))
    print()
    rows = []
    for r in res:
        fin = r["final"]
        rows.append([
            r["name"], "%d" % r["sent_events"], "yes" if r["complete"] else "NO",
            k(r["applied_per_s"]),
            "%.2f/%.2f" % (r["cpu_seconds"], r["busiest_thread_cpu_seconds"]),
            "%s/%s" % (k(r["applied_per_cpu_s"]), k(r["applied_per_thread_cpu_s"])),
            "%s/%s" % (ms(r["lag_p50_final"]), ms(r["lag_p99_final"])),
            ms(r["lag_p99_max_sampled"]), ms(r["lag_hist_p99_le"]),
            "%s/%d" % (fin.get("blocks", "-"), r["publisher_resident"]),
            "%s/%s/%s" % (fin.get("orphans", "-"), fin.get("unknown", "-"), fin.get("bad", "-")),
        ])
    table(rows, ["scenario", "events", "all", "applied/s", "cpu s proc/thr",
                 "per cpu-s proc/thr", "lag p50/p99 ms", "p99 max", "hist p99<=",
                 "blocks/engine's", "orphan/unknown/bad"])
    print()
    rows = []
    for r in res:
        for i in r["incidents"]:
            rows.append([r["name"], i["kind"], secs(i["counted_s"]), secs(i["blocks_again_s"]),
                         secs(i["live_again_s"]),
                         " ".join("%s:%d" % kv for kv in sorted(r["requests"].items())) or "-"])
    if rows:
        table(rows, ["scenario", "incident", "counted s", "blocks again s", "live again s",
                     "requests (status:n)"])
    print()
    goals(by)


def goals(by):
    lag = by.get("lag")
    if lag:
        p99 = max(lag["lag_p99_max_sampled"] or 0, lag["lag_p99_final"] or 0)
        print("goal lag p99 <= 5 ms: %s (worst p99 of the last 1024 batches, sampled: %s ms; "
              "histogram p99 <= %s ms)" % ("met" if p99 <= GOAL_LAG_P99 else "NOT met", ms(p99),
                                          ms(lag["lag_hist_p99_le"])))
    tps = [r for n, r in by.items() if n.startswith("throughput")]
    if tps:
        worst = min(r["applied_per_cpu_s"] for r in tps)
        print("goal >= 50k events per CPU-second: %s (worst %s per CPU-s of the whole process; "
              "%s applied/s)" % ("met" if worst >= GOAL_PER_CORE and all(r["complete"] for r in tps)
                                 else "NOT met", k(worst),
                                 k(min(r["applied_per_s"] for r in tps))))
    healed = [(r, i) for r in by.values() for i in r["incidents"]]
    if healed:
        ok = all(i["blocks_again_s"] is not None and i["blocks_again_s"] <= GOAL_HEAL
                 for _, i in healed)
        failed = sum(n for r in by.values() for c, n in r["requests"].items() if c != "200")
        times = [i["blocks_again_s"] for _, i in healed]
        worst = "never" if None in times else "%s s" % secs(max(times))
        print("goal healed <= 1 s, no request failing: %s (slowest %s; %d requests not 200)" % (
            "met" if ok and not failed else "NOT met", worst, failed))


if __name__ == "__main__":
    main()
