-- Spreads cold requests (no endpoint has any of their prefix cached) over the
-- endpoints least recently given a cold request, so new prefixes land on
-- different endpoints instead of piling onto one.  Warm requests get 0.5
-- everywhere: this scorer then leaves the choice to the others.  As llm-d's
-- no-hit-lru-scorer; it reads what the prefix scorer named prefixPluginName
-- published for the request (without that scorer every request is cold).
local function rank_of(self, endpoints)
  local rank, n = {}, 0
  for _, ep in ipairs(endpoints) do -- never used first, in candidate order
    if not self.pos[tostring(ep)] then
      rank[ep], n = n, n + 1
    end
  end
  local used = {}
  for _, ep in ipairs(endpoints) do
    if self.pos[tostring(ep)] then
      used[#used + 1] = ep
    end
  end
  table.sort(used, function(a, b) -- least recently used first
    return self.pos[tostring(a)] > self.pos[tostring(b)]
  end)
  for _, ep in ipairs(used) do
    rank[ep], n = n, n + 1
  end
  return rank
end

-- Moves name to the front of the LRU (position 1), dropping the oldest past lruSize.
local function touch(self, name)
  local lru = self.lru
  for i = 1, #lru do
    if lru[i] == name then
      table.remove(lru, i)
      break
    end
  end
  table.insert(lru, 1, name)
  if #lru > self.size then
    lru[#lru] = nil
  end
  self.pos = {}
  for i, v in ipairs(lru) do
    self.pos[v] = i
  end
end

local function is_cold(st)
  for _, n in pairs(st.matches) do
    if n > 0 then
      return false
    end
  end
  return true
end

---@type lupin.Plugin
return {
  type = "no-hit-lru-scorer",
  schema = {
    lruSize = { type = "integer", default = 1024, min = 1, max = 1048576, fallback = 1024,
      description = "endpoints remembered; forgotten ones count as never used" },
    prefixPluginName = { type = "string", default = "prefix-cache-scorer",
      description = "the prefix-cache-scorer instance whose matches tell cold from warm" },
    prefixMatchInfoProducerName = { type = "string",
      description = "the prefix producer (approx- or precise-prefix-cache-producer) whose"
        .. " matches are read instead (llm-d-router's name for the source)" },
    prefixPluginType = { type = "string",
      description = "accepted, no effect (deprecated upstream: never used)" },
  },

  new = function(p)
    return { size = p.lruSize, prefix = p.prefixMatchInfoProducerName or p.prefixPluginName,
      lru = {}, pos = {} }
  end,

  migrate = function(self, old)
    for i = math.min(#old.lru, self.size), 1, -1 do
      touch(self, old.lru[i])
    end
  end,

  -- No prefix information (no such prefix scorer) counts as cold, as in llm-d.
  score = function(self, ctx, endpoints)
    local st, out, n = ctx.shared[self.prefix], {}, #endpoints
    if st and not is_cold(st) then
      for i = 1, n do
        out[i] = 0.5
      end
      return out
    end
    ctx.plugin.cold = true
    local rank = rank_of(self, endpoints)
    for i, ep in ipairs(endpoints) do
      out[i] = n > 1 and 1 - rank[ep] / (n - 1) or 1
    end
    return out
  end,

  -- Only cold requests move the LRU: it orders endpoints by their last cold
  -- request.  In P/D serving the prefill endpoint took the cold prompt too.
  pre_request = function(self, ctx, result)
    if not ctx.plugin.cold then
      return
    end
    for _, name in ipairs({ result.primary, "prefill" }) do
      local res = result.profiles[name]
      if res and res.endpoints[1] then
        touch(self, tostring(res.endpoints[1]))
      end
    end
  end,
}
