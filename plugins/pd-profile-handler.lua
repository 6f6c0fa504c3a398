-- Prefill/decode disaggregation (llm-d's pd-profile-handler): runs the decode
-- profile first; then the prefill profile, always when threshold is 0 (as
-- llm-d: `if pdThreshold > 0 { decide } else prefill`), else when the part of
-- the prompt the chosen decode endpoint has not cached (estimated from the
-- prefix scorer's match) is at least threshold characters.  Decode is the
-- primary profile; when it found no endpoint the request fails with its reason.
-- With primaryPort (data parallelism), the request goes to that port of the
-- decode endpoint's address, and x-data-parallel-host-port names the rank.
--
-- Newer llm-d-router configs name a decider instead (deciderPluginName, e.g.
-- a prefix-based-pd-decider): then the decider alone says whether prefill
-- runs, as in disagg-profile-handler; threshold is the older way, not both.
local disagg = require "lupin.disagg"
local DP_HEADER = disagg.DP_HEADER

-- Every matched block is prompt text in lupin's hashes (the model is in the
-- seed, not a block of its own), so no block is discounted.
local function uncached(self, ctx, decode_ep)
  local st = ctx.shared[self.prefix]
  local len = st and st.prompt_length or #ctx.request.prompt
  if not st then
    return len
  end
  local hit = (st.matches[decode_ep.id] or 0) * (st.block_size or self.block)
  return math.max(len - hit, 0)
end

---@type lupin.Plugin
return {
  type = "pd-profile-handler",
  schema = {
    threshold = { type = "integer", min = 0,
      description = "uncached prompt characters from which prefill runs; 0 (the default): always" },
    deciderPluginName = { type = "string",
      description = "the decider instance that says whether prefill runs (instead of threshold)" },
    decodeProfile = { type = "string", default = "decode",
      description = "the profile run first: the primary" },
    prefillProfile = { type = "string", default = "prefill",
      description = "the profile run when prefill runs apart" },
    prefixPluginName = { type = "string", default = "prefix-cache-scorer",
      description = "the prefix-cache-scorer instance whose matches estimate the cached part" },
    prefixPluginType = { type = "string",
      description = "accepted for llm-d configs; prefixPluginName names the instance" },
    hashBlockSize = { type = "integer", default = 64, min = 1,
      description = "characters per matched block, when the prefix scorer does not say" },
    primaryPort = { type = "integer", default = 0, min = 0, max = 65535,
      description = "data parallelism: the port decode requests go to; 0: off" },
  },

  new = function(p, env)
    if p.deciderPluginName and p.threshold then
      error("threshold and deciderPluginName are two ways to decide when prefill runs: give one"
        .. " (deciderPluginName is the newer)", 0)
    end
    return { threshold = p.threshold or 0, decode = p.decodeProfile, prefill = p.prefillProfile,
      prefix = p.prefixPluginName, block = p.hashBlockSize, decider_name = p.deciderPluginName,
      env = env, port = p.primaryPort > 0 and p.primaryPort or nil }
  end,

  -- the decider may be declared after the handler: resolved once all exist
  init = function(self)
    if self.decider_name then
      self.decider = disagg.decider(self.env, "deciderPluginName", self.decider_name)
    end
  end,

  pick_profiles = function(self, ctx, profiles, results)
    if not profiles[self.decode] then
      error(("no scheduling profile named %q (decodeProfile)"):format(self.decode))
    end
    local decode = results[self.decode]
    if decode == nil then
      return { self.decode }
    end
    if not decode or results[self.prefill] ~= nil or not profiles[self.prefill] then
      return {}
    end
    if self.decider then
      if not self.decider:disaggregate(ctx, decode.endpoints[1]) then
        return {}
      end
    elseif self.threshold > 0 and uncached(self, ctx, decode.endpoints[1]) < self.threshold then
      return {}
    end
    return { self.prefill }
  end,

  process_results = function(self, ctx, results)
    local decode = results[self.decode]
    if self.port and decode then
      ctx:set_header(DP_HEADER, decode.endpoints[1].hostport)
    end
    return { primary = self.decode, port = self.port }
  end,
}
