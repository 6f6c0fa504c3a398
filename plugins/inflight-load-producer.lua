-- llm-d-router's inflight-load-producer: a request's tokens in flight on the
-- endpoints chosen for it.  Before the profiles run it estimates the request
-- and publishes, in ctx.shared[<its name>], { input, output, tokens }:
-- tokens[ep.id] is what the request would add on ep, its input less the part
-- the prefix plugins found cached there, plus the output estimate.
-- token-load-scorer reads it (inFlightLoadProducerName).  pre_request holds
-- those tokens on each profile's chosen endpoint with ctx:set_in_flight_tokens,
-- so ep.in_flight_tokens (one counter per endpoint for every worker of the
-- process, which the core empties when the request ends, on every path) is
-- the in-flight load; the first body byte of a streamed response takes off
-- what prefill has done (the input; with the output estimate, the prefill
-- profile's share).  Requests in flight are the core's count, ep.in_flight.
--
-- Upstream counts tokenized input; lupin runs no tokenizer, so the input is
-- ceil(prompt characters / 4), as everywhere in lupin.
local CHARS_PER_TOKEN = 4
local PREFILL = "prefill" -- the profile whose endpoint is done at the first byte
-- Where a route carries the client's output cap, first found first (upstream's
-- openai parser); a negative or fractional value is skipped.
local CAPS = {
  { "/chat/completions", { "max_completion_tokens", "max_tokens" } },
  { "/completions", { "max_tokens" } },
  { "/responses", { "max_output_tokens" } },
}
-- Plugins whose prepare publishes { block_size, total, matches } under their name.
local SOURCE_TYPES = { ["approx-prefix-cache-producer"] = true,
  ["precise-prefix-cache-producer"] = true, ["prefix-cache-scorer"] = true }
local DEFAULT_SOURCES = { "approx-prefix-cache-producer", "precise-prefix-cache-producer",
  "prefix-cache-scorer" }

local function input_tokens(request)
  return math.ceil(#request.prompt / CHARS_PER_TOKEN)
end

-- The client's own output cap, nil when it gave none (upstream's parser).
local function client_cap(request)
  local body, path = request.body, request.path or ""
  if type(body) ~= "table" then
    return nil
  end
  for _, row in ipairs(CAPS) do
    if path:find(row[1], 1, true) then
      for _, k in ipairs(row[2]) do
        local v = body[k]
        if type(v) == "number" and v >= 0 and v % 1 == 0 and v < math.huge then
          return v
        end
      end
      return nil
    end
  end
end

-- round(input × ratio), capped by the client's and the operator's maximum.
local function output_tokens(input, ratio, client, operator)
  if input <= 0 then
    return 0
  end
  local est = math.floor(input * ratio + 0.5) -- Go's math.Round for x ≥ 0
  if client and client >= 0 and client < est then
    est = client
  end
  if operator and operator >= 0 and operator < est then
    est = operator
  end
  return est
end

-- The input ep has to compute: the indexed blocks it has not cached, plus
-- the prompt past the last indexed block (the prefix plugins cap what they
-- hash).  Without matches, the whole input.
local function uncached(input, info, ep)
  if not info or type(info.matches) ~= "table" or not info.block_size
    or info.block_size <= 0 then
    return input
  end
  local per = info.block_size / CHARS_PER_TOKEN -- tokens a block
  local indexed = info.total * per
  local left = math.max(0, indexed - (info.matches[ep.id] or 0) * per)
  return math.floor(left + math.max(0, input - indexed))
end

local NO_EFFECT = "has no effect in lupin: %s"

---@type lupin.Plugin
return {
  type = "inflight-load-producer",
  data_producer = true,
  -- exported for the spec's vectors (token_estimator_test.go)
  input_tokens = input_tokens,
  client_cap = client_cap,
  output_tokens = output_tokens,
  uncached = uncached,
  schema = {
    addEstimatedOutputTokens = { type = "boolean", default = false,
      description = "add round(input × outputRatio) estimated output tokens to the load" },
    outputRatio = { type = "number", default = 1.5, min = 0, max = 1000000,
      description = "estimated output tokens per input token" },
    maxEstimatedOutputTokens = { type = "integer", min = 0,
      description = "the most output tokens estimated for a request (unset: no cap)" },
    prefixMatchInfoProducerName = { type = "string",
      description = "the prefix producer whose matches are not counted as input (default: one"
        .. " named approx-prefix-cache-producer, precise-prefix-cache-producer or"
        .. " prefix-cache-scorer)" },
    syncCrossReplicaState = { type = "boolean",
      description = "no effect: lupin shares no in-flight load between replicas" },
  },

  new = function(p, env)
    if p.syncCrossReplicaState then
      env.warn("syncCrossReplicaState", NO_EFFECT, "no cross-replica syncer exists (data"
        .. ".crossReplica is refused); the load counted is this process's, every worker's"
        .. " (docs/replicas.md)")
    end
    return { name = env.name, env = env, out = p.addEstimatedOutputTokens,
      ratio = p.outputRatio, max_out = p.maxEstimatedOutputTokens,
      source_name = p.prefixMatchInfoProducerName }
  end,

  -- The prefix source: the one named (lupin.datalayer checks it is a prefix
  -- producer), else one of the default names, else none.
  init = function(self)
    for _, name in ipairs(self.source_name and { self.source_name } or DEFAULT_SOURCES) do
      local _, type_ = self.env.plugin(name)
      if SOURCE_TYPES[type_] then
        self.source = name
        return
      end
    end
  end,

  -- Runs after the other plugins' prepare (lupin.datalayer orders it), when
  -- the prefix matches are published.
  prepare = function(self, ctx, endpoints)
    local req = ctx.request
    local input = input_tokens(req)
    local out = self.out and output_tokens(input, self.ratio, client_cap(req), self.max_out) or 0
    local info = self.source and ctx.shared[self.source]
    local tokens = {}
    for _, ep in ipairs(endpoints) do
      tokens[ep.id] = uncached(input, info, ep) + out
    end
    ctx.shared[self.name] = { input = input, output = out, tokens = tokens }
  end,

  -- Each profile's first pick holds the request's tokens there; an endpoint
  -- two profiles chose holds both shares, as upstream counts each profile.
  pre_request = function(self, ctx, result)
    local pub = ctx.shared[self.name]
    if not pub then
      return
    end
    local held = {}
    for name, res in pairs(result.profiles) do
      local ep = res and res.endpoints[1]
      local n = ep and pub.tokens[ep.id]
      if n then
        local e = held[ep.id] or { ep = ep, total = 0, prefill = 0 }
        held[ep.id] = e
        e.total = e.total + n
        e.prefill = e.prefill + (name == PREFILL and n or 0)
      end
    end
    for _, e in pairs(held) do
      ctx:set_in_flight_tokens(e.ep, e.total)
    end
    -- a response that is not streamed is released whole at its end (the core)
    if ctx.request.stream then
      ctx.plugin.held = held
    end
  end,

  -- The first body byte: prefill is done.  Input only: nothing is left in
  -- flight; with the output estimate, all but the prefill profile's share.
  response_chunk = function(self, ctx)
    local st = ctx.plugin
    local held = st.held
    if not held then
      return
    end
    st.held = nil
    for _, e in pairs(held) do
      local left = self.out and e.total - e.prefill or 0
      if left ~= e.total then
        ctx:set_in_flight_tokens(e.ep, left)
      end
    end
  end,
}
