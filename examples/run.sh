#!/usr/bin/env bash
# `make run`: lupin-sim with 4 endpoints (127.0.0.1:8001-8004) and lupin serve
# with examples/configs/default.yaml on 127.0.0.1:8080 (admin 127.0.0.1:9090).
# The banner shows once both answer; a port already taken or a process that
# dies, at start or later, is named and the exit is non-zero.  Ctrl-C stops
# both.  B names the build directory (default build); CONFIG the config,
# SIM_PORT the first of the 4 endpoints' ports, PORT and ADMIN_PORT the
# gateway's (make run CONFIG=... PORT=... passes them through).
# EPP=1 (`make run-epp`): lupin epp instead, the picker Envoy would call, on
# 127.0.0.1:$GRPC_PORT (9002; health 9003, metrics ADMIN_PORT).
set -u
cd "$(dirname "$0")/.."
B=${B:-build}
export LUPIN_HOME=$PWD
model=meta-llama/Llama-3.1-8B-Instruct
config=${CONFIG:-examples/configs/default.yaml}
SIM_PORT=${SIM_PORT:-8001}
PORT=${PORT:-8080}
ADMIN_PORT=${ADMIN_PORT:-9090}
EPP=${EPP:-}
GRPC_PORT=${GRPC_PORT:-9002}
sim_ports=($SIM_PORT $((SIM_PORT + 1)) $((SIM_PORT + 2)) $((SIM_PORT + 3)))
endpoints=examples/configs/sim-endpoints.json
if [ "$SIM_PORT" != 8001 ]; then # the example file names 8001-8004
  endpoints=$(mktemp)
  for i in 0 1 2 3; do
    echo "{\"name\": \"sim-$i\", \"address\": \"127.0.0.1\", \"port\": ${sim_ports[$i]}}"
  done | paste -sd, | sed 's/^/[/; s/$/]/' >"$endpoints"
fi

declare -A names # pid -> what it is
stop() {
  trap - INT TERM EXIT
  for p in "${!names[@]}"; do kill -TERM "$p" 2>/dev/null; done
  wait
  [ "$endpoints" = examples/configs/sim-endpoints.json ] || rm -f "$endpoints"
  echo "stopped"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
  echo "make run: $*" >&2
  exit 1
}

# A port someone else holds: say so before starting anything, as the error
# of a process that could not bind is easy to miss among the others' output.
ports=("${sim_ports[@]}" "$ADMIN_PORT")
if [ -n "$EPP" ]; then ports+=("$GRPC_PORT" $((GRPC_PORT + 1))); else ports+=("$PORT"); fi
for port in "${ports[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "127.0.0.1:$port is in use (another make run?); stop what holds it and try again"
  fi
done

"$B/lupin-sim" --endpoints 4 --port "${sim_ports[0]}" --model "$model" &
names[$!]=lupin-sim
if [ -n "$EPP" ]; then
  "$B/lupin" epp --config-file "$config" --endpoints "$endpoints" --bind-address 127.0.0.1 \
    --grpc-port "$GRPC_PORT" --grpc-health-port $((GRPC_PORT + 1)) --metrics-port "$ADMIN_PORT" &
  names[$!]="lupin epp"
else
  "$B/lupin" serve --config "$config" \
    --endpoints "$endpoints" \
    --listen "127.0.0.1:$PORT" --admin "127.0.0.1:$ADMIN_PORT" --log-level info &
  names[$!]="lupin serve"
fi

# Waits until every simulated endpoint answers and the gateway is ready (an
# endpoint scraped); stops at once when either process has exited.
ready() {
  for p in "${!names[@]}"; do
    kill -0 "$p" 2>/dev/null || return 2
  done
  for port in "${sim_ports[@]}"; do
    curl -sf "http://127.0.0.1:$port/metrics" >/dev/null 2>&1 || return 1
  done
  curl -sf "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null 2>&1
}
for _ in $(seq 150); do
  ready
  case $? in
  0) break ;;
  2)
    for p in "${!names[@]}"; do
      kill -0 "$p" 2>/dev/null || fail "${names[$p]} exited while starting (its message is above)"
    done
    ;;
  esac
  sleep 0.1
done
ready || fail "not ready after 15 s: lupin-sim or the gateway does not answer (messages above)"

if [ -n "$EPP" ]; then
  cat <<MSG

  lupin-sim     4 simulated vLLM endpoints on 127.0.0.1:${sim_ports[0]}-${sim_ports[3]} ($model)
  lupin epp     ext_proc on 127.0.0.1:$GRPC_PORT, gRPC health on 127.0.0.1:$((GRPC_PORT + 1))
  metrics       http://127.0.0.1:$ADMIN_PORT/metrics  /readyz  /admin/endpoints
  access log    one JSON line per request below

  /usr/bin/python3 spec/fixtures/epp/envoy.py --target 127.0.0.1:$GRPC_PORT request \\
    --body '{"model":"$model","prompt":"Hello, lupin","max_tokens":16}'

  plays Envoy: the request through the picker, then to the endpoint picked
  (docs/epp.md).  Ctrl-C stops everything.
MSG
else

cat <<MSG

  lupin-sim     4 simulated vLLM endpoints on 127.0.0.1:${sim_ports[0]}-${sim_ports[3]} ($model)
  lupin serve   http://127.0.0.1:$PORT   (config $config)
  admin         http://127.0.0.1:$ADMIN_PORT/metrics  /readyz  /admin/endpoints  /admin/requests
  access log    one JSON line per request below

  curl -s http://127.0.0.1:$PORT/v1/completions -H 'content-type: application/json' \\
    -d '{"model":"$model","prompt":"Hello, lupin","max_tokens":16}'

  make demo (in another terminal) compares this routing with random on a
  shared-prefix workload.  Ctrl-C stops everything.
MSG
fi

# Whichever ends first ends the run; say which and why.  Both exit 0 only
# when told to stop (Ctrl-C reaches the whole process group, and they may
# stop before this shell runs its trap): that is a stop, not a failure.
wait -n "${!names[@]}"
status=$?
for p in "${!names[@]}"; do
  if ! kill -0 "$p" 2>/dev/null; then
    case $status in
    0 | 130 | 143) echo "make run: ${names[$p]} was stopped; stopping the other"; exit 130 ;;
    *) fail "${names[$p]} exited (status $status); stopping the other" ;;
    esac
  fi
done
