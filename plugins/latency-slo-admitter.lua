-- llm-d-router's latency-slo-admitter: refuses a sheddable request (429)
-- when no candidate endpoint can be expected to meet its latency objectives
-- by predicted-latency-producer's predictions (lupin.slo).  It admits when
-- a candidate has a valid prediction (both objectives met), or is idle
-- (nothing in flight there through this gateway), or is cold (KV cache
-- under 2% used: its predictions are not to be trusted yet).  Requests it
-- cannot judge are admitted: no producer, no objective set, or no
-- prediction for any candidate.
--
-- Sheddable: priority < priorityThreshold (lupin's parameter; upstream
-- sheds priority < 0, the default).  The priority is the one flow control
-- computes from the request's objective header (ctx.request.priority).
local slo = require "lupin.slo"

-- Below this KV-cache use an endpoint is cold: upstream's 2%.
local COLD = 0.02

local function refusal(s, priority, threshold)
  local named = {}
  if s.ttft then
    named[#named + 1] = ("ttft %g ms"):format(s.ttft)
  end
  if s.tpot then
    named[#named + 1] = ("tpot %g ms"):format(s.tpot)
  end
  return ("no endpoint can meet the request's latency objectives (%s): none is predicted within"
    .. " them, none is idle, none is cold; the request is sheddable (priority %d < %d); retry later"
    .. " or raise its priority"):format(table.concat(named, ", "), priority, threshold)
end

---@type lupin.Plugin
return {
  type = "latency-slo-admitter",
  schema = {
    priorityThreshold = { type = "integer", default = 0,
      description = "requests with a lower priority are sheddable; the others are always admitted" },
  },

  new = function(p)
    return { threshold = p.priorityThreshold }
  end,

  admit = function(self, ctx, endpoints)
    local priority = ctx.request.priority or 0
    if priority >= self.threshold then
      return
    end
    local pl = slo.predictions(ctx)
    if not pl or not (pl.slo.ttft or pl.slo.tpot) then
      return
    end
    local preds, predicted = pl.endpoints, false
    for _, ep in ipairs(endpoints) do
      local p = preds[ep.id]
      local kv = ep.kv_cache_usage
      if p then
        predicted = true
        if p.valid then
          return
        end
      end
      if (p and p.dispatched or ep.in_flight) == 0 or (kv == kv and kv or 0) < COLD then
        return
      end
    end
    if not predicted then
      return
    end
    return false, 429, refusal(pl.slo, priority, self.threshold)
  end,
}
