-- Debian's nginx with ngx_http_lupin_module for the end-to-end specs
-- (spec/e2e/nginx*_spec.lua): a prefix dir per nginx, a random port, the
-- module built with or without the sanitizers, and what went wrong read
-- back from nginx's logs once it stopped.
local P = require "e2e.procs"
local S = require "support"
local json = P.json

local M = {}

M.MODULE = S.ROOT .. "/" .. S.BUILD .. "/ngx_http_lupin_module.so"
M.NGINX = "/usr/sbin/nginx"

local function exists(path)
  local f = io.open(path)
  if f then
    f:close()
  end
  return f ~= nil
end

--- Whether the module and nginx are there (make nginx-module needs nginx-dev).
function M.available()
  return exists(M.MODULE) and exists(M.NGINX)
end

--- A lupin config: queue-scorer, a picker of two, the e2e-recorder fixture
--- (it journals each request and logs the journal from finish, once).
function M.config(endpoints, extra)
  local cfg = {
    kind = "EndpointPickerConfig",
    pluginDirs = { S.FIXTURES },
    plugins = { { type = "queue-scorer" },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 2 } },
      { type = "e2e-recorder" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
    endpoints = endpoints,
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local ROOT_USER = (P.run("id -u")) == "0\n"

-- Under LUPIN_ASAN=1 (make test-asan) the module is built with ASan and
-- UBSan, Debian's nginx is not: the runtime spec/run preloads is given back
-- to nginx (P.start and P.run drop it for what they start), and the reports
-- go to files in nginx's prefix dir, which stop_clean reads.  Leaks are
-- checked but for what nginx's own allocator gave (spec/nginx-lsan.supp).
local ASAN = os.getenv("LUPIN_ASAN") == "1"
local LSAN_SUPP = S.ROOT .. "/spec/nginx-lsan.supp"

--- The command that runs nginx on the prefix dir, with args.
function M.cmd(dir, args)
  local cmd = ("%s -p %s -c %s/nginx.conf %s"):format(M.NGINX, dir, dir, args or "")
  if not ASAN then
    return cmd
  end
  local log = "log_path=" .. dir .. "/sanitizer"
  return ("env LD_PRELOAD=%s ASAN_OPTIONS=%s LSAN_OPTIONS=%s UBSAN_OPTIONS=%s %s"):format(
    P.quote(os.getenv("LD_PRELOAD")),
    P.quote("detect_leaks=1:exitcode=23:" .. log),
    P.quote("suppressions=" .. LSAN_SUPP .. ":print_suppressions=0"),
    P.quote("print_stacktrace=1:halt_on_error=1:" .. log), cmd)
end

--- nginx.conf for a prefix dir (everything nginx writes stays in it).
--- opts: workers (1), http, server, location: lines added at that level
--- (location: the scheduled /v1/ one); listen: the listen line's parameters
--- ("reuseport": each worker its own socket, new connections spread over
--- the workers by the kernel).
function M.conf(dir, port, opts)
  opts = opts or {}
  return ([[
load_module %s;
daemon off;
master_process on;
worker_processes %d;
%s
pid %s/nginx.pid;
error_log %s/error.log info;
events { worker_connections 1024; }
http {
  access_log %s/access.log;
  client_body_temp_path %s/body;
  proxy_temp_path %s/proxy;
  fastcgi_temp_path %s/fastcgi;
  uwsgi_temp_path %s/uwsgi;
  scgi_temp_path %s/scgi;
  lupin_home %s;
  lupin_config lupin.json;
  upstream llm { lupin; }
  %s
  server {
    listen 127.0.0.1:%d %s;
    location /v1/ {
      lupin_schedule on;
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      %s
    }
    location = /lupin_status { lupin_status; }
    %s
  }
}
]]):format(M.MODULE, opts.workers or 1, ROOT_USER and "user root;" or "", dir, dir, dir, dir,
    dir, dir, dir, dir, S.ROOT, opts.http or "", port, opts.listen or "", opts.location or "",
    opts.server or "")
end

local seq = 0

--- nginx with lupin_config = cfg on a random free port (nginx reports no
--- port it picked: a taken one makes it exit, and another is tried).  The
--- process has .dir (its prefix), .base (its URL) and .port.
function M.start(cfg, opts)
  for _ = 1, 10 do
    seq = seq + 1
    local dir = ("%s/nginx-%d"):format(P.dir, seq)
    os.execute("mkdir -p " .. dir)
    local port = P.port()
    S.write(dir .. "/lupin.json", json.encode(cfg))
    S.write(dir .. "/nginx.conf", M.conf(dir, port, opts))
    local p = P.start(M.cmd(dir))
    p.dir, p.port, p.base = dir, port, "http://127.0.0.1:" .. port
    local up = P.poll(function()
      if P.read(p.rc) then
        return "exited"
      end
      local code = P.get(p.base .. "/lupin_status", "--max-time 1")
      return code == 200 and "up"
    end, "nginx to listen")
    if up == "up" then
      return p
    end
    local log = P.read(dir .. "/error.log") or ""
    assert(log:find("Address already in use", 1, true), "nginx did not start: " .. log
      .. (P.read(p.err) or ""))
  end
  error("nginx did not start")
end

--- Stops nginx gracefully: the workers finish and free their runtimes.
function M.stop(p)
  if p and not P.read(p.rc) then
    P.signal(p, "QUIT")
    P.wait(p)
  end
end

--- What went wrong in nginx's processes, once stopped: its exit status, a
--- worker the master saw die or exit with a failure (a sanitizer's exitcode
--- 23), and the sanitizers' reports.  Empty when all is well.
function M.stop_clean(p)
  M.stop(p)
  local problems = {}
  local rc = tonumber((P.read(p.rc) or ""):match("%d+"))
  if rc ~= 0 then
    problems[#problems + 1] = "nginx exited with " .. tostring(rc)
  end
  for line in (P.read(p.dir .. "/error.log") or ""):gmatch("[^\n]+") do
    if line:find("exited on signal", 1, true) or line:find("exited with code [1-9]") then
      problems[#problems + 1] = line
    end
  end
  local reports = P.run(("cat %s/sanitizer.* 2>/dev/null"):format(p.dir))
  if reports ~= "" then
    problems[#problems + 1] = reports
  end
  return table.concat(problems, "\n")
end

--- A sample of /lupin_status by its series text (args: "?collect").
function M.status(ngx, series, args)
  local _, _, text = P.get(ngx.base .. "/lupin_status" .. (args or ""))
  for line in text:gmatch("[^\n]+") do
    local name, v = line:match("^(.-) (%S+)$")
    if name == series then
      return tonumber(v)
    end
  end
end

--- The journals the e2e-recorder logged from finish for request id.
function M.journals(ngx, id)
  local found = {}
  local pat = "request " .. id:gsub("%-", "%%-") .. " %[e2e%-recorder%] journal ([^\n]*)"
  for j in (P.read(ngx.dir .. "/error.log") or ""):gmatch(pat) do
    found[#found + 1] = j
  end
  return found
end

--- The journals of id, once there is one.
function M.journal(ngx, id)
  P.poll(function()
    return #M.journals(ngx, id) > 0
  end, "the journal of " .. id)
  return M.journals(ngx, id)
end

return M
