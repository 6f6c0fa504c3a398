-- llm-d-router's latency-scorer: scores endpoints by predicted latency
-- headroom, the request's objective minus predicted-latency-producer's
-- prediction (lupin.slo), TTFT and TPOT blended by ttftWeight/tpotWeight.
--
-- Which endpoints are scored, the rest scoring 0: those meeting both
-- objectives (headroom ≥ 0; an endpoint without a prediction counts there,
-- at headroom 0, as upstream); when none does, the idle ones (no request in
-- flight); when none is, the least bad bucket: only TPOT missed, then only
-- TTFT missed, then both.  Within them each headroom's magnitude is
-- normalized over the scored endpoints; a dimension where all are equal
-- gives its weight to the other.  "least" prefers the endpoint closest to
-- its objectives (bin packing), "most" the one with the most headroom; a
-- missed objective always uses "least".  Without any prediction: a blend of
-- free KV cache, relative waiting queue and the producer's prefix match.
local slo = require "lupin.slo"

local W_MAX, EPS = 100, 1e-9
local abs, floor, huge, max, min = math.abs, math.floor, math.huge, math.max, math.min

-- Upstream's weights as a convex blend; both 0 means TTFT alone.
local function normalized(a, b)
  local sum = a + b
  if sum <= 0 then
    return 1, 0
  end
  return a / sum, b / sum
end

-- NaN (a metric never scraped) reads 0, as in the EPP.
local function metric(v)
  return v == v and v or 0
end

-- Scores the endpoints whose indices are in `bucket` (ttft[i], tpot[i]:
-- their headrooms) into scores; least: closest to the objectives first.
local function score_bucket(self, bucket, ttft, tpot, scores, least)
  local lo_a, hi_a, lo_b, hi_b = huge, -huge, huge, -huge
  for _, i in ipairs(bucket) do
    local a, b = abs(ttft[i]), abs(tpot[i])
    lo_a, hi_a = min(lo_a, a), max(hi_a, a)
    lo_b, hi_b = min(lo_b, b), max(hi_b, b)
  end
  local range_a, range_b = hi_a - lo_a, hi_b - lo_b
  local alpha, beta = self.alpha, self.beta
  -- a dimension that cannot tell the endpoints apart would squeeze every
  -- score towards one value: the other dimension takes its weight
  if range_a <= EPS and range_b > EPS then
    alpha, beta = 0, 1
  elseif range_b <= EPS and range_a > EPS then
    alpha, beta = 1, 0
  end
  for _, i in ipairs(bucket) do
    local na = range_a > EPS and (abs(ttft[i]) - lo_a) / range_a or 0.5
    local nb = range_b > EPS and (abs(tpot[i]) - lo_b) / range_b or 0.5
    local combined = alpha * na + beta * nb
    local w = floor((least and 1 - combined or combined) * W_MAX) + 1
    scores[i] = min(w, W_MAX) / W_MAX -- upstream's best is 1.01; lupin's scores stop at 1
  end
end

-- Without predictions: free KV cache, the waiting queue relative to the
-- longest among the candidates, and the prefix match, blended.
local function composite(self, endpoints, pl)
  local wkv, wq, wpre = self.kv, self.queue, self.prefix
  local sum = wkv + wq + wpre
  if sum <= 0 then
    wkv, wq, wpre, sum = 1, 0, 0, 1
  end
  wkv, wq, wpre = wkv / sum, wq / sum, wpre / sum
  local prefix = pl and pl.prefix or {}
  local max_q = 0
  for _, ep in ipairs(endpoints) do
    max_q = max(max_q, metric(ep.waiting_queue_size))
  end
  local scores = {}
  for i, ep in ipairs(endpoints) do
    local rel_q = max_q > 0 and (max_q - metric(ep.waiting_queue_size)) / max_q or 1
    local c = wkv * (1 - metric(ep.kv_cache_usage)) + wq * rel_q + wpre * (prefix[ep.id] or 0)
    scores[i] = floor(W_MAX * c + 0.5) / W_MAX
  end
  return scores
end

---@type lupin.Plugin
return {
  type = "latency-scorer",
  schema = {
    ttftWeight = { type = "number", default = 0.8, min = 0,
      description = "weight of TTFT headroom in the blend" },
    tpotWeight = { type = "number", default = 0.2, min = 0,
      description = "weight of TPOT headroom in the blend (0 for non-streaming traffic)" },
    headroomSelectionStrategy = { type = "string", default = "least", enum = { "least", "most" },
      description = "least: closest to the objectives (bin packing); most: the most headroom" },
    compositeKVWeight = { type = "number", default = 1, min = 0,
      description = "without predictions: weight of free KV cache" },
    compositeQueueWeight = { type = "number", default = 1, min = 0,
      description = "without predictions: weight of the relative waiting queue" },
    compositePrefixWeight = { type = "number", default = 1, min = 0,
      description = "without predictions: weight of the producer's prefix-cache match" },
  },

  new = function(p)
    local alpha, beta = normalized(p.ttftWeight, p.tpotWeight)
    return { alpha = alpha, beta = beta, most = p.headroomSelectionStrategy == "most",
      kv = p.compositeKVWeight, queue = p.compositeQueueWeight, prefix = p.compositePrefixWeight }
  end,

  score = function(self, ctx, endpoints)
    local pl = slo.predictions(ctx)
    local preds = pl and pl.endpoints
    local ttft, tpot, dispatched = {}, {}, {}
    local positive, negative, any = {}, {}, false
    for i, ep in ipairs(endpoints) do
      local p = preds and preds[ep.id]
      if p then
        any = true
        ttft[i], tpot[i], dispatched[i] = p.ttft_headroom, p.tpot_headroom, p.dispatched
      else
        ttft[i], tpot[i] = 0, 0
      end
      local list = p and (ttft[i] < 0 or tpot[i] < 0) and negative or positive
      list[#list + 1] = i
    end
    if not any then
      return composite(self, endpoints, pl)
    end
    local scores = {}
    for i = 1, #endpoints do
      scores[i] = 0
    end
    if #positive > 0 then
      score_bucket(self, positive, ttft, tpot, scores, not self.most)
      return scores
    end
    -- every objective missed somewhere: idle endpoints take the load first,
    -- then the least bad bucket; "most" would favour the worst, so "least"
    local idle, tpot_only, ttft_only, both = {}, {}, {}, {}
    for _, i in ipairs(negative) do
      if dispatched[i] == 0 then
        idle[#idle + 1] = i
      end
      local list = ttft[i] >= 0 and tpot_only or tpot[i] >= 0 and ttft_only or both
      list[#list + 1] = i
    end
    local bucket = #idle > 0 and idle or #tpot_only > 0 and tpot_only or #ttft_only > 0 and ttft_only
      or both
    score_bucket(self, bucket, ttft, tpot, scores, true)
    return scores
  end,
}
