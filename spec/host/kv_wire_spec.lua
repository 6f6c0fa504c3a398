-- vLLM's KV-cache events decoded (host/kv_wire.c, lh_kv_decode): payloads of
-- vLLM's ZMQ publisher, in every shape vLLM has sent, written here with
-- lua-messagepack and by hand where the exact encoding matters, run through
-- spec/host/kv_wire.c (build/kv-wire), which prints each batch as JSON
-- after checking that every array and string lies in the batch's one
-- allocation (at most 40 x len + 1 KiB).  The fuzz target's seeds
-- (spec/fuzz/corpus/kv_wire/) are payloads of this spec: LUPIN_WRITE_KV_CORPUS=1
-- writes them again.
local support = require "support"
local mp = require "MessagePack"

local null = support.json.null

-- --- payloads ---------------------------------------------------------------

-- nil inside arrays and maps (a Lua nil ends a table)
local NIL = setmetatable({}, { __tostring = function() return "NIL" end })

local function raw(bytes) return { raw = bytes } end
local function M(pairs_) return { map = pairs_ } end -- k1, v1, k2, v2, ... in this order

local function be(n, width) -- n: an integer below 2^53
  local t = {}
  for i = width, 1, -1 do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end

local function hex(h)
  return (h:gsub("..", function(b) return string.char(tonumber(b, 16)) end))
end

local function header(n, fix, fixmax, b16, b32)
  if n <= fixmax then return string.char(fix + n) end
  if n <= 0xffff then return string.char(b16) .. be(n, 2) end
  return string.char(b32) .. be(n, 4)
end

