#!/usr/bin/env bash
# `make run`: lupin-sim with 4 endpoints (127.0.0.1:8001-8004) and lupin serve
# with examples/configs/default.json on 127.0.0.1:8080 (admin 127.0.0.1:9090).
# Ctrl-C stops both.  B names the build directory (default build).
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
export LUPIN_HOME=$PWD
model=meta-llama/Llama-3.1-8B-Instruct

pids=()
stop() {
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait
  echo "stopped"
}
trap stop INT TERM EXIT

"$B/lupin-sim" --endpoints 4 --port 8001 --model "$model" &
pids+=($!)
"$B/lupin" serve --config examples/configs/default.json \
  --endpoints examples/configs/sim-endpoints.json \
  --listen 127.0.0.1:8080 --admin 127.0.0.1:9090 --log-level info &
pids+=($!)

# ready once an endpoint has been scraped
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:9090/readyz >/dev/null 2>&1 && break
  sleep 0.1
done
cat <<MSG

  lupin-sim     4 simulated vLLM endpoints on 127.0.0.1:8001-8004 ($model)
  lupin serve   http://127.0.0.1:8080   (config examples/configs/default.json)
  admin         http://127.0.0.1:9090/metrics  /readyz  /admin/endpoints  /admin/requests
  access log    one JSON line per request below

  curl -s http://127.0.0.1:8080/v1/completions -H 'content-type: application/json' \\
    -d '{"model":"$model","prompt":"Hello, lupin","max_tokens":16}'

  Ctrl-C stops everything.
MSG
wait -n "${pids[@]}"
