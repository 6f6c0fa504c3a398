-- The request lifecycle: every extension point, in order, with the error
-- policy of DESIGN.md §4.  Called by the C core through lupin.runtime.
local ffi = require "ffi"
local budget = require "lupin.runtime.budget"
local capi = require "lupin.runtime.capi"
local ctx = require "lupin.runtime.ctx"
local enums = require "lupin.runtime.enums"
local explain = require "lupin.runtime.explain"
local flow = require "lupin.runtime.flow"
local leaks = require "lupin.runtime.leaks"
local log = require "lupin.log"
local openai = require "lupin.runtime.openai"
local parsers = require "lupin.runtime.parsers"
local pool = require "lupin.runtime.pool"
local traceback = require "lupin.runtime.traceback"
local clear = require "table.clear"
local new_table = require "table.new"
local invoke = require "lupin.invoke"

local M = {}

-- mirrors enum lupin_outcome in core/lupin.h
local OUTCOME = enums.outcome
local OK, REJECTED, NO_ENDPOINT, PLUGIN_ERROR, INVALID = OUTCOME.ok, OUTCOME.rejected,
  OUTCOME.no_endpoint, OUTCOME.plugin_error, OUTCOME.invalid_request
-- mirrors LUPIN_REQUEST_* in core/lupin.h
local EXPLAIN, DRY = enums.request_flag.explain, enums.request_flag.dry_run

local now = capi.clock
local enter, leave = ctx.enter, ctx.leave
local header = ctx.header

-- upper bounds (seconds) of the plugin call duration buckets: the endpoint
-- picker's, as LUPIN_PLUGIN_BOUNDS in core/lupin.h (the gateway's
-- llm_d_epp_plugin_duration_seconds)
local PLUGIN_BOUNDS = { 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1 }
local N_BOUNDS, FIRST_BOUND = #PLUGIN_BOUNDS, PLUGIN_BOUNDS[1]
M.PLUGIN_BOUNDS = PLUGIN_BOUNDS
local alloc, limit = nil, 0
local B -- the call budget's deadline and flag (core/budget.c)
local id_prefix, id_seq = "", 0
-- the C functions, looked up once: indexing the capi struct makes a new
-- function cdata each time when interpreted
local add_pick, add_header, add_client_header
-- how long the last plugin call took, in seconds: an explain record reads it
-- after the call (a store to an upvalue is all it costs the others)
local last_dt = 0

function M.init(opts)
  now = capi.clock
  local api = capi.api
  add_pick, add_header = api.result_add_pick, api.result_add_header
  add_client_header = api.client_add_header
  alloc = capi.alloc
  limit = opts.memory_limit or 0
  B = budget.bind()
  id_prefix = ("%08x"):format(math.random(0, 0x7fffffff))
end

--- Sets the memory limit after start (a host reading it from the config).
function M.set_memory_limit(bytes)
  limit = bytes
  alloc.limit = bytes
end

--- trace: the plugin's frames where the error was raised, if it was
local function plugin_error(r, rec, point, err, trace)
  local st = rec.stats[point]
  st.errors = st.errors + 1
  err = budget.describe(err)
  if r.explain then
    explain.error(r.explain, rec, point, err, trace)
  end
  local msg = trace and ("%s (traceback: %s)"):format(err, trace) or err
  if r.errors then -- a dry run reports its errors, it does not log them
    r.errors[#r.errors + 1] = { rec = rec, point = point, message = msg }
    return
  end
  log.limited(rec.name .. "/" .. point, "error", "request %s: plugin %s (%s) failed in %s: %s",
    r.id, rec.name, rec.type, point, msg)
end

-- The plugin call's error handler (lupin.invoke runs it where the error was
-- raised): keeps the plugin's frames, returns the error unchanged
local last_trace
local function on_error(err)
  if limit > 0 then -- the trace must not fail on the plugin's memory limit
    alloc.enforce = 0
  end
  local ok, trace = pcall(traceback.capture, 4) -- 4: past capture, pcall and this
  last_trace = ok and trace or nil
  return err
