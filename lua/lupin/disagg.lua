-- Disaggregated serving (llm-d-router's P/D and E/P/D): what the profile
-- handlers, deciders and header handlers share.  A decider is a plugin
-- instance with disaggregate(self, ctx, decode_endpoint) -> boolean, named
-- by a handler's parameters and resolved once every instance exists.
---@class lupin.disagg
local M = {}

M.PREFILL_HEADER = "x-prefiller-host-port"
M.ENCODE_HEADER = "x-encoder-hosts-ports"
M.DP_HEADER = "x-data-parallel-host-port"

-- The ctx.shared key under which disagg-profile-handler puts the decode
-- pick before it runs the prefill profile: the peer the topology plugins
-- compare prefill candidates with.
M.PEER = "peer-endpoint"

-- Upstream's estimate: the request is not tokenized (AverageCharactersPerToken).
M.CHARS_PER_TOKEN = 4

-- The plugins that publish prefix matches in ctx.shared, by default name:
-- the producer first, as upstream's decider reads the producer's data.
local MATCH_SOURCES = { "approx-prefix-cache-producer", "prefix-cache-scorer" }

--- The decider instance named `ref` for `field` (an error naming the field
--- when there is none, or it is not a decider).  Call from init.
---@param env lupin.Env
---@param field string the parameter, for the message
---@param ref string
---@return table
function M.decider(env, field, ref)
  local obj, type_ = env.plugin(ref)
  if not obj then
    error(("%s: no plugin named %q in this config"):format(field, ref), 0)
  elseif type(obj.disaggregate) ~= "function" then
    error(("%s: plugin %q (%s) is not a decider (prefix-based-pd-decider,"
      .. " always-disagg-pd-decider, always-disagg-multimodal-decider)"):format(field, ref, type_), 0)
  end
  return obj
end

--- The request's prompt in tokens, estimated as upstream does (characters / 4;
--- for chat the JSON of the messages, which is lupin's prompt for chat).
---@param ctx lupin.Ctx
function M.prompt_tokens(ctx)
  return math.floor(#ctx.request.prompt / M.CHARS_PER_TOKEN)
end

--- Tokens of the prompt the endpoint holds, from the prefix matches a
--- producer or scorer published (`source`, or the default names); 0 when
--- no prefix plugin ran.  lupin's blocks are characters: 4 make a token.
---@param ctx lupin.Ctx
---@param ep lupin.Endpoint
---@param source string?
function M.cached_tokens(ctx, ep, source)
  local st = source and ctx.shared[source]
  if not source then
    for _, name in ipairs(MATCH_SOURCES) do
      st = st or ctx.shared[name]
    end
  end
  if not st then
    return 0
  end
  return math.floor((st.matches[ep.id] or 0) * st.block_size / M.CHARS_PER_TOKEN)
end

-- Content part types that need an encoder (upstream's hasMultimodalContent).
local MEDIA = { image_url = true, video_url = true, input_audio = true }

--- Whether a chat request carries images, video or audio.
---@param body table|false
function M.multimodal(body)
  local messages = type(body) == "table" and body.messages
  if type(messages) ~= "table" then
    return false
  end
  for _, m in ipairs(messages) do
    local content = type(m) == "table" and m.content
    if type(content) == "table" then
      for _, part in ipairs(content) do
        if type(part) == "table" and MEDIA[part.type] then
          return true
        end
      end
    end
  end
  return false
end

--- Writes the headers a P/D sidecar reads: x-prefiller-host-port (the
--- prefill profile's endpoint) and x-encoder-hosts-ports (every endpoint
--- the encode profile picked, comma-separated), for the stages that ran.
---@param ctx lupin.Ctx
---@param result lupin.Result
---@param prefill string the prefill profile's name
---@param encode string the encode profile's name
function M.set_headers(ctx, result, prefill, encode)
  local p = result.profiles[prefill]
  if p and p.endpoints[1] then
    ctx:set_header(M.PREFILL_HEADER, p.endpoints[1].hostport)
  end
  local e = result.profiles[encode]
  if e and #e.endpoints > 0 then
    local list = {}
    for i, ep in ipairs(e.endpoints) do
      list[i] = ep.hostport
    end
    ctx:set_header(M.ENCODE_HEADER, table.concat(list, ","))
  end
end

-- Topology levels, tightest first; a pair sharing none is at NO_LEVEL.
M.LEVELS = { host = 1, rack = 2, zone = 3, region = 4 }
M.NO_LEVEL = 5

--- The topology-extractor instance named `ref` for `field`, or nil with a
--- warning at the field when the config has none (the topology plugins
--- then do nothing, as upstream's); an error when `ref` is another type.
--- Call from init.
---@param env lupin.Env
---@param field string
---@param ref string
function M.topology_producer(env, field, ref)
  local obj, type_ = env.plugin(ref)
  if not obj then
    env.warn(field, "no plugin named %q: without topology-extractor no endpoint has a topology,"
      .. " so this plugin does nothing; add a topology-extractor", ref)
    return nil
  elseif type(obj.topology) ~= "function" or type(obj.level) ~= "function" then
    error(("%s: plugin %q (%s) is not a topology-extractor"):format(field, ref, type_), 0)
  end
  return obj
end

--- The topology of the request's peer (the decode pick, when the prefill
--- profile runs), or nil.
---@param ctx lupin.Ctx
---@param producer table? a topology-extractor instance
function M.peer_topology(ctx, producer)
  local peer = producer and ctx.shared[M.PEER]
  return peer and producer:topology(peer)
end

return M
