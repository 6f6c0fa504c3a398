--- lupin.testing: unit tests for plugins, from plain busted in any directory
--- (docs/writing-a-plugin.md).  Each harness is a real lupin runtime -- the
--- one `lupin serve` runs, in its own Lua state -- so a plugin is loaded
--- through the same sandbox and runs under the same call budgets and memory
--- limit as when serving.  The plugin's code never runs in busted's state:
--- what comes back (scores, picks, state) is a copy.
---
---     local testing = require "lupin.testing"
---     local t = testing.new { plugins = "my-scorer.lua" }
---     t:endpoints { { name = "a", waiting_queue_size = 3 }, { name = "b" } }
---     local out = t:call("my-scorer", "score")
---     assert.same({ 0.25, 1 }, out.scores)
---
--- `lupin test` runs busted with the paths set; without it, LUA_PATH must
--- reach this file (LUPIN_HOME/lua/?.lua) and LUA_CPATH lupin_native.so.
---@class lupin.testing
local M = {}

local cjson = require "cjson"
do -- the config reader is lua/lupin/config/init.lua: reach it by a LUA_PATH of ?.lua alone
  local root = debug.getinfo(1, "S").source:match("^@(.*/)lupin/testing%.lua$")
  if root and not package.path:find(root .. "?/init.lua", 1, true) then
    package.path = package.path .. ";" .. root .. "?/init.lua"
  end
end
local config_reader = require "lupin.config"

-- A config file's decoded root (JSON or YAML), or nil when it does not read:
-- loading it then reports the error with its line.
local function read_config(path)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local text = f:read("*a")
  f:close()
  return (config_reader.decode(text, path))
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then
    f:close()
  end
  return f ~= nil
end

-- This file is HOME/lua/lupin/testing.lua, in a source tree or an install.
local here = debug.getinfo(1, "S").source:match("^@(.*)$") or ""
local own_home = dirname(dirname(dirname(here)))

--- The lupin home (lua/lupin/, plugins/): $LUPIN_HOME, else the tree or
--- install this file is in.
M.HOME = os.getenv("LUPIN_HOME") or own_home

-- lupin_native: `lupin test` puts it on package.cpath; else the build tree's
-- ($LUPIN_BUILD, build/) or the install's (PREFIX/lib/lua/5.1).
local function native()
  local ok, mod = pcall(require, "lupin_native")
  if ok then
    return mod
  end
  local build = os.getenv("LUPIN_BUILD") or "build"
  local candidates = { build:sub(1, 1) == "/" and build or M.HOME .. "/" .. build,
    M.HOME .. "/../../lib/lua/5.1" }
  for _, dir in ipairs(candidates) do
    local path = dir .. "/lupin_native.so"
    if exists(path) then
      local open, err = package.loadlib(path, "luaopen_lupin_native")
      if not open then
        error("lupin.testing: cannot load " .. path .. ": " .. err, 0)
      end
      package.loaded.lupin_native = open()
      return package.loaded.lupin_native
    end
  end
  error("lupin.testing: lupin_native.so not found (looked on package.cpath, in "
    .. table.concat(candidates, " and ") .. "); run the specs with `lupin test`", 0)
end

-- Reads a Lua literal made by lupin.probe: data only, no globals.
local function undump(text)
  local f = assert(loadstring("return " .. text, "=probe"))
  setfenv(f, {})
  return f()
end

