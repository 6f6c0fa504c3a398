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
