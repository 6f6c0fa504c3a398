-- Request bodies decoded by simdjson in C (core/json.cpp, lua/lupin/runtime/json.lua):
-- every text it accepts decodes to what lua-cjson makes of it, every text
-- lua-cjson refuses it refuses too, so the refusal and its message stay
-- lua-cjson's.  Run inside a runtime's Lua state, where the C module is.
local S = require "support"

local rt
setup(function()
  rt = S.runtime()
end)
teardown(function()
  rt:free()
end)

-- Decodes each text both ways in the runtime; returns, per text, "same",
-- "refused" (native refused, cjson's verdict stands) or what differs.
local function compare(texts)
  local code = [[
    local cjson = require "cjson.safe"
    local strict = cjson.new()
    strict.decode_invalid_numbers(false)
    local native = require("lupin.json.native").decode
    local function same(a, b)
      if type(a) ~= type(b) then return false end
      if type(a) == "number" then
        return a == b and 1 / a == 1 / b or (a ~= a and b ~= b)
      end
      if type(a) ~= "table" then return a == b end
      if getmetatable(a) ~= getmetatable(b) then return false end
      for k, v in pairs(a) do if not same(v, b[k]) then return false end end
      for k in pairs(b) do if a[k] == nil then return false end end
      return true
    end
    local out = {}
    for i, text in ipairs(TEXTS) do
      local v = native(text)
      local want = strict.decode(text)
      if v == nil then
        out[i] = want == nil and "refused" or "refused what cjson takes"
      elseif want == nil then
        out[i] = "took what cjson refuses"
      else
        out[i] = same(v, want) and "same" or "differs"
      end
    end
    return out]]
  local list = {}
  for i, t in ipairs(texts) do
    list[i] = ("%q"):format(t)
  end
  return S.eval(rt, "local TEXTS = {" .. table.concat(list, ",") .. "}\n" .. code)
end

local function all(n, v)
  local t = {}
  for i = 1, n do
    t[i] = v
  end
  return t
end

describe("request body JSON", function()
  it("decodes what lua-cjson decodes, to the same values", function()
    local texts = {
      '{"model":"m","prompt":"hello","max_tokens":16,"stream":true}',
      '{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":""}]}',
      '{"a":null,"b":false,"c":[],"d":{},"e":[null,1,"x",[2,[3]]]}',
      '{"esc":"tab\\t nl\\n quote\\" slash\\/ back\\\\ \\u00e9 \\u20ac \\ud83d\\ude00"}',
      '{"nul":"a\\u0000b"}',
      '{"n":[0,1,-1,0.1,1.5e-7,1E3,-2.5e+2,9007199254740993,18446744073709551615]}',
      '{"big":-9223372036854775808,"small":5e-324,"max":1.7976931348623157e308}',
      '{"dup":1,"dup":2}',
      '  \t\r\n{ "spaced" : [ 1 , 2 ] }  \n',
      '"a string"', "42", "true", "null", "[]",
      '{"utf8":"héllo wörld ✓ 😀"}',
    }
    assert.same(all(#texts, "same"), compare(texts))
  end)

  it("refuses what lua-cjson refuses, leaving it the verdict", function()
    local texts = {
      "", " ", "{", "}", '{"a":1,}', "[1,2,]", "{'a':1}", '{"a":NaN}', '{"a":Infinity}',
      '{"a":0x10}', '{"a":1} x', '{"a":"\\x"}', '{"a":"unterminated}', "nul", "tru",
      '{"a":01}', '{"a":.5}', '{"a":-}', "/* c */ {}", '{"a":"\\u12"}',
    }
    assert.same(all(#texts, "refused"), compare(texts))
  end)

  it("hands lua-cjson what it alone decides: -0, huge numbers, 1., lone surrogates", function()
    -- cjson reads -0 as -0.0, 1e400 as infinity, a 30-digit integer as a
    -- float and takes "1."; simdjson reads -0 as 0 and refuses the others,
    -- so these go to cjson and its value is the one used
    local out = compare({ '{"a":-0}', '{"a":[1,-0]}', '{"a":1e400}',
      '{"a":123456789012345678901234567890}', '{"a":1.}', '{"a":"\\ud800"}',
      '{"a":"\\udc00x"}', '{"a":0,"b":"x -0 y"}' })
    for i, v in ipairs(out) do
      assert.is_truthy(v:find("^refused") or v == "same", ("text %d: %s"):format(i, v))
    end
    -- a 0 and a -0 inside a string decode natively all the same
    assert.same({ "same", "same" }, compare({ '{"t":0,"s":"-01"}', '{"t":-0.5,"n":0}' }))
  end)

  it("nests as deep as lua-cjson allows and no deeper", function()
    local function nested(n)
      return ("["):rep(n) .. ("]"):rep(n)
    end
    assert.same({ "same", "same", "refused", "refused" },
      compare({ nested(999), nested(1000), nested(1001), nested(5000) }))
  end)

  it("decodes a body past the kept parser's size with a parser of its own", function()
    local big = '{"prompt":"' .. ("0123456789abcdef"):rep(8192) .. '","n":[' ..
      ("1,"):rep(5000) .. '2]}' -- ~140 KB
    assert.same({ "same", "same" }, compare({ big, '{"after":"the big one"}' }))
  end)

  it("finds where a text stops being UTF-8, in utf8proc's terms, only when it is not", function()
    local v = S.eval(rt, [[
      local json = require "lupin.runtime.json"
      local cjson = require "cjson.safe"
      local out = {}
      for i, text in ipairs({
        '{"p":"caf\195\169 \240\159\152\128"}', -- valid: no offset
        '{"p":"\255"}', -- not a UTF-8 byte
        '{"p":"\192\175"}', -- an overlong "/"
        '{"p":"\237\160\128"}', -- a surrogate
        '{"p":"\244\144\128\128"}', -- past U+10FFFF
        '{"p":"ok \226\130', -- cut short, and not JSON either
        '{"a":-0,"p":"\255"}', -- what would go to lua-cjson
      }) do
        local value, err, at = json.decode_utf8(text, cjson)
        out[i] = at or (value ~= nil and "value") or err
      end
      return out]])
    assert.same({ "value", 6, 6, 6, 6, 9, 13 }, v)
  end)

  it("reads the body a plugin sees with it, null as cjson.null", function()
    local v = S.eval(rt, [[
      local json = require "lupin.runtime.json"
      local cjson = require "cjson.safe"
      local body = json.decode('{"model":"m","stop":null}', cjson)
      return { native = json.native, model = body.model, null = body.stop == cjson.null }]])
    assert.same({ native = true, model = "m", null = true }, v)
  end)
end)
