--- lupin.latency: what predicted-latency-producer does, in the runtime
--- instead of the EPP's XGBoost sidecars (docs/latency-prediction.md).
--- For every candidate endpoint it builds one feature vector (the load the
--- endpoint reports, the load this gateway sent it, the request's input and
--- the part of it not cached there), predicts TTFT and TPOT with online
--- models (lupin.predictor: one per group of endpoints, one per endpoint
--- once it has samples of its own), and after the response trains both on
--- what the request took: TTFT from its dispatch to the first body byte,
--- TPOT as the time between the first and the last event over the events
--- between (ctx.timing, measured by the core).
---@class lupin.latency
local M = {}

local new_table = require "table.new"
local predictor = require "lupin.predictor"
local prefix = require "lupin.prefix"

local CHARS_PER_TOKEN = 4 -- lupin's estimate without a tokenizer (token-load-scorer's)

--- The features, in the models' order: a name each, for explain.
M.FEATURES = { "bias", "uncached_ktokens", "input_ktokens", "waiting", "running", "in_flight",
  "in_flight_ktokens", "prefill_ktokens", "kv_usage" }
local D = #M.FEATURES

local NEVER_SCRAPED = { "waiting", "running", "kv_usage" }

-- A metric the endpoint never reported reads NaN: 0, and noted as missing.
local function num(v)
  if v ~= v or v == nil then
    return 0, true
  end
  return v, false
end

