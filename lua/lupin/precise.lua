--- lupin.precise: prefix matching from the engines' own KV-cache events
--- (docs/kv-events.md), shared by precise-prefix-cache-scorer and
--- precise-prefix-cache-producer.
---
--- The host subscribes to every endpoint's events and keeps a keyed prefix
--- index of the blocks each engine holds now, keyed by lupin's chained hash
--- of the blocks' token ids.  A request is matched against it by its own
--- token ids: a token-id prompt has them; a text prompt's come from the
--- engine's /tokenize, asked off the request path for the prefix earlier
--- requests already sent (the approximate index below finds it) and kept in
--- the token cache, so a long shared context is tokenized once.  Until they
--- are there, and for an endpoint whose stream is unsure, the approximate
--- index answers: never worse than prefix-cache-scorer.
local prefix = require "lupin.prefix"
local tokens = require "lupin.tokens"
local units = require "lupin.config.units"
local openai = require "lupin.runtime.openai"

---@class lupin.precise
local M = {}

local CHAR_BLOCK = 64 -- the approximate index's block, in characters
local MAX_CHAR_BLOCKS = 4096
local APPROX_CAPACITY = 31250

local function check(cond, fmt, ...)
  if not cond then
    error(fmt:format(...), 0)
  end
end

local function object(p, name)
  local v = p[name]
  check(v == nil or type(v) == "table", "%s must be an object, got %s", name, type(v))
  return v or {}
end

local function integer(t, path, name, default, lo, hi)
  local v = t[name]
  if v == nil then
    return default
  end
  check(type(v) == "number" and v % 1 == 0 and v >= lo and v <= hi,
    "%s.%s must be an integer between %d and %d, got %s", path, name, lo, hi, tostring(v))
  return v
end

local function string_of(t, path, name, default)
  local v = t[name]
  if v == nil then
    return default
  end
  check(type(v) == "string", "%s.%s must be a string, got %s", path, name, type(v))
  return v
end

-- What lupin reads but does not act on, and why (a warning at its line).
local IGNORED = {
  ["kvEventsConfig.concurrency"] = "one subscriber thread decodes every engine's events",
  ["kvEventsConfig.podDiscoveryConfig.podLabelSelector"] =
    "the pool's endpoints are the engines subscribed to",
  ["kvEventsConfig.podDiscoveryConfig.podNamespace"] =
    "the pool's endpoints are the engines subscribed to",
  ["indexerConfig.kvBlockIndexConfig.inMemoryConfig.podCacheSize"] =
    "an endpoint's blocks are bounded by maxBlocksPerEndpoint",
  ["indexerConfig.kvBlockIndexConfig.costAwareMemoryConfig"] =
    "the index is in memory, bounded by maxBlocksPerEndpoint",
  ["indexerConfig.tokenizersPoolConfig"] = "lupin tokenizes through the engines' /tokenize",
  ["indexerConfig.kvCacheBackendConfigs"] = "only the GPU tier's blocks are indexed",
  ["indexerConfig.kvBlockIndexConfig.maxPrefixTokensToMatch"] =
    "a request's token blocks are matched whole",
}

local function warn_ignored(p, env)
  for path, why in pairs(IGNORED) do
    local v = p
    for part in path:gmatch("[^.]+") do
      v = type(v) == "table" and v[part] or nil
    end
    if v ~= nil then
      env.warn(path, "%s is not acted on: %s", path, why)
    end
  end
end

