-- llm-d-router's disagg-profile-handler: decode (D) always runs first and is
-- the primary; then encode (E) when deciders.encode names a decider that says
-- yes, then prefill (P) when deciders.prefill does.  No decider, no stage:
-- decode only.  The decode pick is put in ctx.shared[disagg.PEER] before
-- prefill runs (upstream's peer endpoint, read by the topology plugins).
-- Before forwarding it writes the headers the sidecar reads
-- (x-prefiller-host-port, x-encoder-hosts-ports), as upstream's PreRequest.
-- The flat parameters of older versions (decodeProfile, deciderPluginName...)
-- are accepted, but not mixed with profiles/deciders, as upstream.
local disagg = require "lupin.disagg"

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
    -- pd-profile-handler's, accepted so its configs switch type unchanged;
    -- upstream ignores them here too
    prefixPluginType = string_param("ignored (pd-profile-handler's)"),
    prefixPluginName = string_param("ignored (pd-profile-handler's)"),
    primaryPort = { type = "integer", description = "ignored (pd-profile-handler's)" },
  },

  new = function(p, env)
    local profiles, deciders = normalize(p, env)
    return { decode = profiles.decode or "decode", prefill = profiles.prefill or "prefill",
      encode = profiles.encode or "encode", names = deciders, env = env }
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
