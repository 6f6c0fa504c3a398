-- lupin's own Lua-pattern matcher (core/pattern.c), which plugins get in
-- place of LuaJIT's so that a pattern can be cut by the call's budget:
-- differential against the original functions (this process's string
-- library, which nothing replaced) over hand-written and generated cases.
-- Results must be the same; for a malformed pattern both must fail, ours
-- with the original's message or that message followed by details.
local native = require "lupin_native"

local G = native.guard() -- the bounded built-ins, outside any runtime (never cut)

local function pack(...)
  return { n = select("#", ...), ... }
end

-- What a call gives: its results, or its error without a position prefix.
local function outcome(f, ...)
  local r = pack(pcall(f, ...))
  if not r[1] then
    return { err = tostring(r[2]):gsub("^[^:]*:%d+: ", "") }
  end
  return { n = r.n - 1, unpack(r, 2, r.n) }
end

local function same(want, got, what)
  if want.err then
    assert(got.err, what .. ": the original failed with " .. want.err .. ", ours gave a result")
    assert(got.err:sub(1, #want.err) == want.err,
      ("%s: the original said %q, ours %q"):format(what, want.err, got.err))
    return
  end
  assert(not got.err, ("%s: ours failed with %s"):format(what, tostring(got.err)))
  assert.same(want, got, what)
end

local function describe_case(f, args)
  local out = {}
  for i = 1, args.n or #args do
    out[i] = type(args[i]) == "string" and ("%q"):format(args[i]) or tostring(args[i])
  end
  return ("%s(%s)"):format(f, table.concat(out, ", "))
end

-- Every iteration of gmatch, as one list.
local function all_gmatch(gmatch, s, p)
  local rows = {}
  for a, b, c in gmatch(s, p) do
    rows[#rows + 1] = { a, b, c }
    if #rows > 1000 then
      error("gmatch does not end")
    end
  end
  return rows
end

-- gsub with a function replacement: the results and the calls it got.
local function gsub_calls(gsub, s, p, n)
  local calls = {}
  local res, count = gsub(s, p, function(...)
    calls[#calls + 1] = pack(...)
    local a = ...
    if a == "b" then
      return false -- keeps the match
    elseif type(a) == "number" then
      return a * 10
    end
    return "<" .. tostring(a) .. ">"
  end, n)
  return res, count, calls
end

local function check(f, ...)
  local args = pack(...)
  local what = describe_case(f, args)
  if f == "gmatch" then
    same(outcome(all_gmatch, string.gmatch, ...), outcome(all_gmatch, G.gmatch, ...), what)
  elseif f == "gsub_fn" then
    same(outcome(gsub_calls, string.gsub, ...), outcome(gsub_calls, G.gsub, ...), what)
  else
    same(outcome(string[f], unpack(args, 1, args.n)), outcome(G[f], unpack(args, 1, args.n)), what)
  end
end

local HAND = {
  { "find", "hello world", "o w" }, { "find", "hello world", "l+" }, { "find", "hello", "l", -2 },
  { "find", "hello", "l", -100 }, { "find", "hello", "", 10 }, { "find", "hello", "", 6 },
  { "find", "hello", "", 5 }, { "find", "abc", "c", 4 }, { "find", "abc", "b", 0 }, { "find", "abc", "b", 1.7 },
  { "find", "a+b", "+", 1, true }, { "find", "a.b", ".", 1, 1 }, { "find", "a.b", ".", 1, false },
  { "find", "a.b", ".", 1, nil }, { "find", "x^y", "^y", 1, true }, { "find", 12345, 34 },
  { "find", "a\0b", "\0" }, { "find", "a\0b", "%z" }, { "find", "a\0b", "[\0]" }, { "find", "xa\0b", "a\0b" },
  { "match", "xa\0b", "a\0b" }, { "find", "", "" }, { "find", "", "a" }, { "find", "abc", "abcd" },
  { "match", "key = value", "(%w+)%s*=%s*(%w+)" }, { "match", "  x", "^%s*()" }, { "match", "hello", "()ll()" },
  { "match", "THE (quick) fox", "%((%a+)%)" }, { "match", "f(a(b)c)d", "%b()" }, { "match", "f(a(b c)d", "%b()" },
  { "match", "[[x]]", "%b[]" }, { "match", "abc", "%bac" }, { "match", "aaa", "%baa" },
  { "find", "THE (quick) fox", "%f[%a]%a+", 5 }, { "match", "hello", "%f[%l]" }, { "match", "HeLLo", "%f[%u]%u+" },
  { "gmatch", "THE (quick) fox", "%f[%a]%a+" }, { "gmatch", "x y z", "%f[%S]" }, { "match", "abc", "%f[%z]" },
  { "match", "abab", "(ab)%1" }, { "match", "abba", "(a)(b)%2%1" }, { "match", "aXa", "()X%1" },
  { "match", "hello", "(h)(e)(l)(l)(o)" }, { "match", "aaa", "(a*(.)%w(%s*))" }, { "match", "[]]", "[]]" },
  { "match", "x-y", "[%w-]+" }, { "match", "a-z", "[a%-z]+" }, { "match", "]^", "[]^]+" }, { "match", "^a", "[^^]" },
  { "match", "a]", "[^]]" }, { "match", "-", "[a-]" }, { "match", "b", "[a-]" }, { "match", "5", "[0-9]" },
  { "match", "\200\255", "[\128-\255]+" }, { "match", "é", "[%w]" }, { "match", "a$b", "a$b" },
  { "match", "ab", "b$" },
  { "match", "ab$", "b$" }, { "match", "ab", "^b" }, { "match", "a.b", "%." }, { "match", "a%b", "%%" },
  { "match", "tab\there", "%s" }, { "match", "x", "%g" }, { "match", " ", "%g" }, { "match", "A1_", "%W" },
  { "match", "aaab", "a-b" }, { "match", "aaab", "a-" }, { "match", "aaab", "^a-$" }, { "match", "aaa", "a*" },
  { "match", "", "a*" }, { "match", "", "a+" }, { "match", "b", "a?b" }, { "match", "ab", "a?b" },
  { "match", "abc", "" },
  { "match", "abc", "", 10 }, { "match", "abc", "()", -1 }, { "match", "abc", ".-b" }, { "match", "abcabc", ".*b" },
  { "gmatch", "one two  three", "%a+" }, { "gmatch", "a=1, b=2", "(%w+)=(%w+)" }, { "gmatch", "abc", "" },
  { "gmatch", "^a^a", "^a" }, { "gmatch", "abc", "()" }, { "gmatch", "aaa", "a*" }, { "gmatch", "a,b,,c", "([^,]*)" },
  { "gsub", "hello world", "(o)", "[%1]" }, { "gsub", "abc", "", "-" }, { "gsub", "abc", "b*", "-" },
  { "gsub", "hello", "l", { l = "L" } }, { "gsub", "hello", "(l)(l)", { l = 7 } },
  { "gsub", "hello", "l", { l = false } },
  { "gsub", "abc", "%w", "%0%0", 2 }, { "gsub", "abc", "%w", "%0", 0 }, { "gsub", "abc", "%w", "%0", -1 },
  { "gsub", "abc", "%w", "x", 1.9 }, { "gsub", "x", "x", "%" }, { "gsub", "abc", "b", "%x" },
  { "gsub", "abc", "b", "%%" },
  { "gsub", "abc", "(b)", "%2" }, { "gsub", "abc", "b", "%1" }, { "gsub", "abc", "b", "%0%1" },
  { "gsub", "abc", "b", 5 },
  { "gsub", "abc", "b", true }, { "gsub", "abc", "b" }, { "gsub", "abc", "^", ">" }, { "gsub", "abc", "$", "<" },
  { "gsub", "abc", "^a", "" }, { "gsub", "aaa", "^a", "" }, { "gsub", "abc", "()", "%1" },
  { "gsub", "a b", "%s", "\0" },
  { "gsub", "hello", "(", "x" }, { "gsub", "hello world", "%w+", "%0 %0", 1 }, { "gsub", 123, 2, 9 },
  { "gsub_fn", "hello world", "%w+" }, { "gsub_fn", "abc", "%w" }, { "gsub_fn", "abc", "()%w()" },
  { "gsub_fn", "abc", "" }, { "gsub_fn", "a b c", "(%w) ?", 2 },
  -- malformed patterns and arguments: both fail
  { "match", "abc", "%" }, { "match", "abc", "[a" }, { "match", "abc", "[a%" }, { "match", "abc", "%b" },
  { "match", "abc", "%ba" }, { "match", "abc", "%f" }, { "match", "abc", "%fa" }, { "match", "abc", "%1" },
  { "match", "abc", "%0" }, { "match", "abc", "(()" }, { "match", "abc", ")" }, { "match", "abc", "(a)%2" },
  { "match", "abc", ("("):rep(33) .. "a" .. (")"):rep(33) }, { "match", "abc", "[%" }, { "match", "abc", "[]" },
  { "match", "abc", "[^]" }, { "match", "abc", "%fx" }, { "find", "abc", "(b" }, { "gsub", "abc", "(b", "x" },
  { "gsub", "abc", "b", "%2" }, { "gsub", "abc", "b", function() return {} end }, { "gmatch", "abc", "(" },
  { "find" }, { "find", "a" }, { "find", "a", "a", "x" }, { "find", {}, "a" }, { "gsub", "a", "a", "x", "y" },
  { "match", nil, "a" }, { "gmatch", "a" },
}

-- Generated: random patterns over a small alphabet of items, quantifiers,
-- captures, anchors and %-forms, against random subjects over the same
-- characters (a fixed seed: the same cases every run).
local ITEMS = { "a", "b", "c", ".", "%a", "%d", "%s", "%w", "%A", "%S", "%p", "[ab]", "[^a]", "[a-c]",
  "[%d_]", "[(]", "%(", "%)", " ", "1", "_", "%b()", "%f[%w]", "%f[%W]", "%1", "()" }
local QUANT = { "", "", "", "*", "+", "-", "?" }
local SUBJ = "aab b(c)1 2_c(a)"

-- and a narrow alphabet, where most patterns match somewhere
local NARROW_ITEMS = { "a", "b", ".", "[ab]", "[^a]", "%a", "%1", "()", "%bab", "%f[b]" }
local NARROW_SUBJ = "aabab"

local function random_pattern(rnd, items)
  items = items or ITEMS
  local out, open = {}, 0
  if rnd(4) == 1 then
    out[1] = "^"
  end
  for _ = 1, rnd(6) do
    local r = rnd(10)
    if r == 1 and open < 3 then
      out[#out + 1] = "("
      open = open + 1
    elseif r == 2 and open > 0 then
      out[#out + 1] = ")"
      open = open - 1
    else
      local it = items[rnd(#items)]
      local simple = not it:find("^%%[bf1]") and it ~= "()"
      out[#out + 1] = it .. (simple and QUANT[rnd(#QUANT)] or "")
    end
  end
  out[#out + 1] = (")"):rep(rnd(3) == 1 and open or 0) -- sometimes left open: an error
  if rnd(5) == 1 then
    out[#out + 1] = "$"
  end
  return table.concat(out)
end

local function random_subject(rnd, chars)
  chars = chars or SUBJ
  local out = {}
  for i = 1, rnd(14) - 1 do
    local k = rnd(#chars)
    out[i] = chars:sub(k, k)
  end
  return table.concat(out)
end

describe("lupin's pattern matcher against LuaJIT's", function()
  it("gives the same results and errors on hand-written cases", function()
    for _, c in ipairs(HAND) do
      check(c[1], unpack(c, 2, table.maxn(c)))
    end
  end)

  it("gives the same results and errors on 800 generated cases of each function", function()
    local state = 51
    local function rnd(n) -- a small LCG: math.random's sequence is not ours to fix
      state = (state * 1103515245 + 12345) % 2147483648
      return state % n + 1
    end
    for i = 1, 800 do
      local narrow = i > 400
      local s = random_subject(rnd, narrow and NARROW_SUBJ)
      local p = random_pattern(rnd, narrow and NARROW_ITEMS)
      check("find", s, p)
      check("find", s, p, rnd(8) - 4)
      check("match", s, p)
      check("gmatch", s, p)
      check("gsub", s, p, "<%0>")
      check("gsub", s, p, "%1", rnd(3))
      check("gsub_fn", s, p)
    end
  end)

  it("finds plain text in long subjects as the original does", function()
    local s = ("ab"):rep(1500000) .. "needle" .. ("ab"):rep(10)
    for _, c in ipairs({ { s, "needle" }, { s, "needle", 3000001 }, { s, "needle", 3000002 },
      { s, "ab", -3 }, { s, "bab", 2999999 }, { s, "abn", 1, true }, { s, "x" } }) do
      check("find", unpack(c))
    end
    check("gsub", s, "needle", "N")
    check("match", s, "(n%a+)")
  end)

  it("ends a pattern that nests too deeply in an error, not a crash", function()
    local ok, err = pcall(G.find, ("a"):rep(1000), ("a?"):rep(100000) .. "b")
    assert.is_false(ok)
    assert.matches("pattern too complex", err)
  end)

  it("ends recursion through a gsub replacement in a C-stack error", function()
    local function f()
      return (G.gsub("x", "x", f))
    end
    local ok, err = pcall(f)
    assert.is_false(ok)
    assert.matches("C stack overflow", err)
    local t
    local function g()
      return (G.gsub("x", "x", t))
    end
    t = setmetatable({}, { __index = function() return g() end })
    ok, err = pcall(g)
    assert.is_false(ok)
    assert.matches("C stack overflow", err)
  end)

  it("builds string.rep and table.concat results as the originals do", function()
    for _, c in ipairs({ { "ab", 3 }, { "ab", 3, "," }, { "x", 0 }, { "x", -1 }, { "", 5 }, { "", 3, "," },
      { "abc", 1, "," }, { "abc", 400000 }, { "ab", 300000, "--" }, { ("q"):rep(3000000), 2, "|" },
      { 12, 3 }, { "a", "x" } }) do
      local want, got = outcome(string.rep, unpack(c)), outcome(G.rep, unpack(c))
      same(want, got, describe_case("rep", c))
    end
    local big = {}
    for i = 1, 3000 do
      big[i] = tostring(i):rep(500)
    end
    for _, c in ipairs({ { { 1, 2, "x" }, "-" }, { {}, "x" }, { { "a", "b", "c" }, ",", 2, 3 },
      { { "a", "b" }, ",", 3 }, { { "a" }, ",", 1, 1 }, { { 1, {}, 3 } }, { big, ";" }, { big },
      { { 1.5, -0, 1e300 }, " " }, { { "a", "b" }, nil, 1, 5 } }) do
      same(outcome(table.concat, unpack(c, 1, 4)), outcome(G.concat, unpack(c, 1, 4)),
        describe_case("concat", c))
    end
  end)
end)
