-- llm-d's context-length-aware plugin: a scorer (and, with enableFiltering,
-- a filter) by the context length range an endpoint's label declares,
-- "min-max" or several, comma-separated ("0-2048,8192-16384").  The
-- request's length is its prompt's characters × 0.25, upstream's estimate
-- without a tokenizer (lupin has none).
--
-- Score: 0.5 without the label, 0 for a label that does not parse; in a
-- range, 0.3 + 0.7 × (0.7 / (1 + width / 10000) + 0.3 × headroom / width)
-- (1 for a zero-width range), the best range wins; in none, 0.3 / (1 +
-- distance / 1000) to the nearest range (llm-d-router
-- .../scorer/contextlengthaware/context_length_aware.go).  An in-range score
-- stays above 0.3 and a fallback below it, so any match beats every miss,
-- however wide its range.  Filter: endpoints without the label stay; a label
-- that does not parse removes the endpoint.
local CHARS_TO_TOKENS = 0.25
local FALLBACK = 0.3 -- the ceiling of an out-of-range score, the floor of an in-range one

local function parse(s)
  if s == "" then
    return nil
  end
  local ranges = {}
  for part in (s .. ","):gmatch("([^,]*),") do
    local lo, hi = part:match("^%s*(%d+)%s*%-%s*(%d+)%s*$")
    lo, hi = tonumber(lo), tonumber(hi)
    if not lo or lo > hi then
      return nil
    end
    ranges[#ranges + 1] = { lo, hi }
  end
  return ranges
end

local function score(len, ranges)
  local best, matched = 0, false
  for _, r in ipairs(ranges) do
    local lo, hi = r[1], r[2]
    if len >= lo and len <= hi then
      matched = true
      local width = hi - lo
      if width == 0 then
        return 1
      end
      local s = FALLBACK + (1 - FALLBACK) * (0.7 / (1 + width / 10000) + 0.3 * (hi - len) / width)
      best = math.max(best, s)
    end
  end
  if matched then
    return best
  end
  for _, r in ipairs(ranges) do
    local d = len > r[2] and len - r[2] or r[1] - len
    best = math.max(best, FALLBACK / (1 + d / 1000))
  end
  return best
end

local function length(ctx)
  return math.floor(#(ctx.request.prompt or "") * CHARS_TO_TOKENS)
end

---@type lupin.Plugin
return {
  type = "context-length-aware",
  schema = {
    label = { type = "string", default = "llm-d.ai/context-length-range",
      description = "the endpoint label holding its ranges, \"min-max[,min-max...]\"" },
    enableFiltering = { type = "boolean", default = false,
      description = "also remove endpoints whose ranges miss the request's length" },
  },

  new = function(params)
    if params.label == "" then
      error("'label' must be specified", 0)
    end
    return { label = params.label, filtering = params.enableFiltering }
  end,

  parse = parse,

  filter = function(self, ctx, endpoints)
    if not self.filtering then
      return endpoints
    end
    local len, kept = length(ctx), {}
    for _, ep in ipairs(endpoints) do
      local v = ep.labels and ep.labels[self.label]
      local ranges = v and parse(v)
      local keep = v == nil
      for _, r in ipairs(ranges or {}) do
        keep = keep or (len >= r[1] and len <= r[2])
      end
      if keep then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,

  score = function(self, ctx, endpoints)
    local len, out = length(ctx), {}
    for i, ep in ipairs(endpoints) do
      local v = ep.labels and ep.labels[self.label]
      local ranges = v and parse(v)
      out[i] = v == nil and 0.5 or ranges and score(len, ranges) or 0
    end
    return out
  end,
}
