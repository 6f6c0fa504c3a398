#!/usr/bin/env python3
"""bench-flow's load generator (bench/flow/run.sh): open-loop Poisson
arrivals per traffic class, each class with its own rate and headers
(fairness id, objective).  Every request is a streamed POST
/v1/completions on its own connection; TTFT is taken at the first SSE
"data:" line.  Prints one TSV line per request on --out (class status
ttft_ms latency_ms reason) and nothing else: run.sh summarizes.

  client.py --target 127.0.0.1:8080 --duration 20 --seed 1 --out reqs.tsv \
      --class light:4.5:x-gateway-inference-fairness-id=light \
      --class heavy:45:x-gateway-inference-fairness-id=heavy
"""
import argparse
import asyncio
import json
import random
import time


def parse_class(text):
    name, rate, *headers = text.split(":")
    h = {}
    for item in headers:
        for pair in filter(None, item.split(",")):
            k, v = pair.split("=", 1)
            h[k] = v
    return name, float(rate), h


async def one(host, port, cls, headers, body, results, t0):
    start = time.monotonic()
    ttft, status, reason = None, 0, ""
    try:
        r, w = await asyncio.open_connection(host, port)
        lines = [f"POST /v1/completions HTTP/1.1", f"host: {host}:{port}",
                 "content-type: application/json", f"content-length: {len(body)}",
                 "connection: close"] + [f"{k}: {v}" for k, v in headers.items()]
        w.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        rest = b""
        while True:
            chunk = await r.read(65536)
            if not chunk:
                break
            if ttft is None and status == 200 and b"data:" in rest + chunk:
                ttft = time.monotonic() - start
            rest += chunk
        if status != 200:
            text = rest.decode(errors="replace")
            i = text.find("{")
            try:
                reason = json.loads(text[i:text.rfind("}") + 1])["error"]["message"]
            except (ValueError, KeyError, TypeError):
                reason = text.strip()[:80]
        w.close()
    except (OSError, asyncio.IncompleteReadError) as e:
        reason = f"connection: {e}"
    end = time.monotonic()
    results.append((cls, status, (ttft or 0) * 1000, (end - start) * 1000,
                    reason.replace("\t", " ").replace("\n", " ")))


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--out", required=True)
    ap.add_argument("--class", dest="classes", action="append", required=True)
    a = ap.parse_args()
    host, port = a.target.rsplit(":", 1)
    rng = random.Random(a.seed)
    # the arrival schedule: a pure function of the seed and the rates
    events = []
    for cls in map(parse_class, a.classes):
        t = 0.0
        while True:
            t += rng.expovariate(cls[1])
            if t >= a.duration:
                break
            events.append((t, cls))
    events.sort(key=lambda e: e[0])
    results, tasks = [], []
    t0 = time.monotonic()
    for i, (at, (name, _, headers)) in enumerate(events):
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        body = json.dumps({"model": "m", "prompt": f"request {i} of {name}", "stream": True,
                           "max_tokens": a.max_tokens}).encode()
        tasks.append(asyncio.ensure_future(
            one(host, int(port), name, headers, body, results, t0)))
    await asyncio.gather(*tasks)
    with open(a.out, "w") as f:
        for row in results:
            f.write("%s\t%d\t%.1f\t%.1f\t%s\n" % row)


asyncio.run(main())