end

-- A call cut by its budget: counted, and past the policy's count the
-- instance is disabled (every later call fails at once).
local function cut(r, rec, point)
  local st = rec.stats[point]
  st.cuts = st.cuts + 1
  rec.cuts = rec.cuts + 1
  local msg = ("plugin %q (%s) exceeded its budget of %g ms in %s"):format(rec.name, rec.type,
    rec.call_budget * 1000, point)
  local limit_cuts = rec.disable_after
  if limit_cuts > 0 and rec.cuts >= limit_cuts and not rec.disabled and not r.errors then
    rec.disabled = ("plugin %q (%s) is disabled: cut %d times by its budget of %g ms"):format(
      rec.name, rec.type, rec.cuts, rec.call_budget * 1000)
    log.warn("%s (budgets.disableAfterCuts); a reload re-enables it", rec.disabled)
  end
  return msg
end

-- The duration bucket of a call slower than the first bound.
local function bucket_of(dt)
  local i = 2
  while i <= N_BOUNDS and dt > PLUGIN_BOUNDS[i] do
    i = i + 1
  end
  return i
end

-- Calls one extension point of one plugin: its ctx, the profile it runs in,
-- the memory limit, the counters.  Returns pcall's results.
-- Fixed arity, no vararg: LuaJIT does not compile a vararg passed on through
-- pcall, and no extension point takes more than two arguments after ctx.
local function call(r, rec, point, profile, x, y)
  if rec.disabled then
    last_dt = 0
    plugin_error(r, rec, point, rec.disabled)
    return false, rec.disabled
  end
  local c = ctx.of(r, rec)
  r.profile = profile or false -- ctx.profile and ctx.cycle read it
  local st = rec.stats[point]
  local t0 = now()
  if limit > 0 then
    if alloc.used > limit * 0.9 then
      collectgarbage()
    end
    alloc.enforce = 1
  end
  budget.grace = rec.call_grace -- its second chance (budget.lua, trip)
  B.deadline = t0 + rec.call_budget
  local outer = enter(r)
  local ok, a, b, d = invoke(on_error, rec[point], rec.obj, c, x, y)
  leave(outer)
  B.deadline = 0
  if limit > 0 then -- a store into a cdata costs when interpreted
    alloc.enforce = 0
  end
  if budget.tripped then -- over budget, even if the plugin caught the cut
    -- (a flag left from a call that ended is cleared by the next poll)
    B.cut = 0
    budget.tripped = false
    ok, a = false, cut(r, rec, point)
  end
  local dt = now() - t0
  st.calls = st.calls + 1
  last_dt = dt
  st.ns = st.ns + dt * 1e9
  local i = dt <= FIRST_BOUND and 1 or bucket_of(dt)
  local buckets = st.buckets
  buckets[i] = buckets[i] + 1
  if not ok then
    plugin_error(r, rec, point, a, last_trace)
    last_trace = nil
  end
  return ok, a, b, d
end

--- One call into one plugin instance exactly as a request makes it (its ctx,
--- budget, memory limit, counters, error logging): lupin.probe calls single
--- extension points for lupin.testing through it.
M.call = call

-- step(r, item, a, b, c) for the items of list from i on, in order, until a
-- step returns true (then true).  A tail call, not a loop: see "Compiled
-- paths" in docs/performance.md.
local function each(list, i, step, r, a, b, c)
  local item = list[i]
  if item == nil then
    return false
  elseif step(r, item, a, b, c) then
    return true
  end
  return each(list, i + 1, step, r, a, b, c)
end

-- A point that only observes: each instance called, its errors counted.
local function notify(r, rec, point, x, y)
  call(r, rec, point, nil, x, y)
end

-- The same, recorded when the request is explained, with the `explain`
-- field of what a data producer published under its name (docs/explain.md).
local function notify_explained(r, rec, point, x)
  call(r, rec, point, nil, x)
  if r.explain then
    local published = r.shared and r.shared[rec.name]
    local note = type(published) == "table" and rawget(published, "explain")
    explain.step(r.explain, rec, point, last_dt, note and { published = note } or nil)
  end
