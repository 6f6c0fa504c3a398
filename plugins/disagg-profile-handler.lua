-- llm-d-router's disagg-profile-handler: by default decode (D) runs first and is
-- the primary; then encode (E) when deciders.encode names a decider that says
-- yes, then prefill (P) when deciders.prefill does.  No decider, no stage:
-- decode only.  The decode pick is put in ctx.shared[disagg.PEER] before
-- prefill runs (upstream's peer endpoint, read by the topology plugins).
-- Before forwarding it writes the headers the sidecar reads
-- (x-prefiller-host-port, x-encoder-hosts-ports), as upstream's PreRequest.
-- The flat parameters of older versions (decodeProfile, deciderPluginName...)
-- are accepted, but not mixed with profiles/deciders, as upstream.
--
-- stageOrder "prefill-first" turns the order round: prefill (whenever its
-- profile exists), then encode if its decider says so (it sees no decode
-- endpoint yet), then decode, still the primary.  No prefill decider then.
local disagg = require "lupin.disagg"

local DECODE_FIRST, PREFILL_FIRST = "decode-first", "prefill-first"

-- upstream's spellings: case, "-" and "_" do not matter; "decode"/"prefill" too
local function stage_order(s)
  local k = (s or ""):lower():gsub("[-_]", "")
  if k == "" or k == "decodefirst" or k == "decode" then
    return DECODE_FIRST
  elseif k == "prefillfirst" or k == "prefill" then
    return PREFILL_FIRST
  end
  error(("invalid stage order %q, must be %q or %q"):format(s, DECODE_FIRST, PREFILL_FIRST), 0)
end

local NESTED = { profiles = { decode = true, prefill = true, encode = true },
  deciders = { prefill = true, encode = true } }
-- legacy flat name -> nested field
local FLAT = { decodeProfile = "profiles.decode", prefillProfile = "profiles.prefill",
  encodeProfile = "profiles.encode", prefillDeciderPluginName = "deciders.prefill",
  encodeDeciderPluginName = "deciders.encode", deciderPluginName = "deciders.prefill" }

local function nested(p, section)
  local t = p[section] or {}
  for k, v in pairs(t) do
    if not NESTED[section][k] then
      error(("%s.%s: unknown; known: %s"):format(section, tostring(k),
        section == "profiles" and "decode, prefill, encode" or "prefill, encode"), 0)
    elseif type(v) ~= "string" then
      error(("%s.%s: must be a string, got %s"):format(section, k, tostring(v)), 0)
    end
  end
  return t
end

-- The parameters as { profiles = {...}, deciders = {...} }, from either format.
local function normalize(p, env)
  local profiles, deciders = nested(p, "profiles"), nested(p, "deciders")
  local flat = {}
  for name in pairs(FLAT) do
    if p[name] ~= nil then
      flat[#flat + 1] = name
    end
  end
  table.sort(flat)
  if #flat == 0 then
    return profiles, deciders
  elseif p.profiles or p.deciders then
    error(("cannot mix the deprecated flat parameters (%s) with profiles/deciders: use one"
      .. " format"):format(table.concat(flat, ", ")), 0)
  end
  for _, name in ipairs(flat) do
    local section, field = FLAT[name]:match("(%a+)%.(%a+)")
    local t = section == "profiles" and profiles or deciders
    -- deciderPluginName (pd-profile-handler's) yields to prefillDeciderPluginName
    if not (name == "deciderPluginName" and p.prefillDeciderPluginName) then
      t[field] = p[name]
      env.log("info", "deprecated parameter %s: use %s", name, FLAT[name])
    end
  end
  return profiles, deciders
end

-- prefill-first: prefill when its profile exists, encode if its decider
-- says so, then decode; after decode, nothing more
local function pick_prefill_first(self, ctx, profiles, results)
  if results[self.decode] ~= nil then
    return {}
  end
  if profiles[self.prefill] and results[self.prefill] == nil then
    return { self.prefill }
  end
  local decider, skipped = self.encode_decider, ctx.plugin
  if decider and profiles[self.encode] and results[self.encode] == nil and not skipped.encode then
    if decider:disaggregate(ctx, nil) then
      return { self.encode }
    end
    skipped.encode = true
  end
  if not profiles[self.decode] then
    error(("no scheduling profile named %q (profiles.decode)"):format(self.decode))
  end
  return { self.decode }
end

local function string_param(description)
  return { type = "string", description = description }
end

---@type lupin.Plugin
return {
  type = "disagg-profile-handler",
  schema = {
    profiles = { type = "object",
      description = "profile names: decode (default \"decode\"), prefill, encode" },
    deciders = { type = "object",
      description = "decider plugin names: prefill enables P/D, encode enables E" },
    decodeProfile = string_param("deprecated: profiles.decode"),
    prefillProfile = string_param("deprecated: profiles.prefill"),
    encodeProfile = string_param("deprecated: profiles.encode"),
    prefillDeciderPluginName = string_param("deprecated: deciders.prefill"),
    encodeDeciderPluginName = string_param("deprecated: deciders.encode"),
    deciderPluginName = string_param("deprecated (pd-profile-handler's): deciders.prefill"),
    stageOrder = string_param("\"decode-first\" (the default) or \"prefill-first\""),
    -- pd-profile-handler's: refused with a message saying so, as upstream
    -- (llm-d-router #1068) refuses them here
    prefixPluginType = { type = "any", description = "refused (pd-profile-handler's)" },
    prefixPluginName = { type = "any", description = "refused (pd-profile-handler's)" },
    primaryPort = { type = "any", description = "refused (pd-profile-handler's)" },
  },

  new = function(p, env)
    for _, k in ipairs({ "prefixPluginType", "prefixPluginName", "primaryPort" }) do
      if p[k] ~= nil then
        error(("%s is pd-profile-handler's: disagg-profile-handler refuses it, as llm-d-router"
          .. " does; remove it"):format(k), 0)
      end
    end
    local profiles, deciders = normalize(p, env)
    local order = stage_order(p.stageOrder)
    if order == PREFILL_FIRST and deciders.prefill then
      error(("deciders.prefill: no prefill decider in %s stage order (prefill always"
        .. " runs first)"):format(PREFILL_FIRST), 0)
    end
    return { decode = profiles.decode or "decode", prefill = profiles.prefill or "prefill",
      encode = profiles.encode or "encode", names = deciders, env = env,
      prefill_first = order == PREFILL_FIRST }
  end,

  -- the deciders may be declared after the handler: resolved once all exist
  init = function(self)
    for _, stage in ipairs({ "encode", "prefill" }) do
      local ref = self.names[stage]
      if ref then
        self[stage .. "_decider"] = disagg.decider(self.env, "deciders." .. stage, ref)
      end
    end
  end,

  -- One stage per call: decode; encode if its decider says so; prefill if
  -- its decider says so.  A stage a decider declined is remembered for the
  -- request, so the decider is asked once.
  pick_profiles = function(self, ctx, profiles, results)
    if self.prefill_first then
      return pick_prefill_first(self, ctx, profiles, results)
    end
    local decode = results[self.decode]
    if decode == nil then
      if not profiles[self.decode] then
        error(("no scheduling profile named %q (profiles.decode)"):format(self.decode))
      end
      return { self.decode }
    elseif not decode then
      return {} -- decode found no endpoint: the request fails with its reason
    end
    local ep, skipped = decode.endpoints[1], ctx.plugin
    for _, stage in ipairs({ "encode", "prefill" }) do
      local name, decider = self[stage], self[stage .. "_decider"]
      if decider and profiles[name] and results[name] == nil and not skipped[stage] then
        if decider:disaggregate(ctx, ep) then
          if stage == "prefill" then
            ctx.shared[disagg.PEER] = ep -- what the topology plugins compare candidates with
          end
          return { name }
        end
        skipped[stage] = true
      end
    end
    return {}
  end,

  process_results = function(self)
    return { primary = self.decode }
  end,

  pre_request = function(self, ctx, result)
    disagg.set_headers(ctx, result, self.prefill, self.encode)
  end,
}
