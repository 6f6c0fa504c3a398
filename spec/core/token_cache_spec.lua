-- The token cache of a lupin_shared (core/token_cache.c): token ids of prompt
-- prefixes by a caller's key, LRU-bounded in bytes, tokenize jobs handed to a
-- host's hook; in C through FFI and from plugins' Lua through lupin.tokens.
local S = require "support"
local native = require "lupin_native"
local N = require "core.native_ffi"
local ffi = require "ffi"
local bit = require "bit"

local C = N.C
local ENTRY = 56 -- an entry's bytes besides its ids (core/token_cache.c)

local function ids_upto(n, mul)
  local t = {}
  for i = 1, n do
    t[i] = i * (mul or 1)
  end
  return t
end

-- the C hashes of ids straight, as hex
local function direct(list, prev, bs)
  local ids, n = N.ids(list)
  local out = ffi.new("uint64_t[64]")
  local k = tonumber(C.lupin_token_block_hashes(prev, ids, n, bs, out, 64))
  local hex = {}
  for i = 0, k - 1 do
    hex[#hex + 1] = bit.tohex(out[i], 16)
  end
  return hex
end

local function cached(s, key, prev, bs)
  local out = ffi.new("uint64_t[64]")
  local k = tonumber(C.lupin_shared_tokens_hashes(s, key, prev, bs, out, 64))
  if k < 0 then
    return nil
  end
  local hex = {}
  for i = 0, k - 1 do
    hex[#hex + 1] = bit.tohex(out[i], 16)
  end
  return hex
end

local function put(s, key, list)
  local ids, n = N.ids(list)
  return C.lupin_shared_tokens_put(s, key, ids, n)
end

describe("the token cache, in C", function()
  local shared, s

  before_each(function()
    shared = native.shared(1)
    s = N.shared(shared)
  end)

  it("hashes the ids cached under a key, counts hits and misses", function()
    assert.equal(0, put(s, 1, ids_upto(40)))
    assert.same(direct(ids_upto(40), 9, 16), cached(s, 1, 9, 16)) -- 2 full blocks
    assert.equal(2, #cached(s, 1, 9, 16))
    assert.is_nil(cached(s, 2, 9, 16))
    assert.equal(40, tonumber(C.lupin_shared_tokens_count(s, 1)))
    assert.equal(-1, tonumber(C.lupin_shared_tokens_count(s, 2)))
    local st = N.stats(s)
    assert.same({ entries = 1, hits = 2, misses = 1, bytes = ENTRY + 160, limit = 64 * 2 ^ 20 },
      { entries = st.entries, hits = st.hits, misses = st.misses, bytes = st.bytes, limit = st.limit })
  end)

  it("replaces what a key held", function()
    assert.equal(0, put(s, 1, ids_upto(40)))
    assert.equal(0, put(s, 1, ids_upto(20, 3)))
    assert.same(direct(ids_upto(20, 3), 0, 4), cached(s, 1, 0, 4))
    local st = N.stats(s)
    assert.equal(1, st.entries)
    assert.equal(ENTRY + 80, st.bytes)
    assert.equal(0, put(s, 7, {})) -- no ids: cached, no blocks
    assert.same({}, cached(s, 7, 0, 4))
  end)

  it("writes no more than cap, and refuses bad arguments", function()
    assert.equal(0, put(s, 1, ids_upto(40)))
    local out = ffi.new("uint64_t[4]")
    out[1] = 42
    assert.equal(1, tonumber(C.lupin_shared_tokens_hashes(s, 1, 0, 16, out, 1)))
    assert.equal(42, tonumber(out[1]))
    assert.equal(-1, tonumber(C.lupin_shared_tokens_hashes(s, 1, 0, 0, out, 4)))
    assert.equal(-1, tonumber(C.lupin_shared_tokens_hashes(s, 1, 0, 16, nil, 4)))
    assert.equal(-1, tonumber(C.lupin_shared_tokens_hashes(nil, 1, 0, 16, out, 4)))
    assert.equal(-1, C.lupin_shared_tokens_put(s, 1, nil, 3))
    assert.equal(-1, C.lupin_shared_tokens_put(nil, 1, N.ids({ 1 }), 1))
    assert.equal(-1, tonumber(C.lupin_shared_tokens_count(nil, 1)))
    assert.equal(-1, C.lupin_shared_tokens_want(s, nil))
    assert.equal(-1, C.lupin_shared_tokens_want(nil, ffi.new("spec_tokenize_job")))
    assert.equal(-1, C.lupin_shared_tokens_want(s, ffi.new("spec_tokenize_job", { text_len = 3 })))
    C.lupin_shared_tokens_limit(nil, 1) -- no effect, no crash
    C.lupin_shared_tokens_failed(nil, 1)
  end)

  it("evicts the least recently used past its byte limit", function()
    local each = ENTRY + 16 -- 4 ids
    C.lupin_shared_tokens_limit(s, 3 * each)
    for key = 1, 3 do
      assert.equal(0, put(s, key, { key, 2, 3, 4 }))
    end
    assert.truthy(cached(s, 1, 0, 4)) -- 1 is now the most recent: 2 the least
    assert.equal(0, put(s, 4, { 4, 2, 3, 4 }))
    assert.equal(-1, tonumber(C.lupin_shared_tokens_count(s, 2)))
    for _, key in ipairs({ 1, 3, 4 }) do
      assert.equal(4, tonumber(C.lupin_shared_tokens_count(s, key)))
    end
    local st = N.stats(s)
    assert.same({ 3, 3 * each, 1 }, { st.entries, st.bytes, st.evictions })
    -- a lower limit evicts at once, least recent first: 4 is kept
    C.lupin_shared_tokens_limit(s, each)
    assert.equal(4, tonumber(C.lupin_shared_tokens_count(s, 4)))
    assert.equal(1, N.stats(s).entries)
    -- more than the whole limit: refused, the cache as it was
    assert.equal(-1, put(s, 5, { 1, 2, 3, 4, 5 }))
    assert.equal(-1, tonumber(C.lupin_shared_tokens_count(s, 5)))
    assert.equal(4, tonumber(C.lupin_shared_tokens_count(s, 4)))
  end)

  describe("jobs", function()
    local jobs, hook, on_job

    before_each(function()
      jobs, on_job = {}, nil
      hook = ffi.cast("spec_tokenize_fn", function(_, job)
        jobs[#jobs + 1] = {
          key = tonumber(job.key),
          endpoint = job.endpoint ~= nil and ffi.string(job.endpoint) or nil,
          model = job.model ~= nil and ffi.string(job.model) or nil,
          text = ffi.string(job.text, job.text_len),
          chat = job.chat,
        }
        if on_job then
          on_job(job)
        end
      end)
    end)

    after_each(function()
      C.lupin_shared_on_tokenize(s, nil, nil)
      hook:free()
    end)

    local function want(key, text, extra)
      local j = ffi.new("spec_tokenize_job", extra or {})
      j.key, j.text, j.text_len = key, text, #text
      return C.lupin_shared_tokens_want(s, j)
    end
    jit.off(want) -- a callback out of a compiled FFI call is refused

    it("asks nothing without a hook", function()
      assert.equal(0, want(1, "abc"))
      assert.equal(0, N.stats(s).pending)
    end)

    it("gives the hook the job's fields, once until answered", function()
      C.lupin_shared_on_tokenize(s, hook, nil)
      assert.equal(1, want(5, "[{\"role\":\"user\"}]", { endpoint = "ep1", model = "m", chat = 1 }))
      assert.same({ { key = 5, endpoint = "ep1", model = "m", text = "[{\"role\":\"user\"}]", chat = 1 } },
        jobs)
      assert.equal(0, want(5, "again")) -- pending
      assert.equal(1, N.stats(s).pending)
      assert.equal(0, put(s, 5, ids_upto(8)))
      assert.equal(0, want(5, "again")) -- cached
      assert.equal(1, want(6, "other"))
      assert.equal(0, jobs[2].chat)
      assert.is_nil(jobs[2].endpoint)
      local st = N.stats(s)
      assert.same({ 2, 1, 1 }, { st.asked, st.pending, st.entries })
    end)

    it("asks again after a failure, or once the pending job expired", function()
      C.lupin_shared_on_tokenize(s, hook, nil)
      assert.equal(1, want(5, "x"))
      C.lupin_shared_tokens_failed(s, 5)
      C.lupin_shared_tokens_failed(s, 6) -- never asked: not counted
      assert.equal(1, want(5, "x"))
      C.lupin_shared_tokens_pending_seconds(s, 0)
      assert.equal(1, want(7, "y"))
      assert.equal(1, want(7, "y")) -- expired at once
      -- with no time to live every job pending expired, 5's too (it had 5 s
      -- when asked: the time counts as it is when checked), the last 7 at stats
      local st = N.stats(s)
      assert.same({ asked = 4, failed = 1, expired = 3, pending = 0 },
        { asked = st.asked, failed = st.failed, expired = st.expired, pending = st.pending })
      -- a negative or NaN time is refused: jobs still expire at once
      C.lupin_shared_tokens_pending_seconds(s, -1)
      C.lupin_shared_tokens_pending_seconds(s, 0 / 0)
      assert.equal(1, want(7, "y"))
    end)

    it("calls the hook with no lock held: it can answer at once", function()
      on_job = function(job)
        assert.equal(0, put(s, job.key, ids_upto(16)))
      end
      C.lupin_shared_on_tokenize(s, hook, nil)
      assert.equal(1, want(9, "now"))
      assert.equal(16, tonumber(C.lupin_shared_tokens_count(s, 9)))
      assert.equal(0, N.stats(s).pending)
      assert.same(direct(ids_upto(16), 0, 16), cached(s, 9, 0, 16))
    end)
  end)
end)

describe("lupin.tokens", function()
  local shared, s, a, b

  before_each(function()
    shared = native.shared(2)
    s = N.shared(shared)
    a = S.runtime({ shared = shared })
    b = S.runtime({ shared = shared })
    S.endpoints(a, 2)
  end)

  after_each(function()
    a:free()
    b:free()
  end)

  local function eval(rt, code)
    return S.eval(rt, [[
      local prefix, tokens, bit = require "lupin.prefix", require "lupin.tokens", require "bit"
      local function hex(h)
        local out = {}
        for i = 0, h.n - 1 do out[#out + 1] = bit.tohex(prefix._list(h).h[i], 16) end
        return out
      end
    ]] .. code)
  end

  it("caches ids in one runtime that another hashes, as prefix.token_hashes does", function()
    eval(a, [[tokens.put(77, { 1, 2, 3, 4, 5, 6, 7, 8, 9 })]])
    local got = eval(b, [[
      local seed = prefix.token_seed("s", "", "")
      local h = tokens.hashes(77, seed, 4, 256)
      return { n = h.n, block_size = h.block_size, hex = hex(h), count = tokens.count(77),
        same = table.concat(hex(h))
          == table.concat(hex(prefix.token_hashes({ 1, 2, 3, 4, 5, 6, 7, 8, 9 }, seed, 4, 256))),
        table = table.concat(hex(tokens.hashes(77, { hash_seed = "s" }, 4, 256))) == table.concat(hex(h)),
        capped = tokens.hashes(77, seed, 4, 1).n, miss = tokens.hashes(78, seed, 4, 256) == nil,
        none = tokens.count(78) == nil }
    ]])
    assert.same({ n = 2, block_size = 4, count = 9, same = true, table = true, capped = 1,
      miss = true, none = true, hex = got.hex }, got)
    assert.same(direct({ 1, 2, 3, 4, 5, 6, 7, 8, 9 }, C.lupin_token_seed("s", 1, "", 0, "", 0), 4),
      got.hex)
    assert.same({ 3, 1 }, { N.stats(s).hits, N.stats(s).misses })
  end)

  it("keys a prefix by its character hash (prefix.key), sizing long lists by count", function()
    local got = eval(a, [[
      local h = prefix.hashes(("abcd"):rep(10), "m", "", 4, 256)
      local key = prefix.key(h, 9)
      local ids = {}
      for i = 1, 20000 do ids[i] = i end
      tokens.put(key, ids)
      local t = tokens.hashes(key, 0, 4, 100000) -- over 4096 blocks: counted first
      local x = prefix.index(10000, "precise")
      local ep = require("lupin.runtime.pool").list[1]
      x:record(ep.id, t)
      local m = x:match(t)
      prefix.release(t)
      return { n = t.n, count = tokens.count(key), matched = m[ep.id] }
    ]])
    assert.same({ n = 5000, count = 20000, matched = 5000 }, got)
  end)

  it("asks the host's hook for a prefix's ids, once", function()
    local jobs = {}
    local hook = ffi.cast("spec_tokenize_fn", function(_, job)
      jobs[#jobs + 1] = { key = tostring(job.key), model = ffi.string(job.model),
        endpoint = job.endpoint ~= nil and ffi.string(job.endpoint) or false,
        text = ffi.string(job.text, job.text_len), chat = job.chat }
    end)
    C.lupin_shared_on_tokenize(s, hook, nil)
    local got = eval(a, [[
      local key = prefix.key(prefix.hashes("abcdefgh", "m", "", 4, 256), 1)
      local first = tokens.want { key = key, model = "m", text = "abcdefgh", endpoint = "ep1" }
      local again = tokens.want { key = key, model = "m", text = "abcdefgh" }
      local chat = tokens.want { key = 5, model = "m", text = "[]", chat = true }
      return { first, again, chat, tostring(key) }
    ]])
    C.lupin_shared_on_tokenize(s, nil, nil)
    hook:free()
    assert.same({ true, false, true }, { got[1], got[2], got[3] })
    assert.same({
      { key = got[4], model = "m", endpoint = "ep1", text = "abcdefgh", chat = 0 },
      { key = "5ULL", model = "m", endpoint = false, text = "[]", chat = 1 },
    }, jobs)
    assert.is_false(eval(b, [[return tokens.want { key = 6, text = "no hook" }]]))
  end)

  it("refuses bad keys, ids and jobs, naming them", function()
    local function err(code)
      local ok, e = pcall(eval, a, code)
      assert.is_false(ok)
      return e
    end
    assert.matches("tokens.put: key must be a 64-bit key", err([[tokens.put("k", { 1 })]]), 1, true)
    assert.matches("tokens.put: key must be a 64-bit key", err([[tokens.put(-1, { 1 })]]), 1, true)
    assert.matches("tokens.put: ids[2] is -3", err([[tokens.put(1, { 1, -3 })]]), 1, true)
    assert.matches("tokens.put: ids must be an array", err([[tokens.put(1, 5)]]), 1, true)
    assert.matches("tokens.hashes: block size must be a positive integer",
      err([[tokens.hashes(1, 0, 0, 4)]]), 1, true)
    assert.matches("tokens.hashes: the seed must be", err([[tokens.hashes(1, "x", 4, 4)]]), 1, true)
    assert.matches("tokens.want: a table", err([[tokens.want(1)]]), 1, true)
    assert.matches("tokens.want: text must be a string, got nil", err([[tokens.want { key = 1 }]]),
      1, true)
    assert.matches("tokens.want: model must be a string, got number",
      err([[tokens.want { key = 1, text = "", model = 3 }]]), 1, true)
    assert.matches("tokens.want: key must be", err([[tokens.want { text = "" }]]), 1, true)
    -- more ids than the cache's limit
    C.lupin_shared_tokens_limit(s, 100)
    assert.matches("tokens.put: refused", err([[tokens.put(1, { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 })]]),
      1, true)
  end)

  it("is what a plugin requires as lupin.tokens, without the runtime's own", function()
    local got = eval(a, [[
      local loader = require "lupin.generation.loader"
      return { sdk = loader.REQUIRE["lupin.tokens"] == true, key = type(prefix.key),
        token_hashes = type(prefix.token_hashes) }
    ]])
    assert.same({ sdk = true, key = "function", token_hashes = "function" }, got)
  end)
end)
