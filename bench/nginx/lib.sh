# shellcheck shell=bash
# Debian's nginx with ngx_http_lupin_module in front of lupin-sim endpoints
# (sourced, bash; functions only, no trap): bench/nginx/run.sh and
# bench/routing/run.sh FRONT=nginx.  Run from the repository's root.

# lupin_nginx_config SRC ENDPOINTS OUT: the JSON config SRC with the list in
# the ENDPOINTS file as its `endpoints` (the module reads them from
# lupin_config) and its relative pluginDirs made absolute (they are relative
# to SRC's directory, which OUT is not in).
lupin_nginx_config() {
  local src=$1 eps=$2 out=$3 dir
  case $src in
  *.json) ;;
  *) echo "lupin_nginx_config: $src: a JSON config, please (jq writes the copy)" >&2; return 1 ;;
  esac
  dir=$(cd "$(dirname "$src")" && pwd)
  jq --slurpfile eps "$eps" --arg dir "$dir" '.endpoints = $eps[0]
    | if has("pluginDirs")
      then .pluginDirs |= map(if startswith("/") then . else $dir + "/" + . end)
      else . end' "$src" >"$out"
}

# start_lupin_nginx DIR PORT WORKERS CPUS CONFIG ENDPOINTS [ARRAY]: nginx
# with the module on 127.0.0.1:PORT, WORKERS worker processes, pinned to
# CPUS (taskset's list), its prefix, conf, lupin.json and logs in DIR;
# lupin's config CONFIG (JSON) with the endpoints of the file ENDPOINTS.
# LUPIN_NGINX_LISTEN: more parameters of the listen line ("reuseport": the
# kernel spreads connections over the workers); LUPIN_NGINX_HTTP: more
# directives in http {} ("lupin_prefix_zone off;").
# Sets LUPIN_NGINX_PID (the master: its workers are its children) and
# appends it at once to the caller's array of pids to stop, named ARRAY
# (PIDS); returns once /lupin_status answers.
start_lupin_nginx() {
  local dir=$1 port=$2 workers=$3 cpus=$4 config=$5 eps=$6 user="" module _
  local -n pids_=${7:-PIDS}
  module=$PWD/${B:-build}/ngx_http_lupin_module.so
  [ -f "$module" ] || { echo "no $module (make nginx-module)" >&2; return 1; }
  mkdir -p "$dir/tmp"
  dir=$(cd "$dir" && pwd) # nginx takes a relative -c as under its prefix
  lupin_nginx_config "$config" "$eps" "$dir/lupin.json"
  [ "$(id -u)" = 0 ] && user="user root;"
  sed -e "s|@USER@|$user|; s|@MODULE@|$module|; s|@WORK@|$dir|g; s|@HOME@|$PWD|" \
      -e "s|@WORKERS@|$workers|; s|@PORT@|$port|; s|@LISTEN@|${LUPIN_NGINX_LISTEN:-}|" \
      -e "s|@HTTP@|${LUPIN_NGINX_HTTP:-}|" \
      bench/nginx/nginx.conf.in >"$dir/nginx.conf"
  : >"$dir/error.log"
  taskset -c "$cpus" nginx -c "$dir/nginx.conf" -p "$dir" -g 'daemon off;' >"$dir/stdout.log" 2>&1 &
  LUPIN_NGINX_PID=$!; pids_+=("$LUPIN_NGINX_PID")
  for _ in $(seq 200); do
    curl -sf -o /dev/null "http://127.0.0.1:$port/lupin_status" && return 0
    kill -0 "$LUPIN_NGINX_PID" 2>/dev/null || break
    sleep 0.05
  done
  echo "nginx with ngx_http_lupin_module did not start:" >&2
  cat "$dir/error.log" "$dir/stdout.log" >&2
  return 1
}
