-- The runtime side of lupin.testing: runs inside a runtime's Lua state
-- (through rt:eval) and calls one extension point of one plugin instance of
-- the current generation through the engine's own call (budget, memory
-- limit, counters), reads an instance's state, and reads the scheduling
-- result of a request in flight.  Arguments come in, and results go out, as
-- Lua literals (M.dump): numbers keep all their digits, which JSON would not.
-- Plugins cannot require this module (lupin.loader's allow-list).
local M = {}

local dump -- forward

local function key_literal(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then
    return k
  end
  return "[" .. dump(k, 0, {}) .. "]"
end

local function number_literal(v)
  if v ~= v then
    return "0/0"
  elseif v == math.huge then
    return "1/0"
  elseif v == -math.huge then
    return "-1/0"
  end
  return ("%.17g"):format(v)
end

-- Plugin state holds plugin tables: read raw (no metamethod of theirs runs),
-- endpoints as their names, what has no literal as a placeholder string.
function dump(v, depth, seen)
  local t = type(v)
  if t == "string" then
    -- %q leaves CR raw, which would end the literal
    return (("%q"):format(v):gsub("\r", "\\r"))
  elseif t == "number" then
    return number_literal(v)
  elseif t == "boolean" or t == "nil" then
    return tostring(v)
  elseif t == "cdata" then
    local pool = package.loaded["lupin.runtime.pool"]
    if pool and pool.is_endpoint(v) then
      return ("%q"):format(tostring(v))
    end
    return '"<cdata>"'
  elseif t ~= "table" then
    return ('"<%s>"'):format(t)
  elseif seen[v] then
    return '"<cycle>"'
  elseif depth > 32 then
    return '"<too deep>"'
  end
  seen[v] = true
  local out, n = {}, 0
  local len = 0
  while rawget(v, len + 1) ~= nil do
    len = len + 1
    n = n + 1
    out[n] = dump(rawget(v, len), depth + 1, seen)
  end
  for k, x in next, v do
    local kt = type(k)
    local in_array = kt == "number" and k >= 1 and k <= len and k % 1 == 0
    if not in_array and (kt == "string" or kt == "number" or kt == "boolean") then
      n = n + 1
      out[n] = key_literal(k) .. "=" .. dump(x, depth + 1, seen)
    end
  end
  seen[v] = nil
  return "{" .. table.concat(out, ",") .. "}"
end

--- A Lua literal of v (tables raw, endpoints by name).
---@param v any
---@return string
function M.dump(v)
  return dump(v, 0, {})
end

local function current()
  local gen = require("lupin.runtime").current
  if not gen then
    error("no config loaded: load one first (testing.new{config = ...} or t:load)", 0)
  end
  return gen
end

local function instance(gen, name)
  local rec = gen.by_name[name]
  if not rec then
    local names = {}
    for i, r in ipairs(gen.instances) do
      names[i] = ("%s (%s)"):format(r.name, r.type)
    end
    error(("no plugin named %q in the loaded config; it has %s"):format(tostring(name),
      table.concat(names, ", ")), 0)
  end
  return rec
end

local function endpoints_by_name()
  local by = {}
  for _, ep in ipairs(require("lupin.runtime.pool").list) do
    by[ep.name] = ep
  end
  return by
end

-- The candidates named, in that order (all of the pool's when names is nil).
local function endpoints(names)
  local list = require("lupin.runtime.pool").list
  if names == nil then
    return list
  end
  local by, out = endpoints_by_name(), {}
  for i, n in ipairs(names) do
    out[i] = by[n] or error(("no healthy endpoint named %q in the pool"):format(tostring(n)), 0)
  end
  return out
end

local function names(list)
  local out = {}
  if type(list) == "table" then
    for i = 1, #list do
      local ep = rawget(list, i)
      out[i] = require("lupin.runtime.pool").is_endpoint(ep) and ep.name or ep
    end
  end
  return out
end

local kept = {} -- key -> request table, for calls that share one request
local seq = 0

local function lower_keys(t)
  local out = {}
  for k, v in pairs(t or {}) do
    out[tostring(k):lower()] = tostring(v)
  end
  return out
end

local function request(gen, a)
  local r = a.keep and kept[a.keep]
  if r then
    return r
  end
  seq = seq + 1
  local d = a.request or {}
  -- creq false, not nil: a counted request, so leak checks see its state
  r = require("lupin.runtime.ctx").new_request(gen, false, d.id or ("probe-" .. seq),
    d.path or "/v1/completions", d.body, d.model, lower_keys(d.headers))
  r.candidates = require("lupin.runtime.pool").list
  if a.keep then
    kept[a.keep] = r
  end
  return r
end

-- The first profile that has the plugin in it (filters, scorers, pickers
-- run inside one: ctx.cycle and ctx.profile are that profile's).
local function profile_of(gen, rec, want)
  if want then
    return want
  end
  for _, prof in ipairs(gen.profiles) do
    for _, n in ipairs(prof.plugins) do
      if n == rec.name then
        return prof.name
      end
    end
  end
end

-- A profile result from names: {endpoints = {...}, scores = {...}}.
local function profile_result(res)
  if type(res) ~= "table" then
    return res
  end
  local eps = endpoints(res.endpoints or res)
  return { endpoints = eps, scores = res.scores, candidates = eps }
end

local function result_of(a)
  local res = a.result
  if res == nil then
    return nil
  end
  local primary = res.primary or "default"
  local profiles = {}
  for name, p in pairs(res.profiles or { [primary] = res.endpoints or res }) do
    profiles[name] = profile_result(p)
  end
  return { primary = primary, endpoints = profiles[primary] and profiles[primary].endpoints
    or endpoints(res.endpoints or {}), profiles = profiles }
end

local ARGS = {} -- point -> function(gen, r, a, eps): the point's arguments

function ARGS.pick(_, _, a, eps)
  local scores = a.scores
  if scores == nil then
    scores = {}
    for i = 1, #eps do
      scores[i] = 0
    end
  end
  return { endpoints = eps, scores = scores }
end

function ARGS.pick_profiles(gen, _, a)
  local results = {}
  for name, p in pairs(a.results or {}) do
    results[name] = profile_result(p)
  end
  return gen.profile_views, results
end

function ARGS.process_results(_, _, a)
  local results = {}
  for name, p in pairs(a.results or {}) do
    results[name] = profile_result(p)
  end
  return results
end

function ARGS.pre_request(_, r)
  return r.result
end

function ARGS.response_header(_, r)
  return r.response
end

function ARGS.response_chunk(_, r, a)
  return r.response, a.chunk or ""
end

ARGS.response_complete = ARGS.response_header

function ARGS.finish(_, _, a)
  return a.outcome or "ok"
end

local function default_args(_, _, _, eps)
  return eps
end

local OUT = {} -- point -> function(out, ok, a, b, c): the point's answer

function OUT.score(out, scores)
  out.scores = scores
end

function OUT.filter(out, list)
  out.kept = names(list)
end

function OUT.pick(out, list)
  out.picked = names(list)
end

function OUT.admit(out, verdict, status, reason)
  out.admitted = verdict ~= false
  out.status, out.reason = status, reason
end

function OUT.pick_profiles(out, list)
  out.profiles = list
end

function OUT.process_results(out, res)
  out.primary = type(res) == "table" and rawget(res, "primary") or res
end

--- Calls a.point of the instance named a.plugin; see lupin.testing's call.
function M.call(a)
  local gen = current()
  local rec = instance(gen, a.plugin)
  local point = a.point
  if type(rec[point]) ~= "function" then
    error(("plugin %q (%s) has no %s"):format(rec.name, rec.type, tostring(point)), 0)
  end
  local r = request(gen, a)
  local eps = endpoints(a.endpoints)
  r.candidates = eps
  if a.result ~= nil then
    r.result = result_of(a)
  end
  if a.response ~= nil then
    r.response = { status = a.response.status or 200, headers = lower_keys(a.response.headers) }
  elseif (point:match("^response") or point == "finish") and not r.response then
    r.response = { status = 200, headers = {} }
  end
  local x, y = (ARGS[point] or default_args)(gen, r, a, eps)
  local profile = (point == "filter" or point == "score" or point == "pick")
    and profile_of(gen, rec, a.profile) or nil
  local ok, v1, v2, v3 = require("lupin.runtime.engine").call(r, rec, point, profile, x, y)
  local out = { ok = ok }
  if not ok then
    out.error = require("lupin.runtime.budget").describe(v1)
  else
    out.value = v1
    if OUT[point] then
      OUT[point](out, v1, v2, v3)
    end
  end
  out.plugin = require("lupin.runtime.ctx").private(r, rec)
  out.cycle = profile and r.profiles and r.profiles[profile] or nil
  out.shared = r.shared
  out.upstream_headers = r.upstream_headers or {}
  out.response_headers = r.response_headers or {}
  out.endpoints = names(eps)
  if point == "finish" or not a.keep then
    r.outcome = point == "finish" and (a.outcome or "ok") or "ok"
    if a.keep then
      kept[a.keep] = nil
    end
  end
  return M.dump(out)
end

--- The state of an instance of the current generation: `self`, or what
--- expr (Lua statements ending in a return, or an expression) makes of it.
function M.state(a)
  local rec = instance(current(), a.plugin)
  if not a.expr then
    return M.dump(rec.obj)
  end
  local code = a.expr
  if not code:find("^%s*return") and not code:find("\n") then
    code = "return " .. code
  end
  local f = assert(loadstring("local self = ...\n" .. code, "=state"))
  return M.dump(f(rec.obj))
end

--- The scheduling result of the request in flight with this id: the
--- primary profile, and each profile's picks and scores by endpoint name.
function M.result(id)
  local found
  require("lupin.runtime.leaks").each_live(function(r)
    if r.id == id then
      found = r
    end
  end)
  if not found or not found.result then
    return M.dump(nil)
  end
  local res = found.result
  local out = { primary = res.primary, profiles = {} }
  for name, p in pairs(res.profiles) do
    if p then
      local scores = {}
      for i, ep in ipairs(p.candidates) do
        scores[ep.name] = p.scores[i]
      end
      out.profiles[name] = { picks = names(p.endpoints), candidates = names(p.candidates),
        scores = scores }
    end
  end
  return M.dump(out)
end

--- Drops the requests kept across calls (t:reset).
function M.reset()
  for k, r in pairs(kept) do
    r.outcome = "cancelled"
    kept[k] = nil
  end
  return "nil"
end

return M
