-- The oracle of the routing benchmark: it is told each request's prefix
-- group (the benchmark client's x-bench-group header, which no real router
-- has) and sends group g to the (g mod n)-th candidate by ip:port, so every
-- group lives on exactly one endpoint and groups are spread evenly.  With the
-- benchmark's cache sizes each endpoint's share of system prompts fits in
-- its cache: after a group's first request every request hits.
-- Without the header it falls back to round-robin.
local HEADER = "x-bench-group"

local function by_hostport(a, b)
  return a.hostport < b.hostport
end

return {
  type = "group-oracle-picker",
  schema = {},

  new = function()
    return { next = 0 }
  end,

  pick = function(self, ctx, scored)
    local eps = {}
    for i, ep in ipairs(scored.endpoints) do
      eps[i] = ep
    end
    table.sort(eps, by_hostport)
    local g = tonumber(ctx.request.headers[HEADER] or "")
    if not g then
      g = self.next
      self.next = self.next + 1
    end
    return { eps[math.floor(g) % #eps + 1] }
  end,
}
