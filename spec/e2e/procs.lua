-- Real processes for the end-to-end specs: the gateway binary, the fixture
-- model server, curl.  Everything listens on 127.0.0.1 with ports the
-- processes pick themselves (port 0) and report; waiting is by polling.
local cjson = require "cjson"
local support = require "support"

local M = {}

-- the programs may come from another build than the native module busted
-- loads (make test-tsan: a ThreadSanitizer build cannot be loaded into luajit)
local BUILD = os.getenv("LUPIN_PROGRAMS") or support.BUILD
M.LUPIN = support.ROOT .. "/" .. BUILD .. "/lupin"
M.UPSTREAM = support.ROOT .. "/spec/fixtures/gateway/upstream.py"

local function read(path)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local s = f:read("*a")
  f:close()
  return s
end
M.read = read

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
M.quote = sh_quote

local function sleep(s)
  os.execute("sleep " .. s)
end

--- Polls fn until it returns a true value (or gives up after many tries).
function M.poll(fn, what)
  for _ = 1, 1500 do
    local v = fn()
    if v then
      return v
    end
    sleep(0.01)
  end
  error("gave up waiting for " .. (what or "a condition"), 2)
end

--- The request ids of gw's access log, in order, joined by spaces, once it
--- holds n request lines: a line is written as its request ends, which may
--- be just after its client has the answer.
function M.access_log_ids(gw, n)
  local ids
  M.poll(function()
    ids = {}
    for line in (read(gw.out) or ""):gmatch("[^\n]+") do
      local ok, rec = pcall(cjson.decode, line)
      if ok and type(rec) == "table" and rec.id and rec.path then
        ids[#ids + 1] = rec.id
      end
    end
    return #ids >= n
  end, n .. " access log lines")
  return table.concat(ids, " ")
end

local dir = support.tmpdir()

-- Under `make test-asan` the specs run with the sanitizer runtime preloaded;
-- curl and python must not inherit it (curl hangs in it), and the gateway
-- binary is built with it already.  LSan keeps its defaults for the gateway.
local ENV = "env -u LD_PRELOAD -u LSAN_OPTIONS "
local seq = 0

-- Every process started and not yet seen to exit.  A spec that fails before
-- its M.stop would leave its gateway running past the suite (found after a
-- loaded ASan run: three gateways of failed specs still up); the sentinel's
-- finalizer, run when busted closes the Lua state, kills what is left.
local running = {}
local sentinel = newproxy(true)
getmetatable(sentinel).__gc = function()
  for p in pairs(running) do
    if not read(p.rc) then
      os.execute(("kill -KILL %d 2>/dev/null"):format(p.pid))
    end
  end
end
M._sentinel = sentinel -- held by the module, so collected only when the state closes

--- Starts a command in the background; its stdout, stderr and exit status go
--- to files.  Returns a process record.
function M.start(cmd)
  seq = seq + 1
  local p = { out = ("%s/%d.out"):format(dir, seq), err = ("%s/%d.err"):format(dir, seq),
    rc = ("%s/%d.rc"):format(dir, seq) }
  local pidfile = ("%s/%d.pid"):format(dir, seq)
  -- the inner shell records the exit status; exec keeps signals going to cmd.
  -- The status file appears whole, renamed into place: callers take "p.rc
  -- exists" for "exited with the status in it", and `echo $? > rc` creates
  -- the file empty before it writes (read in between: no status, which
  -- hostile_start_spec once took for a process that had not exited).
  local inner = ("%s > %s 2> %s & echo $! > %s; wait $!; echo $? > %s.tmp; mv -f %s.tmp %s"):format(
    "exec " .. ENV .. cmd, p.out, p.err, pidfile, p.rc, p.rc, p.rc)
  os.execute(("sh -c %s > /dev/null 2>&1 &"):format(sh_quote(inner)))
  p.pid = M.poll(function()
    local s = read(pidfile)
    return s and tonumber(s:match("%d+"))
  end, "a pid")
  running[p] = true
  return p
end

function M.signal(p, sig)
  os.execute(("kill -%s %d 2>/dev/null"):format(sig or "TERM", p.pid))
end

--- Waits for a process to exit; returns its exit status.
function M.wait(p)
  local rc = M.poll(function()
    local s = read(p.rc)
    return s and tonumber(s:match("%d+"))
  end, "process " .. p.pid .. " to exit")
  running[p] = nil
  return rc
end

function M.stop(p)
  if p and not read(p.rc) then
    M.signal(p, "KILL")
    M.wait(p)
  end
end

--- The fixture model server; returns the process with its port.
function M.upstream(args)
  local p = M.start("python3 -u " .. M.UPSTREAM .. " " .. (args or ""))
  p.port = M.poll(function()
    local s = read(p.out)
    return s and tonumber(s:match("port (%d+)"))
  end, "the fixture server's port")
  p.hostport = "127.0.0.1:" .. p.port
  return p
end

M.SIM = support.ROOT .. "/" .. BUILD .. "/lupin-sim"

math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)") or "0", 16) % 100000)

