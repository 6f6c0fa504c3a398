-- Picks the best-scoring endpoint among those whose load stays within a bound
-- of the mean: prefix (or any other) affinity, but only while it keeps the
-- load balanced, as SGLang's cache-aware router and consistent hashing with
-- bounded loads do.  Requests without affinity (every score at most
-- affinityThreshold) go to the least loaded endpoint, so cold requests spread.
--
-- Load is what this gateway knows now, not what the last scrape said: the
-- requests it has in flight to each endpoint (ep.in_flight: the core counts
-- them from scheduling to the end on every path, one count per endpoint for
-- all the workers of the process), so a burst between two scrapes spreads at
-- once.  While an endpoint's metrics are fresh (at most metricsMaxAgeMs old),
-- load is the larger of that count and the scraped running + waiting requests
-- plus what this gateway sent there since that scrape (other gateways'
-- traffic), less the requests of this gateway that the scrape caught running
-- and that have ended since: a scrape is up to a refresh interval old, and
-- counting a request that already left would move a light load's affinity
-- away for it.  That sent/ended bookkeeping is this instance's, so per
-- worker (runtime): with several workers the correction sees only its own
-- worker's requests, while the in-flight count it is compared with is the
-- process's.
--
-- An endpoint is eligible while load + 1 ≤ (1 + balanceRelThreshold) × mean
-- + balanceAbsThreshold, the mean counting this request, and load + 1 ≤ the
-- least load + min(maxLoadSpread, 1 + mean): endpoints that hold no cache
-- yet must not stay idle while the others sit under the mean's bound, which
-- at light load is loose (a chat's shared system prompt otherwise keeps
-- every new session on the endpoints that cached it first); the least loaded
-- always is eligible.  The pick is the
-- eligible endpoint with the highest score, then the lowest load, then at
-- random; fallbacks (maxNumOfEndpoints > 1) follow in the same order, the
-- endpoints over the bound last.
local picker = require "lupin.picker"
local new_table = require "table.new"

local random = math.random
local MAX_DONE = 4096 -- ended requests remembered per endpoint until scraped

local function num(v)
  return v == v and v or 0 -- NaN: never scraped
end

-- The requests of this gateway that ended, per endpoint: when each was sent
-- (starts) and when it ended (ends), n of them, and how many of them a
-- scrape at `at` caught running (`left`).  A pick reads that count; it is
-- worked out again only when the endpoint's scrape time moves, once per
-- scrape, not per request.
local function ended_of(self, name)
  local d = self.ended[name]
  if not d then
    d = { at = false, left = 0, starts = {}, ends = {}, n = 0 }
    self.ended[name] = d
  end
  return d
end

-- Requests of this gateway that a scrape at `at` caught running and that have
-- ended since; forgets those that ended before it, which no later scrape sees.
local function left_since(self, name, at)
  local d = self.ended[name]
  if not d then
    return 0
  end
  if d.at == at then
    return d.left
  end
  -- a new scrape: keep, at the front, the requests that ended after it
  local starts, ends, n, left = d.starts, d.ends, 0, 0
  for i = 1, d.n do
    local s, e = starts[i], ends[i]
    starts[i], ends[i] = nil, nil
    if e > at then
      n = n + 1
      starts[n], ends[n] = s, e
      if s <= at then
        left = left + 1
      end
    end
  end
  if n == 0 then
    self.ended[name] = nil
    return 0
  end
  d.n, d.at, d.left = n, at, left
  return left
end

-- One more ended request on an endpoint, sent at `started`, ended `now`.
local function record_ended(self, name, started, now)
  local d = ended_of(self, name)
  if d.n >= MAX_DONE then
    return
  end
  local n = d.n + 1
  d.starts[n], d.ends[n], d.n = started, now, n
  if d.at and started <= d.at and now > d.at then
    d.left = d.left + 1
  end
end

-- The load of one endpoint, in requests.
local function load(self, ep, now)
  local name = ep.name
  local inflight = ep.in_flight
  local at = ep.scraped_at
  if at <= 0 or now - at > self.max_age then
    self.ended[name] = nil
    return inflight
  end
  local sent = self.sent[name]
  local since = (sent and sent.at >= at) and sent.count or 0
  local scraped = num(ep.running_requests) + num(ep.waiting_queue_size) - left_since(self, name, at)
  return math.max(inflight, scraped + since)
end