--- The request's input tokens, estimated from the prompt's characters.
---@param request lupin.RequestView
function M.input_tokens(request)
  return math.ceil(#request.prompt / CHARS_PER_TOKEN)
end

--- The request's output budget: max_tokens or max_completion_tokens, else 0.
function M.output_tokens(request)
  local body = request.body or {}
  local n = body.max_tokens
  if type(n) ~= "number" then
    n = body.max_completion_tokens
  end
  if type(n) ~= "number" or n ~= n or n < 0 or n == math.huge then
    return 0
  end
  return math.floor(n)
end

--- The feature vector of ep for a request of `input` tokens of which
--- `cached` are cached there; the second value lists the metrics missing.
---@param ep lupin.Endpoint
---@return number[] x, string[]? missing
function M.features(ep, input, cached)
  local waiting, mw = num(ep.waiting_queue_size)
  local running, mr = num(ep.running_requests)
  local kv, mk = num(ep.kv_cache_usage)
  local missing
  if ep.scraped_at == 0 then -- never scraped: what it reads is no report
    missing = NEVER_SCRAPED
  elseif mw or mr or mk then
    missing = {}
    if mw then missing[#missing + 1] = "waiting" end
    if mr then missing[#missing + 1] = "running" end
    if mk then missing[#missing + 1] = "kv_usage" end
  end
  local uncached = math.max(0, input - cached)
  return { 1, uncached / 1000, input / 1000, waiting, running, ep.in_flight,
    ep.in_flight_tokens / 1000, ep.in_flight_prefill_tokens / 1000, kv }, missing
end

--- The tokens of the request not cached where row's endpoint is.
function M.uncached_tokens(row)
  return math.floor(row.x[2] * 1000 + 0.5)
end

--- A producer's models and settings (params: the plugin's).
---@param env lupin.Env
function M.new(p, env)
  local self = { name = env.name, env = env, models = {}, slots = {}, p = p,
    batch = { ttft = predictor.batch(D, 64), tpot = predictor.batch(D, 64) }, rows = 64 }
  return self
end

-- The model of that target and group, opened once per runtime (the C side
-- keeps one per name for the whole process); false when none could be made.
local function model(self, target, group, exported)
  local key = target .. "\0" .. group
  local m = self.models[key]
  if m == nil then
    local p = self.p
    local err
    m, err = predictor.model({ plugin = self.name, target = target, group = group, features = D,
      halfLife = p.halfLifeSeconds, quantile = p.quantile, exported = exported })
    if not m then
      self.env.log("warn", "no %s model for %s: %s; predictions fall back", target, group, err)
      m = false
    end
    self.models[key] = m
  end
  return m
end

-- The label that groups endpoints: groupLabel, else endpointRoleLabel.
local function group_label(p)
  return p.groupLabel ~= "" and p.groupLabel or p.endpointRoleLabel ~= "" and p.endpointRoleLabel
end

--- The group an endpoint's samples train besides its own: its groupLabel's
--- value, else its endpointRoleLabel's, else "all".
function M.group(self, ep)
  local label = group_label(self.p)
  local g = label and ep.labels[label]
  return g and label .. "=" .. g or "all"
end

-- An endpoint's models, {own, group} per target, found once and kept by
-- its id until its group's label changes: no string is made per request.
local function slot(self, ep)
  local label = group_label(self.p)
  local value = label and ep.labels[label] or false
  local s = self.slots[ep.id]
  if s and s.value == value then
    return s
  end
  local group = M.group(self, ep)
  local own = self.p.perEndpoint and "endpoint=" .. ep.name
  s = { value = value, group = group,
    ttft = { own and model(self, "ttft", own, false), model(self, "ttft", group, true) },
    tpot = { own and model(self, "tpot", own, false), model(self, "tpot", group, true) } }
  self.slots[ep.id] = s
  return s
end

local function grow(self, n)
  if n > self.rows then
    self.rows = n
    self.batch = { ttft = predictor.batch(D, n), tpot = predictor.batch(D, n) }
  end
end

local FROM = { "endpoint", "group" }

-- Predicts target for every row: its own model's answer when warm, else
-- the group's when warm, else none.  Two batched calls into C; the answer
-- in row[target .. "_ms"] and row[target .. "_from"].
local function predict(self, target, rows)
  local b, min = self.batch[target], self.p.minSamples
  local ms_key, from_key = target .. "_ms", target .. "_from"
  for pass = 1, 2 do
    b:reset()
    local n = 0
    for i = 1, #rows do
      local row = rows[i]
      local m = row.slot[target][pass]
      if m and not row[ms_key] then
        n = b:add(m, row.x)
        row[pass] = n
      else
        row[pass] = false
      end
    end
    if n > 0 then
      b:predict()
      for i = 1, #rows do
        local row = rows[i]
        local j = row[pass]
        if j then
          local ms, trained = b:get(j)
          if trained >= min then
            row[ms_key], row[from_key] = ms, FROM[pass]
          end
        end
      end
    end
  end
end

--- Predictions for every endpoint, in rows (in order, and by endpoint id): the features
--- (x, missing), the models (slot), ttft_ms/ttft_from and tpot_ms/tpot_from
--- (nil when its models are all cold), for publish, pre_request and explain.
---@param endpoints lupin.Endpoint[]
---@param input integer the request's input tokens
---@param cached table<integer, integer> cached tokens by endpoint id
function M.predict(self, endpoints, input, cached)
  local n = #endpoints
  grow(self, n)
  local rows, by_id = new_table(n, 0), new_table(0, n)
  for i = 1, n do
    local ep = endpoints[i]
    local row = new_table(2, 8) -- made at its final size
    row.ep, row.slot = ep, slot(self, ep)
    row.x, row.missing = M.features(ep, input, cached[ep.id] or 0)
    rows[i], by_id[ep.id] = row, row
  end
  predict(self, "ttft", rows)
  predict(self, "tpot", rows)
  return rows, by_id
end

--- Trains the models of the row the request was sent by on what it took
--- (ms; tpot nil when not measured), and records the error of the
--- predictions used on the group's model (the /metrics series).
function M.train(row, ttft, tpot, now)
  for target, y in pairs({ ttft = ttft, tpot = tpot }) do
    local own, g = row.slot[target][1], row.slot[target][2]
    if g then
      g:train(row.x, y, now)
      local used = row[target .. "_ms"]
      if used then
        g:observe(used, y)
      end
    end
    if own then
      own:train(row.x, y, now)
    end
  end
end

-- Whether ep serves prefills only: its TPOT is not this request's.
local function prefill_only(self, ep)
  local label = self.p.endpointRoleLabel
  return label ~= "" and ep.labels[label] == "prefill"
end

--- Fills out.endpoints with each predicted endpoint's latencies and
--- headroom under the request's objectives (out.slo).  A request with no
--- objective at all has 0 for both, as upstream: the headroom is minus the
--- prediction and the least latency wins.  One that states only one leaves
--- the other neutral (headroom 0, met), so a TTFT objective alone is
--- judged on TTFT, where upstream would count every TPOT as missed.  The
--- TTFT counts the time the request has waited in the gateway so far.
function M.publish(self, ctx, out, rows)
  local p, eps, slo = self.p, out.endpoints, out.slo
  local t = ctx.timing
  local waited = t and (self.env.now() - t.begun_at) * 1000 or 0
  local none = not slo.ttft and not slo.tpot
  local ttft_slo, tpot_slo = slo.ttft, slo.tpot and slo.tpot * p.sloBufferFactor
  local explained = ctx.request.explained and {}
  for i = 1, #rows do -- the list: pairs would not compile
    local row = rows[i]
    local id, pt, pp = row.ep.id, row.ttft_ms, row.tpot_ms
    if pt then
      local ttft = pt + waited
      local e = { ttft = ttft, dispatched = row.ep.in_flight }
      if ttft_slo or none then
        e.ttft_headroom = (ttft_slo or 0) - ttft
        e.ttft_valid = e.ttft_headroom > 0
      else
        e.ttft_headroom, e.ttft_valid = 0, true
      end
      e.tpot = pp or 0
      if p.streamingMode and pp and not prefill_only(self, row.ep) and (tpot_slo or none) then
        e.tpot_headroom = (tpot_slo or 0) - pp
        e.tpot_valid = e.tpot_headroom > 0
      else -- neutral: no objective, not this request's to meet here, or not known yet
        e.tpot_headroom, e.tpot_valid = 0, true
      end
      e.valid = e.ttft_valid and e.tpot_valid
      eps[id] = e
    end
    if explained then
      explained[row.ep.name] = M.explain(row, function(m) return m:stats() end)
    end
  end
  if explained then
    out.explain = { waited_ms = waited, slo = slo, endpoints = explained }
  end
end

--- After a request that ended well: what it took, trained.  Streaming:
--- TTFT from the dispatch to the first body byte, TPOT over the events
--- after the first (less [DONE], and the usage event when asked for).
--- Otherwise the whole response is the TTFT sample, as upstream's default.
function M.learn(self, ctx, st)
  local t = ctx.timing
  if not t or t.first_byte_at == 0 then
    return
  end
  local ttft, tpot
  if self.p.streamingMode then
    local req = ctx.request
    if not req.stream then
      return
    end
    ttft = (t.first_byte_at - st.sent_at) * 1000
    local body = req.body or {}
    local usage = type(body.stream_options) == "table" and body.stream_options.include_usage
    local tokens = t.events - 1 - (usage == true and 1 or 0)
    if tokens >= 2 and not prefill_only(self, st.row.ep) then
      tpot = (t.last_byte_at - t.first_byte_at) * 1000 / (tokens - 1)
    end
  else
    ttft = (t.last_byte_at - st.sent_at) * 1000
  end
  M.train(st.row, ttft, tpot, self.env.now())
end

--- What explain shows of one row: predictions, the model each came from
--- with its samples and its error so far (the mean absolute percentage
--- error of its predictions before each sample: out of sample), the
--- group's error of the predictions the scheduler used, and the features.
function M.explain(row, stats_of)
  local f = {}
  for i, name in ipairs(M.FEATURES) do
    f[name] = row.x[i]
  end
  local out = { features = f, missing = row.missing, group = row.slot.group }
  for _, target in ipairs({ "ttft", "tpot" }) do
    local ms, from = row[target .. "_ms"], row[target .. "_from"]
    local own, g = row.slot[target][1], row.slot[target][2]
    local m = ms and (from == "endpoint" and own or g)
    local s, gs = m and stats_of(m), g and stats_of(g)
    out[target] = { ms = ms, from = from or "none (cold: fallback)",
      samples = s and s.trained, error = s and s.apriori.mape,
      group_samples = gs and gs.trained, group_error = gs and gs.served.mape }
  end
  return out
end

--- An approximate prefix index of its own, for a producer with no prefix
--- producer to read (upstream auto-creates approx-prefix-cache-producer).
function M.own_prefix(name)
  local block = 16 * CHARS_PER_TOKEN
  return { block = block, index = prefix.index(31250, "predicted-latency-producer/" .. name) }
end

--- Cached tokens by endpoint id from a prefix producer's published matches
--- ({block_size, total, matches}), and the match fraction by id.
function M.cached(st)
  local tokens, frac = {}, {}
  if not st or not st.matches then
    return tokens, frac
  end
  local per = st.block_size / CHARS_PER_TOKEN
  for id, n in pairs(st.matches) do
    tokens[id] = math.floor(n * per)
    frac[id] = st.total > 0 and n / st.total or 0
  end
  return tokens, frac
end

return M