--- The settings of a precise plugin's parameters (llm-d's names): what
--- the host subscribes with (kv_events, read by lupin.datalayer) and what
--- matching needs.  Errors name the parameter.
---@param p table the validated parameters
---@param env lupin.Env
function M.settings(p, env)
  local kv, idx = object(p, "kvEventsConfig"), object(p, "indexerConfig")
  -- older configs nest the token processor's settings in indexerConfig
  local tpc = p.tokenProcessorConfig ~= nil and object(p, "tokenProcessorConfig")
    or object(idx, "tokenProcessorConfig")
  local bs = integer(tpc, "tokenProcessorConfig", "blockSizeTokens",
    integer(tpc, "tokenProcessorConfig", "blockSize", 16, 1, 4096), 1, 4096)
  local seed = string_of(tpc, "tokenProcessorConfig", "hashSeed", "")
  local engine = string_of(kv, "kvEventsConfig", "engineType", "vllm")
  check(engine == "vllm", "kvEventsConfig.engineType %q is not supported: lupin reads vLLM's"
    .. " events (ZMQ, msgpack); use \"vllm\"", engine)
  local bind = string_of(kv, "kvEventsConfig", "zmqEndpoint", "")
  check(bind == "" or bind:match("^tcp://.+:%d+$"), "kvEventsConfig.zmqEndpoint must be"
    .. " tcp://HOST:PORT for the gateway to bind, got %q", bind)
  local discover = kv.discoverPods
  check(discover == nil or type(discover) == "boolean",
    "kvEventsConfig.discoverPods must be a boolean, got %s", type(discover))
  check(discover ~= false or bind ~= "", "kvEventsConfig.discoverPods is false and no"
    .. " zmqEndpoint is given: no engine's events would be heard; give zmqEndpoint")
  local pdc = object(kv, "podDiscoveryConfig")
  local kbic = object(idx, "kvBlockIndexConfig")
  check(kbic.redisConfig == nil, "indexerConfig.kvBlockIndexConfig.redisConfig is not"
    .. " supported: every lupin replica subscribes to the engines itself; remove it")
  local mem = object(kbic, "inMemoryConfig")
  local ttl = p.speculativeTTL
  local secs = units.duration(ttl)
  check(secs and secs > 0, "speculativeTTL must be a duration such"
    .. " as \"2s\", got %s", tostring(ttl))
  warn_ignored(p, env)
  local max_blocks = integer(mem, "indexerConfig.kvBlockIndexConfig.inMemoryConfig", "size",
    p.maxBlocksPerEndpoint, 1, 1e9)
  local key = ("precise/%d/%s"):format(bs, seed)
  return {
    block = bs,
    seed = seed,
    key = key,
    max_blocks = math.min(max_blocks, p.maxBlocksPerEndpoint),
    speculative = p.speculativeIndexing,
    ttl = secs,
    tokenize_unseen = p.tokenizeUnseen,
    kv_events = {
      index = key,
      hash_seed = seed,
      -- on an endpoint's own socket every topic is its; a bound socket's
      -- topics say which engine sent (llm-d's kv@<pod>@<model>)
      topic = kv.topicFilter or (bind ~= "" and "kv@" or ""),
      bind = bind,
      -- 0: no subscription of the host's own (only the bound socket)
      port = discover == false and 0
        or integer(pdc, "kvEventsConfig.podDiscoveryConfig", "socketPort", 5557, 1, 65535),
      replay_port = integer(kv, "kvEventsConfig", "replayPort", 0, 0, 65535),
      block_size = bs,
      max_blocks = math.min(max_blocks, p.maxBlocksPerEndpoint),
      max_pending = p.maxPendingBatches,
      unsure_seconds = p.unsureSeconds,
    },
  }
end

--- The parameters every precise plugin takes (llm-d's, and lupin's own).
M.SCHEMA = {
  tokenProcessorConfig = { type = "object",
    description = "blockSize/blockSizeTokens (tokens a block, 16), hashSeed (\"\")" },
  kvEventsConfig = { type = "object", description = "zmqEndpoint, topicFilter, engineType"
    .. " (vllm), discoverPods, podDiscoveryConfig.socketPort (5557), replayPort (lupin's)" },
  indexerConfig = { type = "object",
    description = "kvBlockIndexConfig.inMemoryConfig.size bounds an endpoint's blocks" },
  speculativeIndexing = { type = "boolean", default = false,
    description = "count the pick as holding the request's blocks until its events come" },
  speculativeTTL = { type = "string", default = "2s",
    description = "how long a speculative entry counts" },
  maxBlocksPerEndpoint = { type = "integer", default = 1000000, min = 1, max = 1000000000,
    description = "an endpoint's blocks kept at most (past it: learnt again)" },
  maxPendingBatches = { type = "integer", default = 10000, min = 1, max = 10000000,
    description = "event batches queued per endpoint before the excess is dropped (a gap)" },
  unsureSeconds = { type = "number", default = 10, min = 0, max = 3600,
    description = "after an endpoint's blocks were purged, how long it is scored"
      .. " approximately" },
  tokenizeUnseen = { type = "boolean", default = false,
    description = "also tokenize prompts no earlier request shares (multi-turn chat)" },
}

--- The instance's state: its indexes (the precise one the host feeds, the
--- approximate one of what was sent where) and its speculative entries.
function M.new(s, env)
  s.name, s.now = env.name, env.now
  s.index = prefix.index(s.max_blocks, s.key)
  s.approx = prefix.index(APPROX_CAPACITY, ("precise-approx/%s"):format(env.name))
  s.recent = {} -- speculative: a prefix's last token key -> { id, expires }
  s.n_recent = 0
  s.scores = {}
  return s