--- A random port for a server that cannot listen on port 0 and report it,
--- with room for n in a row: below the kernel's ephemeral ports (32768 up),
--- so no outgoing connection of a concurrent spec holds it.  It may still
--- be taken by another server: callers try another when the bind fails.
function M.port(n)
  return math.random(20000, 32000 - (n or 1))
end

--- lupin-sim with n endpoints on a random free port range (it has no port 0
--- for a range: a taken port makes it exit, and another range is tried).
--- Returns the process with ports[i] and hostports[i].  host: the listen
--- address (127.0.0.1 unless given; IPv6 bare, "::" for both families).
function M.sim(args, n, host)
  n = n or 1
  host = host or "127.0.0.1"
  local shown = host:find(":", 1, true) and "[" .. host .. "]" or host
  for _ = 1, 10 do
    local base = M.port(n)
    local p = M.start(("%s --port %d --endpoints %d --host %s %s"):format(M.SIM, base, n, host,
      args or ""))
    local last = ("endpoint %d listening on %s:%d"):format(n - 1, shown, base + n - 1)
    local up = M.poll(function()
      if (read(p.err) or ""):find(last, 1, true) or (read(p.out) or ""):find(last, 1, true) then
        return "up"
      end
      return read(p.rc) and "failed"
    end, "lupin-sim to listen")
    if up == "up" then
      p.ports, p.hostports = {}, {}
      for i = 1, n do
        p.ports[i] = base + i - 1
        p.hostports[i] = shown .. ":" .. p.ports[i]
      end
      return p
    end
  end
  error("lupin-sim did not start")
end

