-- The EPP's round-robin-fairness-policy: the band serves its flows (fairness
-- ids, x-gateway-inference-fairness-id) in turn, one request each, in id
-- order, skipping flows with nothing waiting: a tenant sending ten times the
-- requests of another gets the same share of dispatches while both wait.
-- The cursor (the last flow served) is kept in band.state.
---@type lupin.Plugin
return {
  type = "round-robin-fairness-policy",
  schema = {},

  pick_flow = function(self, band, flows)
    local st = band.state
    local last = st[self] -- per instance: two policies may share a band over reloads
    if last then
      for _, f in ipairs(flows) do
        if f.id > last then
          st[self] = f.id
          return f
        end
      end
    end
    st[self] = flows[1].id
    return flows[1]
  end,
}
