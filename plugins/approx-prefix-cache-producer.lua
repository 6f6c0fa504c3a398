-- llm-d-router's approx-prefix-cache-producer: the hashing and matching half
-- of prefix-cache-scorer, for configs that split producer and scorer
-- (prefix-cache-scorer / prefix-cache-affinity-filter with
-- prefixMatchInfoProducerName).  Before the profiles run it hashes the
-- prompt's leading blocks and matches them against its index of what was sent
-- where, publishing { block_size, total, matches, prompt_length } in
-- ctx.shared under its name; after scheduling it records the picks.
--
-- Upstream hashes token IDs; lupin has no tokenizer, so a block of
-- blockSizeTokens tokens is blockSizeTokens × 4 characters (upstream's own
-- estimate) and maxPrefixTokensToMatch caps the blocks at
-- maxPrefixTokensToMatch / block tokens (docs/epp-compatibility.md).
--
-- As upstream (llm-d-router #1158), a block is never under 64 tokens, however
-- it was set (reported by the endpoints, configured, or the default 16): the
-- index keeps an entry per endpoint and block, and smaller blocks make it
-- grow without bound.  A smaller configured size is logged at load.
local prefix = require "lupin.prefix"

local DEFAULT_TOKENS = 16 -- upstream's block size without autoTune or metrics
local MIN_TOKENS = 64 -- upstream's minBlockSizeTokens
local MIN_CHARS = MIN_TOKENS * prefix.CHARS_PER_TOKEN
local DEFAULT_CAPACITY = 31250
local UNLIMITED = 1048576 -- blocks: both caps 0 match the whole prompt

---@type lupin.Plugin
return {
  type = "approx-prefix-cache-producer",
  schema = {
    autoTune = { type = "boolean", default = true,
      description = "block size and capacity from the endpoints' reported cache geometry" },
    blockSizeTokens = { type = "integer", default = 0, min = 0, max = 262144,
      description = "tokens per block (0: 16; under 64: 64), hashed as 4 characters a token" },
    maxPrefixBlocksToMatch = { type = "integer", default = 0, min = 0, max = 1048576,
      description = "blocks matched at most (0: no limit but maxPrefixTokensToMatch)" },
    maxPrefixTokensToMatch = { type = "integer", default = 131072, min = 0, max = 16777216,
      description = "tokens matched at most; wins over maxPrefixBlocksToMatch when > 0" },
    lruCapacityPerServer = { type = "integer", default = 0, min = 0, max = 2147483647,
      description = "block hashes remembered per endpoint without metrics (0: 31250)" },
    blockSize = { type = "integer", min = 1, max = 262144,
      description = "deprecated upstream: blockSizeTokens' old name (tokens)" },
  },

  new = function(p, env)
    local given = p.blockSizeTokens > 0 and p.blockSizeTokens or p.blockSize
    if given and given < MIN_TOKENS then
      env.log("warn", "blockSizeTokens %d is below the minimum: blocks of %d tokens are used, as"
        .. " upstream does (llm-d-router #1158)", given, MIN_TOKENS)
    end
    local block = math.max(given or DEFAULT_TOKENS, MIN_TOKENS) * prefix.CHARS_PER_TOKEN
    local capacity = p.lruCapacityPerServer > 0 and p.lruCapacityPerServer or DEFAULT_CAPACITY
    -- one index per key for every worker and across reloads (as prefix-cache-scorer)
    local key = ("approx-prefix-cache-producer/%s/%d/%d/%s"):format(env.name, block, capacity,
      tostring(p.autoTune))
    return { name = env.name, block = block, max_tokens = p.maxPrefixTokensToMatch,
      max_blocks = p.maxPrefixBlocksToMatch > 0 and p.maxPrefixBlocksToMatch or UNLIMITED,
      capacity = capacity, auto = p.autoTune, index = prefix.index(capacity, key) }
  end,

  prepare = function(self, ctx, endpoints)
    local st = ctx.plugin
    local bs = math.max(prefix.block_chars(self.block, self.auto, endpoints), MIN_CHARS)
    -- the token cap, when set, at this request's block size: a cap under one
    -- block hashes nothing, as upstream (a misconfiguration, not "no cap")
    local max_blocks = self.max_tokens > 0
      and math.floor(self.max_tokens * prefix.CHARS_PER_TOKEN / bs) or self.max_blocks
    local req = ctx.request
    local body = req.body
    local salt = body and type(body.cache_salt) == "string" and body.cache_salt or ""
    st.hashes = prefix.hashes(req.prompt, req.model, salt, bs, max_blocks)
    st.matches = self.index:match(st.hashes)
    ctx.shared[self.name] = { block_size = bs, total = st.hashes.n, matches = st.matches,
      prompt_length = #req.prompt }
  end,

  -- As prefix-cache-scorer: the primary profile's pick and, in P/D, the
  -- prefill pick hold the prompt's blocks from now on.
  pre_request = function(self, ctx, result)
    local st = ctx.plugin
    local h = st.hashes
    if not h then
      return
    end
    if h.n > 0 then
      prefix.record_result(self.index, result, h, self.auto)
    end
    st.hashes = nil
    prefix.release(h) -- the next request hashes into it
  end,
}