--- lupin serve with a config given as a table; returns the process with
--- base (http://host:port) and admin URLs.  env: "NAME=value ..." for it.
function M.gateway(config, args, env)
  seq = seq + 1
  local path = ("%s/config-%d.json"):format(dir, seq)
  support.write(path, type(config) == "string" and config or cjson.encode(config))
  local listen = (args or ""):find("--listen", 1, true) and "" or "--listen 127.0.0.1:0 "
  -- LUPIN_TEST_WORKERS runs every gateway of the suite with that many
  -- workers (make test-tsan: 2); else one, unless a spec asks
  if not (args or ""):find("--workers", 1, true) then
    listen = listen .. "--workers " .. (os.getenv("LUPIN_TEST_WORKERS") or "1") .. " "
  end
  local p = M.start(("%s%s serve --config %s %s--admin 127.0.0.1:0 %s"):format(
    env and env .. " " or "", M.LUPIN, path, listen, args or ""))
  p.config = path
  M.poll(function()
    local s = read(p.out) or ""
    p.base, p.admin = s:match("listening on (http://%S+) admin (http://%S+)")
    return p.base or read(p.rc)
  end, "the gateway to listen")
  assert(p.base, "the gateway did not start: " .. (read(p.err) or ""))
  return p
end

--- lupin epp (the ext_proc endpoint picker) with a config given as a table:
--- its "endpoints" go to an --endpoints file (an empty list when it has
--- none), the rest to --config-file.  Every listener on 127.0.0.1, port 0;
--- returns the process with grpc, health (host:port) and admin (a URL).
function M.epp(config, args)
  seq = seq + 1
  local cfg = {}
  for k, v in pairs(config) do
    if k ~= "endpoints" then
      cfg[k] = v
    end
  end
  local path = ("%s/epp-config-%d.json"):format(dir, seq)
  local eps = ("%s/epp-endpoints-%d.json"):format(dir, seq)
  support.write(path, cjson.encode(cfg))
  support.write(eps, #(config.endpoints or {}) > 0 and cjson.encode(config.endpoints) or "[]")
  args = args or ""
  if not args:find("--workers", 1, true) then
    args = args .. " --workers " .. (os.getenv("LUPIN_TEST_WORKERS") or "1")
  end
  -- a pool from Kubernetes is the endpoints' one source
  local source = args:find("--pool-name", 1, true) and "" or "--endpoints " .. eps
  local p = M.start(("%s epp --config-file %s %s --bind-address 127.0.0.1"
    .. " --grpc-port 0 --grpc-health-port 0 --metrics-port 0 %s"):format(M.LUPIN, path, source,
    args))
  p.config, p.endpoints = path, eps
  M.poll(function()
    local s = read(p.out) or ""
    p.grpc, p.health, p.admin = s:match(
      "listening on grpc://(%S+) health grpc://(%S+) admin (http://%S+)")
    return p.grpc or read(p.rc)
  end, "lupin epp to listen")
  assert(p.grpc, "lupin epp did not start: " .. (read(p.err) or ""))
  return p
end

-- The Envoy stand-in (spec/fixtures/epp/envoy.py) needs Debian's python3
-- with python3-grpcio; a python3 earlier on PATH may lack it.
M.ENVOY = "/usr/bin/python3 " .. support.ROOT .. "/spec/fixtures/epp/envoy.py"

--- Runs envoy.py SUB ARGS against target (host:port); its JSON decoded.
function M.envoy(target, sub, args)
  local out, rc = M.run(("%s --target %s %s %s 2>&1"):format(M.ENVOY, target, sub, args or ""))
  local ok, v = pcall(cjson.decode, out or "")
  if rc ~= 0 or not ok then
    error(("envoy.py %s %s: exit %s: %s"):format(sub, args or "", tostring(rc), out), 2)
  end
  return v
end

--- The access-log records of p (stdout JSON lines) for request id.
function M.access_records(p, id)
  local recs = {}
  for line in (read(p.out) or ""):gmatch("[^\n]+") do
    local ok, rec = pcall(cjson.decode, line)
    if ok and type(rec) == "table" and rec.id == id and rec.path then
      recs[#recs + 1] = rec
    end
  end
  return recs
end

--- wrk posting body (a table, as JSON) to base's /v1/completions for the
--- seconds given over conns connections; returns the requests it counted
--- and its output.
function M.wrk_post(base, body, seconds, conns)
  seq = seq + 1
  local script = ("%s/wrk-%d.lua"):format(dir, seq)
  support.write(script, ([[
    wrk.method = "POST"
    wrk.body = %q
    wrk.headers["Content-Type"] = "application/json"
  ]]):format(cjson.encode(body)))
  local out = M.run(("wrk -t1 -c%d -d%ds -s %s %s/v1/completions"):format(conns, seconds,
    script, base))
  return tonumber(out:match("(%d+) requests in")) or 0, out
end

--- Runs a shell command; returns its output and exit status (LuaJIT's
--- io.popen does not report the status).
function M.run(cmd)
  local f = io.popen("{ " .. ENV .. cmd .. "; } ; echo \" $?\"")
  local out = f:read("*a")
  f:close()
  local text, rc = out:match("^(.-) (%d+)\n$")
  return text, tonumber(rc)
end

--- Runs curl; returns status, headers (lower-case names), body, curl's exit.
function M.curl(args)
  seq = seq + 1
  local h, b = ("%s/%d.h"):format(dir, seq), ("%s/%d.b"):format(dir, seq)
  local code, rc = M.run(("curl -sS -N -D %s -o %s -w '%%{http_code}' %s 2>/dev/null"):format(h,
    b, args))
  local headers = {}
  for line in (read(h) or ""):gmatch("[^\r\n]+") do
    local k, v = line:match("^([^:]+):%s*(.*)$")
    if k then
      headers[k:lower()] = v
    end
  end
  return tonumber(code) or 0, headers, read(b) or "", rc
end

--- POSTs a JSON body (a table or a string) to path.
--- A completion in the background, curl as its own process (so its own
--- connection), sent with x-request-id id for model "m".  opts: headers,
--- max_tokens (the simulator's default when nil), max_time (s, 60).
--- M.result(p) waits for it.
function M.send(gw, id, opts)
  opts = opts or {}
  local h = ""
  for k, v in pairs(opts.headers or {}) do
    h = h .. (" -H %s"):format(M.quote(k .. ": " .. v))
  end
  seq = seq + 1
  local body = ("%s/send-%d.json"):format(dir, seq)
  local out = ("%s/send-%d.out"):format(dir, seq)
  local head = ("%s/send-%d.head"):format(dir, seq)
  support.write(body, cjson.encode({ model = "m", prompt = "hello " .. id,
    max_tokens = opts.max_tokens }))
  local p = M.start(("curl -sS -o %s -D %s -w '%%{http_code}' --max-time %s -H 'x-request-id: %s'"
    .. " -H 'content-type: application/json'%s --data-binary @%s %s"):format(out, head,
    opts.max_time or 60, id, h, body, M.quote(gw.base .. "/v1/completions")))
  p.body_file, p.head_file = out, head
  return p
end

--- The status, body and headers (lower-case names) of a request M.send
--- started, once it has ended.
function M.result(p)
  M.wait(p)
  local code = tonumber((read(p.out) or ""):match("%d+")) or 0
  local headers = {}
  for line in (p.head_file and read(p.head_file) or ""):gmatch("[^\r\n]+") do
    local k, v = line:match("^([^:]+):%s*(.*)$")
    if k then
      headers[k:lower()] = v
    end
  end
  return code, read(p.body_file) or "", headers
end

--- Polls the admin's in-flight list until request id is at an endpoint.
function M.until_running(gw, id)
  M.poll(function()
    local _, _, body = M.get(gw.admin .. "/admin/requests")
    for _, r in ipairs(cjson.decode(body).requests) do
      if r.id == id and r.endpoint ~= "" then
        return true
      end
    end
  end, id .. " running")
end

function M.post(base, path, body, extra)
  local text = type(body) == "string" and body or cjson.encode(body)
  local file = ("%s/body-%d.json"):format(dir, seq + 1)
  support.write(file, text)
  return M.curl(("%s -H 'content-type: application/json' --data-binary @%s %s"):format(
    extra or "", file, sh_quote(base .. path)))
end

function M.get(url, extra)
  return M.curl((extra or "") .. " " .. sh_quote(url))
end

-- promtool's linter reads the "d" of llm-d-router's llm_d_epp_ prefix as
-- an abbreviation of days: a name upstream chose, so that one complaint, on
-- those names only, is let through.
local UPSTREAM_LINT = "^llm_d_epp_[%w_]+ metric names should not contain abbreviated units$"

--- Runs promtool check metrics on an exposition text: it must parse (exit 1
--- otherwise), with no lint problem but UPSTREAM_LINT (exit 3: lint only).
--- Returns nil, or promtool's first other complaint and its output.
function M.promtool(text)
  local file = ("%s/metrics-%d.txt"):format(dir, seq + 1)
  seq = seq + 1
  support.write(file, text)
  local _, found = M.run("promtool --version > /dev/null 2>&1")
  -- not skipped: CI installs it (`make deps`, Debian package prometheus)
  if found ~= 0 then
    return "promtool is missing: apt-get install prometheus (or make deps)"
  end
  local out, rc = M.run("promtool check metrics < " .. sh_quote(file) .. " 2>&1")
  if rc == 0 then
    return nil
  elseif rc ~= 3 then
    return ("promtool exited %d: %s"):format(rc, out)
  end
  for line in out:gmatch("[^\n]+") do
    if not line:find(UPSTREAM_LINT) then
      return "promtool: " .. line
    end
  end
end

--- A sample of the admin /metrics, by its full series text.
function M.metric(gw, series)
  local _, _, text = M.get(gw.admin .. "/metrics")
  for line in text:gmatch("[^\n]+") do
    local name, v = line:match("^(.-) (%S+)$")
    if name == series then
      return tonumber(v)
    end
  end
end

--- Waits until every endpoint /admin/endpoints lists passes ok(entry).
function M.poll_endpoints(gw, ok, what)
  return M.poll(function()
    local _, _, t = M.get(gw.admin .. "/admin/endpoints")
    for _, e in ipairs(cjson.decode(t).endpoints) do
      if not ok(e) then
        return false
      end
    end
    return true
  end, what)
end

--- A config's endpoints for a lupin-sim's ports: sim-1, sim-2, ...
function M.sim_endpoints(sim)
  local eps = {}
  for i, hp in ipairs(sim.hostports) do
    local host, port = hp:match("^(.*):(%d+)$")
    eps[i] = { name = "sim-" .. i, address = host, port = tonumber(port) }
  end
  return eps
end

--- Responses each worker answered (lupin_worker_requests_total), by worker
--- index; and the /metrics text.
function M.worker_requests(gw)
  local _, _, text = M.get(gw.admin .. "/metrics")
  local counts = {}
  for w, v in text:gmatch('lupin_worker_requests_total{worker="(%d+)"} (%S+)') do
    counts[tonumber(w)] = tonumber(v)
  end
  return counts, text
end

M.json = cjson
M.dir = dir
return M