-- Ranks a before b: eligible first, then higher score, lower load, random key.
local function before(e, s, l, key, a, b)
  if e[a] ~= e[b] then
    return e[a]
  elseif s[a] ~= s[b] then
    return s[a] > s[b]
  elseif l[a] ~= l[b] then
    return l[a] < l[b]
  end
  return key[a] < key[b]
end

---@type lupin.Plugin
return {
  type = "bounded-load-picker",
  schema = {
    maxNumOfEndpoints = picker.schema.maxNumOfEndpoints,
    balanceRelThreshold = { type = "number", default = 0.25, min = 0,
      description = "an endpoint may exceed the mean load by this fraction" },
    balanceAbsThreshold = { type = "number", default = 2, min = 0,
      description = "and by this many requests besides" },
    maxLoadSpread = { type = "number", default = 4, min = 0,
      description = "and never by more than this many requests over the least loaded" },
    affinityThreshold = { type = "number", default = 0, min = 0,
      description = "scores at or below this count as no affinity (least loaded wins)" },
    metricsMaxAgeMs = { type = "integer", default = 2000, min = 0,
      description = "scraped load older than this is ignored; 0: in-flight counts only" },
  },

  new = function(params, env)
    return { k = picker.count(params), rel = params.balanceRelThreshold,
      abs = params.balanceAbsThreshold, threshold = params.affinityThreshold,
      spread = params.maxLoadSpread,
      max_age = params.metricsMaxAgeMs / 1000, now = env.now,
      sent = {}, -- endpoint name -> { at = scraped_at seen, count = sent since }
      ended = {}, -- endpoint name -> its ended requests not yet scraped (ended_of)
      -- a pick's working lists, by candidate: one set per instance, as a
      -- runtime runs one pick at a time
      l = {}, s = {}, e = {}, key = {}, taken = {} }
  end,

  -- Share the bookkeeping with the instance this one replaces: requests
  -- pinned to the old generation end into the same tables (an instance of
  -- an older release of this file kept them otherwise: they start afresh).
  migrate = function(self, old)
    self.sent, self.ended = old.sent, old.ended or {}
  end,

  pick = function(self, _, scored)
    local eps, scores = scored.endpoints, scored.scores
    local n, now, total, min = #eps, self.now(), 1, math.huge
    local l, s, e, key, taken = self.l, self.s, self.e, self.key, self.taken
    for i = 1, n do
      l[i] = load(self, eps[i], now)
      total, min = total + l[i], math.min(min, l[i])
      local v = scores[i]
      s[i] = v > self.threshold and v or 0
    end
    local mean = total / n
    local bound = math.min((1 + self.rel) * mean + self.abs, min + math.min(self.spread, 1 + mean))
    for i = 1, n do
      e[i] = l[i] + 1 <= bound or l[i] == min -- the least loaded is always eligible
      key[i], taken[i] = random(), false
    end
    local k = math.min(self.k, n)
    local out = new_table(k, 0)
    for j = 1, k do
      local best
      for i = 1, n do
        if not taken[i] and (not best or before(e, s, l, key, i, best)) then
          best = i
        end
      end
      taken[best], out[j] = true, eps[best]
    end
    return out
  end,

  -- sent counts the requests sent since the endpoint's last scrape and still
  -- in flight: one that already ended is in no later scrape either, so
  -- counting it would make a run of quick requests look like a queue
  pre_request = function(self, ctx, result)
    -- each endpoint counted, then the scrape time it was counted against
    local held, n = new_table(2, 0), 0
    local st = ctx.plugin
    st.held, st.started = held, self.now() -- first: all counted is released
    for _, res in pairs(result.profiles) do
      local ep = res and res.endpoints[1]
      if ep then
        local name, at = ep.name, ep.scraped_at
        held[n + 1], held[n + 2], n = name, at, n + 2
        local sent = self.sent[name]
        if not sent or sent.at < at then
          self.sent[name] = { at = at, count = 1 }
        else
          sent.count = sent.count + 1
        end
      end
    end
  end,

  finish = function(self, ctx)
    local st = ctx.plugin
    local held = st.held
    if held then
      st.held = nil
      local started, now = st.started, self.now()
      for i = 1, #held, 2 do
        local name, at = held[i], held[i + 1]
        record_ended(self, name, started, now)
        local sent = self.sent[name]
        if sent and sent.at == at and sent.count > 0 then
          sent.count = sent.count - 1
        end
      end
    end
  end,
}
