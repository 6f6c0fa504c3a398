#!/usr/bin/env python3
"""One scenario of bench/kv_events/run.sh, watched from lupin serve's side.

Polls GET /admin/kv-events every --every seconds while bench-kv-publish runs
(its stdout files given as --pub, in the order they ran), writes the
timeline as TSV (--out), and prints one JSON object: what was sent, what
lupin applied and when, the lupin serve process's CPU time over the run
(and its busiest thread's: the subscriber's, by elimination), the lag
quantiles, and for each incident (a restart or gap the publisher printed,
or the publisher replaced: --respawn) how long until lupin counted it and
held blocks again.  With --gateway, completions are sent through lupin every
--request-every seconds meanwhile and their statuses counted.

Done when every publisher has printed its `sent` line and lupin has applied
as many batches as they sent, or --timeout seconds after the last one
finished (then `complete` is false).
"""
import argparse
import glob
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request

TICK = os.sysconf("SC_CLK_TCK")


def get(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def kv_state(admin):
    """The single endpoint's subscription and the lag quantiles, or None."""
    try:
        d = json.loads(get(admin + "/admin/kv-events"))
    except (OSError, ValueError):
        return None
    eps = d.get("endpoints") or []
    if not d.get("enabled") or not eps:
        return None
    e = dict(eps[0])
    e["p50"] = d.get("lag_seconds", {}).get("p50", 0)
    e["p99"] = d.get("lag_seconds", {}).get("p99", 0)
    return e


def ticks(pid):
    """CPU ticks (user + system) of the process and of each of its threads."""
    def stat(path):
        try:
            with open(path) as f:
                s = f.read()
        except OSError:
            return 0
        fields = s[s.rindex(")") + 2:].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    threads = {os.path.basename(t): stat(t + "/stat") for t in glob.glob("/proc/%d/task/*" % pid)}
    return stat("/proc/%d/stat" % pid), threads


def publisher(path):
    """What a publisher printed: its incidents, and its `sent` summary once done."""
    out = {"incidents": [], "sent": None}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
        if line.startswith("restart_at="):
            out["incidents"].append({"kind": "restart", "at": float(kv["restart_at"])})
        elif line.startswith("gap_at="):
            out["incidents"].append({"kind": "gap", "at": float(kv["gap_at"])})
        elif line.startswith("sent "):
            out["sent"] = {k: float(v) for k, v in kv.items()}
    return out


def histogram(admin, name="lupin_kv_events_lag_seconds"):
    """The lag histogram's cumulative buckets [(le, count)] from the admin /metrics."""
    try:
        text = get(admin + "/metrics")
    except OSError:
        return []
    rx = re.compile(r'^%s_bucket\{(?:.*,)?le="([^"]+)"[^}]*\} (\S+)' % name)
    out = []
    for line in text.splitlines():
        m = rx.match(line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            out.append((le, float(m.group(2))))
    return sorted(out)


def bucket_quantile(buckets, q):
    """The upper bound of the bucket holding quantile q (a histogram only says 'at most')."""
    if not buckets or buckets[-1][1] == 0:
        return None
    total = buckets[-1][1]
    for le, n in buckets:
        if n >= q * total:
            return le
    return float("inf")


class Requests(threading.Thread):
    """Completions through the gateway until stopped; statuses counted."""

    def __init__(self, base, model, every):
        super().__init__(daemon=True)
        self.base, self.model, self.every = base, model, every
        self.codes, self.stop = {}, threading.Event()

    def one(self):
        body = json.dumps({"model": self.model, "prompt": "Tell me about KV caches. " * 8,
                           "max_tokens": 2}).encode()
        req = urllib.request.Request(self.base + "/v1/completions", body,
                                     {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                r.read()
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError as e:
            return "error:" + type(e).__name__

    def run(self):
        while not self.stop.is_set():
            code = str(self.one())
            self.codes[code] = self.codes.get(code, 0) + 1
            self.stop.wait(self.every)


def heal(incident, rows, counter):
    """Seconds from the incident to lupin counting it (counter grew), and to
    blocks held again after that; the state then."""
    base = None
    for r in rows:
        if r["t"] < incident["at"]:
            base = r[counter]
    base = base or 0
    out = {"kind": incident["kind"], "counted_s": None, "blocks_again_s": None, "live_again_s": None}
    for r in rows:
        if r["t"] < incident["at"]:
            continue
        if out["counted_s"] is None and r[counter] > base:
            out["counted_s"] = r["t"] - incident["at"]
        if out["counted_s"] is not None and out["blocks_again_s"] is None and r["blocks"] > 0:
            out["blocks_again_s"] = r["t"] - incident["at"]
        if out["counted_s"] is not None and out["live_again_s"] is None and r["state"] == "live":
            out["live_again_s"] = r["t"] - incident["at"]
    return out


COLS = ["t", "batches", "stored", "removed", "cleared", "blocks", "state", "restarts", "resyncs",
        "gaps", "lost", "orphans", "unknown", "bad", "p50", "p99"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--admin", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--pub", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--every", type=float, default=0.02)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--respawn", action="store_true")
    ap.add_argument("--gateway")
    ap.add_argument("--model", default="m")
    ap.add_argument("--request-every", type=float, default=0.05)
    a = ap.parse_args()

    cpu0, threads0 = ticks(a.pid)
    reqs = None
    if a.gateway:
        reqs = Requests(a.gateway, a.model, a.request_every)
        reqs.start()
    rows, finished_at, done_at, start = [], None, None, time.time()
    with open(a.out, "w") as tsv:
        tsv.write("\t".join(COLS) + "\n")
        while True:
            now = time.time()
            e = kv_state(a.admin)
            if e is not None:
                r = {c: e.get(c, 0) for c in COLS if c != "t"}
                r["t"] = now
                rows.append(r)
                tsv.write("\t".join("%.6f" % r["t"] if c == "t" else str(r[c]) for c in COLS) + "\n")
            pubs = [publisher(p) for p in a.pub]
            if all(p["sent"] for p in pubs):
                finished_at = finished_at or now
                want = sum(p["sent"]["batches"] for p in pubs)
                if rows and rows[-1]["batches"] >= want:
                    done_at = now
                    break
                if now - finished_at > a.timeout:
                    break
            elif now - start > a.max_seconds:
                break
            time.sleep(a.every)
    cpu1, threads1 = ticks(a.pid)
    if reqs:
        reqs.stop.set()
        reqs.join(10)

    sent = [p["sent"] for p in pubs]
    last = rows[-1] if rows else {}
    res = {
        "name": a.name,
        "complete": done_at is not None,
        "sent_events": sum(s["events"] for s in sent),
        "sent_batches": sum(s["batches"] for s in sent),
        "sent_stored_blocks": sum(s["stored_blocks"] for s in sent),
        "sent_removed_blocks": sum(s["removed_blocks"] for s in sent),
        "publisher_resident": sent[-1]["resident"],
        "publish_seconds": sum(s["seconds"] for s in sent),
        "final": last,
        "cpu_seconds": (cpu1 - cpu0) / TICK,
        "busiest_thread_cpu_seconds": max(
            [(threads1[t] - threads0.get(t, 0)) / TICK for t in threads1] or [0]),
    }
    end = done_at or (rows[-1]["t"] if rows else time.time())
    secs = end - sent[0]["first_wall"]
    applied = res["sent_events"] * min(1.0, last.get("batches", 0) / max(1, res["sent_batches"]))
    res["applied_events"] = applied
    res["apply_seconds"] = secs
    res["applied_per_s"] = applied / secs if secs > 0 else 0
    res["applied_per_cpu_s"] = applied / res["cpu_seconds"] if res["cpu_seconds"] else 0
    res["applied_per_thread_cpu_s"] = (applied / res["busiest_thread_cpu_seconds"]
                                       if res["busiest_thread_cpu_seconds"] else 0)
    live = [r for r in rows if r["batches"] > 0]
    res["lag_p50_final"] = last.get("p50")
    res["lag_p99_final"] = last.get("p99")
    res["lag_p99_max_sampled"] = max([r["p99"] for r in live] or [0])
    b = histogram(a.admin)
    res["lag_hist_count"] = b[-1][1] if b else 0
    res["lag_hist_p50_le"] = bucket_quantile(b, 0.5)
    res["lag_hist_p99_le"] = bucket_quantile(b, 0.99)
    incidents = [i for p in pubs for i in p["incidents"]]
    if a.respawn and len(sent) > 1:
        incidents.append({"kind": "respawn", "at": sent[0]["last_wall"]})
    counter = {"restart": "restarts", "respawn": "restarts", "gap": "gaps"}
    res["incidents"] = [heal(i, rows, counter[i["kind"]]) for i in incidents]
    res["requests"] = reqs.codes if reqs else {}
    print(json.dumps(res))


if __name__ == "__main__":
    main()