-- msgpack of v: a Lua table is an array (NIL for nil), M{...} a map, raw{}
-- bytes as they are, anything else lua-messagepack's (integers as the
-- smallest int, other numbers as float 64, strings as str)
local function enc(v)
  if v == NIL then return "\192" end
  if type(v) ~= "table" then return mp.pack(v) end
  if v.raw then return v.raw end
  local out = {}
  if v.map then
    out[1] = header(#v.map / 2, 0x80, 15, 0xde, 0xdf)
    for i = 1, #v.map do out[#out + 1] = enc(v.map[i]) end
  else
    out[1] = header(#v, 0x90, 15, 0xdc, 0xdd)
    for i = 1, #v do out[#out + 1] = enc(v[i]) end
  end
  return table.concat(out)
end

local function u64(h) return raw("\207" .. hex(h)) end -- uint 64
local function i64(h) return raw("\211" .. hex(h)) end -- int 64
local function bin(s) return raw("\196" .. string.char(#s) .. s) end -- bin 8
local function f32(x)
  mp.set_number "float"
  local s = mp.pack(x)
  mp.set_number "double"
  return raw(s)
end

-- BlockStored as vLLM >= 0.10 sends it positionally: every field
local function stored(f)
  return { "BlockStored", f.hashes, f.parent or NIL, f.tokens, f.block_size or 4, f.lora_id or NIL,
    f.medium or NIL, f.lora_name or NIL, f.extra_keys or NIL, f.group_idx or NIL, f.kind or NIL,
    f.window or NIL }
end

-- the same as a map (vLLM PR #42892): fields equal to their default omitted
local function stored_map(f)
  local m = { "type", "BlockStored", "block_hashes", f.hashes, "parent_block_hash", f.parent or NIL,
    "token_ids", f.tokens, "block_size", f.block_size or 4, "lora_id", f.lora_id or NIL,
    "medium", f.medium or NIL, "lora_name", f.lora_name or NIL }
  for _, kv in ipairs { { "extra_keys", f.extra_keys }, { "group_idx", f.group_idx },
    { "kv_cache_spec_kind", f.kind }, { "kv_cache_spec_sliding_window", f.window } } do
    if kv[2] ~= nil then
      m[#m + 1] = kv[1]
      m[#m + 1] = kv[2]
    end
  end
  return M(m)
end

local function removed(hashes, medium, group)
  return { "BlockRemoved", hashes, medium or NIL, group or NIL }
end
local function removed_map(hashes, medium, group)
  local m = { "type", "BlockRemoved", "block_hashes", hashes, "medium", medium or NIL }
  if group then
    m[#m + 1] = "group_idx"
    m[#m + 1] = group
  end
  return M(m)
end
local CLEARED, CLEARED_MAP = { "AllBlocksCleared" }, M { "type", "AllBlocksCleared" }

local function batch(events, rank, ts) return enc { ts or 1700000000.25, events, rank or NIL } end
local function map_batch(events, rank, ts)
  return enc(M { "ts", ts or 1700000000.25, "events", events, "data_parallel_rank", rank or NIL })
end

-- --- the program --------------------------------------------------------------

local dir = support.tmpdir()
local written = 0

-- kv-wire [mode] over the payloads; its lines
local function run(payloads, mode)
  local files = {}
  for i, p in ipairs(payloads) do
    written = written + 1
    files[i] = dir .. "/p" .. written
    local f = assert(io.open(files[i], "wb"))
    f:write(p)
    f:close()
  end
  local out = support.program("kv-wire", (mode and mode .. " " or "") .. table.concat(files, " "))
  assert.equal("0", out:match("rc=(%d+)%s*$"), out)
  local lines = {}
  for line in out:gmatch("[^\n]+") do
    if not line:match("^rc=") then lines[#lines + 1] = line end
  end
  return lines, out
end

-- each payload decoded: the batch, or {error = code, message = ...}
local function results(payloads)
  local lines, out = run(payloads)
  assert.equal(#payloads, #lines, out)
  local r = {}
  for i, line in ipairs(lines) do
    if line:sub(1, 1) == "{" then
      r[i] = support.json.decode(line)
      assert.is_true(r[i].one_allocation, line)
    else
      local code, msg = line:match("^error (%-%d) (.*)$")
      assert(code, line) -- "invariant broken: ..." fails here
      r[i] = { error = tonumber(code), message = msg }
    end
  end
  return r
end
local function decode(p) return results({ p })[1] end

-- an event as kv-wire prints it, the defaults filled in
local function ev(t)
  return { type = t.type or "BlockStored", hashes = t.hashes or {}, parent = t.parent or null,
    tokens = t.tokens or {}, block_size = t.block_size or 0, medium = t.medium or null,
    lora_name = t.lora_name or null, salt = t.salt or null, other_group = t.other_group or false }
end

local function events(b)
  assert.is_nil(b.error, b.message)
  return b.events
end

-- --- the seeds of the fuzz target ----------------------------------------------

local sha = string.char(unpack((function()
  local t = {}
  for i = 1, 32 do t[i] = i end
  return t
end)()))

local seeds = {
  ["array-batch-array-events"] = batch({
    stored { hashes = { u64 "d0c1b2a394857667", u64 "8000000000000001" }, parent = 42,
      tokens = { 1, 2, 3, 4, 5, 6, 7, 8 }, block_size = 4, medium = "GPU", group_idx = 0,
      kind = "full_attention" },
    removed({ u64 "d0c1b2a394857667" }, "GPU", 0),
    CLEARED,
  }, 0),
  ["array-batch-map-events"] = batch({
    stored_map { hashes = { 7, 8 }, tokens = { 10, 11, 12, 13, 14, 15, 16, 17 }, medium = "GPU",
      lora_name = "lora-a", extra_keys = { { "lora-a", "salt-1" }, { "lora-a" } } },
    removed_map({ 7 }, "CPU"),
    CLEARED_MAP,
  }, 1),
  ["map-batch-mixed-events"] = map_batch({
    stored { hashes = { bin(sha) }, parent = bin(sha), tokens = { 70000, 4294967295, 0, 1 } },
    stored_map { hashes = { i64 "ffffffffffffffff", -5 }, tokens = { 1, 2, 3, 4, 5, 6, 7, 8 },
      group_idx = 1, kind = "sliding_window", window = 128 },
    { "BlockMoved", { 1 } },
    M { "type", "Unknown", "block_hashes", { 1 } },
  }, 3),
  ["old-shapes"] = enc { 1700000000, {
    { "BlockStored", { 1, 2 }, NIL, { 1, 2, 3, 4, 5, 6, 7, 8 }, 4 },
    { "BlockStored", { 3 }, 2, { 9, 10, 11, 12 }, 4, NIL },
    { "BlockStored", { 4 }, 3, { 13, 14, 15, 16 }, 4, NIL, "GPU" },
    { "BlockRemoved", { 1, 2 } },
  } },
  ["extra-fields"] = enc { f32(1.5), {
    { "BlockStored", { "abcdefghij" }, bin "xyz", { 1, 2 }, 2, 7, "GPU", NIL, NIL, NIL, NIL, NIL,
      "locality", 99 },
    { "BlockRemoved", { 1 }, NIL, NIL, "locality" },
  }, NIL, "later", 1 },
}

-- refused ones, kept as regression inputs: the code each gets
local bad_seeds = {
  ["bad-huge-array-length"] = { "\146\0\221\255\255\255\255", -1 },
  ["bad-huge-map-length"] = { "\146\0\145\223\255\255\255\255", -1 },
  ["bad-deep-nesting"] = { ("\145"):rep(40) .. "\0", -2 },
  ["bad-truncated"] = { seeds["array-batch-map-events"]:sub(1, 100), -1 },
  ["bad-wrong-types"] = { batch({ stored { hashes = { 1 }, tokens = M { "a", 1 } } }), -2 },
}

-- --- the specs ---------------------------------------------------------------------

describe("vLLM's KV-cache events (host/kv_wire.c)", function()
  it("decodes positional events in an array batch (vLLM <= 0.23)", function()
    local b = decode(batch({
      stored { hashes = { 123, 456 }, parent = 7, tokens = { 1, 2, 3, 4, 5, 6, 7, 8 }, block_size = 4,
        lora_id = 3, medium = "GPU", lora_name = "lora-a", extra_keys = { { "lora-a" }, { "lora-a" } },
        group_idx = 0, kind = "full_attention" },
      removed({ 123 }, "GPU", 0),
      CLEARED,
    }, 0))
    assert.equal(1700000000.25, b.ts)
    assert.equal(0, b.dp_rank)
    assert.same({ "array", "array", 0 }, { b.batch_shape, b.event_shape, b.skipped })
    assert.same({
      ev { hashes = { "123", "456" }, parent = "7", tokens = { 1, 2, 3, 4, 5, 6, 7, 8 }, block_size = 4,
        medium = "GPU", lora_name = "lora-a" },
      ev { type = "BlockRemoved", hashes = { "123" }, medium = "GPU" },
      ev { type = "AllBlocksCleared" },
    }, b.events)
  end)

  it("decodes map events in an array batch (vLLM >= 0.26) to the same events", function()
    local f = { hashes = { 123, 456 }, parent = 7, tokens = { 1, 2, 3, 4, 5, 6, 7, 8 }, block_size = 4,
      medium = "GPU", lora_name = "lora-a", extra_keys = { { "lora-a", "s" } } }
    local positional = decode(batch({ stored(f), removed({ 9 }, "CPU"), CLEARED }, 0))
    local mapped = decode(batch({ stored_map(f), removed_map({ 9 }, "CPU"), CLEARED_MAP }, 0))
    assert.equal("map", mapped.event_shape)
    assert.equal("array", mapped.batch_shape)
    assert.same(events(positional), events(mapped))
    assert.equal("s", mapped.events[1].salt)
    -- fields left at their default are omitted: a map with the required ones only
    local minimal = decode(batch({ M { "type", "BlockStored", "block_hashes", { 1 }, "token_ids", { 5 } },
      M { "type", "BlockRemoved", "block_hashes", { 1 } } }))
    assert.same({ ev { hashes = { "1" }, tokens = { 5 } }, ev { type = "BlockRemoved", hashes = { "1" } } },
      events(minimal))
  end)

  it("decodes a map batch, with either event shape, and mixed shapes in one batch", function()
    local b = decode(map_batch({ stored_map { hashes = { 1 }, tokens = { 1, 2, 3, 4 } },
      stored { hashes = { 2 }, parent = 1, tokens = { 5, 6, 7, 8 } } }, 2, 12))
    assert.same({ "map", "both", 2, 12 }, { b.batch_shape, b.event_shape, b.dp_rank, b.ts })
    assert.same({ ev { hashes = { "1" }, tokens = { 1, 2, 3, 4 }, block_size = 4 },
      ev { hashes = { "2" }, parent = "1", tokens = { 5, 6, 7, 8 }, block_size = 4 } }, b.events)
    -- the batch's keys in any order, unknown ones ignored, no rank: -1
    local m = decode(enc(M { "extra", { 1, 2 }, "events", {}, "ts", f32(0.5) }))
    assert.same({ "map", null, -1, 0.5, 0 }, { m.batch_shape, m.event_shape, m.dp_rank, m.ts, #m.events })
    assert.same({ error = -2, message = 'batch: a map without "events"' }, decode(enc(M { "ts", 1 })))
    assert.same({ error = -2, message = 'batch: a map without "ts"' }, decode(enc(M { "events", {} })))
  end)

  it("reads every hash encoding to the same u64", function()
    local b = decode(batch({ stored { tokens = {}, hashes = {
      u64 "ffffffffffffffff",    -- uint 64 >= 2^63
      u64 "8000000000000001",
      5,                         -- positive fixint
      300,                       -- uint 16
      i64 "ffffffffffffffff",    -- int 64: -1
      -2,                        -- negative fixint
      i64 "8000000000000000",    -- the least int 64
      bin(sha),                  -- 32 bytes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0): the last 8
      bin(hex "0102030405060708"), -- 8 bytes
      bin "\1\2\3",              -- 3 bytes: left-padded
      "abcdefghij",              -- str: as bin
      "xyz",
    } } }))
    assert.same({ "18446744073709551615", "9223372036854775809", "5", "300", "18446744073709551615",
      "18446744073709551614", "9223372036854775808", "1808788007904223008", "72623859790382856", "66051",
      "7161960797921896810", "7895418" }, events(b)[1].hashes)
    -- vLLM's int form of a sha256 (int.from_bytes(h, "big") & (2^64 - 1)) and its bytes agree
    local same = decode(batch({ stored { hashes = { u64 "191a1b1c1d1e1f20", bin(sha) }, tokens = {} } }))
    assert.equal(same.events[1].hashes[1], same.events[1].hashes[2])
    -- the parent the same ways; nil: none
    for _, case in ipairs { { u64 "ffffffffffffffff", "18446744073709551615" }, { -1, "18446744073709551615" },
      { bin(sha), "1808788007904223008" }, { "xyz", "7895418" }, { NIL, null } } do
      local p = decode(batch({ stored { hashes = {}, parent = case[1], tokens = {} } }))
      assert.equal(case[2], events(p)[1].parent)
    end
    -- an empty hash is no hash
    assert.same({ error = -2, message = "event 0 (BlockStored): block_hashes[1]: an empty hash" },
      decode(batch({ stored { hashes = { 1, bin "" }, tokens = {} } })))
    assert.same({ error = -2, message = "event 0 (BlockRemoved): block_hashes[0]: an empty hash" },
      decode(batch({ removed { "" } })))
    assert.same({ error = -2, message = "event 0 (BlockStored): parent_block_hash: an empty hash" },
      decode(batch({ stored { hashes = {}, parent = bin "", tokens = {} } })))
  end)

  it("accepts the older, shorter arrays and ignores extra trailing elements", function()
    local b = decode(seeds["old-shapes"])
    assert.equal(1700000000, b.ts)
    assert.equal(-1, b.dp_rank) -- the first shape had no rank
    assert.same({
      ev { hashes = { "1", "2" }, tokens = { 1, 2, 3, 4, 5, 6, 7, 8 }, block_size = 4 },
      ev { hashes = { "3" }, parent = "2", tokens = { 9, 10, 11, 12 }, block_size = 4 },
      ev { hashes = { "4" }, parent = "3", tokens = { 13, 14, 15, 16 }, block_size = 4, medium = "GPU" },
      ev { type = "BlockRemoved", hashes = { "1", "2" } },
    }, events(b))
    local x = decode(seeds["extra-fields"])
    assert.same({ 1.5, -1 }, { x.ts, x.dp_rank })
    assert.same({ ev { hashes = { "7161960797921896810" }, parent = "7895418", tokens = { 1, 2 }, block_size = 2,
      medium = "GPU" }, ev { type = "BlockRemoved", hashes = { "1" } } }, events(x))
    -- shorter than the fields every version had
    assert.same({ error = -2, message = "event 0 (BlockStored): 4 elements, 5 at least" },
      decode(batch({ { "BlockStored", { 1 }, NIL, { 1 } } })))
    assert.same({ error = -2, message = "event 1 (BlockRemoved): 1 elements, 2 at least" },
      decode(batch({ CLEARED, { "BlockRemoved" } })))
    assert.same({ error = -2, message = "batch: an array of 1 elements, not [ts, events, dp_rank]" },
      decode(enc { 1 }))
  end)

  it("skips and counts events of an unknown type, ignores unknown keys", function()
    local b = decode(seeds["map-batch-mixed-events"])
    assert.same({ "map", "both", 2, 3 }, { b.batch_shape, b.event_shape, b.skipped, b.dp_rank })
    assert.equal(2, #b.events)
    local k = decode(batch({
      M { "component_id", 3, "type", "BlockStored", "snapshot_version", { 1, 2 }, "block_hashes", { 1 },
        "token_ids", { 2 }, "locality", M { "a", 1 }, "block_size", 1 },
      M { "type", "BlockRemoved", "token_ids", "ignored: not a BlockRemoved field", "block_hashes", { 1 } },
      M { "type", "AllBlocksCleared", "block_hashes", "ignored" },
      M { "type", "Future", "block_hashes", true },
      { "Future", M {} },
    }))
    assert.same({ ev { hashes = { "1" }, tokens = { 2 }, block_size = 1 },
      ev { type = "BlockRemoved", hashes = { "1" } }, ev { type = "AllBlocksCleared" } }, events(k))
    assert.equal(2, k.skipped)
    -- only unknown events: none, not an error
    local none = decode(batch({ { "Future" } }))
    assert.same({ 0, 1, "array" }, { #none.events, none.skipped, none.event_shape })
    local empty = decode(batch({}))
    assert.same({ 0, 0, null }, { #empty.events, empty.skipped, empty.event_shape })
  end)

  it("reads nil and absent ranks, parents and media as absent", function()
    local b = decode(enc { 1, { stored { hashes = { 1 }, tokens = { 1 }, parent = NIL, medium = NIL } } })
    assert.same({ -1, null, null }, { b.dp_rank, b.events[1].parent, b.events[1].medium })
    assert.equal(-1, decode(batch({}, NIL)).dp_rank)
    assert.equal(7, decode(batch({}, 7)).dp_rank)
    assert.equal(-1, decode(map_batch({}, NIL)).dp_rank)
    assert.equal(-1, decode(enc(M { "ts", 1, "events", {} })).dp_rank)
    assert.equal(0, decode(batch({ stored { hashes = { 1 }, tokens = {}, block_size = NIL } })).events[1].block_size)
  end)

  it("takes the cache salt from the first block's extra keys", function()
    local function salt(extra_keys, lora_name)
      local b = decode(batch({ stored { hashes = { 1, 2 }, tokens = {}, lora_name = lora_name,
        extra_keys = extra_keys } }))
      return events(b)[1].salt
    end
    -- vLLM's order: LoRA name, multimodal (identifier, offset) pairs, salt, prompt-embedding hashes
    assert.equal("salt-1", salt({ { "lora-a", { "mm-hash", 0 }, "salt-1", bin(sha) }, { "lora-a" } }, "lora-a"))
    assert.equal("s", salt({ { "s" } }))
    assert.equal("s", salt({ { { "mm", 3 }, "s" }, NIL }))
    assert.equal(null, salt({ { "lora-a" }, { "lora-a" } }, "lora-a")) -- the LoRA name only
    assert.equal(null, salt({ NIL, { "later-block" } }))               -- a salt is the first block's only
    assert.equal(null, salt({}))
    assert.equal(null, salt(NIL))
    assert.equal(null, salt({ 5, { "x" } }))                           -- not an array: ignored
    assert.equal(null, salt({ { 1, bin "b", M {} } }))
    assert.equal("lora-b", salt({ { "lora-a", "lora-b" } }, "lora-a"))
    local m = decode(batch({ stored_map { hashes = { 1 }, tokens = {}, lora_name = "l",
      extra_keys = { { "l", "s2" } } } }))
    assert.same({ "l", "s2" }, { m.events[1].lora_name, m.events[1].salt })
  end)

  it("marks events of groups other than the full-attention one", function()
    local function other(f)
      f.hashes, f.tokens = { 1 }, {}
      local a = events(decode(batch({ stored(f) })))[1].other_group
      local m = events(decode(batch({ stored_map(f) })))[1].other_group
      assert.equal(a, m)
      return a
    end
    assert.is_false(other {})
    assert.is_false(other { group_idx = 0 })
    assert.is_true(other { group_idx = 1 })
    assert.is_false(other { group_idx = 0, kind = "full_attention" })
    assert.is_false(other { kind = "mla_attention" })
    assert.is_false(other { kind = "sink_full_attention" })
    assert.is_true(other { group_idx = 0, kind = "sliding_window", window = 1024 })
    assert.is_true(other { kind = "mamba" })
    assert.is_true(other { kind = "unknown" })
    assert.is_true(events(decode(batch({ removed({ 1 }, NIL, 2) })))[1].other_group)
    assert.is_false(events(decode(batch({ removed_map({ 1 }, NIL, 0) })))[1].other_group)
  end)

  it("refuses every truncation of a valid payload as not msgpack", function()
    local p = batch({ stored { hashes = { u64 "d0c1b2a394857667", bin(sha) }, parent = -3, tokens = { 1, 70000 },
      lora_name = "l", extra_keys = { { "l", "salt" } }, kind = "full_attention" },
      stored_map { hashes = { 1 }, tokens = { 2 }, medium = "CPU" }, removed { 9 }, CLEARED_MAP }, 1)
    assert.is_nil(decode(p).error)
    local lines, out = run({ p }, "--truncate")
    assert.equal(#p, #lines, out)
    for n, line in ipairs(lines) do
      local len, code, msg = line:match("^(%d+) (%-?%d+) (.*)$")
      assert.equal(n - 1, tonumber(len), line)
      assert.equal("-1", code, line)
      assert.truthy(msg:match("^truncated") or msg == "an empty payload", line)
    end
  end)

  it("refuses garbage: bytes that are not msgpack, wrong types in every field, huge lengths", function()
    local function err(p) return decode(p) end
    -- not msgpack
    assert.same({ error = -1, message = "an empty payload" }, err(""))
    assert.same({ error = -1, message = "not msgpack: byte 0xc1 at 3" }, err("\147\1\144\193"))
    assert.same({ error = -1, message = "trailing bytes: the batch ends at byte 3 of 4" }, err(enc { 1, {} } .. "\0"))
    -- a length no payload of this size can hold: refused before anything is allocated
    assert.same({ error = -1,
      message = "truncated: the array at byte 2 declares 4294967295 elements, 0 bytes are left" },
      err("\146\0\221\255\255\255\255"))
    assert.equal(-1, err("\146\0\223\255\255\255\255").error)            -- map 32
    assert.equal(-1, err("\146\0\145\219\255\255\255\255abc").error)      -- str 32
    assert.equal(-1, err("\146\0\145\198\127\255\255\255abc").error)      -- bin 32
    assert.equal(-1, err("\146\0\145\201\255\255\255\255\1abc").error)    -- ext 32
    assert.equal(-1, err("\146\0\220\255\255" .. ("\0"):rep(100)).error) -- array 16, 100 bytes
    -- nested deeper than msgpack-c goes
    assert.same({ error = -2, message = "nested deeper than 32 at byte 32" },
      err(("\145"):rep(40) .. "\0"))
    -- 32 deep is as deep as msgpack-c goes: read, then refused for its shape
    assert.same({ error = -2, message = "batch: an array of 1 elements, not [ts, events, dp_rank]" },
      err(("\145"):rep(32) .. "\0"))
    -- not a batch
    assert.same({ error = -2, message = "batch: an integer, not an array or a map" }, err(enc(5)))
    assert.same({ error = -2, message = "batch: ts is a str, not a number" }, err(enc { "now", {} }))
    assert.same({ error = -2, message = "batch: ts is not finite" }, err(enc { raw "\203\127\248\0\0\0\0\0\0", {} }))
    assert.same({ error = -2, message = "batch: events is a map, not an array" }, err(enc { 1, M {} }))
    assert.same({ error = -2, message = "batch: data_parallel_rank is a str, not nil or an integer in [0, 2^31)" },
      err(enc { 1, {}, "0" }))
    assert.equal(-2, err(enc { 1, {}, -1 }).error)
    assert.equal(-2, err(enc { 1, {}, 2 ^ 31 }).error)
    assert.same({ error = -2, message = "event 0: an integer, not an array or a map" }, err(batch({ 1 })))
    assert.same({ error = -2, message = "event 0: an empty array, no type" }, err(batch({ {} })))
    assert.same({ error = -2, message = "event 0: its type is an integer, not a str" }, err(batch({ { 1, { 1 } } })))
    assert.same({ error = -2, message = 'event 0: a map without "type"' }, err(batch({ M { "block_hashes", {} } })))
    assert.same({ error = -2, message = "event 0: its type is nil, not a str" }, err(batch({ M { "type", NIL } })))
    assert.same({ error = -2, message = "event 1 (BlockStored): no token_ids" },
      err(batch({ CLEARED, M { "type", "BlockStored", "block_hashes", {} } })))
    assert.same({ error = -2, message = "event 0 (BlockRemoved): no block_hashes" },
      err(batch({ M { "type", "BlockRemoved" } })))

    -- every field of the wrong type, in both shapes
    local fields = { "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
      "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window" }
    local good = stored { hashes = { 1 }, tokens = { 1 } }
    local payloads, expect = {}, {}
    for i, name in ipairs(fields) do
      for _, wrong in ipairs { M {}, true, f32(1.5) } do
        local a = { unpack(good) }
        a[i + 1] = wrong
        payloads[#payloads + 1] = batch({ a })
        expect[#expect + 1] = name
        local m = { "type", "BlockStored", "block_hashes", { 1 }, "token_ids", { 1 } }
        for k = 1, #m, 2 do
          if m[k] == name then table.remove(m, k); table.remove(m, k); break end
        end
        m[#m + 1] = name
        m[#m + 1] = wrong
        payloads[#payloads + 1] = batch({ M(m) })
        expect[#expect + 1] = name
      end
    end
    -- and the values of the right type but out of range
    for _, case in ipairs {
      { "block_hashes", { hashes = { 1.5 }, tokens = {} } },
      { "block_hashes", { hashes = { NIL }, tokens = {} } },
      { "token_ids", { hashes = {}, tokens = { -1 } } },
      { "token_ids", { hashes = {}, tokens = { 2 ^ 32 } } },
      { "token_ids", { hashes = {}, tokens = { "1" } } },
      { "block_size", { hashes = {}, tokens = {}, block_size = -16 } },
      { "block_size", { hashes = {}, tokens = {}, block_size = 2 ^ 32 } },
      { "group_idx", { hashes = {}, tokens = {}, group_idx = -1 } },
      { "medium", { hashes = {}, tokens = {}, medium = bin "GPU" } },
      { "lora_name", { hashes = {}, tokens = {}, lora_name = 3 } },
      { "kv_cache_spec_kind", { hashes = {}, tokens = {}, kind = 1 } },
    } do
      payloads[#payloads + 1] = batch({ stored(case[2]) })
      expect[#expect + 1] = case[1]
    end
    for _, case in ipairs { { "block_hashes", removed(M {}) }, { "medium", removed({ 1 }, 5) },
      { "group_idx", removed({ 1 }, NIL, "0") }, { "group_idx", removed_map({ 1 }, NIL, -3) } } do
      payloads[#payloads + 1] = batch({ case[2] })
      expect[#expect + 1] = case[1]
    end
    for i, r in ipairs(results(payloads)) do
      assert.equal(-2, r.error, expect[i])
      assert.truthy(r.message:match("^event 0 %(Block%a+%): " .. expect[i]), r.message)
    end
  end)

  it("never fails on random bytes or on valid payloads with bytes changed", function()
    math.randomseed(43)
    local payloads = {}
    for _ = 1, 300 do
      local t = {}
      for k = 1, math.random(0, 80) do t[k] = string.char(math.random(0, 255)) end
      payloads[#payloads + 1] = table.concat(t)
    end
    local valid = {}
    for _, p in pairs(seeds) do valid[#valid + 1] = p end
    table.sort(valid)
    for _ = 1, 600 do
      local p = valid[math.random(#valid)]
      local bytes = { p:byte(1, -1) }
      for _ = 1, math.random(1, 4) do bytes[math.random(#bytes)] = math.random(0, 255) end
      payloads[#payloads + 1] = string.char(unpack(bytes))
    end
    local seen = {}
    for _, r in ipairs(results(payloads)) do
      local k = r.error or "ok"
      seen[k] = (seen[k] or 0) + 1
      assert.truthy(k == "ok" or k == -1 or k == -2, r.message)
    end
    assert.truthy(seen.ok and seen[-1] and seen[-2])
  end)

  it("reads the sequence frame: 8 bytes big-endian, signed", function()
    local lines = run({ ("\0"):rep(8), hex "0000000000000102", ("\255"):rep(8), hex "7fffffffffffffff",
      hex "8000000000000000", ("\0"):rep(7), ("\0"):rep(9), "" }, "--seq")
    assert.same({ "seq 0", "seq 258", "seq -1", "seq 9223372036854775807", "seq -9223372036854775808",
      "error -1 a sequence frame of 7 bytes, not 8", "error -1 a sequence frame of 9 bytes, not 8",
      "error -1 a sequence frame of 0 bytes, not 8" }, lines)
  end)

  it("holds a batch in one allocation a small multiple of its length", function()
    local evs = {}
    for i = 1, 64 do
      local tokens = {}
      for k = 1, 16 do tokens[k] = 1000 + i * 16 + k end
      evs[i] = stored { hashes = { u64(string.format("70000000%08x", i)) }, parent = i,
        tokens = tokens, block_size = 16, medium = "GPU" }
    end
    local p = batch(evs, 0)
    local b = decode(p)
    assert.equal(64, #events(b))
    assert.is_true(b.one_allocation)
    -- msgpack-c's tree (24 bytes a value, 3-byte tokens) is most of it
    assert.truthy(b.mem <= 16 * #p, ("%d bytes for %d"):format(b.mem, #p))
    -- the most a payload can ask for: one-byte elements
    local ones = {}
    for i = 1, 1000 do ones[i] = 1 end
    local worst = enc { 1, { { "Future", ones } } }
    local w = decode(worst)
    assert.truthy(w.mem <= 40 * #worst + 1024, ("%d bytes for %d"):format(w.mem, #worst))
  end)

  -- no timing asserted (CONTRIBUTING.md: performance goals live in make bench);
  -- the rate is printed as a TAP comment
  it("decodes one batch many times over (kv-wire --bench)", function()
    local evs = {}
    for i = 1, 64 do
      local tokens = {}
      for k = 1, 16 do tokens[k] = 20000 + i * 16 + k end
      evs[i] = stored { hashes = { u64(string.format("90000000%08x", i)) },
        parent = u64(string.format("90000000%08x", i - 1)), tokens = tokens, block_size = 16,
        medium = "GPU", group_idx = 0, kind = "full_attention" }
    end
    local lines = run({ batch(evs, 0) }, "--bench 2000")
    assert.truthy(lines[1]:match("^bench 128000 events, 2000 batches of %d+ bytes in [%d.]+ s: %d+ events/s"),
      lines[1])
    print("# " .. lines[1])
  end)

  it("writes the fuzz target's seeds (spec/fuzz/corpus/kv_wire/), every one decoding as meant", function()
    local corpus = support.ROOT .. "/spec/fuzz/corpus/kv_wire/"
    local all = {}
    for name, p in pairs(seeds) do all[name] = { p } end
    for name, case in pairs(bad_seeds) do all[name] = case end
    local names = {}
    for name in pairs(all) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      local payload, code = all[name][1], all[name][2]
      if os.getenv("LUPIN_WRITE_KV_CORPUS") == "1" then
        local f = assert(io.open(corpus .. name, "wb"))
        f:write(payload)
        f:close()
      end
      local f = assert(io.open(corpus .. name, "rb"), name)
      local committed = f:read("*a")
      f:close()
      assert.equal(payload, committed, name .. ": LUPIN_WRITE_KV_CORPUS=1 writes it again")
      assert.equal(code, decode(committed).error, name)
    end
  end)
end)
