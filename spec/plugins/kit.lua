-- Helpers for the built-in plugins' specs: call one plugin's extension point
-- directly inside a runtime's Lua state on the pool's real endpoint objects
-- (exact numbers, no picker in between), read a loaded instance's state, and
-- get the message of a config that fails to load.
local S = require "support"
local cjson = require "cjson"

local K = {}

-- Runs inside the runtime: builds (or reuses, by key) an instance of a
-- built-in plugin and calls one point with a ctx made for the call.
local CALL = [==[
local json = require "cjson"
local capi, loader, pool, schema =
  require "lupin.runtime.capi", require "lupin.generation.loader", require "lupin.runtime.pool", require "lupin.schema"
local a = json.decode(%s)
__kit = __kit or {}
local obj = a.key and __kit[a.key]
if not obj then
  local mod = assert(loader.load(a.root .. "/plugins/" .. a.type .. ".lua", a.type))
  local params = assert(schema.validate(mod.schema, a.params))
  obj = mod.new and mod.new(params, { name = a.type, type = a.type, now = capi.now,
    log = function() end }) or { params = params }
  if getmetatable(obj) == nil then
    setmetatable(obj, { __index = mod })
  end
  if a.key then
    __kit[a.key] = obj
  end
end
local eps = pool.list
if a.names then
  local by = {}
  for _, ep in ipairs(pool.list) do
    by[ep.name] = ep
  end
  eps = {}
  for i, n in ipairs(a.names) do
    eps[i] = by[n]
  end
end
local body = a.body or false
local prompt = a.prompt or (body and type(body.prompt) == "string" and body.prompt) or ""
local logs, response_headers = {}, {}
local ctx = {
  plugin = {}, cycle = {}, shared = {},
  request = { id = "kit", headers = a.headers or {}, body = body, prompt = prompt,
    model = a.model or (body and body.model) },
  log = function(_, level, fmt, ...) logs[#logs + 1] = level .. ": " .. fmt:format(...) end,
  set_response_header = function(_, k, v) response_headers[k] = v end,
}
local names = function(list)
  local out = {}
  for i, ep in ipairs(list) do
    out[i] = ep.name
  end
  return out
end
if a.result then
  local by = {}
  for _, ep in ipairs(pool.list) do
    by[ep.name] = ep
  end
  local r = {}
  for i, n in ipairs(a.result) do
    r[i] = by[n]
  end
  ctx.result = { primary = "default", endpoints = r, profiles = { default = { endpoints = r } } }
end
local out = { logs = logs, response_headers = response_headers }
if a.point == "score" then
  local scores = obj:score(ctx, eps)
  out.scores = {} -- as text: JSON numbers keep only 14 digits
  for i = 1, #eps do
    local v = scores[i]
    out.scores[i] = type(v) == "number" and ("%%.17g"):format(v) or tostring(v)
  end
  out.names = names(eps)
elseif a.point == "filter" then
  out.kept = names(obj:filter(ctx, eps))
elseif a.point == "pick" then
  out.picked = names(obj:pick(ctx, { endpoints = eps, scores = a.scores }))
elseif a.point == "pick_many" then
  out.first, out.any, out.sizes, out.dups = {}, {}, {}, 0
  for _ = 1, a.times do
    local picked = names(obj:pick(ctx, { endpoints = eps, scores = a.scores }))
    local seen = {}
    for i, n in ipairs(picked) do
      if seen[n] then
        out.dups = out.dups + 1
      end
      seen[n] = true
      out.any[n] = (out.any[n] or 0) + 1
      if i == 1 then
        out.first[n] = (out.first[n] or 0) + 1
      end
    end
    local size = tostring(#picked)
    out.sizes[size] = (out.sizes[size] or 0) + 1
  end
elseif a.point == "admit" then
  local verdict, status, reason = obj:admit(ctx, eps)
  out.admitted = verdict ~= false
  out.status, out.reason = status, reason
elseif a.point == "response_header" then
  obj:response_header(ctx, { status = 200, headers = a.response or {} })
end
return json.encode(out)
]==]

--- Calls a.point of plugin a.type (params a.params) on the pool's endpoints
--- (or those named in a.names, in that order).  a.headers, a.body (a table),
--- a.model, a.prompt make the request; a.scores feeds a picker; a.result
--- names the chosen endpoints for response_header, a.response the response
--- headers it reads; a.key keeps the instance
--- across calls.  Returns the decoded output: scores keyed by endpoint name
--- (and .list in order), kept, picked, admitted/status/reason, logs.
function K.call(rt, a)
  a.root = S.ROOT
  local out = cjson.decode(rt:eval(CALL:format(("%q"):format(cjson.encode(a)))))
  if out.scores then
    local list, by = {}, {}
    for i, name in ipairs(out.names) do
      list[i] = tonumber(out.scores[i]) or out.scores[i]
      by[name] = list[i]
    end
    out.list, out.scores = list, by
  end
  return out
end

--- Picks `times` times with a picker over the given scores; returns how
--- often each endpoint came first (.first) and was picked at all (.any),
--- how many picks had each size (.sizes["2"]: picks of two endpoints) and had duplicates (.dups).
function K.pick_many(rt, type_, params, scores, times, names)
  return K.call(rt, { type = type_, params = params, point = "pick_many", scores = scores,
    times = times, names = names })
end

--- The scores of a scorer, keyed by endpoint name.
function K.scores(rt, type_, params, a)
  a = a or {}
  a.type, a.params, a.point = type_, params, "score"
  return K.call(rt, a).scores
end

--- A plugin's parameters after the schema: defaults filled in.
function K.params(rt, type_, params)
  return S.eval(rt, ([[
    local m = assert(require("lupin.generation.loader").load(%q, %q))
    return assert(require("lupin.schema").validate(m.schema, require("cjson").decode(%q)))
  ]]):format(S.ROOT .. "/plugins/" .. type_ .. ".lua", type_, cjson.encode(params or {})))
end

--- A runtime with n endpoints ep1..epn carrying the given metrics.
function K.pool(n, metrics, opts)
  local rt = S.runtime(opts)
  S.endpoints(rt, n, metrics)
  return rt
end

--- The current generation's instance of a plugin, read through rt:eval:
--- evaluates expr (a Lua expression, or statements ending in a return, with
--- `self` the instance) and returns it decoded from JSON.
function K.instance(rt, name, expr)
  if not expr:find("^%s*return") and not expr:find("\n") then
    expr = "return " .. expr
  end
  return S.eval(rt, ([[
local gen
for _, v in pairs(debug.getregistry()) do
  if type(v) == "table" and rawget(v, "by_name") and rawget(v, "number")
    and (not gen or v.number > gen.number) then
    gen = v
  end
end
local self = gen.by_name[%q].obj
%s
]]):format(name, expr))
end

--- The start of a K.instance expression for the predicted-latency family's
--- consumers: from `a` (JSON, %q in the format), `eps` (the pool, or the
--- endpoints a.names names, in that order) and `shared` holding what
--- predicted-latency-producer would publish: a.pl's slo, and its prefix and
--- endpoints keyed by endpoint name (no a.pl: no producer).  Each spec ends
--- it with its own call (a format string: %% for a literal percent sign).
K.PREDICTED = [[
local a = require("cjson").decode(%q)
local by, eps = {}, {}
for _, ep in ipairs(require("lupin.runtime.pool").list) do
  by[ep.name] = ep
  eps[#eps + 1] = ep
end
if a.names then
  eps = {}
  for i, n in ipairs(a.names) do eps[i] = by[n] end
end
local shared = {}
if a.pl then
  local pl = { slo = a.pl.slo, streaming = true, prefix = {}, endpoints = {} }
  for n, v in pairs(a.pl.prefix or {}) do pl.prefix[by[n].id] = v end
  for n, v in pairs(a.pl.endpoints or {}) do pl.endpoints[by[n].id] = v end
  shared[require("lupin.slo").KEY] = pl
end
]]

--- The error of loading a config whose "plugins" are the given JSON texts,
--- one per line: plugins[i] is on line 2 + i of "spec.json".
function K.load_error(plugins)
  local rt = S.runtime()
  local text = '{\n  "plugins": [\n    ' .. table.concat(plugins, ",\n    ") .. "\n  ]\n}\n"
  local ok, err = rt:load_string(text, "spec.json")
  rt:free()
  assert(not ok, "the config loaded")
  return err
end

--- A config with the given plugins (Lua tables) in one profile "default".
function K.config(plugins, refs)
  local list = {}
  for i, p in ipairs(plugins) do
    list[i] = p
  end
  return {
    plugins = list,
    schedulingProfiles = { { name = "default", plugins = refs } },
  }
end

--- Schedules one request; returns the names of the picks in order and the result.
function K.picks(rt, desc)
  local req = assert(rt:begin(desc or { path = "/v1/completions",
    body = '{"model":"m","prompt":"hello"}' }))
  local res = req:schedule()
  req:finish("ok")
  local names = {}
  for i, p in ipairs(res.picks or {}) do
    names[i] = p.name
  end
  return names, res
end

return K
