# Shared by bench/gateway/run.sh and bench/gateway/soak.sh (sourced, bash).
# Starts lupin-sim (--instant), lupin serve and nginx on free loopback ports
# in a temp dir; cleanup() stops every process started here (by pid).
B=${B:-build}
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
SIM_ENDPOINTS=${SIM_ENDPOINTS:-4}
WORK=$(mktemp -d /tmp/lupin-gwbench.XXXXXX)
PIDS=()

cleanup() {
  local rc=$? p
  trap - INT TERM EXIT
  if [ -n "${LUPIN_PID:-}" ] && ! kill -0 "$LUPIN_PID" 2>/dev/null; then
    local st=0
    wait "$LUPIN_PID" || st=$?
    echo "lupin serve exited early (status $st); its log:" >&2
    tail -20 "$WORK/lupin.log" >&2
  fi
  # under set -e a failing kill (wrk is gone already) or wait (TERM gives 143)
  # would end this trap, and the script with that status, before rc is kept
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" = 0 ]; then rm -rf "$WORK"; else echo "kept $WORK" >&2; fi
  return "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_ports N: the first of N consecutive free ports on 127.0.0.1
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    base = random.randint(20000, 60000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks: s.close()
    print(base); sys.exit(0)
sys.exit(1)
PY
}

# wait_http URL: until it answers 2xx (5 s)
wait_http() {
  local _
  for _ in $(seq 100); do curl -sf -o /dev/null "$1" && return 0; sleep 0.05; done
  echo "timed out waiting for $1" >&2; return 1
}

# start_sim CPU: lupin-sim, SIM_ENDPOINTS instant endpoints from SIM_PORT
start_sim() {
  SIM_PORT=$(free_ports "$SIM_ENDPOINTS")
  taskset -c "$1" "$B/lupin-sim" --instant --max-num-seqs 4096 --endpoints "$SIM_ENDPOINTS" \
    --port "$SIM_PORT" --model "$MODEL" >"$WORK/sim.log" 2>&1 &
  SIM_PID=$!; PIDS+=("$SIM_PID")
  local i sep=""
  printf '[' >"$WORK/endpoints.json"
  for ((i = 0; i < SIM_ENDPOINTS; i++)); do
    wait_http "http://127.0.0.1:$((SIM_PORT + i))/metrics" || return 1
    printf '%s{"name":"sim-%d","address":"127.0.0.1","port":%d}' "$sep" "$i" $((SIM_PORT + i)) \
      >>"$WORK/endpoints.json"
    sep=","
  done
  printf ']\n' >>"$WORK/endpoints.json"
}

# start_lupin CPU: lupin serve, LUPIN_CONFIG (default.json), on LUPIN_PORT (admin ADMIN_PORT),
# LUPIN_WORKERS event loops (1).
# --log-level warn: no access-log line per request (nginx runs with access_log off).
start_lupin() {
  LUPIN_PORT=$(free_ports 1); ADMIN_PORT=$(free_ports 1)
  LUPIN_HOME=$PWD taskset -c "$1" "$B/lupin" serve --config "${LUPIN_CONFIG:-examples/configs/default.json}" \
    --endpoints "$WORK/endpoints.json" --listen "127.0.0.1:$LUPIN_PORT" \
    --admin "127.0.0.1:$ADMIN_PORT" --log-level warn --workers "${LUPIN_WORKERS:-1}" \
    >"$WORK/lupin.log" 2>&1 &
  LUPIN_PID=$!; PIDS+=("$LUPIN_PID")
  local _
  for _ in $(seq 100); do
    curl -sf -o /dev/null "http://127.0.0.1:$ADMIN_PORT/readyz" && return 0; sleep 0.05
  done
  echo "lupin serve did not get ready:" >&2; cat "$WORK/lupin.log" >&2; return 1
}

# start_nginx CPU: Debian's nginx as a reverse proxy over the same endpoints:
# NGINX_WORKERS worker processes (1, as lupin's one loop), round-robin, upstream keep-alive,
# buffering off (what streaming needs; one location serves both kinds).
start_nginx() {
  NGINX_PORT=$(free_ports 1)
  mkdir -p "$WORK/nginx/tmp"
  local i servers="" user=""
  for ((i = 0; i < SIM_ENDPOINTS; i++)); do
    servers+="    server 127.0.0.1:$((SIM_PORT + i));"$'\n'
  done
  [ "$(id -u)" = 0 ] && user="user root;"
  cat >"$WORK/nginx/nginx.conf" <<CONF
$user
worker_processes ${NGINX_WORKERS:-1};
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/tmp/body;
  proxy_temp_path $WORK/nginx/tmp/proxy;
  fastcgi_temp_path $WORK/nginx/tmp/fastcgi;
  uwsgi_temp_path $WORK/nginx/tmp/uwsgi;
  scgi_temp_path $WORK/nginx/tmp/scgi;
  upstream sims {
$servers    keepalive 64;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://sims;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
CONF
  taskset -c "$1" nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" -g 'daemon off;' \
    >"$WORK/nginx/stdout.log" 2>&1 &
  NGINX_PID=$!; PIDS+=("$NGINX_PID")
  wait_http "http://127.0.0.1:$NGINX_PORT/metrics" || { cat "$WORK/nginx/error.log" >&2; return 1; }
}

# ticks AWK_EXPR PID...: clock ticks of the processes and their live children
# (nginx's worker is the master's child), as the awk expression over
# /proc/PID/stat makes them ($14 user, $15 system)
ticks() {
  local expr=$1 p t=0 c
  shift
  for p in "$@"; do
    for c in "$p" $(cat /proc/"$p"/task/*/children 2>/dev/null); do
      t=$((t + $(awk "{print $expr}" "/proc/$c/stat" 2>/dev/null || echo 0)))
    done
  done
  echo "$t"
}
cpu_ticks() { ticks '$14 + $15' "$@"; }  # user + system
user_ticks() { ticks '$14' "$@"; }
