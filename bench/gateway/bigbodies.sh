#!/usr/bin/env bash
# The RSS of lupin serve under N concurrent big bodies sent to an endpoint
# that accepts and never reads (the worst case: every body stays in the
# gateway until firstByteTimeoutMs), with the default memory bounds and with
# them lifted.  Prints, per run, the answers by status, the peak RSS and the
# RSS 3 s after the last answer (what the gateway kept).
#   bench/gateway/bigbodies.sh [N=64] [MB=15]
#   RUNS="defaults" WORKERS=1 WAIT_MS=4000: one run, one worker
set -euo pipefail
B=${B:-build}
N=${1:-64}
MB=${2:-15}
WAIT_MS=${WAIT_MS:-8000}
RUNS=${RUNS:-defaults unbounded}
WORKERS=${WORKERS:-auto}
WORK=$(mktemp -d /tmp/lupin-bigbodies.XXXXXX)
PIDS=()

cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# an endpoint that accepts connections and reads nothing
python3 - "$WORK/tarpit.port" <<'PY' &
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 0)); s.listen(1024)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
held = []
while True:
    c, _ = s.accept()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    held.append(c)
PY
PIDS+=($!)
until [ -s "$WORK/tarpit.port" ]; do sleep 0.05; done
TARPIT=$(cat "$WORK/tarpit.port")

python3 - "$WORK/body.json" "$MB" <<'PY'
import json, sys
n = int(float(sys.argv[2]) * 1000 * 1000)
open(sys.argv[1], "w").write(json.dumps({"model": "m", "prompt": "x" * (n - 30)}))
PY

# run NAME GATEWAY_JSON: one gateway, N clients at once, peak RSS sampled
run() {
  local name=$1 gateway=$2
  cat > "$WORK/cfg.json" <<EOF
{"endpoints": [{"name": "tarpit", "address": "127.0.0.1", "port": $TARPIT}],
 "gateway": $gateway}
EOF
  rm -f "$WORK/lupin.out"
  "$B/lupin" serve --config "$WORK/cfg.json" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
    --workers "$WORKERS" --log-level error > "$WORK/lupin.out" 2> "$WORK/lupin.err" &
  local pid=$!
  PIDS+=("$pid")
  until grep -q "listening on" "$WORK/lupin.out" 2>/dev/null; do sleep 0.05; done
  local base
  base=$(sed -n 's/.*listening on \(http:[^ ]*\) admin.*/\1/p' "$WORK/lupin.out" | head -1)
  local peak=0 rss clients=()
  for i in $(seq "$N"); do
    curl -s -o /dev/null -w '%{http_code}\n' -H 'content-type: application/json' \
      --data-binary @"$WORK/body.json" "$base/v1/completions" > "$WORK/status.$i" &
    clients+=($!)
  done
  while :; do
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
    [ "$rss" -gt "$peak" ] && peak=$rss
    local running=0 c
    for c in "${clients[@]}"; do kill -0 "$c" 2>/dev/null && running=1 && break; done
    [ "$running" = 0 ] && break
    sleep 0.1
  done
  sleep 3
  local hwm after
  hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status")
  after=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  printf '%-10s %d x %s MB: answers %s; peak RSS %d MB (sampled), VmHWM %d MB, after %d MB\n' \
    "$name" "$N" \
    "$MB" "$(cat "$WORK"/status.* | sort | uniq -c | awk '{printf "%s%s×%s", s, $1, $2; s=", "}')" \
    $((peak / 1024)) $((hwm / 1024)) $((after / 1024))
  rm -f "$WORK"/status.*
}

case " $RUNS " in *" defaults "*) run defaults "{\"firstByteTimeoutMs\": $WAIT_MS}" ;; esac
case " $RUNS " in *" unbounded "*) run unbounded "{\"firstByteTimeoutMs\": $WAIT_MS, \"maxBufferedBodyBytes\": 1099511627776,
  \"maxRequestsInFlight\": 100000, \"maxLuaMemoryBytes\": 0}" ;; esac
