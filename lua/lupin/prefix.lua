--- lupin.prefix: prompt block hashes and the prefix index, from C through FFI
--- (core/blockhash.c, core/prefix_index.c), so prefix plugins stay short
--- (docs/prefix-index.md).
---
---   local h = prefix.hashes(prompt, model, salt, 64, 256)  -- h.n full blocks
---   local t = prefix.token_hashes(ids, prefix.token_seed(seed, lora, salt), 16, 256)
---   local index = prefix.index(31250, key)                 -- capacity per endpoint
---   index:record(ep.id, h)            -- ep has cached this prompt
---   local matches = index:match(h)    -- { [ep.id] = matched blocks }
local ffi = require "ffi"
local capi = require "lupin.runtime.capi"
local new_table = require "table.new"
local bit = require "bit"
local bor, rshift = bit.bor, bit.rshift

---@class lupin.prefix
local M = {}

--- Work counters, for specs and stats: prompts hashed, lookups made, hash
--- lists filled again after a release.
M.counters = { hashed = 0, matched = 0, reused = 0 }

local live = setmetatable({}, { __mode = "k" }) -- every index alive, for memory()

---@class lupin.Hashes a prompt's block hashes (lists are reused: M.release)
---@field n integer the number of full blocks hashed
---@field block_size integer characters per block
local HASHES = ffi.typeof("struct { int32_t n, block_size, cap, live; uint64_t h[?]; }")

-- What a caller holds is a plain table; the C list behind it lives here.  A
-- list handed out as cdata would let plugin code index it past its end or
-- write its count, and C would read or write that far (a crash or worse).
local lists = setmetatable({}, { __mode = "k" }) -- hashes -> HASHES cdata
local HASHES_VIEW = {
  __newindex = function(_, k)
    error(("prefix hashes are read-only (setting %s)"):format(tostring(k)), 2)
  end,
  __metatable = false,
}

-- The C list of hashes h; an error at the caller's caller for anything else
-- (forged, or released already).
local function list_of(h)
  local hs = lists[h]
  if not hs or hs.live == 0 then
    error("prefix: hashes must come from prefix.hashes and not be released yet", 3)
  end
  return hs
end

local input = ffi.new("lupin_hash_input") -- reused: a runtime is single-threaded

-- Hash lists given back (M.release), by capacity: a request's hashes live
-- from its prepare to its pre_request, inside one synchronous scheduling
-- call, so one kept list per capacity serves the next request.  Capacities
-- are powers of two from 16 blocks; lists over MAX_KEPT blocks are left to
-- the collector.
local kept = {}
local MIN_CAP, MAX_KEPT = 16, 4096

