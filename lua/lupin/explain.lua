--- Explain records: why a request went where it went (docs/explain.md).
---
--- A request begun with LUPIN_REQUEST_EXPLAIN carries one record (r.explain);
--- the engine fills it at each plugin call and lupin_request_explain returns
--- it as JSON.  Requests without the flag never reach this module: the
--- engine tests r.explain once per step and does nothing else.
---
--- Per endpoint lists are arrays in candidate order (or best first), never
--- objects keyed by name: an endpoint may be named "1" or "", and the order
--- is part of the answer.
local cjson = require "cjson.safe"
local fallback = require "lupin.fallback"

local M = {}

-- The record is written by a small encoder of its own: keys in a fixed,
-- readable order, and an empty list as [] (lua-cjson 2.1 writes {} for it).
local null = cjson.null
local ORDER = {}
for i, k in ipairs({ "request_id", "path", "model", "generation", "dry_run", "status",
  "outcome", "message", "plugin", "primary", "picks", "fallbacks", "scheduling_us", "name",
  "point", "type", "address", "endpoint", "weight", "us", "admitted", "profiles", "in", "kept",
  "removed", "raw", "weighted", "total", "candidates", "steps", "cycles", "filters", "scorers",
  "totals", "picker", "failure", "errors", "traceback", "waiting_queue_size",
  "running_requests", "kv_cache_usage", "labels", "gateway" }) do
  ORDER[k] = ORDER[k] or i
end
-- the fields that hold lists, empty or not
local LISTS = { candidates = true, steps = true, cycles = true, profiles = true, errors = true,
  filters = true, scorers = true, kept = true, removed = true, scores = true, totals = true,
  picks = true, fallbacks = true }

local function key_before(a, b)
  local x, y = ORDER[a] or 1000, ORDER[b] or 1000
  if x ~= y then
    return x < y
  end
  return a < b
end