end

local function candidates(subset)
  local list = pool.checked()
  if not subset then
    return list
  end
  local want = {}
  for _, s in ipairs(subset) do
    want[s] = true
  end
  local out = {}
  for _, ep in ipairs(list) do
    if want[ep.name] or want[ep.hostport] then
      out[#out + 1] = ep
    end
  end
  return out
end

-- Marks a plugin reached (its finish runs): a plugin with response hooks
-- observes every request.
local function reach(r, rec)
  ctx.of(r, rec)
end

local COMPACT_EVERY = 65536
local until_compact = COMPACT_EVERY

--- The begin hook: the request description comes as arguments
--- (core/request.c); path nil: the body's (chat when it has "messages");
--- body: a string, or, when the host asked for the body's checks (check), a
--- pointer into the host's memory, valid only during this call, and
--- body_len its bytes; headers: a header block (lupin.ctx's header);
--- flags: LUPIN_REQUEST_*.
--- Returns the request, its id, its model and stream flag when known.  A
--- body that fails the checks makes a request that fails scheduling with a
--- 400 and reaches no plugin.
function M.begin(gen, creq, id, path, body, model, headers, subset, check, flags, body_len)
  path = path or openai.path_of(body, body_len)
  id = id or header(headers, "x-request-id") -- names in lower case (core/request.c)
  if not id or id == "" then
    id_seq = id_seq + 1
    id = id_prefix .. "-" .. id_seq
  end
  -- the parser that claims the path (lupin.runtime.parsers): one lookup
  local hit = parsers.resolve(gen.parsers, path)
  local parser = hit and hit.parser
  local passthrough = parser and parser.passthrough
  if passthrough then -- the fallback parser: the body is not read
    check = false
    model = model or parser.model_header and header(headers, parser.model_header) or parser.model
  elseif hit and hit.row.raw then -- forwarded as sent (a token count)
    check = false
  end
  local decoded, message, param
  if check and not hit then
    message = parsers.unclaimed(gen.parsers, path)
  elseif check then
    decoded, message, param = openai.check_row(hit.row, body, header(headers, "content-type"),
      body_len)
    model = model or (decoded and decoded.model)
  end
  -- the EPP's model rewrite: the model the request is scheduled for (and the
  -- host forwards in the body) in place of the one it names
  local rewrite = header(headers, "x-llm-d-model-name-rewrite")
    or header(headers, "x-gateway-model-name-rewrite")
  if rewrite and rewrite ~= "" and not message then
    model = rewrite
    if decoded and decoded.model ~= nil then
      decoded.model = rewrite
    end
  end
  local r = ctx.new_request(gen, creq, id, path, body, model, headers, body_len)
  r.candidates = candidates(subset)
  r.subset = subset ~= nil
  if flags ~= 0 then
    M.set_flags(r, flags)
  end
  if passthrough then
    rawset(r.request, "body", false) -- never decoded: the prompt is ""
  elseif decoded then
    rawset(r.request, "body", decoded) -- decoded once, here
  elseif check then
    r.failure = { status = 400, message = message, param = param, outcome = INVALID }
    return r, id
  end
  each(gen.observers, 1, reach, r)
  until_compact = until_compact - 1
  if until_compact == 0 then -- keep the leak manifests' list sized to the traffic
    until_compact = COMPACT_EVERY
    leaks.compact()
  end
  return r, id, model, decoded and decoded.stream == true
end

--- The request's flags (LUPIN_REQUEST_* in core/lupin.h): EXPLAIN starts a
--- record, DRY makes scheduling decide without pre_request (nothing is
--- recorded against an endpoint; plugins see ctx.request.dry_run).
function M.set_flags(r, flags)
  if flags % 4 >= DRY then
    r.dry = true
    r.request.dry_run = true
  end
  if flags % 2 == EXPLAIN then
    r.request.explained = true
    r.explain = explain.new(r, now())
  end
end

local function fail(r, status, message, plugin, outcome)
  r.failure = { status = status, message = message, plugin = plugin, outcome = outcome }
  return status, message, plugin, outcome
end

local function failed(f)
  return f.status, f.message, f.plugin, f.outcome, f.param
end

-- The first of picks[i..] that is not an endpoint, and where.
local function bad_pick(picks, i)
  if i > #picks then
    return nil
  end
  local ep = rawget(picks, i)
  if not pool.is_endpoint(ep) then
    return ("pick returned %s at position %d, not an endpoint"):format(type(ep), i)
  end
  return bad_pick(picks, i + 1)
end

local function valid_picks(picks)
  if type(picks) ~= "table" then
    return ("pick must return a list of endpoints, got %s"):format(type(picks))
  end
  return bad_pick(picks, 1)
end

-- The steps of a profile take its result-to-be (res: the endpoints left,
-- the scores so far), its name and its explain record (or false); a step
-- that ends the profile sets res.failure and returns true.

-- One filter: the endpoints it kept are the next step's.
local function filter(r, rec, res, name, x)
  local eps = res.endpoints
  local ok, kept = call(r, rec, "filter", name, eps)
  if x then
    explain.filter(x, rec, last_dt, eps, ok and kept)
  end
  if ok and type(kept) ~= "table" then
    plugin_error(r, rec, "filter", ("filter must return a list of endpoints, got %s"):format(
      type(kept)))
  elseif ok and #kept == 0 then
    res.failure = { status = 503, plugin = rec.name, outcome = NO_ENDPOINT,
      message = ("no endpoint available for profile %q: filter %q removed the last %d"):format(
        name, rec.name, #eps) }
    return true
  elseif ok then
    res.endpoints, res.candidates = kept, kept
  end
end

-- A score in [0, 1] (NaN: 0).
local function clamp(v)
  if v ~= v or v < 0 then
    return 0
  elseif v > 1 then
    return 1
  end
  return v
end

-- One weighted scorer: its scores, each clamped to [0, 1], times its weight
-- added to the totals.  The loops over the endpoints come after the call,
-- never before it in this function: see "Compiled paths".
local function score(r, s, res, name, x)
  local rec, w, eps, total = s.rec, s.weight, res.endpoints, res.scores
  local ok, scores = call(r, rec, "score", name, eps)
  local dt, n, bad = last_dt, #eps, nil
  if ok and type(scores) ~= "table" then
    bad = ("score must return a list of numbers, got %s"):format(type(scores))
  elseif ok then
    for i = 1, n do
      local v = rawget(scores, i) -- what plugins return is read raw: no metamethod runs
      if type(v) ~= "number" then
        bad = ("score %d of %d is %s, not a number"):format(i, n, type(v))
        break
      end
    end
  end
  if bad then
    plugin_error(r, rec, "score", bad)
    ok = false
  elseif ok and total[1] == nil then -- the first scorer to answer sets the totals
    for i = 1, n do
      total[i] = w * clamp(rawget(scores, i))
    end
  elseif ok then
    for i = 1, n do
      total[i] = total[i] + w * clamp(rawget(scores, i))
    end
  end
  if x then
    explain.scorer(x, rec, w, dt, eps, ok and scores)
  end
end

-- Totals no scorer set (none answered, or the profile has none).
local function zeros(total, n)
  for i = 1, n do
    total[i] = 0
  end
end

-- One profile: filters, weighted scorers, picker.  Returns the profile's
-- result, or nil and a failure.
local function run_profile(r, prof, eps)
  local name = prof.name
  local x = r.explain
  x = x and explain.profile(x, name, eps)
  -- the picker's argument, and the profile's result once it has picked
  local res = { endpoints = eps, scores = false, candidates = eps }
  if each(prof.filters, 1, filter, r, res, name, x) then
    return nil, res.failure
  end
  eps = res.endpoints
  local n = #eps
  local total = new_table(n, 0)
  res.scores = total
  each(prof.scorers, 1, score, r, res, name, x)
  if n > 0 and total[1] == nil then
    zeros(total, n)
  end
  local picker = prof.picker
  local ok, picks = call(r, picker, "pick", name, res)
  if x then
    explain.picker(x, picker, last_dt, eps, total, ok and picks)
  end
  local bad = ok and valid_picks(picks)
  if bad then
    plugin_error(r, picker, "pick", bad)
  end
  if not ok or bad then
    return nil, { status = 500, plugin = picker.name, outcome = PLUGIN_ERROR, fatal = true,
      message = ("picker %q failed in profile %q: %s"):format(picker.name, name,
        budget.describe(bad or picks)) }
  end
  if getmetatable(picks) ~= nil then -- the core reads the picks: no metamethod of theirs
    local raw = {}
    for i = 1, #picks do
      raw[i] = rawget(picks, i)
    end
    picks = raw
  end
  if #picks == 0 then
    return nil, { status = 503, plugin = picker.name, outcome = NO_ENDPOINT,
      message = ("no endpoint available for profile %q: picker %q picked none"):format(name,
        picker.name) }
  end
  -- its fields set again: what the picker wrote there does not count
  res.endpoints, res.scores, res.candidates = picks, total, eps
  return res
end

-- the list of no profile: read, never written, so one serves every request
local NONE = {}

-- The profile names of v[i..] (each a name, or a profile table by its
-- name) into names (v itself while they are all names), or nil and why not.
local function names_of(gen, v, i, names)
  local p = rawget(v, i)
  if p == nil then
    return names
  elseif type(p) == "table" then
    if names == v then
      names = {}
      for j = 1, i - 1 do
        names[j] = v[j]
      end
    end
    p = rawget(p, "name")
    names[i] = p
  elseif names ~= v then
    names[i] = p
  end
  if not gen.profile_by_name[p] then
    return nil, ("pick_profiles asked for unknown profile %q"):format(budget.describe(p))
  end
  return names_of(gen, v, i + 1, names)
end

local function profile_list(gen, v)
  if v == nil or (type(v) == "table" and next(v) == nil) then
    return NONE
  elseif type(v) ~= "table" then
    return nil, ("pick_profiles must return a list of profile names, got %s"):format(type(v))
  elseif #v > 0 then
    return names_of(gen, v, 1, v)
  end
  local keys = {} -- a set of names: in name order
  for k in pairs(v) do
    keys[#keys + 1] = k
  end
  table.sort(keys)
  return names_of(gen, keys, 1, keys)
end

-- Room for the results of the profiles a request runs, made at once: the
-- configs lupin ships run one or two, and a table grown by its first key
-- is rehashed (LuaJIT), costlier than one made at that size.
local RESULTS_SIZE = 2

-- from's entries after key k into to.
local function copy(from, to, k)
  local key, value = next(from, k)
  if key == nil then
    return to
  end
  to[key] = value
  return copy(from, to, key)
end

-- The handler reads the results through a table of its own, filled afresh
-- before each of its calls: what it writes there never reaches the engine's
-- results nor its next call.  One such table per request, not one per call.
local function results_view(r, results)
  local v = r.results_view
  if v then
    clear(v)
  else
    v = new_table(0, RESULTS_SIZE)
    r.results_view = v
  end
  return copy(results, v, nil)
end

local function handler_failed(r, point, err)
  local name = r.gen.handler.name
  return fail(r, 500, ("profile handler %q failed in %s: %s"):format(name, point,
    budget.describe(err)), name, PLUGIN_ERROR)
end

-- Runs a profile the handler named: a profile that ran has an entry in
-- results (false when it failed, its failure in r.failures).  True when
-- the request failed (r.failure set).
local function run_named(r, name, results)
  if results[name] ~= nil then
    local err = ("pick_profiles asked to run profile %q twice"):format(name)
    plugin_error(r, r.gen.handler, "pick_profiles", err)
    handler_failed(r, "pick_profiles", err)
    return true
  end
  local res, f = run_profile(r, r.gen.profile_by_name[name], r.candidates)
  if f and r.explain then
    explain.failed(r.explain, f.message)
  end
  if f and f.fatal then
    fail(r, f.status, f.message, f.plugin, f.outcome)
    return true
  end
  results[name] = res or false
  if f then
    r.failures = r.failures or {}
    r.failures[name] = f
  end
end

-- The profile handler's cycles: it names the profiles to run until it
-- names none.  True when the request failed (r.failure set).
local function run_profiles(r, results)
  local gen, handler = r.gen, r.gen.handler
  local ok, v = call(r, handler, "pick_profiles", nil, gen.profile_views,
    results_view(r, results))
  local dt = last_dt
  local list, err = v, nil
  if ok then
    list, err = profile_list(gen, v)
    if err then
      plugin_error(r, handler, "pick_profiles", err)
    end
  end
  if r.explain then
    explain.cycle(r.explain, handler, dt, ok and not err and list)
  end
  if not ok or err then
    handler_failed(r, "pick_profiles", err or v)
    return true
  elseif #list == 0 then
    return false
  elseif each(list, 1, run_named, r, results) then
    return true
  end
  return run_profiles(r, results)
end

local function primary_of(r, results)
  local handler = r.gen.handler
  if handler.process_results then
    local ok, res = call(r, handler, "process_results", nil, results_view(r, results))
    if r.explain then
      explain.step(r.explain, handler, "process_results", last_dt)
    end
    if not ok then
      return nil, res
    end
    local primary = type(res) == "table" and rawget(res, "primary") or res
    if type(primary) ~= "string" or results[primary] == nil then
      local err = ("process_results must name a profile that ran as primary, got %s"):format(
        budget.describe(primary))
      plugin_error(r, handler, "process_results", err)
      return nil, err
    end
    local port = type(res) == "table" and rawget(res, "port") or nil
    if port ~= nil and (type(port) ~= "number" or port % 1 ~= 0 or port < 1 or port > 65535) then
      local err = ("process_results: port must be an integer from 1 to 65535, got %s"):format(
        budget.describe(port))
      plugin_error(r, handler, "process_results", err)
      return nil, err
    end
    return primary, nil, port
  end
  local only
  for name in pairs(results) do
    if only then
      return nil, "several profiles ran and the handler has no process_results"
    end
    only = name
  end
  return only or nil, "no profile ran"
end

-- A pick at another port of the same endpoint (data parallelism: the
-- server's primary port); the name and address stay the pool's strings.
local function at_port(ep, port)
  local at = ffi.new("lupin_endpoint")
  at.id, at.c_name, at.c_address, at.port = ep.id, ep.c_name, ep.c_address, port
  return at
end

local function add_picks(creq, port, eps, i)
  local ep = eps[i]
  if ep == nil then
    return
  end
  add_pick(creq, port and at_port(ep, port) or ep)
  return add_picks(creq, port, eps, i + 1)
end

-- Hands the scheduling result to the C request (again, on a repeated call).
local function publish(r)
  local creq = r.creq
  add_picks(creq, r.result.port, r.result.endpoints, 1)
  if r.upstream_headers then
    for name, value in pairs(r.upstream_headers) do
      add_header(creq, name, value)
    end
  end
  return 200, nil, nil, OK
end

-- One admission check: true when it rejected the request (r.failure set).
local function admit(r, rec, eps)
  local ok, verdict, status, reason = call(r, rec, "admit", nil, eps)
  if r.explain then
    explain.step(r.explain, rec, "admit", last_dt, { admitted = not (ok and verdict == false) })
  end
  if ok and verdict == false then
    fail(r, tonumber(status) or 429, reason and budget.describe(reason)
      or ("rejected by %s"):format(rec.name), rec.name, REJECTED)
    return true
  end
end

-- Flow control, preparation, admission, the profiles: the decision, with no
-- effect outside the request.  Returns nothing with r.result set, or the
-- failure.  The EPP's order: the queue first, then the data producers
-- (prepare), whose data admission plugins read (latency-slo-admitter).
local function decide(r)
  local gen, eps = r.gen, r.candidates
  if gen.flow and not flow.released(r) then -- flow control (lupin.flow): wait, or not fit
    local status, message, outcome = flow.arrive(r)
    if status == 0 then
      return 0
    elseif status then
      return fail(r, status, message, nil, outcome)
    end
  end
  each(gen.points.prepare, 1, notify_explained, r, "prepare", eps)
  if each(gen.points.admit, 1, admit, r, eps) then
    return failed(r.failure)
  end
  if #eps == 0 then
    return fail(r, 503, r.subset and "no endpoint matches x-gateway-destination-endpoint-subset"
      or "no endpoints in the pool", nil, NO_ENDPOINT)
  end
  local results = new_table(0, RESULTS_SIZE)
  if run_profiles(r, results) then
    return failed(r.failure)
  end
  local primary, err, port = primary_of(r, results)
  if not primary then
    return handler_failed(r, "process_results", err)
  end
  local res = results[primary]
  if not res then
    local f = r.failures[primary]
    return fail(r, f.status, f.message, f.plugin, f.outcome)
  end
  r.result = { primary = primary, endpoints = res.endpoints, profiles = results, port = port }
end

-- The request is real from here: counted in flight (ep.in_flight, shared by
-- every runtime of the process) on each endpoint its profiles chose, the
-- first pick of each, once however many chose it (ctx.count sets, it does
-- not add); the core releases it when the request ends.
local function count_in_flight(r, profiles, k)
  local name, res = next(profiles, k)
  if name == nil then
    return
  elseif res then
    ctx.count(r, res.endpoints[1], 1)
  end
  return count_in_flight(r, profiles, name)
end

local function schedule(r)
  -- scheduling runs once per request; a repeated call gets the same answer
  if r.fc and flow.waiting(r) then
    return 0
  elseif r.failure then
    return failed(r.failure)
  elseif r.result then
    return publish(r)
  end
  local status, message, plugin, outcome = decide(r)
  if status then
    return status, message, plugin, outcome
  end
  if r.dry then -- explained, not forwarded: nothing to record on an endpoint
    return publish(r)
  end
  count_in_flight(r, r.result.profiles, nil)
  each(r.gen.points.pre_request, 1, notify_explained, r, "pre_request", r.result)
  if r.fc then
    flow.started(r)
  end
  return publish(r)
end

--- Schedules; returns status (0: queued by flow control), message, plugin,
--- outcome, whether the request has response headers to publish (the core
--- calls the response hooks only then, or when a plugin of the generation
--- would see them, M.flags), the parameter at fault, and whether flow
--- control holds or counts it (the core then tells it of the end).
function M.schedule(r)
  local status, message, plugin, outcome, param = schedule(r)
  if r.fc then
    flow.settle(r)
  end
  local x = r.explain
  if x and not x.status and status ~= 0 then
    if r.fc and r.fc.state ~= "through" then
      x.queue_wait = r.fc.waited
    end
    explain.done(x, r, status, message, plugin, outcome, now())
  end
  return status, message, plugin, outcome, r.response_headers ~= nil, param, r.fc ~= nil
end

-- mirrors LUPIN_GEN_* in core/internal.h
local GEN = enums.gen_flag
local OBSERVES_RESPONSE, HAS_FINISH, OBSERVES_CHUNKS, OBSERVES_COMPLETE = GEN.observes_response,
  GEN.has_finish, GEN.observes_chunks, GEN.observes_complete
local TIMES_RESPONSE = GEN.times_response

-- Whether a plugin of gen reads ctx.timing's body times (times_response).
local function times_response(gen)
  for _, rec in ipairs(gen.instances) do
    if type(rec.module) == "table" and rawget(rec.module, "times_response") == true then
      return true
    end
  end
  return false
end

--- What the core may skip for a generation's requests: the call at the
--- response head when no plugin has response_header, response_chunk or
--- response_complete (finish hooks alone get the head with the end: M.finish),
--- each chunk when no plugin has response_chunk, the end of the response when
--- none has response_complete, the finish hook when no plugin has finish;
--- the response's timing (ctx.timing) unless a plugin asks for it.
function M.flags(gen)
  local p = gen.points
  local flags = 0
  if #p.response_header + #p.response_chunk + #p.response_complete > 0 then
    flags = flags + OBSERVES_RESPONSE
  end
  if #p.finish > 0 then
    flags = flags + HAS_FINISH
  end
  if #p.response_chunk > 0 then
    flags = flags + OBSERVES_CHUNKS
  end
  if #p.response_complete > 0 then
    flags = flags + OBSERVES_COMPLETE
  end
  if times_response(gen) then
    flags = flags + TIMES_RESPONSE
  end
  return flags
end

local DRY_BODY = '{"model":"lupin-dry-run","prompt":"lupin checks a new generation before it'
  .. ' serves: this request is never forwarded.","max_tokens":1}'

-- One dry cycle: the first plugin error it met, if any (an entry of
-- r.errors), and whether a call was cut by its budget.
local function dry_cycle(gen)
  local r = ctx.new_request(gen, nil, "dry-run", "/v1/completions", DRY_BODY, nil, {})
  r.request.dry_run = true
  r.candidates = pool.checked()
  r.errors = {}
  each(gen.observers, 1, reach, r)
  decide(r)
  M.finish(r, "dry_run")
  local was_cut = false
  for _, rec in ipairs(gen.instances) do
    was_cut = was_cut or rec.cuts > 0
    for _, st in pairs(rec.stats) do
      st.calls, st.errors, st.ns, st.cuts = 0, 0, 0, 0
      for i = 1, #st.buckets do
        st.buckets[i] = 0
      end
    end
    rec.cuts = 0
  end
  return r.errors[1], was_cut
end

--- Runs a generation's plugins once on a synthetic request against the current
--- endpoints -- admission, preparation, profiles, then finish("dry_run"); no
--- pre_request, so nothing is recorded or counted against an endpoint.
--- A cycle in which a call was cut by its budget runs once more, and the
--- second decides: a plugin's first call can be slow for reasons that are
--- not its own (a cold start, a preempted machine), where one that loops is
--- cut both times.
--- Returns nil, or the first plugin error and the plugin that raised it.
function M.dry_run(gen)
  local e, was_cut = dry_cycle(gen)
  if e and was_cut then
    e = dry_cycle(gen)
  end
  if e then
    return e.message, e.rec, e.point
  end
end

--- Calls a request-control point of every instance having it, in config
--- order, under the point's error policy (counted and logged; the request
--- proceeds): what drives a point of layer "request" in lupin.points.
function M.point(r, name, x, y)
  each(r.gen.points[name], 1, notify, r, name, x, y)
end

-- headers: a header block (lupin.ctx's header), as at begin
function M.response_header(r, status, headers)
  r.response = ctx.response_view(status, headers)
  M.point(r, "response_header", r.response)
  if r.response_headers then
    local creq = r.creq
    for name, value in pairs(r.response_headers) do
      add_client_header(creq, name, value)
    end
  end
end

function M.response_chunk(r, chunk)
  local response = r.response or { status = 200, headers = {} }
  r.response = response
  M.point(r, "response_chunk", response, chunk)
end

function M.response_complete(r)
  local response = r.response or { status = 200, headers = {} }
  r.response = response
  M.point(r, "response_complete", response)
end

-- The finish of one instance, if the request reached it.
local function finish(r, rec, outcome)
  if r.ctxs[rec.slot or rec] then
    call(r, rec, "finish", nil, outcome)
  end
end

-- Request state needs nothing at the end (lupin.leaks): the core calls this
-- only when the generation has finish hooks, and otherwise sets r.outcome
-- itself.  status and head: the response's, when no response hook took them
-- (the core keeps the head for finish hooks alone: ctx.response).
function M.finish(r, outcome, status, head)
  r.outcome = outcome
  if status and not r.response then
    r.response = ctx.response_view(status, head)
  end
  each(r.gen.points.finish, 1, finish, r, outcome)
end

return M
