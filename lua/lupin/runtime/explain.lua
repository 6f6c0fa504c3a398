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
local fallback = require "lupin.runtime.fallback"
local OUTCOME_NAME = require("lupin.runtime.enums").outcome_name
local pool = require "lupin.runtime.pool"

local M = {}

-- The record is written by a small encoder of its own: keys in a fixed,
-- readable order, and an empty list as [] (lua-cjson 2.1 writes {} for it).
local null = cjson.null
local ORDER = {}
for i, k in ipairs({ "request_id", "path", "model", "generation", "dry_run", "status",
  "outcome", "message", "plugin", "primary", "picks", "fallbacks", "scheduling_us", "queue_wait_us", "name",
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

-- Endpoint names of what a plugin returned, read raw: a value that is not
-- an endpoint is shown by its type, none of its metamethods run.
local function name_of(ep)
  return pool.is_endpoint(ep) and ep.name or ("(%s)"):format(type(ep))
end

local function names(eps)
  local out = {}
  for i = 1, #eps do
    out[i] = name_of(rawget(eps, i))
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
      labels = pool.raw_labels(ep) }
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
    local k = {} -- by id: a plugin may return other cdata for the same endpoint
    for i = 1, #kept do
      local ep = rawget(kept, i)
      if pool.is_endpoint(ep) then
        k[ep.id] = true
      end
    end
    local removed = {}
    for i = 1, #before do
      local ep = rawget(before, i)
      if not (pool.is_endpoint(ep) and k[ep.id]) then
        removed[#removed + 1] = name_of(ep)
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
    for i = 1, #eps do
      local v = rawget(scores, i)
      local c = (v ~= v or v < 0) and 0 or v > 1 and 1 or v
      list[i] = { endpoint = name_of(rawget(eps, i)), raw = v, weighted = weight * c }
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
    totals[k] = { endpoint = name_of(rawget(eps, i)), total = total[i] }
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
  x.outcome = OUTCOME_NAME[outcome] or "ok" -- lupin_outcome_name's
  -- the time in the flow-control queue (lupin.flow) is not scheduling's
  local wait = x.queue_wait
  x.queue_wait = nil
  if wait then
    x.queue_wait_us = us(wait)
  end
  x.scheduling_us = us(t1 - x.started - (wait or 0))
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

-- --- reading a record: the gateway's header, `lupin explain`'s text -------

local function g(v)
  return type(v) == "number" and ("%.4g"):format(v) or tostring(v)
end

-- A header value: no control characters, at most n bytes of s.
local function clean(s, n)
  s = tostring(s):gsub("%c", "?")
  return #s > n and s:sub(1, n - 3) .. "..." or s
end

local function primary_profile(x)
  for _, p in ipairs(x.profiles) do
    if p.name == x.primary then
      return p
    end
  end
end

local function head(list, n, f)
  local out = {}
  for i = 1, math.min(n, #list) do
    out[i] = f and f(list[i]) or list[i]
  end
  return table.concat(out, ",") .. (#list > n and ",..." or "")
end

--- One line for a response header (x-lupin-explain): the primary profile,
--- the picks, the best totals, the first fallbacks, the errors, the time.
--- x: a record as its JSON decodes.
function M.summary(x)
  local parts
  if x.status ~= 200 then
    parts = { ("status=%s"):format(x.status), ("outcome=%s"):format(x.outcome),
      ("message=%s"):format(clean(x.message, 160)) }
  else
    local p = primary_profile(x) or {}
    parts = { ("profile=%s"):format(x.primary), ("picks=%s"):format(head(x.picks, 3)),
      ("totals=%s"):format(head(p.totals or {}, 4, function(t)
        return t.endpoint .. ":" .. g(t.total)
      end)), ("fallbacks=%s"):format(head(x.fallbacks or {}, 3)) }
  end
  parts[#parts + 1] = ("errors=%d"):format(#x.errors)
  parts[#parts + 1] = ("us=%s"):format(g(x.scheduling_us))
  if x.queue_wait_us then
    parts[#parts + 1] = ("queued_us=%s"):format(g(x.queue_wait_us))
  end
  return clean(table.concat(parts, "; "), 480)
end

local function pad(s, n)
  s = tostring(s)
  return s .. (" "):rep(n - #s)
end

-- A profile's table: one row per candidate that reached the scorers, best
-- total first; one column per scorer (raw score -> weighted).
local function score_table(out, p, picks, fallbacks)
  local rank = {}
  for i, name in ipairs(picks or {}) do
    rank[name] = "picked" .. (i > 1 and " " .. i or "")
  end
  for i, name in ipairs(fallbacks or {}) do
    rank[name] = rank[name] or ("fallback %d"):format(i)
  end
  local cols = { "endpoint" }
  for _, s in ipairs(p.scorers) do
    cols[#cols + 1] = ("%s (w=%s)"):format(s.plugin, g(s.weight))
  end
  cols[#cols + 1] = "total"
  local rows = {}
  for _, t in ipairs(p.totals) do
    local row = { t.endpoint }
    for _, s in ipairs(p.scorers) do
      local cell = "error"
      for _, sc in ipairs(s.scores or {}) do
        if sc.endpoint == t.endpoint then
          cell = ("%s -> %s"):format(g(sc.raw), g(sc.weighted))
        end
      end
      row[#row + 1] = cell
    end
    row[#row + 1] = g(t.total)
    row[#row + 1] = rank[t.endpoint] or ""
    rows[#rows + 1] = row
  end
  local width = {}
  for c, name in ipairs(cols) do
    width[c] = #name
    for _, row in ipairs(rows) do
      width[c] = math.max(width[c], #row[c])
    end
  end
  local line = {}
  for c, name in ipairs(cols) do
    line[c] = pad(name, width[c] + 2)
  end
  out[#out + 1] = "    " .. table.concat(line):gsub("%s+$", "")
  for _, row in ipairs(rows) do
    for c = 1, #cols do
      line[c] = pad(row[c], width[c] + 2)
    end
    line[#cols + 1] = row[#cols + 1]
    out[#out + 1] = "    " .. table.concat(line):gsub("%s+$", "")
  end
end

local function profile_text(out, x, p)
  out[#out + 1] = ("profile %s (%d candidates)%s"):format(p.name, #p.candidates,
    p.name == x.primary and ": primary" or "")
  for _, f in ipairs(p.filters) do
    if f.error then
      out[#out + 1] = ("  filter %s (%s) %s us: failed, the endpoints went on unfiltered")
        :format(f.plugin, f.type, g(f.us))
    else
      out[#out + 1] = ("  filter %s (%s) %s us: kept %d of %d: %s%s"):format(f.plugin, f.type,
        g(f.us), #f.kept, f["in"], table.concat(f.kept, ", "),
        #f.removed > 0 and "; removed " .. table.concat(f.removed, ", ") or "")
    end
  end
  for _, s in ipairs(p.scorers) do
    out[#out + 1] = ("  scorer %s (%s) weight %s, %s us%s"):format(s.plugin, s.type, g(s.weight),
      g(s.us), s.error and ": failed, added nothing" or "")
  end
  if p.totals and #p.scorers > 0 then
    local primary = p.name == x.primary
    score_table(out, p, primary and x.picks, primary and x.fallbacks)
  end
  if p.picker then
    out[#out + 1] = ("  picker %s (%s) %s us: picked %s"):format(p.picker.plugin, p.picker.type,
      g(p.picker.us), #p.picker.picks > 0 and table.concat(p.picker.picks, ", ") or "none")
  end
  if p.failure then
    out[#out + 1] = "  failed: " .. p.failure
  end
end

--- The record as text for a person (`lupin explain`).  x: a record as its
--- JSON decodes.
function M.text(x)
  local out = {}
  out[#out + 1] = ("request %s %s model %s, generation %s%s"):format(x.request_id, x.path,
    x.model == null and "(none)" or x.model, g(x.generation), x.dry_run and ", dry run" or "")
  out[#out + 1] = ("status %s (%s)%s, scheduling %s us%s"):format(x.status, x.outcome,
    x.message ~= null and ": " .. x.message or "", g(x.scheduling_us),
    x.queue_wait_us and (", after %s us in the flow-control queue"):format(g(x.queue_wait_us))
      or "")
  out[#out + 1] = ("candidates (%d):"):format(#x.candidates)
  for _, c in ipairs(x.candidates) do
    local labels = {}
    for k, v in pairs(type(c.labels) == "table" and c.labels or {}) do
      labels[#labels + 1] = k .. "=" .. v
    end
    table.sort(labels)
    out[#out + 1] = ("  %s %s queue %s running %s kv %s%s"):format(c.name, c.address,
      g(c.waiting_queue_size), g(c.running_requests), g(c.kv_cache_usage),
      #labels > 0 and " labels " .. table.concat(labels, ",") or "")
  end
  for _, s in ipairs(x.steps) do
    if s.point == "admit" or s.point == "prepare" then
      out[#out + 1] = ("%s %s (%s) %s us%s"):format(s.point, s.plugin, s.type, g(s.us),
        s.admitted == false and ": rejected" or "")
    end
  end
  for _, c in ipairs(x.cycles) do
    out[#out + 1] = ("profile handler %s (%s) %s us: %s"):format(c.plugin, c.type, g(c.us),
      #c.profiles > 0 and "run " .. table.concat(c.profiles, ", ") or "done")
  end
  for _, p in ipairs(x.profiles) do
    profile_text(out, x, p)
  end
  for _, s in ipairs(x.steps) do
    if s.point ~= "admit" and s.point ~= "prepare" then
      out[#out + 1] = ("%s %s (%s) %s us"):format(s.point, s.plugin, s.type, g(s.us))
    end
  end
  if x.status == 200 then
    out[#out + 1] = ("primary profile %s: picks %s; fallbacks %s"):format(x.primary,
      table.concat(x.picks, ", "), #(x.fallbacks or {}) > 0 and table.concat(x.fallbacks, ", ")
      or "none")
  end
  if #x.errors > 0 then
    out[#out + 1] = ("errors (%d):"):format(#x.errors)
    for _, e in ipairs(x.errors) do
      out[#out + 1] = ("  %s (%s) in %s: %s"):format(e.plugin, e.type, e.point, e.message)
      if e.traceback ~= null then
        out[#out + 1] = "    at " .. e.traceback
      end
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- mirrors enum lupin_explain_format in core/lupin.h
local TEXT, SUMMARY = 1, 2

--- The record of request r in a form of lupin_explain_format, or nil when it
--- was not asked for.  The text forms read the JSON back: they see what an
--- embedder sees.
function M.render(r, format)
  local json = M.encode(r)
  if not json or (format ~= TEXT and format ~= SUMMARY) then
    return json
  end
  local x = cjson.decode(json)
  return format == TEXT and M.text(x) or M.summary(x)
end

return M