-- the power of two at or above n, MIN_CAP at least (no loop: it compiles
-- inside the caller's trace)
local function list_capacity(n)
  local x = bor(n - 1, MIN_CAP - 1)
  x = bor(x, rshift(x, 1))
  x = bor(x, rshift(x, 2))
  x = bor(x, rshift(x, 4))
  x = bor(x, rshift(x, 8))
  x = bor(x, rshift(x, 16))
  return x + 1
end

-- A list for n hashes and the view a caller holds: a kept one when there is
-- one of that capacity, else a new pair.
local function acquire(n)
  local cap = list_capacity(n)
  -- a list and its view stay paired for life: no weak-table entry per call
  local h = kept[cap]
  if h then
    kept[cap] = nil
    M.counters.reused = M.counters.reused + 1
    return h, lists[h]
  end
  local hs = HASHES(cap)
  hs.cap = cap
  h = setmetatable({ n = 0, block_size = 0 }, HASHES_VIEW)
  lists[h] = hs
  return h, hs
end

-- h and its list now hold got hashes of blocks of block_size.
local function publish(h, hs, got, block_size)
  M.counters.hashed = M.counters.hashed + 1
  hs.n, hs.block_size, hs.live = got, block_size, 1
  h.n, h.block_size = got, block_size
  return h
end

--- The chained xxh64 hashes of a prompt's full blocks (at most max_blocks).
---@param prompt string
---@param model string?
---@param salt string? the request's cache_salt
---@param block_size integer characters per block, ≥ 1
---@param max_blocks integer
---@return lupin.Hashes
function M.hashes(prompt, model, salt, block_size, max_blocks)
  assert(block_size >= 1 and block_size % 1 == 0, "block size must be a positive integer")
  model, salt = model or "", salt or ""
  local n = math.max(0, math.min(math.floor(#prompt / block_size), max_blocks))
  local h, hs = acquire(n)
  input.prompt, input.prompt_len = prompt, #prompt
  input.model, input.model_len = model, #model
  input.salt, input.salt_len = salt, #salt
  input.block_size, input.max_blocks = block_size, math.max(max_blocks, 0)
  local got = tonumber(capi.api.block_hashes(input, hs.h, n))
  input.prompt, input.model, input.salt = nil, nil, nil -- no pointers into freed strings
  if got < 0 then
    error("block hashing refused its input", 2)
  end
  return publish(h, hs, got, block_size)
end

-- --- token ids (core/blockhash.c's token chain; docs/prefix-index.md) ------

local U64 = ffi.typeof("uint64_t")
local I64 = ffi.typeof("int64_t")
local TWO53 = 2 ^ 53

-- v as a uint64_t: a uint64_t (or int64_t) cdata as it is, an integer
-- number in 0..2^53 exactly; an error at the caller's caller else.
local function u64(v, what, level)
  if type(v) == "number" and v >= 0 and v <= TWO53 and v % 1 == 0 then
    return U64(v)
  end
  if type(v) == "cdata" and (ffi.istype(U64, v) or ffi.istype(I64, v)) then
    return U64(v)
  end
  error(("%s must be a 64-bit key (a uint64_t from lupin.prefix, or an integer number), got %s")
    :format(what, type(v)), level + 1)
end
M._u64 = u64

local ids_buf, ids_cap = nil, 0 -- reused: a runtime is single-threaded
local UINT32_MAX = 4294967295

-- The ids of a Lua array in a uint32_t buffer (valid until the next call),
-- and their count; an error naming the first id that is not one.
local function ids_of(ids, what, level)
  if type(ids) ~= "table" then
    error(("%s: ids must be an array of token ids, got %s"):format(what, type(ids)), level + 1)
  end
  local n = #ids
  if n > ids_cap then
    ids_cap = math.max(n, 2 * ids_cap, 256)
    ids_buf = ffi.new("uint32_t[?]", ids_cap)
  end
  for i = 1, n do
    local v = ids[i]
    if type(v) ~= "number" or v < 0 or v > UINT32_MAX or v % 1 ~= 0 then
      error(("%s: ids[%d] is %s, not an integer in 0..2^32-1"):format(what, i, tostring(v)),
        level + 1)
    end
    ids_buf[i - 1] = v
  end
  return ids_buf, n
end
M._ids = ids_of

--- The start of a token-id chain: the config's hashSeed, the LoRA adapter
--- ("" or nil: the base model) and the request's cache_salt.  Pass it to
--- prefix.token_hashes or lupin.tokens.hashes.
---@param hash_seed string?
---@param lora string?
---@param salt string?
---@return ffi.cdata* seed a uint64_t
function M.token_seed(hash_seed, lora, salt)
  hash_seed, lora, salt = hash_seed or "", lora or "", salt or ""
  for _, v in ipairs({ hash_seed, lora, salt }) do
    if type(v) ~= "string" then
      error(("prefix.token_seed: strings expected, got %s"):format(type(v)), 2)
    end
  end
  return capi.shared.token_seed(hash_seed, #hash_seed, lora, #lora, salt, #salt)
end

---@alias lupin.TokenSeed ffi.cdata*|integer|{hash_seed: string?, lora: string?, salt: string?}

-- The chain's start: a seed or block hash given as it is, or made from a
-- table {hash_seed=, lora=, salt=}.
local function seed_of(seed, what, level)
  if type(seed) == "table" then
    return M.token_seed(seed.hash_seed, seed.lora, seed.salt)
  end
  return u64(seed, what .. ": the seed", level + 1)
end
M._seed = seed_of

--- The chained hashes of the full blocks of a prompt's token ids (at most
--- max_blocks): the keys an engine's KV-cache events map to.  seed: what
--- prefix.token_seed returns, a table of its arguments, or a block's hash
--- (prefix.key) to continue that chain.  h.block_size counts tokens.
---@param ids integer[] token ids, each in 0..2^32-1
---@param seed lupin.TokenSeed
---@param block_size integer tokens per block, ≥ 1
---@param max_blocks integer
---@return lupin.Hashes
function M.token_hashes(ids, seed, block_size, max_blocks)
  if type(block_size) ~= "number" or block_size < 1 or block_size % 1 ~= 0 then
    error("prefix.token_hashes: block size must be a positive integer", 2)
  end
  local prev = seed_of(seed, "prefix.token_hashes", 2)
  local buf, k = ids_of(ids, "prefix.token_hashes", 2)
  local n = math.max(0, math.min(math.floor(k / block_size), max_blocks))
  local h, hs = acquire(n)
  local got = tonumber(capi.shared.token_block_hashes(prev, buf, k, block_size, hs.h, n))
  if got < 0 then
    hs.live = 1 -- a list never handed out: keep it for the next call
    M.release(h)
    error("prefix.token_hashes: hashing refused its input", 2)
  end
  return publish(h, hs, got, block_size)
end

-- The runtime's own (a leading "_": not in a plugin's copy of the module):
-- the C list behind hashes, and hashes made from given values (specs); a
-- list to fill and its publication (lupin.tokens).
function M._list(h)
  return list_of(h)
end
M._acquire, M._publish = acquire, publish

function M._from(values)
  local hs = HASHES(math.max(#values, 1))
  hs.cap, hs.n, hs.block_size, hs.live = math.max(#values, 1), #values, 1, 1
  for i, v in ipairs(values) do
    hs.h[i - 1] = v
  end
  local h = setmetatable({ n = #values, block_size = 1 }, HASHES_VIEW)
  lists[h] = hs
  return h
end

--- Gives back hashes its caller is done with (recorded, and referred to
--- nowhere else): a later prefix.hashes fills them again.  h must not be
--- read after this.
---@param h lupin.Hashes
function M.release(h)
  local hs = list_of(h)
  hs.live = 0
  if hs.cap <= MAX_KEPT then
    kept[hs.cap] = h
  end
end

---@class lupin.PrefixIndex
local Index = {}

-- An index is an empty table too: its C index and match buffers live here
-- (an index whose buffer size a plugin could write would let C write past
-- the buffer's end).
local states = setmetatable({}, { __mode = "k" }) -- index -> { x, cap, ids, counts }

local function read_only(methods)
  return {
    __index = methods,
    __newindex = function(_, k)
      error(("a prefix index is read-only (setting %s)"):format(tostring(k)), 2)
    end,
    __metatable = false, -- its methods are every index's
  }
end
local INDEX = read_only(Index)

-- The state of index self; an error at the caller's caller for anything else.
local function state_of(self)
  local st = states[self]
  if not st then
    error("not a prefix index: call the methods on what prefix.index returns", 3)
  end
  return st
end

--- The EPP's estimate of characters per token (blocks are in characters).
M.CHARS_PER_TOKEN = 4

-- An endpoint's announced cache block size in characters, or nil.
local function chars(ep)
  local size = ep.cache_block_size
  return size > 0 and math.floor(size) * M.CHARS_PER_TOKEN or nil
end

-- The first size endpoints[2..] announce, in characters, or nil.  The loop
-- only compares: when no endpoint reports a size it runs over them all, on
-- every call.
local function announced(endpoints)
  for i = 2, #endpoints do
    if endpoints[i].cache_block_size > 0 then
      return chars(endpoints[i])
    end
  end
end

--- The block size in characters for one request: with auto (autoTune), the
--- cache block size the first reporting endpoint announces, in tokens, hence
--- the factor; else block.
---@param block integer
---@param auto boolean
---@param endpoints lupin.Endpoint[]
function M.block_chars(block, auto, endpoints)
  local first = endpoints[1]
  if not auto or not first then
    return block
  end
  -- mostly the first answers: no loop, which would abort LuaJIT's traces at
  -- one trip (docs/performance.md, "Compiled paths")
  return chars(first) or announced(endpoints) or block
end

local function record_on(index, ep, h, auto)
  if ep then
    index:record(ep.id, h, auto and ep.num_blocks > 0 and math.floor(ep.num_blocks) or nil)
  end
end

--- Records the blocks of h on the endpoints a scheduling result sends the
--- request to: the primary profile's pick and, in P/D serving, the prefill
--- profile's pick (its prompt is prefilled there too).  auto: capacities
--- follow the endpoints' reported cache size (num_blocks).
---@param index lupin.PrefixIndex
---@param result lupin.Result
---@param h lupin.Hashes
---@param auto boolean
function M.record_result(index, result, h, auto)
  local primary = result.profiles[result.primary]
  local prefill = result.primary ~= "prefill" and result.profiles.prefill
  record_on(index, primary and primary.endpoints[1], h, auto)
  record_on(index, prefill and prefill.endpoints[1], h, auto)
end

local Shared = {}
local SHARED = read_only(Shared)

--- A prefix index; entries per endpoint are capped at capacity (LRU).
--- Removing an endpoint from the pool purges its entries.
---
--- With a key, the process-wide index of that key (docs/workers.md): made on
--- first use, the same index for every runtime (worker) of the process and
--- for every generation that asks for the key, so it outlives reloads; freed
--- when nothing holds it any more.  Name in the key all that gives the index
--- its meaning (plugin type, instance name, block size, capacity): the first
--- capacity given for a key is the one it keeps.  Without a key, an index of
--- this runtime only.
---@param capacity integer default capacity per endpoint, in blocks
---@param key string? the index's name in the process
---@return lupin.PrefixIndex
function M.index(capacity, key)
  if key ~= nil then
    if type(key) ~= "string" or key == "" then
      error(("prefix index key must be a non-empty string, got %s"):format(
        key == "" and "\"\"" or type(key)), 2)
    end
    local sh = capi.shared
    local v = sh.prefix_open(capi.rt, key, capacity)
    if v == nil then
      error("prefix index: out of memory", 2)
    end
    local self = setmetatable({}, SHARED)
    states[self] = { x = ffi.gc(v, sh.prefix_close), cap = 0, key = key }
    live[self] = true
    return self
  end
  local api = capi.api
  local x = api.prefix_new(capi.rt, capacity)
  if x == nil then
    error("prefix index: out of memory", 2)
  end
  local self = setmetatable({}, INDEX)
  states[self] = { x = ffi.gc(x, api.prefix_free), cap = 0 }
  live[self] = true
  return self
end

-- The hash of block i (0-based) of h.
local function block(h, i)
  local hs = list_of(h)
  if type(i) ~= "number" or i < 0 or i >= hs.n or i % 1 ~= 0 then
    error(("prefix: block %s is not one of the %d hashed"):format(tostring(i), hs.n), 3)
  end
  return hs.h[i]
end

--- The hash of block i (0-based) of h, as a uint64_t: the key of a prefix in
--- lupin.tokens (its character chain's hash names it), or the seed that
--- continues a token chain after block i (prefix.token_hashes).
---@param h lupin.Hashes
---@param i integer
---@return ffi.cdata* key a uint64_t
function M.key(h, i)
  return U64(block(h, i))
end

--- Records that endpoint id has cached the blocks of h (the last block is
--- evicted first).  Endpoints no longer in the pool are ignored.
---@param id integer endpoint id (ep.id)
---@param h lupin.Hashes
---@param capacity integer? caps id's entries first (its reported cache size)
function Index:record(id, h, capacity)
  local st, hs = state_of(self), list_of(h)
  if capacity then
    self:set_capacity(id, capacity)
  end
  if capi.api.prefix_record(st.x, id, hs.h, hs.n) ~= 0 then
    error("prefix index: out of memory", 2)
  end
end

-- Blocks matched by endpoint id from the C answer's k pairs.  Mostly one
-- endpoint holds the prompt: that case has no loop, which would abort
-- LuaJIT's traces at one trip (docs/performance.md, "Compiled paths").
local function matched(ids, counts, k)
  -- made at its size, in the hash part: ids are the process's, growing as
  -- endpoints come and go, so an array part keyed by them would be rehashed
  -- into a hash part by the first id past k
  local out = new_table(0, k)
  if k == 1 then
    out[ids[0]] = counts[0]
    return out
  end
  for i = 0, k - 1 do
    out[ids[i]] = counts[i]
  end
  return out
end

--- Per endpoint id, how many of h's blocks it holds, walking from the first
--- block and stopping at the first block no endpoint holds.
---@param h lupin.Hashes
---@return table<integer, integer> matches endpoint id -> matched blocks
function Index:match(h)
  local st, hs = state_of(self), list_of(h)
  local api, x = capi.api, st.x
  local need = tonumber(api.prefix_endpoints(x))
  if need > st.cap then
    st.cap = need * 2
    st.ids = ffi.new("uint32_t[?]", st.cap)
    st.counts = ffi.new("uint32_t[?]", st.cap)
  end
  M.counters.matched = M.counters.matched + 1
  if hs.n == 0 or need == 0 then
    return {}
  end
  local k = tonumber(api.prefix_match(x, hs.h, hs.n, st.ids, st.counts, st.cap))
  return matched(st.ids, st.counts, k)
end

--- Caps endpoint id's entries (evicting the least recent ones now if over).
function Index:set_capacity(id, capacity)
  local st = state_of(self)
  if capi.api.prefix_set_capacity(st.x, id, capacity) ~= 0 then
    error("prefix index: out of memory", 2)
  end
end

--- Drops every entry of endpoint id.
function Index:purge(id)
  local st = state_of(self)
  capi.api.prefix_purge(st.x, id)
end

--- How many block hashes endpoint id holds.
---@return integer
function Index:count(id)
  local st = state_of(self)
  return tonumber(capi.api.prefix_count(st.x, id))
end

--- Whether endpoint id holds block i (0-based) of h.
---@return boolean
function Index:holds(id, h, i)
  local st = state_of(self)
  return capi.api.prefix_holds(st.x, id, block(h, i)) ~= 0
end

--- Bytes of C memory the index holds.
---@return integer
--- A runtime's own index is never fed by a host: always sure.
function Index.unsure()
  return false
end

function Index:memory()
  local st = state_of(self)
  return tonumber(capi.api.prefix_memory(st.x))
end

-- The keyed index: the same methods over core/prefix_shared.c.

function Shared:record(id, h, capacity)
  local st, hs = state_of(self), list_of(h)
  if capi.shared.prefix_record(st.x, id, hs.h, hs.n, capacity or 0) ~= 0 then
    error("prefix index: out of memory", 2)
  end
end

--- runs: each endpoint counts the blocks it holds from the first without a
--- gap (what an engine can reuse: the precise plugins), rather than every
--- block it holds up to the first block nobody holds (the EPP's count).
function Shared:match(h, runs)
  local st, hs = state_of(self), list_of(h)
  M.counters.matched = M.counters.matched + 1
  if hs.n == 0 then
    return {}
  end
  local sh, x = capi.shared, st.x
  local f = runs and sh.prefix_match_runs or sh.prefix_match
  local k = tonumber(f(x, hs.h, hs.n, st.ids, st.counts, st.cap))
  while k > st.cap do -- more endpoints than room: it says how many
    st.cap = k * 2
    st.ids = ffi.new("uint32_t[?]", st.cap)
    st.counts = ffi.new("uint32_t[?]", st.cap)
    k = tonumber(f(x, hs.h, hs.n, st.ids, st.counts, st.cap))
  end
  if k < 0 then
    error("prefix index: out of memory", 2)
  end
  return matched(st.ids, st.counts, k)
end

function Shared:set_capacity(id, capacity)
  local st = state_of(self)
  if capi.shared.prefix_set_capacity(st.x, id, capacity) ~= 0 then
    error("prefix index: out of memory", 2)
  end
end

function Shared:purge(id)
  local st = state_of(self)
  capi.shared.prefix_purge(st.x, id)
end

function Shared:count(id)
  local st = state_of(self)
  return tonumber(capi.shared.prefix_count(st.x, id))
end

function Shared:holds(id, h, i)
  local st = state_of(self)
  return capi.shared.prefix_holds(st.x, id, block(h, i)) ~= 0
end

function Shared:memory()
  local st = state_of(self)
  return tonumber(capi.shared.prefix_memory(st.x))
end

--- Whether the host cannot vouch for what the index says of endpoint id
--- now: it purged what the engine's events had told it and is learning it
--- again (lupin_shared_prefix_unsure; docs/kv-events.md).
---@param id integer
---@return boolean
function Shared:unsure(id)
  local st = state_of(self)
  return capi.shared.prefix_unsure(st.x, id) ~= 0
end

--- Endpoint id no longer holds the blocks of h (only block i, 0-based, when
--- given): an engine evicted them.
---@param id integer
---@param h lupin.Hashes
---@param i integer?
function Shared:remove(id, h, i)
  local st, hs = state_of(self), list_of(h)
  local rc
  if i ~= nil then
    local one = ffi.new("uint64_t[1]", block(h, i))
    rc = capi.shared.prefix_remove(st.x, id, one, 1)
  else
    rc = capi.shared.prefix_remove(st.x, id, hs.h, hs.n)
  end
  if rc < 0 then
    error("prefix index: out of memory", 2)
  end
end

--- Bytes held by every live prefix index of this runtime (a keyed index
--- counted whole, whichever runtimes share it).
---@return integer
function M.memory()
  local total = 0
  for index in pairs(live) do
    total = total + index:memory()
  end
  return total
end

return M
