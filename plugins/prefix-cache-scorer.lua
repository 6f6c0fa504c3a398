-- Scores endpoints by how much of the prompt they probably have cached: the
-- fraction of the prompt's leading blocks recorded against them when earlier
-- requests were sent there.  Parameters and behaviour follow the EPP's prefix
-- plugin, so its configs port unchanged (hashBlockSize is its blockSize).
--
-- With matchLengthWeight w > 0 the length of the match counts too, so a long
-- cached prefix beats a short one of the same fraction: w × min(1, matched
-- tokens / matchLengthScaleTokens)² + (1 − w) × fraction, matched tokens
-- being matched blocks × block characters / 4 (no tokenizer).
local prefix = require "lupin.prefix"

local NO_MATCHES = {}

-- The request's hashes and matches, computed once per request and kept in the
-- plugin's private request state; also published read-only in ctx.shared
-- under this instance's name for the plugins that build on it.
local function state(self, ctx, endpoints)
  local st, bs = ctx.plugin, prefix.block_chars(self.block, self.auto, endpoints)
  if st.hashes and st.hashes.block_size == bs then
    return st
  end
  local req = ctx.request
  local body = req.body
  local salt = body and type(body.cache_salt) == "string" and body.cache_salt or ""
  local prompt = req.prompt
  st.hashes = prefix.hashes(prompt, req.model, salt, bs, self.max_blocks)
  st.matches = self.index:match(st.hashes)
  ctx.shared[self.name] = { block_size = bs, total = st.hashes.n, matches = st.matches,
    prompt_length = #prompt }
  return st
end

---@type lupin.Plugin
return {
  type = "prefix-cache-scorer",
  schema = {
    blockSize = { type = "integer", min = 1, max = 1048576, fallback = 64,
      description = "characters per hashed block (default 64)" },
    hashBlockSize = { type = "integer", min = 1, max = 1048576, fallback = 64,
      description = "the EPP's name for blockSize" },
    maxPrefixBlocksToMatch = { type = "integer", default = 256, min = 1, max = 1048576,
      fallback = 256, description = "blocks hashed at most, from the start of the prompt" },
    lruCapacityPerServer = { type = "integer", default = 31250, min = 1, max = 2147483647,
      fallback = 31250, description = "block hashes remembered per endpoint (LRU)" },
    autoTune = { type = "boolean", default = true,
      description = "use the endpoints' reported cache block size and number of blocks" },
    prefixMatchInfoProducerName = { type = "string",
      description = "score the matches this approx-prefix-cache-producer found (newer EPPs'"
        .. " producer/scorer split) instead of hashing here" },
    matchLengthWeight = { type = "number", default = 0, min = 0, max = 1,
      description = "share of the score given to the match's length (0: the fraction alone)" },
    matchLengthScaleTokens = { type = "integer", default = 8192,
      description = "matched tokens at which the length part reaches 1 (> 0 when used)" },
    mode = { type = "string", description = "\"approximate\" (lupin's own index); llm-d v0.4's"
      .. " \"cache_tracking\" loads the instance as precise-prefix-cache-scorer" },
    kvEventsConfig = { type = "any", description = "refused: precise-prefix-cache-scorer's" },
    indexerConfig = { type = "any", description = "refused: precise-prefix-cache-scorer's" },
  },

  new = function(p, env)
    for _, k in ipairs({ "kvEventsConfig", "indexerConfig" }) do
      if p[k] ~= nil then
        error(("%s is not supported here: lupin's prefix-cache-scorer is the approximate mode;"
          .. " for the engines' KV-cache events use precise-prefix-cache-scorer"
          .. " (docs/kv-events.md)"):format(k), 0)
      end
    end
    if p.mode ~= nil and p.mode ~= "approximate" then
      error(("mode %q is not supported here: use mode \"approximate\" (the default), or"
        .. " precise-prefix-cache-scorer for the engines' KV-cache events"):format(p.mode), 0)
    end
    local w, scale = p.matchLengthWeight, p.matchLengthScaleTokens
    if w > 0 and scale <= 0 then
      error(("matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0, got %d"):format(
        scale), 0)
    end
    if p.prefixMatchInfoProducerName then
      return { name = env.name, producer = p.prefixMatchInfoProducerName, scores = {},
        weight = w, scale = scale }
    end
    if p.blockSize and p.hashBlockSize and p.blockSize ~= p.hashBlockSize then
      error(("blockSize (%d) and hashBlockSize (%d) are the same parameter; give one"):format(
        p.blockSize, p.hashBlockSize), 0)
    end
    local block = p.blockSize or p.hashBlockSize or 64
    -- The index is keyed by what gives it its meaning: every worker's
    -- instance shares it, and a reload that changes none of these keeps what
    -- it learned (another block size or capacity starts a fresh one).
    local key = ("prefix-cache-scorer/%s/%d/%d/%s"):format(env.name, block,
      p.lruCapacityPerServer, tostring(p.autoTune))
    return { name = env.name, block = block, max_blocks = p.maxPrefixBlocksToMatch,
      capacity = p.lruCapacityPerServer, auto = p.autoTune,
      index = prefix.index(p.lruCapacityPerServer, key), scores = {}, weight = w, scale = scale }
  end,

  -- Before any profile runs, so filters and the profile handler can read the
  -- matches in ctx.shared.
  prepare = function(self, ctx, endpoints)
    if self.producer then -- its prepare ran first: republish for readers of this name
      ctx.shared[self.name] = ctx.shared[self.producer]
    else
      state(self, ctx, endpoints)
    end
  end,

  score = function(self, ctx, endpoints)
    local total, matches, bs
    if self.producer then -- the producer hashed and matched in its prepare
      local info = ctx.shared[self.producer]
      if not info then
        error(("no prefix match info from %q: name an approx-prefix-cache-producer instance in"
          .. " prefixMatchInfoProducerName"):format(self.producer), 0)
      end
      total, matches, bs = info.total, info.matches, info.block_size
    else
      local st = state(self, ctx, endpoints)
      total, matches, bs = st.hashes.n, st.matches, st.hashes.block_size
    end
    -- the engine reads the scores as they are returned and keeps none: one
    -- list per instance serves every request
    local out = self.scores
    for i = #out, #endpoints + 1, -1 do -- fewer candidates than last time
      out[i] = nil
    end
    if total == 0 then -- nothing hashed: every endpoint scores 0
      matches, total = NO_MATCHES, 1
    end
    -- the test of total kept out of the loop: inside it, the loop took 3-4x
    -- as long (docs/performance.md, "Compiled paths")
    local w = self.weight
    if w > 0 then -- a loop of its own: the default pays nothing for it
      local per_block = bs / prefix.CHARS_PER_TOKEN / self.scale
      for i = 1, #endpoints do
        local m = matches[endpoints[i].id] or 0
        local len = math.min(1, m * per_block)
        out[i] = w * len * len + (1 - w) * m / total
      end
      return out
    end
    for i = 1, #endpoints do
      out[i] = (matches[endpoints[i].id] or 0) / total
    end
    return out
  end,

  -- The request goes to the primary profile's endpoint (and, in P/D serving,
  -- its prompt is also prefilled on the prefill profile's endpoint): both
  -- will hold its blocks.  The hashes are not needed after that: the next
  -- request hashes into them (never published, only this instance has them).
  pre_request = function(self, ctx, result)
    local st = ctx.plugin
    local h = st.hashes
    if not h then -- a producer's matches were scored
      return
    end
    if h.n > 0 then
      prefix.record_result(self.index, result, h, self.auto)
    end
    st.hashes = nil
    prefix.release(h)
  end,
}