end

-- A prompt given as token ids: the ids, else nil.
local function token_prompt(body)
  local p = body and body.prompt
  if type(p) ~= "table" or #p == 0 then
    return nil
  end
  for i = 1, #p do
    local v = p[i]
    if type(v) ~= "number" or v < 0 or v % 1 ~= 0 or v >= 4294967296 then
      return nil
    end
  end
  return p
end

-- A chat request's prompt is its messages as canonical JSON
-- (lupin.runtime.openai): "[" then the messages, comma-separated.  The
-- messages wholly inside the first `chars` characters, as a JSON array for
-- the engine to render with its own template, or nil when not even the
-- first is.
local function chat_prefix(messages, chars)
  local at, k = 1, 0 -- the characters the first k messages take, "[" included
  for i = 1, #messages do
    local len = #openai.canonical(messages[i]) + (i > 1 and 1 or 0)
    if at + len > chars then
      break
    end
    at, k = at + len, i
  end
  if k == 0 then
    return nil
  end
  local parts = {}
  for i = 1, k do
    parts[i] = openai.canonical(messages[i])
  end
  return "[" .. table.concat(parts, ",") .. "]"
end

-- The endpoint to tokenize with: the one holding the most of the prompt
-- (it is up, and the likely pick), else the first.
local function tokenizer(approx, endpoints)
  local best, most = endpoints[1], 0
  for i = 1, #endpoints do
    local m = approx[endpoints[i].id] or 0
    if m > most then
      best, most = endpoints[i], m
    end
  end
  return best
end

-- The request's token hashes and the characters they cover, or nil while
-- its tokens are not known (a tokenize job is asked for).
local function token_hashes(self, ctx, st, approx, endpoints, seed)
  local req = ctx.request
  local body = req.body
  local ids = token_prompt(body)
  if ids then
    return prefix.token_hashes(ids, seed, self.block, MAX_CHAR_BLOCKS), #req.prompt
  end
  -- the shared prefix: the most leading blocks any endpoint was sent
  local j = 0
  for _, m in pairs(approx) do
    if m > j then
      j = m
    end
  end
  if j == 0 and self.tokenize_unseen then
    j = st.chars.n
  end
  if j == 0 then
    return nil
  end
  local key = prefix.key(st.chars, j - 1)
  local h = tokens.hashes(key, seed, self.block, MAX_CHAR_BLOCKS)
  if h then
    return h, j * CHAR_BLOCK
  end
  local ep = tokenizer(approx, endpoints)
  local text, chat = req.prompt:sub(1, j * CHAR_BLOCK), false
  if type(body.messages) == "table" and body.prompt == nil then
    -- the messages that end in the shared blocks or the next one, whose
    -- start is shared: ids of a tail that differs elsewhere only miss
    text, chat = chat_prefix(body.messages, (j + 1) * CHAR_BLOCK), true
  end
  if ep and text then
    tokens.want({ key = key, endpoint = ep.name, model = req.model, text = text, chat = chat })
    st.waiting = true
  end
  return nil
end

local function most(matches)
  local m = 0
  for _, v in pairs(matches) do
    if v > m then
      m = v
    end
  end
  return m
end

-- The request's token hashes and what the engines hold of them.  vLLM keys
-- a LoRA adapter's blocks with the adapter's name, never the base model's
-- with its own: a request whose model finds blocks under its name names an
-- adapter, and those keys are its.
local function held_blocks(self, ctx, st, approx, endpoints, salt)
  local h, covered = token_hashes(self, ctx, st, approx, endpoints, st.seed)
  local precise = h and h.n > 0 and self.index:match(h, true)
  local model = ctx.request.model
  if precise and type(model) == "string" and model ~= "" then
    local seed = prefix.token_seed(self.seed, model, salt)
    local hl = token_hashes(self, ctx, st, approx, endpoints, seed)
    local pl = hl and hl.n > 0 and self.index:match(hl, true)
    if pl and most(pl) > 0 then
      prefix.release(h)
      h, precise = hl, pl
    elseif hl then
      prefix.release(hl)
    end
  end
  return h, covered, precise
end

