-- The EPP's global-strict-fairness-policy: no fairness between flows — the
-- band serves the request its ordering puts first across all its flows (with
-- fcfs: the oldest in the band), whichever flow holds it.  The default
-- fairness of every priority band.  A fairness policy of flow control
-- (docs/flow-control.md): pick_flow(band, flows) names the flow to serve.
---@type lupin.Plugin
return {
  type = "global-strict-fairness-policy",
  schema = {},

  pick_flow = function(_, band, flows)
    local best = flows[1]
    for i = 2, #flows do
      if band:less(flows[i]:head(), best:head()) then
        best = flows[i]
      end
    end
    return best
  end,
}
