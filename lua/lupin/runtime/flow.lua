-- Flow control (docs/flow-control.md): between admission and scheduling,
-- requests wait in priority bands, in flows keyed by fairness id, while the
-- pool is saturated, and leave as it frees — the EPP's flow-control layer.
--
-- One controller for the runtime (a worker of lupin serve): its limits and
-- policies are the current generation's, and a queued request stays pinned to the generation it
-- began on (its scheduling runs with that generation's plugins when it
-- leaves).  The C core asks it, one request at a time, for the next one
-- whose scheduling is final (core/flow.c): an evicted one first, then, while
-- the saturation detector says the pool has room, the best queued one —
-- highest band, the fairness policy's flow, the ordering policy's head.
--
-- Each runtime queues its own requests, but the limits and the bands'
-- precedence are the process's: the runtimes made with one lupin_shared
-- count what they hold in one atomic (the requests, core/flow.c) and one
-- shared dict (each band's requests and bytes, all bands' bytes, and the
-- priorities ever queued), so a band full in one worker is full in all,
-- and no worker sends a band while a higher one waits in another.  Each
-- runtime also publishes when its oldest request of each band arrived: of
-- the runtimes holding the top band, the one holding its oldest request
-- sends next (its own policies choose which of its requests), so no worker
-- starves another's clients and arrival order holds across workers.
--
-- The policies are plugins (plugins/*-fairness-policy.lua,
-- *-ordering-policy.lua, *-detector.lua) written against this queue API:
--
--   fairness:  pick_flow(self, band, flows) -> one of flows
--              band.priority, band.state (a table the policy keeps things in),
--              band:less(a, b) (the band's ordering); flows: the band's flows
--              with requests waiting, by id; flow.id, flow.len, flow.bytes,
--              flow:head() (the item its ordering serves next)
--   ordering:  less(self, a, b) -> a is served before b
--              item.id, item.seq (arrival order), item.enqueued_at,
--              item.deadline (math.huge: none), item.bytes, item.priority,
--              item.flow (the fairness id), item.headers (the request's,
--              lower-case names: slo-deadline-ordering-policy reads its
--              objective there)
--   detector:  saturated(self, endpoints, load) -> saturated[, level]
--              level: llm-d-router's saturation level, 0 idle, 1 full, above
--              1 how far over (saturated: level >= 1); without it, 1 when
--              saturated, else 0.  load.inflight(ep): requests in flight
--              there (ep.in_flight: every runtime of the process, whether
--              through flow control or not), load.tokens(ep): tokens in
--              flight there (ep.in_flight_tokens), load.since_scrape(ep):
--              requests this runtime's flow control sent there since its
--              last scrape
local config = require "lupin.config"
local capi = require "lupin.runtime.capi"
local budget = require "lupin.runtime.budget"
local log = require "lupin.log"
local pool = require "lupin.runtime.pool"
local shared = require "lupin.shared"

local M = {}

-- mirrors enum lupin_outcome in core/lupin.h
local OUTCOME = require("lupin.runtime.enums").outcome
local QUEUE_TTL, QUEUE_FULL, SHED = OUTCOME.queue_ttl, OUTCOME.queue_full, OUTCOME.shed

-- llm-d-router's names, then GIE's older ones they replace
local OBJECTIVE, OLD_OBJECTIVE = "x-llm-d-inference-objective", "x-gateway-inference-objective"
local FAIRNESS, OLD_FAIRNESS = "x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id"
local TTL_HEADER = "x-lupin-request-ttl"

local hosted = false -- the host set a dispatch callback
local evicts = false -- the host set an eviction callback (lupin_runtime_set_evict)
local conf -- the current generation's gen.flow, nil: off
local bands, order = {}, {} -- priority -> band; bands by priority, highest first
-- evicted items not yet handed over, first in first out (ready[head..tail])
local ready, ready_head, ready_tail = {}, 1, 0
local queued_n, queued_bytes = 0, 0
local marks = {} -- endpoint name -> { at = scraped_at, n }: sent since that scrape
local next_deadline = math.huge
local seq = 0
local next_reap = 0 -- when idle flows and bands are looked for next
local clamped = {} -- priority -> requests whose integer objective was clamped to it
local idle_flows = 0 -- flows with nothing waiting, not yet dropped
local kept = false -- what the core was told: ticks reach reap while no request does
-- enableEviction: sheddable requests sent to an endpoint (fc -> true), those
-- evicted whose end has not come yet (fc -> true, how many), those a
-- decision picked and not yet handed over (batch[1..]), and when the next
-- decision may come
local sent, sent_n, victims, victims_n, batch, quiet_until = {}, 0, {}, 0, {}, 0
-- llm-d-router's pacing: one decision waits for the last eviction's end
-- (the endpoint frees its place) and a grace for the detector to see it;
-- an end that does not come in EVICT_TIMEOUT counts as come.  A decision
-- evicts at most EVICT_MAX (upstream's maxRevocationsPerDecision default).
local EVICT_GRACE, EVICT_TIMEOUT, EVICT_MAX = 0.5, 10, 2

-- Tells the core whether this runtime keeps idle state to drop at a tick.
local function keep(on)
  if on ~= kept then
    kept = on
    capi.shared.flow_keep(capi.rt, on and 1 or 0)
  end
end

-- --- the process's counts (every runtime of the lupin_shared) --------------

local DICT_ENTRIES = 16384 -- 4 per priority ever queued, 1 per band and runtime, and 3
local sd -- the shared dict "lupin.flow", opened at the first queued request
local me -- this runtime's number among the dict's users
local known, known_n = {}, 0 -- the priorities ever queued in the process

local function dict()
  if not sd then
    sd = shared._runtime_dict("lupin.flow", { max_entries = DICT_ENTRIES })
    sd:incr("bytes", 0, 0)
    sd:incr("prios", 0, 0)
    me = sd:incr("runtimes", 1, 0) or 0
  end
  return sd
end

-- The requests queued in the process, after adding delta (this runtime's).
local function all_queued(delta)
  return capi.shared.flow_add(capi.rt, delta or 0)
end

-- Whether another runtime may hold requests (this one's in the atomic are
-- queued_n, but for one being counted in): one atomic load, no lock.
local function elsewhere()
  return all_queued() > queued_n
end

-- Counts a request of band into the process's queue (sign 1) or out of it
-- (-1).  Returns the band's requests and bytes and all bands' after that.
local function count(band, bytes, sign)
  local d = dict()
  local n, b = all_queued(sign), d:incr("bytes", sign * bytes, 0) or 0
  if band.solo then
    return band.n + (sign > 0 and 1 or 0), band.bytes + (sign > 0 and bytes or 0), n, b
  end
  return d:incr(band.nkey, sign, 0) or 0, d:incr(band.bkey, sign * bytes, 0) or 0, n, b
end

-- Makes band's keys; the first runtime to queue at its priority lists it
-- for the others.  A band the full dict has no room for is counted by this
-- runtime alone (solo).
local function register(band)
  local d, p = dict(), band.priority
  local first = d:incr("seen:" .. p, 1, 0)
  if first and d:incr(band.nkey, 0, 0) and d:incr(band.bkey, 0, 0) then
    local i = first == 1 and d:incr("prios", 1, 0)
    if i then
      d:set("prio:" .. i, p)
    end
    return true
  end
  log.limited("flow/dict", "error", "flow control: no room for priority %s in the process's"
    .. " counts (%d keys): its band is limited and ordered per worker", tostring(p), DICT_ENTRIES)
  return false
end

-- Publishes when the oldest request band holds here arrived (none: the key
-- goes).  The band's requests in arrival order are in band.fifo[first..last];
-- those out of the queue are dropped from the front here.
local function publish(band)
  local fifo, i = band.fifo, band.first
  while i <= band.last and fifo[i].out do
    fifo[i] = nil
    i = i + 1
  end
  band.first = i
  if i > band.last then
    band.first, band.last = 1, 0
  end
  local at = fifo[i] and fifo[i].enqueued_at or nil
  if at ~= band.oldest and not band.solo then
    band.oldest = at
    dict():set(band.okey, at)
  end
end

-- Whether another runtime holds a request of band older than this one's
-- oldest: that runtime sends next.
local function older_elsewhere(band)
  if band.solo or not band.oldest or not elsewhere() then
    return false
  end
  local d = dict()
  for i = 1, d:get("runtimes") or 0 do
    if i ~= me then
      local at = d:get("o:" .. band.priority .. ":" .. i)
      if at and at < band.oldest then
        return true
      end
    end
  end
  return false
end

-- Whether a band above priority p (from p when from) holds requests in any
-- runtime of the process.
local function queued_above(p, from)
  if not elsewhere() then -- this runtime's bands are looked at by the callers
    return false
  end
  local d = dict()
  local n = d:get("prios") or 0
  while known_n < n do
    local q = d:get("prio:" .. (known_n + 1))
    if q == nil then -- being listed: read again next time
      break
    end
    known_n = known_n + 1
    known[known_n] = q
  end
  for i = 1, known_n do
    local q = known[i]
    if (q > p or (from and q == p)) and (d:get("n:" .. q) or 0) > 0 then
      return true
    end
  end
  return false
end

-- The queue's clock: the core's, plus how far a spec moved it on
-- (M._advance), so that TTLs and idle timeouts are tested without sleeping.
local skew = 0
local function now()
  return capi.now() + skew
end

--- Moves the queue's clock on by seconds (specs).
function M._advance(seconds)
  skew = skew + seconds
end

-- --- the policies' calls: an error is logged and the default used ----------

-- f(rec.obj, ...) for rec's method, under the plugin's call budget like any
-- plugin call: a policy that loops must not hold the event loop
local function call(rec, method, f, ...)
  local ok, a, cut = budget.pcall(rec.call_budget or budget.DEFAULT_CALL_MS / 1000,
    f, rec.obj, ...)
  if not ok then
    log.limited("flow/" .. rec.name, "error", "flow control: plugin %s (%s) failed in %s: %s",
      rec.name, rec.type, method, cut and ("exceeded its budget of %g ms"):format(
        (rec.call_budget or budget.DEFAULT_CALL_MS / 1000) * 1000) or budget.describe(a))
    return nil
  end
  return true, a
end

local function policy(rec, method, ...)
  return call(rec, method, rec.obj[method], ...)
end

-- --- items in a flow: a binary heap by the band's ordering ----------------

local Band = {}
Band.__index = Band

function Band:less(a, b)
  local ok, v = policy(self.conf.ordering, "less", a, b)
  if ok then
    return v == true
  end
  return a.seq < b.seq
end

local Flow = {}
Flow.__index = Flow

function Flow:head()
  return self.heap[1]
end

local function swap(h, i, j)
  h[i], h[j] = h[j], h[i]
  h[i].index, h[j].index = i, j
end

local function up(band, h, i)
  while i > 1 do
    local p = math.floor(i / 2)
    if not band:less(h[i], h[p]) then
      return
    end
    swap(h, i, p)
    i = p
  end
end

local function down(band, h, i)
  local n = #h
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and band:less(h[l], h[m]) then m = l end
    if r <= n and band:less(h[r], h[m]) then m = r end
    if m == i then
      return
    end
    swap(h, i, m)
    i = m
  end
end

local function heap_remove(band, h, i)
  local n = #h
  if i ~= n then
    swap(h, i, n)
  end
  h[n] = nil
  if i < n then
    up(band, h, i)
    down(band, h, i)
  end
end

-- --- bands ----------------------------------------------------------------

local function conf_for(p)
  for _, b in ipairs(conf and conf.bands or {}) do
    if b.priority == p then
      return b
    end
  end
  return conf and (p < 0 and conf.negative_band or conf.default_band)
end

local function band_of(p)
  local b = bands[p]
  if b then
    return b
  end
  b = setmetatable({ priority = p, flows = {}, list = {}, n = 0, bytes = 0, state = {},
    conf = conf_for(p), dispatched = 0, ttl = 0, full = 0, shed = 0, cancelled = 0,
    nkey = "n:" .. p, bkey = "b:" .. p, fifo = {}, first = 1, last = 0, pending = 0,
    n_flows = 0, idle_since = now() }, Band)
  b.solo = not register(b)
  b.okey = "o:" .. p .. ":" .. me
  bands[p] = b
  local i = #order + 1 -- into its place, highest first
  while i > 1 and order[i - 1].priority < p do
    order[i] = order[i - 1]
    i = i - 1
  end
  order[i] = b
  return b
end

local function flow_of(band, id)
  local f = band.flows[id]
  if not f then
    f = setmetatable({ id = id, band = band, heap = {}, len = 0, bytes = 0 }, Flow)
    band.flows[id] = f
    band.n_flows = band.n_flows + 1
  elseif f.len == 0 then
    idle_flows = idle_flows - 1
  end
  if f.len == 0 then -- back among the flows with requests waiting, in id order
    local list, i = band.list, #band.list
    list[i + 1] = f
    while i > 0 and list[i].id > id do
      list[i], list[i + 1] = f, list[i]
      i = i - 1
    end
  end
  return f
end

local function unlist(band, f)
  for i, x in ipairs(band.list) do
    if x == f then
      table.remove(band.list, i)
      return
    end
  end
end

-- Out of the process's counts and its band's published oldest: what the
-- other runtimes see of fc goes.
local function settle(fc)
  count(fc.band, fc.bytes, -1)
  publish(fc.band)
end

-- Out of the runtime's queue.  A request let through (released) stays in
-- the process's counts until its scheduling has counted it in flight
-- (M.settle): were it to leave them first, another worker could see, for a
-- moment, neither the request waiting nor the endpoint busy, and send a
-- lower band, or a later request, into the place it is taking.
local function take(fc, released)
  local f, band = fc.flow_rec, fc.band
  heap_remove(band, f.heap, fc.index)
  f.len, f.bytes = f.len - 1, f.bytes - fc.bytes
  band.n, band.bytes = band.n - 1, band.bytes - fc.bytes
  fc.out = true
  if released then
    fc.unsettled = true
    band.pending = band.pending + 1
  else
    settle(fc)
  end
  queued_n, queued_bytes = queued_n - 1, queued_bytes - fc.bytes
  local t = now()
  if f.len == 0 then
    unlist(band, f)
    f.idle_since = t
    idle_flows = idle_flows + 1
    keep(true)
  end
  if band.n == 0 then
    band.idle_since = t
  end
  fc.waited = t - fc.enqueued_at
end

-- Into the runtime's queue (arrive counted it in the process's already).
local function put(fc)
  local band = fc.band
  local f = flow_of(band, fc.flow)
  fc.flow_rec = f
  local h = f.heap
  h[#h + 1] = fc
  fc.index = #h
  up(band, h, #h)
  f.len, f.bytes = f.len + 1, f.bytes + fc.bytes
  band.n, band.bytes = band.n + 1, band.bytes + fc.bytes
  queued_n, queued_bytes = queued_n + 1, queued_bytes + fc.bytes
  if fc.deadline < next_deadline then
    next_deadline = fc.deadline
  end
  band.last = band.last + 1
  band.fifo[band.last] = fc
  if not band.oldest then
    publish(band)
  end
end

-- --- eviction -------------------------------------------------------------

-- llm-d-router's statuses for what the queue refuses: 429 while the pool
-- has endpoints (capacity exists but is contended: back off, retry), 503
-- when it has none (nothing to wait for)
local function status_of()
  return #pool.list > 0 and 429 or 503
end

local function evict(fc, outcome, message, status)
  take(fc)
  local band = fc.band
  if outcome == QUEUE_TTL then
    band.ttl = band.ttl + 1
  else
    band.shed = band.shed + 1
  end
  fc.r.failure = { status = status or status_of(), message = message, outcome = outcome }
  fc.state = "ready"
  ready_tail = ready_tail + 1
  ready[ready_tail] = fc
end

-- The next evicted item to hand over; one whose request ended meanwhile
-- is skipped.
local function pop_ready()
  while ready_head <= ready_tail do
    local fc = ready[ready_head]
    ready[ready_head] = nil
    ready_head = ready_head + 1
    if fc.state == "ready" then
      return fc
    end
  end
  ready_head, ready_tail = 1, 0
end

local function expire(t)
  if t < next_deadline then
    return
  end
  next_deadline = math.huge
  local late = {}
  for _, band in ipairs(order) do
    for _, f in ipairs(band.list) do
      for _, fc in ipairs(f.heap) do
        if fc.deadline <= t then
          late[#late + 1] = fc
        elseif fc.deadline < next_deadline then
          next_deadline = fc.deadline
        end
      end
    end
  end
  table.sort(late, function(a, b) return a.seq < b.seq end)
  for _, fc in ipairs(late) do
    evict(fc, QUEUE_TTL, ("the request waited %.3gs in the flow-control queue (priority %d)"
      .. " past its TTL of %gs: the pool is saturated; retry later"):format(t - fc.enqueued_at,
      fc.priority, fc.ttl))
  end
end

-- --- the gate -------------------------------------------------------------

-- What a detector reads of the load, read-only: every detector call gets it.
local LOAD = setmetatable({}, {
  __index = {
    inflight = function(ep)
      return ep.in_flight
    end,
    tokens = function(ep)
      return ep.in_flight_tokens
    end,
    since_scrape = function(ep)
      local m = marks[ep.name]
      return m and m.at == ep.scraped_at and m.n or 0
    end,
  },
  __newindex = function() error("the load a detector reads is read-only", 2) end,
  __metatable = false,
})

-- The detector's call: its level is kept aside (no table per decision).
local level_out
local function detect(obj, endpoints, load)
  local sat, level = obj:saturated(endpoints, load)
  level_out = type(level) == "number" and level == level and level or (sat and 1 or 0)
  return sat
end

--- Whether the pool is saturated now (false when flow control is off), and
--- its saturation level (0 when not known).
function M.saturated()
  if not conf then
    return false, 0
  end
  level_out = 0
  local ok, sat = call(conf.detector, "saturated", detect, pool.checked(), LOAD)
  if not (ok and sat) then -- a failing detector does not hold traffic
    return false, ok and level_out or 0
  end
  return true, level_out
end

-- Whether requests of priority p or above wait, here or in another runtime.
local function waiting_from(p)
  for _, band in ipairs(order) do
    if band.priority < p then
      break
    end
    if band.n > 0 then
      return true
    end
  end
  return queued_above(p, true)
end

-- --- a request's way through ----------------------------------------------

local function header_ttl(v)
  if not v then
    return nil
  end
  local n = tonumber(v)
  if n then
    return n >= 0 and n or nil -- seconds
  end
  return config.duration(v) -- "500ms", "5s", "1m30s"
end

-- An integer a client asked for, clamped into levels (the config's
-- priorities, highest first, lupin.flow_config): itself when configured,
-- else the highest level below it, else (below every level) the lowest.
-- Returns the priority and whether it was clamped.
local function clamp(v, levels)
  for _, l in ipairs(levels) do
    if l <= v then
      return l, l ~= v
    end
  end
  return levels[#levels], true
end

--- The request's priority: its objective's (x-llm-d-inference-objective, else x-gateway-inference-objective,
--- naming one of the config's objectives), else the header's value when an
--- integer (as saturation-detector reads it) clamped into the configured
--- priorities (a client cannot make bands of its own), else 0.
---@param gen table the request's generation
---@param headers table<string, string>
---@return integer priority
---@return boolean? clamped
function M.priority_of(gen, headers)
  local v = headers[OBJECTIVE] or headers[OLD_OBJECTIVE]
  if not v then
    return 0
  end
  local p = gen.objectives[v]
  if p then
    return p
  end
  local n = tonumber(v:match("^%s*([-+]?%d+)%s*$"))
  if not n then
    return 0
  end
  local levels = gen.flow and gen.flow.levels
  if not levels then
    return n
  end
  return clamp(n, levels)
end

--- The same for request r, counting a clamped priority for the admin view.
function M.priority(r)
  local q, moved = M.priority_of(r.gen, r.request.headers)
  if moved then
    clamped[q] = (clamped[q] or 0) + 1
    band_of(q) -- listed, so its count shows (a configured priority: bounded)
  end
  return q
end

-- n requests and their bytes, the new one counted, past band's limits.
local function over(band, n, bytes)
  local c = band.conf
  return (c.max_requests > 0 and n > c.max_requests) or (c.max_bytes > 0 and bytes > c.max_bytes)
end

local function over_all(n, bytes)
  return (conf.max_requests > 0 and n > conf.max_requests)
    or (conf.max_bytes > 0 and bytes > conf.max_bytes)
end

-- Room for a request of priority p when the whole queue is full: the newest
-- sheddable request (priority < 0) of the lowest band below p leaves.  Only
-- this runtime's requests can be shed: one queued in another worker is not.
local function shed_for(p)
  for i = #order, 1, -1 do
    local band = order[i]
    if band.priority >= p or band.priority >= 0 then
      return false
    end
    if band.n > 0 then
      local newest
      for _, f in ipairs(band.list) do
        for _, fc in ipairs(f.heap) do
          if not newest or fc.seq > newest.seq then
            newest = fc
          end
        end
      end
      evict(newest, SHED, ("shed from the flow-control queue (priority %d) to make room for a"
        .. " request of priority %d; retry later"):format(band.priority, p))
      return true
    end
  end
  return false
end

--- After admission: nil to go on scheduling now, 0 when the request waits
--- in the queue, or a failure (status, message, outcome) when it does not
--- fit.  Requests of a generation without flow control, dry runs, and hosts
--- without a dispatch callback go on at once.
function M.arrive(r)
  if not (hosted and conf and r.gen.flow) or r.dry or not r.creq then
    return nil
  end
  local p = M.priority(r)
  local headers = r.request.headers
  local ttl = header_ttl(headers[TTL_HEADER]) or (conf_for(p) or {}).ttl or conf.ttl
  local t = now()
  seq = seq + 1
  local fc = { r = r, id = r.id, seq = seq, priority = p, flow = headers[FAIRNESS] or headers[OLD_FAIRNESS] or "",
    headers = headers, bytes = rawget(r.request, "body_bytes"), enqueued_at = t, ttl = ttl,
    deadline = ttl > 0 and t + ttl or math.huge, state = "through", waited = 0 }
  r.fc = fc
  if not waiting_from(p) and not M.saturated() then
    return nil
  end
  local band = band_of(p)
  fc.band = band
  -- counted first, checked after: two workers cannot both take the last place
  local bn, bb, tn, tb = count(band, fc.bytes, 1)
  local full = over(band, bn, bb)
  while not full and over_all(tn, tb) do
    if shed_for(p) then
      tn, tb = all_queued(), dict():get("bytes") or 0
    else
      full = true
    end
  end
  if full then
    count(band, fc.bytes, -1)
    band.full = band.full + 1
    r.fc = nil
    local c = band.conf
    return status_of(), ("the flow-control queue is full for priority %d (band: %d requests,"
      .. " %d bytes, limits %s/%s; all bands: %d requests, %d bytes, limits %s/%s); retry later")
      :format(p, bn - 1, bb - fc.bytes, c.max_requests > 0 and c.max_requests or "none",
      c.max_bytes > 0 and c.max_bytes or "none", tn - 1, tb - fc.bytes,
      conf.max_requests > 0 and conf.max_requests or "none",
      conf.max_bytes > 0 and conf.max_bytes or "none"), QUEUE_FULL
  end
  fc.state = "queued"
  put(fc)
  return 0
end

--- Whether scheduling must wait (the request is queued, or evicted and not
--- yet handed over).
function M.waiting(r)
  local fc = r.fc
  return fc ~= nil and (fc.state == "queued" or fc.state == "ready")
end

--- Whether admission already ran (the request left the queue).
function M.released(r)
  local fc = r.fc
  return fc ~= nil and fc.state == "released"
end

--- A request scheduled to an endpoint: marked sent there since its last
--- scrape (the core counts it in flight, ep.in_flight, until it ends).
function M.started(r)
  local fc = r.fc
  local ep = r.result and r.result.endpoints[1]
  if not (fc and ep) then
    return
  end
  if fc.priority < 0 then -- sheddable: what enableEviction may take back
    sent[fc], sent_n = true, sent_n + 1
    fc.sent_seq = sent_n
  end
  local name = ep.name
  local m = marks[name]
  if m and m.at == ep.scraped_at then
    m.n = m.n + 1
  else
    marks[name] = { at = ep.scraped_at, n = 1 }
  end
end

--- A request let through the gate has been scheduled (and counted in
--- flight when it got an endpoint), or ends: the other runtimes stop
--- counting it as waiting.
function M.settle(r)
  local fc = r.fc
  if fc and fc.unsettled then
    fc.unsettled = nil
    fc.band.pending = fc.band.pending - 1
    fc.band.idle_since = now()
    settle(fc)
  end
end

-- --- what the core calls (core/flow.c, core/request.c) ---------------------

local ops = {}

function ops.hosted(on)
  hosted = on
end

function ops.evicts(on)
  evicts = on
end

-- enableEviction (llm-d-router's in-flight eviction): the pool is saturated
-- and the highest band holding requests here is above sheddable requests
-- sent from here: they, the lowest priority and the last sent first, are
-- ended to free their places.  As upstream sizes a decision: the level's
-- excess over 1 in requests, each in flight weighing level / (requests in
-- flight on the candidates), at least 1 and at most EVICT_MAX.  The next
-- decision waits for their ends and EVICT_GRACE.

-- Retires evictions whose end did not come in EVICT_TIMEOUT; whether any
-- is still awaited.
local function awaited(t)
  for fc in pairs(victims) do
    if t - fc.evicted_at >= EVICT_TIMEOUT then
      victims[fc], victims_n = nil, victims_n - 1
      quiet_until = math.max(quiet_until, t + EVICT_GRACE)
    end
  end
  return victims_n > 0
end

-- How many requests a decision at level evicts.
local function evict_count(level)
  local inflight = 0
  for _, ep in ipairs(pool.checked()) do
    inflight = inflight + ep.in_flight
  end
  if inflight <= 0 or level <= 1 then
    return 1
  end
  return math.min(EVICT_MAX, math.max(1, math.ceil((level - 1) / (level / inflight) - 1e-9)))
end

-- Those picked (the lowest priority below top, the last sent first), each
-- marked with the priority it makes room for.
local function pick_victims(top, n)
  local cands = {}
  for fc in pairs(sent) do
    if fc.priority < top then
      cands[#cands + 1] = fc
    end
  end
  table.sort(cands, function(a, b)
    return a.priority < b.priority or (a.priority == b.priority and a.sent_seq > b.sent_seq)
  end)
  for i = 1, math.min(n, #cands) do
    cands[i].room_for = top
    batch[i] = cands[i]
  end
end

-- The next evicted request to hand over: its C pointer's number and the
-- message, or nil.  level: the detector's, the pool being saturated (nil
-- while a decision's picks are handed over).
local function evict_for(t, level)
  if not (evicts and conf and conf.eviction) then
    batch = {}
    return nil
  end
  if #batch == 0 then
    if next(sent) == nil or awaited(t) or t < quiet_until then
      return nil
    end
    for _, b in ipairs(order) do
      if b.n > 0 then
        pick_victims(b.priority, evict_count(level))
        break
      end
    end
  end
  local pick = table.remove(batch, 1)
  if not pick then
    return nil
  end
  sent[pick] = nil
  victims[pick], victims_n, pick.evicted_at = true, victims_n + 1, t
  return pick.r.creq, ("evicted by flow control after it was sent (priority %d), to make room"
    .. " for a request of priority %d; retry later"):format(pick.priority, pick.room_for)
end

-- Whether band may go: nothing queued, nothing let through and not yet
-- settled, idle for gc seconds, and not a priority the current config names
-- (those stay: bounded by the config, and their counters are /metrics').
local function band_idle(band, t, gc, configured)
  return band.n == 0 and band.pending == 0 and t - band.idle_since >= gc
    and not configured[band.priority]
end

-- Drops the flows (fairness ids) empty for gc seconds and the idle bands of
-- priorities no longer configured: what clients made comes and goes with
-- their requests.
local function reap(t)
  local gc = conf and conf.gc or 0
  next_reap = t + math.min(math.max(gc / 2, 0.05), 10)
  local configured = {}
  for _, p in ipairs(conf and conf.levels or {}) do
    configured[p] = true
  end
  for i = #order, 1, -1 do
    local band = order[i]
    for id, f in pairs(band.flows) do
      if f.len == 0 and t - f.idle_since >= gc then
        band.flows[id] = nil
        band.n_flows = band.n_flows - 1
        idle_flows = idle_flows - 1
      end
    end
    if band_idle(band, t, gc, configured) then
      table.remove(order, i)
      bands[band.priority] = nil
      clamped[band.priority] = nil
    end
  end
  local stray = false
  for _, band in ipairs(order) do
    stray = stray or not configured[band.priority]
  end
  keep(idle_flows > 0 or stray)
end

--- The next request whose scheduling is final, as the C pointer's number.
function ops.next(sweep)
  local t = now()
  if sweep then
    expire(t)
    if t >= next_reap then
      reap(t)
    end
  end
  local fc = pop_ready()
  if fc then
    fc.state = "evicted"
    return fc.r.creq
  end
  if #batch > 0 then -- the rest of a decision's evictions
    local id, message = evict_for(t)
    if id then
      return id, message
    end
  end
  if queued_n == 0 then
    return nil
  end
  local sat, level = M.saturated()
  if sat then
    return evict_for(t, level)
  end
  local band
  for _, b in ipairs(order) do
    if b.n > 0 then
      band = b
      break
    end
  end
  -- another worker holds a higher band, or this band's oldest request: it goes first
  if queued_above(band.priority) or older_elsewhere(band) then
    return nil
  end
  local ok, f = policy(band.conf.fairness, "pick_flow", band, band.list)
  if not (ok and type(f) == "table" and f.band == band and f.len and f.len > 0) then
    f = band.list[1]
  end
  fc = f.heap[1]
  take(fc, true)
  band.dispatched = band.dispatched + 1
  fc.state = "released"
  return fc.r.creq
end

--- The request ends: out of the queue at once (the core took it out of the
--- in-flight counts already).
ops["end"] = function(r)
  local fc = r.fc
  if not fc then
    return
  end
  M.settle(r)
  sent[fc] = nil
  if victims[fc] then -- its place is free: the next decision after the grace
    victims[fc], victims_n = nil, victims_n - 1
    quiet_until = math.max(quiet_until, now() + EVICT_GRACE)
  end
  for i, b in ipairs(batch) do -- picked, not handed over: nothing to evict
    if b == fc then
      table.remove(batch, i)
      break
    end
  end
  if fc.state == "queued" then
    take(fc)
    fc.band.cancelled = fc.band.cancelled + 1
  elseif fc.state == "ready" then -- pop_ready skips it
    fc.state = "ended"
  end
  fc.state, fc.r = "ended", nil
end

function ops.place(r)
  local fc = r.fc
  if not fc then
    return false, 0, "", 0
  end
  local queued = fc.state == "queued"
  return queued, fc.priority, fc.flow, queued and now() - fc.enqueued_at or fc.waited
end

function ops.drain(message)
  local all = {}
  for _, band in ipairs(order) do
    for _, f in ipairs(band.list) do
      for _, fc in ipairs(f.heap) do
        all[#all + 1] = fc
      end
    end
  end
  table.sort(all, function(a, b) return a.seq < b.seq end)
  for _, fc in ipairs(all) do
    evict(fc, SHED, message, 503)
  end
  return #all
end

local function name_of(rec)
  return rec and rec.name or nil
end

function ops.list()
  if not conf and #order == 0 then
    return nil
  end
  local out = {}
  for _, b in ipairs(order) do
    local c = b.conf or {}
    out[#out + 1] = { priority = b.priority, queued = b.n, bytes = b.bytes,
      dispatched = b.dispatched, ttl = b.ttl, full = b.full, shed = b.shed,
      cancelled = b.cancelled, max_requests = c.max_requests, max_bytes = c.max_bytes,
      fairness = name_of(c.fairness), ordering = name_of(c.ordering),
      clamped = clamped[b.priority] or 0, flows_kept = b.n_flows }
    for _, f in ipairs(b.list) do
      out[#out + 1] = { priority = b.priority, flow = f.id, queued = f.len, bytes = f.bytes }
    end
  end
  local sat = M.saturated()
  return out, sat
end

-- The detector's level, nil when flow control is off (as list).
function ops.saturation()
  if not conf and #order == 0 then
    return nil
  end
  local _, level = M.saturated()
  return level
end

function M.hook(op, ...)
  return ops[op](...)
end

--- A new generation swapped in: its limits and policies from now on, for
--- the requests already waiting too (their heaps are rebuilt when the
--- ordering changed).  Without flow control in it, what waits is let go.
function M.configure(gen)
  conf = gen.flow
  if #order > 0 then -- bands this config no longer names go at a tick
    keep(true)
  end
  for _, band in ipairs(order) do
    local old = band.conf and band.conf.ordering
    band.conf = conf_for(band.priority) or band.conf
    if band.conf.ordering ~= old then
      for _, f in ipairs(band.list) do
        local h = f.heap
        for i = math.floor(#h / 2), 1, -1 do
          down(band, h, i)
        end
      end
    end
  end
end

--- For specs: the controller's counters.
function M.state()
  local inflight = {}
  for _, ep in ipairs(pool.list) do
    inflight[ep.name] = ep.in_flight > 0 and ep.in_flight or nil
  end
  local flows = 0
  for _, b in ipairs(order) do
    flows = flows + b.n_flows
  end
  return { queued = queued_n, bytes = queued_bytes, inflight = inflight, bands = #order,
    flows = flows, ready = ready_tail - ready_head + 1, process = all_queued() }
end

return M
