--- lupin.tokens: the token ids of prompt prefixes, cached for the whole
--- process (core/token_cache.c), and the jobs that fetch them.  A tokenizer
--- is a call to an engine, too slow for a request's path: a plugin asks for
--- a prefix's ids once (tokens.want: the host tokenizes off the request path
--- and answers), scores that request without them, and the next requests
--- sharing the prefix find its token-id block hashes here (docs/prefix-index.md).
---
---   local key = prefix.key(h, j - 1)    -- the character chain names the prefix
---   local t = tokens.hashes(key, prefix.token_seed(seed, lora, salt), 16, 256)
---   if not t then tokens.want { key = key, model = model, text = prompt:sub(1, j * 64) } end
local ffi = require "ffi"
local capi = require "lupin.runtime.capi"
local prefix = require "lupin.prefix"

---@class lupin.tokens
local M = {}

local job = ffi.new("lupin_tokenize_job") -- reused: a runtime is single-threaded

local function opt_string(t, field)
  local v = t[field]
  if v ~= nil and type(v) ~= "string" then
    error(("tokens.want: %s must be a string, got %s"):format(field, type(v)), 3)
  end
  return v
end

---@class lupin.TokenizeJob
---@field key ffi.cdata*|integer the prefix's key (prefix.key of its last block)
---@field text string the prefix's text; with chat, a JSON array of its messages
---@field model string? the model to tokenize for
---@field endpoint string? the endpoint to ask, by name (nil: the host chooses)
---@field chat boolean? text is chat messages (rendered by the engine's template)

--- Asks the host to tokenize a prefix unless its ids are cached or asked for
--- already (a job stays pending a few seconds).  Returns whether it asked:
--- false also when the host tokenizes nothing (no hook).
---@param j lupin.TokenizeJob
---@return boolean asked
function M.want(j)
  if type(j) ~= "table" then
    error(("tokens.want: a table {key=, text=, ...} expected, got %s"):format(type(j)), 2)
  end
  local key = prefix._u64(j.key, "tokens.want: key", 2)
  local text = opt_string(j, "text")
  if not text then
    error("tokens.want: text must be a string, got nil", 2)
  end
  local endpoint, model = opt_string(j, "endpoint"), opt_string(j, "model")
  job.key, job.text, job.text_len, job.chat = key, text, #text, j.chat and 1 or 0
  job.endpoint, job.model = endpoint, model
  local rc = capi.shared.tokens_want(capi.rt, job)
  job.text, job.endpoint, job.model = nil, nil, nil -- no pointers into freed strings
  if rc < 0 then
    error("tokens.want: out of memory", 2)
  end
  return rc == 1
end

-- Lists above this many blocks are sized by a count first (one more lookup)
-- rather than at max_blocks.
local DIRECT = 4096

--- The token-id block hashes of the ids cached under key (at most
--- max_blocks), or nil when none are: the same lupin.Hashes prefix.hashes
--- returns, for index:match, index:record and prefix.release.  The ids stay
--- in C.  seed: as prefix.token_hashes takes it.
---@param key ffi.cdata*|integer
---@param seed lupin.TokenSeed
---@param block_size integer tokens per block, ≥ 1
---@param max_blocks integer
---@return lupin.Hashes?
function M.hashes(key, seed, block_size, max_blocks)
  key = prefix._u64(key, "tokens.hashes: key", 2)
  if type(block_size) ~= "number" or block_size < 1 or block_size % 1 ~= 0 then
    error("tokens.hashes: block size must be a positive integer", 2)
  end
  local prev = prefix._seed(seed, "tokens.hashes", 2)
  local sh, rt = capi.shared, capi.rt
  local n = math.max(0, math.floor(max_blocks))
  if n > DIRECT then
    local k = tonumber(sh.tokens_count(rt, key))
    n = math.min(n, math.floor(math.max(k, 0) / block_size))
  end
  local h, hs = prefix._acquire(n)
  local got = tonumber(sh.tokens_hashes(rt, key, prev, block_size, hs.h, n))
  if got < 0 then
    hs.live = 1 -- never handed out: kept for the next call
    prefix.release(h)
    return nil
  end
  return prefix._publish(h, hs, got, block_size)
end

--- Caches ids under key, replacing what it held (specs, and hosts that
--- tokenize in Lua).  Raises when the cache refuses them (bigger than its
--- limit, or out of memory).
---@param key ffi.cdata*|integer
---@param ids integer[] token ids, each in 0..2^32-1
function M.put(key, ids)
  key = prefix._u64(key, "tokens.put: key", 2)
  local buf, n = prefix._ids(ids, "tokens.put", 2)
  if capi.shared.tokens_put(capi.rt, key, buf, n) ~= 0 then
    error("tokens.put: refused (more than the cache's limit, or out of memory)", 2)
  end
end

--- How many token ids are cached under key, or nil.
---@param key ffi.cdata*|integer
---@return integer?
function M.count(key)
  key = prefix._u64(key, "tokens.count: key", 2)
  local n = tonumber(capi.shared.tokens_count(capi.rt, key))
  return n >= 0 and n or nil
end

return M