local encode
local function encode_table(t, key, out)
  if #t > 0 or (next(t) == nil and LISTS[key]) then
    out[#out + 1] = "["
    for i = 1, #t do
      if i > 1 then
        out[#out + 1] = ","
      end
      encode(t[i], nil, out)
    end
    out[#out + 1] = "]"
    return
  end
  local keys = {}
  for k in pairs(t) do
    keys[#keys + 1] = tostring(k)
  end
  table.sort(keys, key_before)
  out[#out + 1] = "{"
  for i, k in ipairs(keys) do
    out[#out + 1] = (i > 1 and "," or "") .. cjson.encode(k) .. ":"
    encode(t[k], k, out)
  end
  out[#out + 1] = "}"
end

function encode(v, key, out)
  local tv = type(v)
  if v == null or v == nil then
    out[#out + 1] = "null"
  elseif tv == "table" then
    encode_table(v, key, out)
  elseif tv == "number" then
    out[#out + 1] = v ~= v and '"NaN"' or v == math.huge and '"Infinity"'
      or v == -math.huge and '"-Infinity"' or ("%.14g"):format(v)
  elseif tv == "boolean" then
    out[#out + 1] = tostring(v)
  else
    out[#out + 1] = (cjson.encode(tostring(v)):gsub("\\/", "/"))
  end
end

--- v as JSON (the record, or a gateway's wrapper of it).
function M.json(v)
  local out = {}
  encode(v, nil, out)
  return table.concat(out)
end

local function us(seconds)
  return math.floor(seconds * 1e7 + 0.5) / 10
end

local function names(eps)
  local out = {}
  for i = 1, #eps do
    out[i] = rawget(eps, i) and tostring(rawget(eps, i)) or "?"
  end
  return out
end

--- A new record for request r over its candidates.
---@param r table the request
---@param t0 number lupin_now() at its start
function M.new(r, t0)
  local eps = {}
  for i, ep in ipairs(r.candidates or {}) do
    eps[i] = { name = ep.name, address = ep.hostport, waiting_queue_size = ep.waiting_queue_size,
      running_requests = ep.running_requests, kv_cache_usage = ep.kv_cache_usage,
      labels = ep.labels }
  end
  return { request_id = r.id, path = r.request.path, model = r.request.model or null,
    generation = r.gen.number, dry_run = r.request.dry_run or false, candidates = eps,
    steps = {}, cycles = {}, profiles = {}, errors = {}, started = t0 }
end

--- One plugin call outside the profiles: admit, prepare, pre_request,
--- process_results.
function M.step(x, rec, point, seconds, extra)
  local s = extra or {}
  s.point, s.plugin, s.type, s.us = point, rec.name, rec.type, us(seconds)
  x.steps[#x.steps + 1] = s
end

--- One call of the profile handler's pick_profiles: the profiles it chose.
function M.cycle(x, rec, seconds, list)
  x.cycles[#x.cycles + 1] = { plugin = rec.name, type = rec.type, us = us(seconds),
    profiles = list or {} }
end

--- A profile about to run over eps; returns its entry.
function M.profile(x, name, eps)
  local p = { name = name, candidates = names(eps), filters = {}, scorers = {} }
  x.profiles[#x.profiles + 1] = p
  return p
end

--- A filter's call: what it kept and removed (kept nil: it failed and the
--- endpoints went on unfiltered).
function M.filter(p, rec, seconds, before, kept)
  local f = { plugin = rec.name, type = rec.type, us = us(seconds), ["in"] = #before }
  if type(kept) == "table" then
    local k = {}
    for i = 1, #kept do
      k[rawget(kept, i) or false] = true
    end
    local removed = {}
    for _, ep in ipairs(before) do
      if not k[ep] then
        removed[#removed + 1] = ep.name
      end
    end
    f.kept, f.removed = names(kept), removed
  else
    f.error = true
  end
  p.filters[#p.filters + 1] = f
end

--- A scorer's call: per endpoint its raw score, the weight, the weighted
--- contribution (of the score clamped to 0..1; NaN counts 0).  scores nil:
--- the scorer failed and added nothing.
function M.scorer(p, rec, weight, seconds, eps, scores)
  local s = { plugin = rec.name, type = rec.type, weight = weight, us = us(seconds) }
  if scores then
    local list = {}
    for i, ep in ipairs(eps) do
      local v = rawget(scores, i)
      local c = (v ~= v or v < 0) and 0 or v > 1 and 1 or v
      list[i] = { endpoint = ep.name, raw = v, weighted = weight * c }
    end
    s.scores = list
  else
    s.error = true
  end
  p.scorers[#p.scorers + 1] = s
end

--- The picker's call, with the totals it was given, best first.
function M.picker(p, rec, seconds, eps, total, picks)
  local idx = {}
  for i = 1, #eps do
    idx[i] = i
  end
  table.sort(idx, function(a, b)
    if total[a] ~= total[b] then
      return total[a] > total[b]
    end
    return a < b
  end)
  local totals = {}
  for k, i in ipairs(idx) do
    totals[k] = { endpoint = eps[i].name, total = total[i] }
  end
  p.totals = totals
  p.picker = { plugin = rec.name, type = rec.type, us = us(seconds),
    picks = type(picks) == "table" and names(picks) or {} }
end

--- The profile that ran last ended without a result, and why.
function M.failed(x, message)
  local p = x.profiles[#x.profiles]
  if p then
    p.failure = message
  end
end

--- A plugin error, with the plugin's own frames when it raised one.
function M.error(x, rec, point, message, trace)
  x.errors[#x.errors + 1] = { plugin = rec.name, type = rec.type, point = point,
    message = message, traceback = trace or null }
end

--- The outcome of scheduling.
function M.done(x, r, status, message, plugin, outcome, t1)
  x.status, x.message, x.plugin = status, message or null, plugin or null
  x.outcome = ({ [0] = "ok", "rejected", "no_endpoint", "plugin_error" })[outcome] or "ok"
  x.scheduling_us = us(t1 - x.started)
  local res = r.result
  if status == 200 and res then
    x.primary = res.primary
    x.picks = names(res.endpoints)
  end
end

--- The record of request r as JSON, or nil when it was not asked for.
function M.encode(r)
  local x = r.explain
  if not x then
    return nil
  end
  if x.status == 200 and not x.fallbacks then
    local flat, fb = fallback.ranked(r), {}
    for i = 1, #flat, 3 do
      fb[#fb + 1] = flat[i]
    end
    x.fallbacks = fb
  end
  local started = x.started
  x.started = nil -- a clock reading means nothing outside the process
  local text = M.json(x)
  x.started = started
  return text
end

return M