-- A speculative entry of the request's prefix: the endpoint and whether it
-- still counts.
local function speculative(self, h, now)
  if not (self.speculative and h and h.n > 0) then
    return nil
  end
  local e = self.recent[tostring(prefix.key(h, h.n - 1))]
  return e and e.expires > now and e.id or nil
end

-- Why endpoint id is scored from the approximate index.
local function why_approximate(self, st, h, held, id)
  if not h then
    return st.waiting and "tokens asked for" or "no prefix or whole message shared yet"
  elseif held then
    return "no engine holds it"
  end
  return self.index:unsure(id) and "events unsure" or "no events from it yet"
end

--- Matches the request once: ctx.plugin keeps the hashes, and the match
--- info { block_size, total, matches, prompt_length, precise, ... } (the
--- shape prefix-cache-scorer reads from a producer) is returned, with
--- matches[id] the characters of the prompt endpoint id holds.
function M.match(self, ctx, endpoints)
  local st = ctx.plugin
  if st.info then
    return st.info
  end
  local req = ctx.request
  local body = req.body
  local salt = body and type(body.cache_salt) == "string" and body.cache_salt or ""
  st.seed = prefix.token_seed(self.seed, "", salt)
  st.chars = prefix.hashes(req.prompt, req.model, salt, CHAR_BLOCK, MAX_CHAR_BLOCKS)
  local approx = self.approx:match(st.chars)
  local h, covered, precise = held_blocks(self, ctx, st, approx, endpoints, salt)
  st.tokens = h
  local matches = {}
  local spec = speculative(self, h, self.now())
  -- the blocks each engine holds, as its events say (nil: they cannot tell;
  -- an engine holding some of them has events, so only the others are asked)
  local held, anyone = {}, false
  for i = 1, #endpoints do
    local id = endpoints[i].id
    local blocks = precise and precise[id]
    if precise and not self.index:unsure(id) and (blocks or self.index:count(id) > 0) then
      held[i] = spec == id and h.n or blocks or 0
      anyone = anyone or held[i] > 0
    end
  end
  local notes = req.explained and {} or nil
  for i = 1, #endpoints do
    local ep = endpoints[i]
    local a = (approx[ep.id] or 0) * CHAR_BLOCK
    -- When no engine holds any of it, where it was sent before decides: the
    -- prompt goes back where its next requests will look for it, rather
    -- than to a fresh engine whose cache it would crowd.
    if held[i] and anyone then
      matches[ep.id] = math.floor(held[i] / h.n * covered)
      if notes then
        notes[ep.name] = { how = spec == ep.id and "speculative" or "precise",
          blocks = held[i], of = h.n, chars = matches[ep.id], approximate_chars = a }
      end
    else
      matches[ep.id] = a
      if notes then
        notes[ep.name] = { how = "approximate", chars = a, why = why_approximate(self, st, h,
          held[i], ep.id) }
      end
    end
  end
  st.info = { block_size = 1, total = #req.prompt, matches = matches,
    prompt_length = #req.prompt, precise = h ~= nil, explain = notes }
  ctx.shared[self.name] = st.info
  return st.info
end

--- The scores of a match: the fraction of the prompt each endpoint holds.
function M.scores(self, info, endpoints)
  local out, total = self.scores, info.total > 0 and info.total or 1
  for i = #out, #endpoints + 1, -1 do
    out[i] = nil
  end
  for i = 1, #endpoints do
    out[i] = (info.matches[endpoints[i].id] or 0) / total
  end
  return out
end

local MAX_RECENT = 65536

--- After the pick: the approximate index records what was sent where, and
--- with speculative indexing the pick counts as holding the request's
--- token blocks for speculativeTTL.
function M.record(self, ctx, result)
  local st = ctx.plugin
  if not st.chars then
    return
  end
  if st.chars.n > 0 then
    prefix.record_result(self.approx, result, st.chars, false)
  end
  local h = st.tokens
  local primary = result.profiles[result.primary]
  local ep = primary and primary.endpoints[1]
  if self.speculative and h and h.n > 0 and ep then
    if self.n_recent >= MAX_RECENT then -- bounded: start again
      self.recent, self.n_recent = {}, 0
    end
    self.recent[tostring(prefix.key(h, h.n - 1))] = { id = ep.id,
      expires = self.now() + self.ttl }
    self.n_recent = self.n_recent + 1
  end
  prefix.release(st.chars)
  if h then
    prefix.release(h)
  end
  st.chars, st.tokens = nil, nil
end

return M
