-- Chained block hashing (core/blockhash.c through lupin.prefix), checked
-- against an independent computation with libxxhash's XXH64 called directly.
local S = require "support"
local ffi = require "ffi"
local bit = require "bit"

ffi.cdef [[ uint64_t XXH64(const void *input, size_t length, uint64_t seed); ]]
local xxh = ffi.load("xxhash")

local function le64(v)
  local b = {}
  for i = 0, 7 do
    b[#b + 1] = string.char(tonumber(bit.band(bit.rshift(v, i * 8), 0xff)))
  end
  return table.concat(b)
end

local function xxh64(s)
  return xxh.XXH64(s, #s, 0)
end

-- The formula of the issue, written out independently of the C code.
local function expected(prompt, model, salt, bs, max)
  local h, out = xxh64(model .. salt), {}
  for i = 0, math.min(math.floor(#prompt / bs), max) - 1 do
    h = xxh64(prompt:sub(i * bs + 1, (i + 1) * bs) .. le64(h))
    out[#out + 1] = bit.tohex(h, 16)
  end
  return out
end

describe("block hashing", function()
  local rt
  setup(function()
    rt = S.runtime()
  end)
  teardown(function()
    rt:free()
  end)

  local function hashes(prompt, model, salt, bs, max)
    return S.eval(rt, ([[
      local h = require("lupin.prefix").hashes(%q, %s, %s, %d, %d)
      local out = {}
      for i = 0, h.n - 1 do out[#out + 1] = require("bit").tohex(require("lupin.prefix")._list(h).h[i], 16) end
      return { n = h.n, hex = out }
    ]]):format(prompt, model and ("%q"):format(model) or "nil",
      salt and ("%q"):format(salt) or "nil", bs, max))
  end

  it("matches xxh64 chained over blocks with the model and salt as seed", function()
    local got = hashes("aaaabbbbcccc", "llama", "tenant-1", 4, 256)
    assert.equal(3, got.n)
    assert.same(expected("aaaabbbbcccc", "llama", "tenant-1", 4, 256), got.hex)
  end)

  it("does not hash a trailing partial block", function()
    local got = hashes("aaaabbbbcc", "m", "", 4, 256)
    assert.equal(2, got.n)
    assert.same(expected("aaaabbbb", "m", "", 4, 256), got.hex)
  end)

  it("hashes at most maxPrefixBlocksToMatch blocks", function()
    local got = hashes(("x"):rep(40), "m", "", 4, 3)
    assert.equal(3, got.n)
    assert.same(expected(("x"):rep(40), "m", "", 4, 3), got.hex)
  end)

  it("gives no hashes for a prompt shorter than a block, or an empty one", function()
    assert.equal(0, hashes("abc", "m", "", 4, 256).n)
    assert.equal(0, hashes("", "m", "", 4, 256).n)
  end)

  it("hashes long blocks (the streaming path) the same way", function()
    local prompt = ("0123456789abcdef"):rep(100) -- 1600 characters, blocks of 700
    local got = hashes(prompt, "m", "s", 700, 256)
    assert.equal(2, got.n)
    assert.same(expected(prompt, "m", "s", 700, 256), got.hex)
  end)

  it("shares leading hashes between prompts with a common prefix, and only those", function()
    local a, b = hashes("aaaabbbbcccc", "m", "", 4, 256), hashes("aaaabbbbdddd", "m", "", 4, 256)
    assert.equal(a.hex[1], b.hex[1])
    assert.equal(a.hex[2], b.hex[2])
    assert.not_equal(a.hex[3], b.hex[3])
  end)

  it("separates models and cache salts from the first block on", function()
    local base = hashes("aaaabbbb", "m1", "", 4, 256)
    assert.not_equal(base.hex[1], hashes("aaaabbbb", "m2", "", 4, 256).hex[1])
    assert.not_equal(base.hex[1], hashes("aaaabbbb", "m1", "salt", 4, 256).hex[1])
    -- a missing model or salt is the empty string
    assert.same(hashes("aaaa", "", "", 4, 256).hex, hashes("aaaa", nil, nil, 4, 256).hex)
  end)

  it("fills given-back hashes again for the next prompt, with nothing of the last one", function()
    local got = S.eval(rt, [[
      local prefix, bit = require "lupin.prefix", require "bit"
      local function hex(h)
        local out = {}
        for i = 0, h.n - 1 do out[#out + 1] = bit.tohex(prefix._list(h).h[i], 16) end
        return out
      end
      local a = prefix.hashes(("a"):rep(80), "m", "", 4, 256)  -- 20 blocks
      local a_list = prefix._list(a)
      prefix.release(a)
      local b = prefix.hashes(("b"):rep(68), "m", "", 4, 256)  -- 17: the same capacity, 32
      local c = prefix.hashes(("b"):rep(68), "m", "", 4, 256)  -- none kept: a fresh list
      local b_hex, b_list = hex(b), prefix._list(b)
      prefix.release(b)
      local d = prefix.hashes(("b"):rep(400), "m", "", 4, 256) -- 100: another capacity
      return { reused = rawequal(a_list, b_list), fresh = not rawequal(b_list, prefix._list(c)),
        other = not rawequal(b_list, prefix._list(d)),
        n = b.n, same = table.concat(b_hex) == table.concat(hex(c)), hex = b_hex }
    ]])
    assert.is_true(got.reused)
    assert.is_true(got.fresh)
    assert.is_true(got.other)
    assert.equal(17, got.n)
    assert.is_true(got.same)
    assert.same(expected(("b"):rep(68), "m", "", 4, 256), got.hex)
  end)

  it("refuses to take back what prefix.hashes did not make", function()
    local ok, err = pcall(S.eval, rt, [[ require("lupin.prefix").release({ n = 3 }) ]])
    assert.is_false(ok)
    assert.matches("prefix: hashes must come from prefix.hashes and not be released yet", err, 1, true)
  end)

  it("refuses a block size of 0, in Lua and in C", function()
    local ok, err = pcall(S.eval, rt, [[ return require("lupin.prefix").hashes("abcd", "m", "", 0, 4) ]])
    assert.is_false(ok)
    assert.matches("block size must be a positive integer", err)
    assert.equal(-1, S.eval(rt, [[
      local ffi, capi = require "ffi", require "lupin.runtime.capi"
      local input = ffi.new("lupin_hash_input", { prompt = "abcd", prompt_len = 4, block_size = 0,
        max_blocks = 4 })
      return tonumber(capi.api.block_hashes(input, ffi.new("uint64_t[4]"), 4))
    ]]))
    assert.equal(-1, S.eval(rt, [[
      local ffi, capi = require "ffi", require "lupin.runtime.capi"
      return tonumber(capi.api.block_hashes(nil, ffi.new("uint64_t[4]"), 4))
    ]]))
  end)
end)

-- Block hashes of token ids (lupin_token_seed, lupin_token_block_hashes):
-- the byte layout pinned by an independent computation over bytes built here.
local function le32(v)
  local b = {}
  for i = 0, 3 do
    b[#b + 1] = string.char(bit.band(bit.rshift(v, i * 8), 0xff))
  end
  return table.concat(b)
end

local function field(s)
  return le64(ffi.new("uint64_t", #s)) .. s
end

local function token_seed(hash_seed, lora, salt)
  local bytes = "lupin-tokens\0" .. field(hash_seed) .. field(lora) .. field(salt)
  return xxh64(bytes)
end

local function token_expected(ids, prev, bs)
  local h, out = prev, {}
  for i = 0, math.floor(#ids / bs) - 1 do
    local block = {}
    for j = 1, bs do
      block[j] = le32(ids[i * bs + j])
    end
    h = xxh.XXH64(table.concat(block) .. le64(h), bs * 4 + 8, 0)
    out[#out + 1] = bit.tohex(h, 16)
  end
  return out
end

describe("token block hashing", function()
  local rt
  setup(function()
    rt = S.runtime()
  end)
  teardown(function()
    rt:free()
  end)

  -- prefix.token_hashes in the runtime; seed: Lua source of its argument
  local function token_hashes(ids, seed, bs, max)
    return S.eval(rt, ([[
      local prefix, bit = require "lupin.prefix", require "bit"
      local h = prefix.token_hashes({ %s }, %s, %d, %d)
      local out = {}
      for i = 0, h.n - 1 do out[#out + 1] = bit.tohex(prefix._list(h).h[i], 16) end
      return { n = h.n, block_size = h.block_size, hex = out }
    ]]):format(table.concat(ids, ", "), seed, bs, max))
  end

  local function seed_hex(args)
    return S.eval(rt, ("return require('bit').tohex(require('lupin.prefix').token_seed(%s), 16)")
      :format(args))
  end

  local IDS = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 4294967295, 0, 65536, 31999, 100 }

  it("chains xxh64 over little-endian u32 ids from a tagged, length-prefixed seed", function()
    local seed = token_seed("s", "lora-a", "salt")
    assert.equal(bit.tohex(seed, 16), seed_hex([["s", "lora-a", "salt"]]))
    local got = token_hashes(IDS, [[require("lupin.prefix").token_seed("s", "lora-a", "salt")]], 4, 256)
    assert.equal(4, got.n) -- 17 ids: 4 full blocks, the 17th id ignored
    assert.equal(4, got.block_size)
    assert.same(token_expected(IDS, seed, 4), got.hex)
    -- a fixed vector: the layout may never change without this line changing
    assert.equal("6ac62b457c4d9df2", bit.tohex(token_seed("", "", ""), 16))
    assert.equal("c6cc5675a86f4cd4", token_expected(IDS, token_seed("", "", ""), 4)[1])
    assert.equal("c6cc5675a86f4cd4", token_hashes(IDS, [[{}]], 4, 1).hex[1])
  end)

  it("takes the seed as a table of its parts, or nil parts as empty", function()
    local want = token_hashes(IDS, [[require("lupin.prefix").token_seed("s", nil, "x")]], 4, 256)
    assert.same(want.hex, token_hashes(IDS, [[{ hash_seed = "s", salt = "x" }]], 4, 256).hex)
    assert.same(want.hex, token_hashes(IDS, [[{ hash_seed = "s", lora = "", salt = "x" }]], 4, 256).hex)
  end)

  it("continues a chain from a stored block's hash as from the whole", function()
    local got = S.eval(rt, [[
      local prefix, bit = require "lupin.prefix", require "bit"
      local ids = {}
      for i = 1, 48 do ids[i] = i * 7 end
      local seed = prefix.token_seed("", "", "")
      local whole = prefix.token_hashes(ids, seed, 16, 256)
      local head = prefix.token_hashes({ unpack(ids, 1, 16) }, seed, 16, 256)
      local tail = prefix.token_hashes({ unpack(ids, 17, 48) }, prefix.key(head, 0), 16, 256)
      local l, t = prefix._list(whole), prefix._list(tail)
      return { whole = whole.n, tail = tail.n, first = l.h[0] == prefix._list(head).h[0],
        rest = l.h[1] == t.h[0] and l.h[2] == t.h[1],
        key = bit.tohex(prefix.key(whole, 2), 16) == bit.tohex(l.h[2], 16) }
    ]])
    assert.same({ whole = 3, tail = 2, first = true, rest = true, key = true }, got)
  end)

  it("separates hash seeds, adapters and salts, and never meets the character chain", function()
    local a = seed_hex([["ab", "c", ""]])
    assert.not_equal(a, seed_hex([["a", "bc", ""]]))
    assert.not_equal(a, seed_hex([["ab", "", "c"]]))
    assert.not_equal(seed_hex([["", "lora", ""]]), seed_hex([["", "", "lora"]]))
    assert.not_equal(seed_hex([["", "", ""]]), bit.tohex(xxh64(""), 16)) -- lupin_block_seed("", "")
    local base = token_hashes(IDS, [[{ lora = "a" }]], 4, 256).hex
    assert.not_equal(base[1], token_hashes(IDS, [[{ lora = "b" }]], 4, 256).hex[1])
    assert.not_equal(base[1], token_hashes(IDS, [[{ lora = "a", salt = "t" }]], 4, 256).hex[1])
  end)

  it("hashes full blocks only, at most max_blocks, long blocks the same way", function()
    assert.equal(0, token_hashes({ 1, 2, 3 }, "0", 4, 256).n)
    assert.equal(0, token_hashes({}, "0", 4, 256).n)
    assert.equal(2, token_hashes(IDS, "0", 4, 2).n)
    assert.equal(0, token_hashes(IDS, "0", 4, 0).n)
    local long = {}
    for i = 1, 700 do
      long[i] = i * 2654435761 % 4294967296
    end
    local got = token_hashes(long, "5", 300, 256) -- 300 ids: the streaming path
    assert.equal(2, got.n)
    assert.same(token_expected(long, ffi.new("uint64_t", 5), 300), got.hex)
  end)

  it("refuses ids that are not u32 integers, a bad block size or seed, naming them", function()
    local function err(code)
      local ok, e = pcall(S.eval, rt, "local prefix = require 'lupin.prefix'\n" .. code)
      assert.is_false(ok)
      return e
    end
    assert.matches("ids[2] is -1, not an integer in 0..2^32-1",
      err([[prefix.token_hashes({ 1, -1 }, 0, 4, 8)]]), 1, true)
    assert.matches("ids[1] is 4294967296, not an integer",
      err([[prefix.token_hashes({ 2^32 }, 0, 4, 8)]]), 1, true)
    assert.matches("ids[3] is 1.5", err([[prefix.token_hashes({ 1, 2, 1.5 }, 0, 4, 8)]]), 1, true)
    assert.matches("ids[1] is x", err([[prefix.token_hashes({ "x" }, 0, 4, 8)]]), 1, true)
    assert.matches("ids must be an array of token ids, got string",
      err([[prefix.token_hashes("1 2 3", 0, 4, 8)]]), 1, true)
    assert.matches("block size must be a positive integer",
      err([[prefix.token_hashes({ 1 }, 0, 0, 8)]]), 1, true)
    assert.matches("the seed must be a 64-bit key", err([[prefix.token_hashes({ 1 }, "s", 4, 8)]]),
      1, true)
    assert.matches("the seed must be a 64-bit key", err([[prefix.token_hashes({ 1 }, -1, 4, 8)]]),
      1, true)
    assert.matches("token_seed: strings expected, got number", err([[prefix.token_seed(1)]]), 1, true)
  end)

  it("refuses bad arguments in C, and writes no more than cap", function()
    local N = require "core.native_ffi"
    local ids, n = N.ids(IDS)
    local out = ffi.new("uint64_t[8]")
    assert.equal(-1, tonumber(N.C.lupin_token_block_hashes(0, ids, n, 0, out, 8)))
    assert.equal(-1, tonumber(N.C.lupin_token_block_hashes(0, nil, n, 4, out, 8)))
    assert.equal(-1, tonumber(N.C.lupin_token_block_hashes(0, ids, n, 4, nil, 8)))
    assert.equal(0, tonumber(N.C.lupin_token_block_hashes(0, nil, 0, 4, nil, 0)))
    out[1] = 42
    assert.equal(1, tonumber(N.C.lupin_token_block_hashes(0, ids, n, 4, out, 1)))
    assert.equal(42, tonumber(out[1]))
    assert.equal(token_expected(IDS, ffi.new("uint64_t", 0), 4)[1], bit.tohex(out[0], 16))
    -- NULL strings are empty ones
    assert.equal(bit.tohex(token_seed("", "", ""), 16),
      bit.tohex(N.C.lupin_token_seed(nil, 0, nil, 0, nil, 0), 16))
  end)
end)