-- A Lua literal of plain data, for the probe (numbers keep every digit).
local function literal(v, seen)
  local t = type(v)
  if t == "string" then
    return (("%q"):format(v):gsub("\r", "\\r"))
  elseif t == "number" then
    return v ~= v and "0/0" or v == math.huge and "1/0" or v == -math.huge and "-1/0"
      or ("%.17g"):format(v)
  elseif t == "boolean" or t == "nil" then
    return tostring(v)
  elseif t ~= "table" then
    error(("lupin.testing: cannot pass a %s to the runtime"):format(t), 0)
  end
  seen = seen or {}
  if seen[v] then
    error("lupin.testing: cannot pass a table that contains itself", 0)
  end
  seen[v] = true
  local out = {}
  for k, x in pairs(v) do
    out[#out + 1] = "[" .. literal(k, seen) .. "]=" .. literal(x, seen)
  end
  seen[v] = nil
  return "{" .. table.concat(out, ",") .. "}"
end

local function check(cond, level, fmt, ...)
  if not cond then
    error("lupin.testing: " .. fmt:format(...), level + 1)
  end
end

--- The serving default of gateway.maxLuaMemoryBytes (gateway/settings.c).
M.DEFAULT_MEMORY_LIMIT = 1024 * 1024 * 1024

local LEVELS = { [0] = "error", "warn", "info", "debug" }

---@class lupin.testing.Harness
---@field rt userdata the lupin_native runtime
---@field plugin_dirs string[]
local H = {}
H.__index = H

---@class lupin.testing.Options
--- plugins: plugin files or directories; a file's directory becomes a
--- plugin directory; relative paths are looked for in the plugin folders
--- first.  Default: the folders `lupin test` names ($LUPIN_TEST_PLUGINS),
--- else the current directory.
--- config: a Lua table, or a JSON or YAML file (found as plugins are).
--- Default, when plugins names one file: that plugin alone.
--- memory_limit: bytes for the Lua state (0: none).  Default: the config's
--- gateway.maxLuaMemoryBytes, else serve's 1 GiB.
---@field plugins string|string[]? plugin files or directories
---@field config table|string? a config: a table, or a JSON or YAML file
---@field memory_limit integer? bytes for the Lua state
---@field seed integer? math.random's seed in the runtime (1)
---@field home string? the lupin home (default M.HOME)

-- The plugin folders `lupin test` names (else the current directory).
local function folders()
  local list = {}
  for d in (os.getenv("LUPIN_TEST_PLUGINS") or "."):gmatch("[^:]+") do
    list[#list + 1] = d
  end
  return list
end

-- A relative path is looked for in the plugin folders, then from the
-- current directory.
local function resolve(p)
  if p:sub(1, 1) ~= "/" then
    for _, d in ipairs(folders()) do
      local full = d .. "/" .. p
      if exists(full) then
        return full
      end
    end
  end
  return p
end

local function plugin_paths(spec)
  if spec == nil then
    spec = folders()
  elseif type(spec) == "string" then
    spec = { spec }
  end
  check(type(spec) == "table", 3, "plugins must be a path or a list of paths, got %s", type(spec))
  local dirs, files, seen = {}, {}, {}
  for _, p in ipairs(spec) do
    check(type(p) == "string", 3, "plugins must be a path or a list of paths, got a %s in the list",
      type(p))
    p = resolve(p)
    local dir = p
    if p:match("%.lua$") then
      check(exists(p), 3, "plugin file %s not found", p)
      dir = dirname(p)
      files[#files + 1] = p:match("([^/]+)%.lua$")
    else
      check(exists(p .. "/."), 3, "plugin directory %s not found", p)
    end
    if not seen[dir] then
      seen[dir] = true
      dirs[#dirs + 1] = dir
    end
  end
  check(#dirs <= 15, 3, "at most 15 plugin directories, got %d", #dirs)
  return dirs, files
end

--- A harness: a runtime over the plugin directories, with the config loaded
--- (an error naming file, line and field when it does not load).
---@param opts lupin.testing.Options?
---@return lupin.testing.Harness
function M.new(opts)
  opts = opts or {}
  check(type(opts) == "table", 2, "new takes a table of options, got %s", type(opts))
  local dirs, files = plugin_paths(opts.plugins)
  local config = opts.config
  if config == nil and #files == 1 then
    config = { plugins = { { type = files[1] } } }
  end
  check(config == nil or type(config) == "table" or type(config) == "string", 2,
    "config must be a table or a file name, got %s", type(config))
  if type(config) == "string" then
    config = resolve(config)
    check(exists(config), 2, "config file %s not found", config)
  end
  local limit = opts.memory_limit
  if limit == nil then
    local gw = type(config) == "table" and config.gateway
    limit = gw and gw.maxLuaMemoryBytes or M.DEFAULT_MEMORY_LIMIT
  end
  check(type(limit) == "number" and limit >= 0, 2, "memory_limit must be a number ≥ 0, got %s",
    tostring(limit))
  local rt, err = native().new({ home = opts.home or M.HOME, plugin_dirs = dirs,
    memory_limit = limit, seed = opts.seed or 1, log_level = 3 })
  check(rt, 2, "cannot start a runtime: %s", tostring(err))
  local t = setmetatable({ rt = rt, plugin_dirs = dirs, names = {}, log_lines = {} }, H)
  if config ~= nil then
    local ok, lerr = t:load(config)
    if not ok then
      rt:free()
      error(lerr, 2)
    end
  end
  return t
end

--- Loads (or reloads) a config, as a reload does: plugins loaded and
--- started, then a dry scheduling cycle over the endpoints.  Returns true,
--- or nil and the error ("file:line: field: message").
---@param config table|string a Lua table, or a JSON or YAML file
---@return true|nil ok, string? err
function H:load(config)
  if type(config) == "string" then
    config = resolve(config)
    check(exists(config), 2, "config file %s not found", config)
    self:accept_gateway(read_config(config))
    return self.rt:load(config)
  end
  check(type(config) == "table", 2, "load takes a table or a file name, got %s", type(config))
  self:accept_gateway(config)
  return self.rt:load_string(cjson.encode(config), "config.json")
end

-- The config's "gateway" section belongs to lupin serve, which declares and
-- checks it (lupin check does too): a harness takes the values as they are,
-- so that an operator's config loads here unchanged.
function H:accept_gateway(root)
  local g = type(root) == "table" and root.gateway
  if type(g) ~= "table" then
    return
  end
  local fields = {}
  for k, v in pairs(g) do
    if type(k) == "string" and type(v) == "number" then
      fields[#fields + 1] = { name = k, default = v, min = -2 ^ 53 }
    end
  end
  assert(self.rt:declare_section("gateway", fields))
end

local METRICS = { "waiting_queue_size", "running_requests", "kv_cache_usage", "max_lora",
  "cache_block_size", "num_blocks", "scraped_at" }

local function csv(v)
  return type(v) == "table" and table.concat(v, ",") or v
end

---@class lupin.testing.Endpoint
---@field name string? (default "ep<i>")
---@field address string? (default "10.0.0.<i>")
---@field port integer? (default 8000)
---@field labels table<string,string>?
---@field healthy boolean? false: in the pool but no candidate
---@field waiting_queue_size number?
---@field running_requests number?
---@field kv_cache_usage number? 0..1
---@field running_lora_adapters string|string[]?
---@field waiting_lora_adapters string|string[]?
---@field max_lora number?
---@field cache_block_size number?
---@field num_blocks number?

--- Makes the pool exactly these endpoints, in this order (a number n: n
--- endpoints ep1..epn with no load).  Metrics are fields of each entry.
---@param list lupin.testing.Endpoint[]|integer
---@return lupin.testing.Harness self
function H:endpoints(list)
  if type(list) == "number" then
    local n = list
    list = {}
    for i = 1, n do
      list[i] = {}
    end
  end
  check(type(list) == "table", 2, "endpoints takes a list of endpoints or a number, got %s",
    type(list))
  for _, name in ipairs(self.names) do
    self.rt:remove(name)
  end
  self.names = {}
  for i, e in ipairs(list) do
    check(type(e) == "table", 2, "endpoint %d must be a table, got %s", i, type(e))
    local name = e.name or ("ep" .. i)
    local ok, err = self.rt:upsert({ name = name, address = e.address or ("10.0.0." .. i),
      port = e.port or 8000, labels = e.labels })
    check(ok, 2, "endpoint %d (%s): %s", i, name, tostring(err))
    self.names[i] = name
    self:set_metrics(name, e)
    if e.healthy == false then
      self.rt:set_healthy(name, false)
    end
  end
  return self
end

--- Sets one endpoint's metrics (the fields of lupin.testing.Endpoint).
---@param name string
---@param m table
function H:set_metrics(name, m)
  local v = {}
  for _, k in ipairs(METRICS) do
    if m[k] ~= nil then
      check(type(m[k]) == "number", 2, "endpoint %s: %s must be a number, got %s", name, k,
        type(m[k]))
      v[k] = m[k]
    end
  end
  v.running_lora_adapters = csv(m.running_lora_adapters)
  v.waiting_lora_adapters = csv(m.waiting_lora_adapters)
  check(self.rt:set_metrics(name, v), 2, "no endpoint named %s", tostring(name))
end

--- Marks an endpoint healthy (a candidate) or not.
function H:set_healthy(name, healthy)
  check(self.rt:set_healthy(name, healthy ~= false), 2, "no endpoint named %s", tostring(name))
end

-- The request as the runtime takes it: a body table becomes JSON.
local function request_desc(d, level)
  d = d or {}
  check(type(d) == "table", level + 1, "a request must be a table, got %s", type(d))
  local body = d.body
  if body == nil then
    if d.messages then
      body = { model = d.model or "test-model", messages = d.messages }
    else
      body = { model = d.model or "test-model", prompt = d.prompt or "Hello" }
    end
    if d.stream then
      body.stream = true
    end
  end
  local path = d.path or (type(body) == "table" and body.messages and "/v1/chat/completions")
    or "/v1/completions"
  return { id = d.id, path = path, model = d.model, headers = d.headers, subset = d.subset,
    body = type(body) == "table" and cjson.encode(body) or body }
end

-- Log lines since the last read, as "level: message".
function H:drain_logs()
  local out = {}
  for i, l in ipairs(self.rt:logs()) do
    out[i] = (LEVELS[l[1]] or tostring(l[1])) .. ": " .. l[2]
    self.log_lines[#self.log_lines + 1] = out[i]
  end
  return out
end

---@alias lupin.testing.Point "admit"|"prepare"|"filter"|"score"|"pick"|"pick_profiles"
---|"process_results"|"pre_request"|"response_header"|"response_chunk"|"response_complete"
---|"finish"

---@class lupin.testing.CallArgs
---@field request table? the request, as begin takes it (default: a completion of "Hello")
---@field endpoints string[]? the candidates, by name (default: every healthy endpoint)
---@field scores number[]? pick: the scores of the candidates (default all 0)
---@field result table? pre_request/response_*/finish: the picks by name ({ "ep1" }), or
--- { primary =, profiles = { name = { "ep1" } } }
---@field results table<string, string[]>? pick_profiles/process_results: profile name -> picks
---@field response table? response_*: { status =, headers = } (default 200, none)
---@field chunk string? response_chunk: the chunk
---@field outcome string? finish: the outcome ("ok", "rejected", ...)
---@field profile string? filter/score/pick: the profile it runs in (default: the first that has the plugin)
---@field keep string? a key: calls with the same key share one request (its ctx.plugin, ctx.shared); finish ends it

---@class lupin.testing.CallResult
---@field ok boolean false: the call raised an error or was cut by its budget
---@field error string? the error (a cut names the budget)
---@field value any the point's first return value, copied
---@field scores number[]? score: one per candidate, as returned (not clamped)
---@field kept string[]? filter: names kept
---@field picked string[]? pick: names picked
---@field admitted boolean? admit
---@field status integer? admit
---@field reason string? admit
---@field profiles string[]? pick_profiles
---@field primary string? process_results
---@field plugin table? ctx.plugin after the call
---@field cycle table? ctx.cycle after the call
---@field shared table? ctx.shared after the call
---@field upstream_headers table<string,string> set with ctx:set_header
---@field response_headers table<string,string> set with ctx:set_response_header
---@field endpoints string[] the candidates, in order
---@field logs string[] log lines during the call ("level: message")

--- Calls one extension point of one plugin instance (by its name in the
--- config) the way a request does: its ctx, the call budget, the memory
--- limit.  An error in the plugin is not raised: it is in out.error.
---@param plugin string the instance's name
---@param point lupin.testing.Point
---@param args lupin.testing.CallArgs?
---@return lupin.testing.CallResult
function H:call(plugin, point, args)
  check(type(plugin) == "string", 2, "call: the plugin name must be a string, got %s",
    type(plugin))
  check(type(point) == "string", 2, "call: the point must be a string, got %s", type(point))
  args = args or {}
  check(type(args) == "table", 2, "call: args must be a table, got %s", type(args))
  local a = {}
  for k, v in pairs(args) do
    a[k] = v
  end
  a.plugin, a.point = plugin, point
  a.request = request_desc(args.request, 2) -- the default: as begin's
  local result = args.result
  if result ~= nil and result.profiles == nil and result.endpoints == nil then
    a.result = { endpoints = result }
  end
  local out = self:probe("call", a, 2)
  out.logs = self:drain_logs()
  return out
end

-- Runs lupin.probe's fn(a) in the runtime; raises the probe's own errors
-- (unknown plugin, point, endpoint) at the caller's level.
function H:probe(fn, a, level)
  local code = ("return require('lupin.runtime.probe').%s(%s)"):format(fn, literal(a))
  local ok, out = pcall(self.rt.eval, self.rt, code)
  if not ok then
    local msg = tostring(out):gsub("^eval: ", ""):gsub("\nstack traceback:.*$", "")
    error("lupin.testing: " .. msg, level + 1)
  end
  return undump(out)
end

--- The state of a plugin instance (its `self`, copied), or of expr
--- evaluated with `self` bound to it (an expression, or statements ending
--- in a return).  Endpoints in it appear as their names.
---@param plugin string
---@param expr string?
function H:state(plugin, expr)
  check(type(plugin) == "string", 2, "state: the plugin name must be a string, got %s",
    type(plugin))
  check(expr == nil or type(expr) == "string", 2, "state: expr must be a string, got %s",
    type(expr))
  return self:probe("state", { plugin = plugin, expr = expr }, 2)
end

---@class lupin.testing.Request
local R = {}
R.__index = R

--- Starts a request through the runtime's real lifecycle (what the
--- gateway does for each client request).
---@param desc table? body (table or string), prompt, messages, model, path, headers, id, subset
---@return lupin.testing.Request
function H:begin(desc)
  local req, err = self.rt:begin(request_desc(desc, 2))
  check(req, 2, "begin: %s", tostring(err))
  return setmetatable({ t = self, req = req, id = req:id() }, R)
end

---@class lupin.testing.ProfileResult
---@field picks string[] the endpoints the profile picked
---@field candidates string[] what its filters left
---@field scores table<string, number> the weighted sum of its scorers, by endpoint name

---@class lupin.testing.ScheduleResult
---@field status integer 200, or the error status
---@field message string? why it failed
---@field plugin string? the plugin that failed it
---@field picks string[] the endpoints picked, by name
---@field headers table<string,string> headers set for the upstream request
---@field primary string? the primary profile
---@field profiles table<string, lupin.testing.ProfileResult> by profile name

--- Schedules: admit, prepare, the profiles, pre_request.
---@return lupin.testing.ScheduleResult
function R:schedule()
  local res = self.req:schedule()
  local picks = {}
  for i, p in ipairs(res.picks or {}) do
    picks[i] = p.name
  end
  local detail = self.t:probe("result", self.id, 2) or {}
  return { status = res.status, message = res.message, plugin = res.plugin, picks = picks,
    headers = res.headers or {}, primary = detail.primary, profiles = detail.profiles or {} }
end

--- The upstream's response headers arrived; returns the headers the client gets from plugins.
function R:response_header(status, headers)
  return self.req:response_header(status or 200, headers or {})
end

--- One chunk of the response body.
function R:response_chunk(chunk)
  self.req:response_chunk(chunk)
end

--- The response ended.
function R:response_complete()
  self.req:response_complete()
end

--- Ends the request (finish hooks run).
---@param outcome string? "ok" (default), "rejected", "no_endpoint", "plugin_error",
--- "upstream_error", "cancelled" or "timeout"
function R:finish(outcome)
  self.req:finish(outcome or "ok")
end

---@class lupin.testing.Response
---@field status integer? (200)
---@field headers table<string,string>?
---@field chunks string[]? the body, in chunks (default one: "{}")
---@field outcome string? (ok)

---@class lupin.testing.LifecycleResult: lupin.testing.ScheduleResult
---@field client_headers table<string,string> headers plugins set on the client's response
---@field logs string[] log lines during the request
---@field errors string[] the error lines among them (plugin errors, cuts)

--- A whole request: begin, schedule (admit, prepare, profiles,
--- pre_request), then when it was scheduled the response header, chunks
--- and completion, and finish.
---@param desc table? the request (see begin)
---@param response lupin.testing.Response?
---@return lupin.testing.LifecycleResult
function H:lifecycle(desc, response)
  response = response or {}
  check(type(response) == "table", 2, "lifecycle: response must be a table, got %s",
    type(response))
  self:drain_logs()
  local r = self:begin(desc)
  local res = r:schedule()
  res.client_headers = {}
  if res.status == 200 then
    res.client_headers = r:response_header(response.status or 200,
      response.headers or { ["content-type"] = "application/json" })
    for _, chunk in ipairs(response.chunks or { "{}" }) do
      r:response_chunk(chunk)
    end
    r:response_complete()
  end
  r:finish(response.outcome or (res.status == 200 and "ok" or "rejected"))
  res.logs = self:drain_logs()
  res.errors = {}
  for _, l in ipairs(res.logs) do
    if l:match("^error: ") then
      res.errors[#res.errors + 1] = l
    end
  end
  return res
end

--- Schedules one request and finishes it: its picks, headers and scores.
---@param desc table? the request (see begin)
---@return lupin.testing.ScheduleResult
function H:schedule(desc)
  local r = self:begin(desc)
  local res = r:schedule()
  r:finish(res.status == 200 and "ok" or "rejected")
  return res
end

--- Request state that outlives its request: the number of requests whose
--- state something still holds, and a report naming each holder.
---@return integer n, string report
function H:leaks()
  return self.rt:check_leaks()
end

--- Fails (error naming the holders) when state of ended requests is held.
function H:assert_no_leaks()
  local n, report = self.rt:check_leaks()
  if n > 0 then
    error(("lupin.testing: %d ended request(s) still held:\n%s"):format(n, report), 2)
  end
end

--- Per plugin and point: calls, errors, cuts (budget), nanoseconds, disabled.
---@return table[]
function H:stats()
  return self.rt:plugin_stats()
end

--- The runtime's counters: lua_memory, memory_limit_hits, live_requests, ...
function H:runtime_stats()
  return self.rt:stats()
end

--- Every log line so far ("level: message"), and those of the last call
--- or lifecycle are in their results.
---@return string[]
function H:logs()
  self:drain_logs()
  return self.log_lines
end

--- Frees the runtime (its plugins' shutdown hooks run).
function H:free()
  if self.rt then
    self.rt:free()
    self.rt = nil
  end
end

M.Harness, M.Request = H, R

return M
