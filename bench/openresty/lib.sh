# start_peer CPU (sourced after bench/gateway/lib.sh and start_sim): the
# OpenResty peer (peer.lua in nginx.conf.in) over the simulator's endpoints
# on PEER_PORT with PEER_WORKERS worker processes (1); its master's pid in
# PEER_PID.
start_peer() {
  PEER_PORT=$(free_ports 1)
  local dir=$PWD/bench/openresty out=$WORK/peer i list="" user=""
  mkdir -p "$out/tmp"
  for ((i = 0; i < SIM_ENDPOINTS; i++)); do list+="127.0.0.1:$((SIM_PORT + i)) "; done
  [ "$(id -u)" = 0 ] && user="user root;"
  sed -e "s|@USER@|$user|; s|@WORK@|$out|g; s|@DIR@|$dir|; s|@PORT@|$PEER_PORT|" \
      -e "s|@WORKERS@|${PEER_WORKERS:-1}|" \
      -e "s|@ENDPOINTS@|${list% }|" bench/openresty/nginx.conf.in >"$out/nginx.conf"
  taskset -c "$1" nginx -c "$out/nginx.conf" -p "$out" -g 'daemon off;' >"$out/stdout.log" 2>&1 &
  PEER_PID=$!; PIDS+=("$PEER_PID")
  wait_http "http://127.0.0.1:$PEER_PORT/metrics" || { cat "$out/error.log" "$out/stdout.log" >&2; return 1; }
}
