-- Prefers endpoints where the request's model (a LoRA adapter) is already
-- loaded: 1.0 when it is active there; else 0.8 when the endpoint can load
-- another adapter (active + waiting < max LoRA); else 0.6 when it is waiting
-- there; else 0.
---@type lupin.Plugin
return {
  type = "lora-affinity-scorer",
  schema = {},

  score = function(_, ctx, endpoints)
    local model = ctx.request.model
    local scores = {}
    for i = 1, #endpoints do
      local ep = endpoints[i]
      local active, waiting = ep.active_adapters, ep.waiting_adapters
      local s = 0
      if model and active[model] then
        s = 1.0
      elseif #active + #waiting < ep.max_lora then
        s = 0.8
      elseif model and waiting[model] then
        s = 0.6
      end
      scores[i] = s
    end
    return scores
  end,
}
