-- Headers plugins set (ctx:set_header, ctx:set_response_header): a bad name
-- or value is an error of the plugin that set it (request-control policy: the
-- request proceeds), and never reaches the request's published headers, even
-- when a plugin writes the header tables directly.
local S = require "support"
local ctx = require "lupin.runtime.ctx"

local SETTER = [[
return {
  type = "spec-header-setter",
  schema = { name = { type = "string", default = "x-bad" }, value = { type = "string",
    default = "ok" }, direct = { type = "boolean", default = false } },
  pre_request = function(self, ctx)
    ctx:set_header("x-before", "1")
    ctx:set_response_header("x-before", "1")
    if self.params.direct then
      ctx.upstream_headers[self.params.name] = self.params.value
      ctx.response_headers[self.params.name] = self.params.value
      return
    end
    ctx:set_header(self.params.name, self.params.value)
    ctx:set_header("x-after", "1")
  end,
  response_header = function(self, ctx)
    if not self.params.direct then
      ctx:set_response_header(self.params.name, self.params.value)
    end
  end,
}
]]

local function stat(rt, point)
  for _, s in ipairs(rt:plugin_stats()) do
    if s.plugin == "setter" and s.point == point then
      return s
    end
  end
  return { calls = 0, errors = 0 }
end

describe("ctx.check_header", function()
  it("takes token names and values without control characters", function()
    assert.same({ "x-ok", "v 1\tb" }, { ctx.check_header("X-OK", "v 1\tb") })
    assert.same({ "a!#$%&'*+-.^_`|~9", "" }, { ctx.check_header("a!#$%&'*+-.^_`|~9", "") })
    assert.same({ "x-n", "42" }, { ctx.check_header("x-n", 42) })
  end)

  for _, case in ipairs({
    { "x", "a\r\nx-smuggled: 1", "control character" },
    { "x", "a\nb", "control character" },
    { "x", "a\rb", "control character" },
    { "x", "a\0b", "control character" },
    { "x", "a\1b", "control character" },
    { "x", "a\127b", "control character" },
    { "x\r\ny", "v", "invalid header name" },
    { "x y", "v", "invalid header name" },
    { "x:y", "v", "invalid header name" },
    { "", "v", "invalid header name" },
    { "x\0", "v", "invalid header name" },
    { 7, "v", "invalid header name" },
    { "x", true, "must be a string" },
    { "Content-Length", "5", "gateway's to set" },
    { "transfer-encoding", "chunked", "gateway's to set" },
    { "Host", "evil", "gateway's to set" },
    { "connection", "close", "gateway's to set" },
    { "x-request-id", "r", "gateway's to set" },
  }) do
    it(("refuses %q: %q"):format(tostring(case[1]), tostring(case[2])), function()
      local name, err = ctx.check_header(case[1], case[2])
      assert.is_nil(name)
      assert.matches(case[3], err, 1, true)
    end)
  end
end)

describe("headers plugins set", function()
  local rt, dir
  before_each(function()
    dir = S.tmpdir()
    S.write(dir .. "/spec-header-setter.lua", SETTER)
  end)
  after_each(function()
    rt:free()
    os.execute("rm -rf " .. dir)
  end)

  local function run(params)
    rt = S.loaded({ plugins = { { type = "spec-header-setter", name = "setter",
      parameters = params } } }, { plugin_dirs = { dir, S.FIXTURES } })
    S.endpoints(rt, 1)
    local req = rt:begin({ id = "h-1" })
    local res = req:schedule()
    local client = req:response_header(200, { ["content-type"] = "text/plain" })
    req:finish("ok")
    return res, client
  end

  it("a CRLF in a value is the setting plugin's error; the request proceeds", function()
    local res, client = run({ value = "a\r\nGET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n" })
    assert.equal(200, res.status)
    assert.same({ ["x-before"] = "1" }, res.headers) -- the call stopped at the error
    assert.same({ ["x-before"] = "1" }, client)
    assert.equal(1, stat(rt, "pre_request").errors)
    assert.equal(1, stat(rt, "response_header").errors)
    local logged = {}
    for _, l in ipairs(rt:logs()) do
      logged[#logged + 1] = l[2]
    end
    assert.matches('plugin setter (spec-header-setter) failed in pre_request: /', logged[1], 1,
      true)
    assert.matches('spec-header-setter.lua:13: header x-bad: the value "a\\13\\10GET /smuggled',
      logged[1], 1, true)
    assert.equal(2, #logged) -- one line each: no newline of the value in the log
  end)

  it("a framing header is refused the same way", function()
    local res = run({ name = "Content-Length", value = "0" })
    assert.equal(200, res.status)
    assert.is_nil(res.headers["content-length"])
    assert.equal(1, stat(rt, "pre_request").errors)
  end)

  it("good headers pass", function()
    local res, client = run({ name = "x-good", value = "v" })
    assert.same({ ["x-before"] = "1", ["x-good"] = "v", ["x-after"] = "1" }, res.headers)
    assert.same({ ["x-before"] = "1", ["x-good"] = "v" }, client)
    assert.equal(0, stat(rt, "pre_request").errors)
  end)

  for _, case in ipairs({ { "x-direct", "a\r\nx-smuggled: 1" }, { "x-direct", "a\nb" },
    { "x\r\ny", "v" }, { "content-length", "0" }, { "Transfer-Encoding", "chunked" } }) do
    it(("written straight into the tables, %q: %q never reaches the request"):format(case[1],
      case[2]), function()
      local res, client = run({ direct = true, name = case[1], value = case[2] })
      assert.equal(200, res.status)
      assert.same({ ["x-before"] = "1" }, res.headers)
      assert.same({ ["x-before"] = "1" }, client)
    end)
  end
end)

-- The headers a request comes with reach Lua as one header block (core/request.c):
-- the engine looks up what it needs in it, and ctx.request.headers is made from
-- it when a plugin first reads it.
describe("the headers a request comes with", function()
  local rt
  after_each(function()
    rt:free()
  end)

  it("are looked up in the header block by whole name, the last of a name winning", function()
    rt = S.runtime()
    local got = S.eval(rt, [[
      local ctx = require "lupin.runtime.ctx"
      local block = "a\0one\0ab\0\0b\0two\0a\0three\0"
      local t = ctx.header_table(block)
      local function show(v) return v == nil and "nil" or v end
      return { show(ctx.header(block, "a")), show(ctx.header(block, "ab")),
        show(ctx.header(block, "b")), show(ctx.header(block, "x")), show(ctx.header(block, "")),
        t.a, t.ab, t.b, show(ctx.header("", "a")), show(ctx.header("a\0one", "a")),
        show(ctx.header("a\0", "a")), show(ctx.header("a", "a")) }]])
    assert.same({ "three", "", "two", "nil", "nil", "three", "", "two", "nil", "one", "nil", "nil" },
      got)
  end)

  -- reports what it read in x-seen: whether the table was made before its
  -- first read, then the headers sorted as name=value
  local READER = [[
return {
  type = "spec-header-reader",
  pre_request = function(_, ctx)
    local before = rawget(ctx.request, "headers")
    local names = {}
    for k, v in pairs(ctx.request.headers) do
      names[#names + 1] = k .. "=" .. v
    end
    table.sort(names)
    ctx:set_header("x-seen", (before == nil and "lazy " or "eager ") .. table.concat(names, ","))
  end,
}
]]

  local function seen(headers)
    local dir = S.tmpdir()
    S.write(dir .. "/spec-header-reader.lua", READER)
    rt = S.loaded({ plugins = { { type = "spec-header-reader", name = "reader" } } },
      { plugin_dirs = { dir, S.FIXTURES } })
    S.endpoints(rt, 1)
    local req = rt:begin({ headers = headers })
    local res = req:schedule()
    local id = req:id()
    req:finish("ok")
    os.execute("rm -rf " .. dir)
    assert.equal(200, res.status)
    return res.headers["x-seen"], id
  end

  it("reach plugins in lower case, made into a table on first read", function()
    assert.equal("lazy content-type=application/json,x-empty=,x-mixed-case=V a:l",
      seen({ ["X-Mixed-Case"] = "V a:l", ["x-empty"] = "", ["Content-Type"] = "application/json" }))
  end)

  it("come whole when there are more than the begin hook's stack buffer holds", function()
    local headers, want = { ["X-Request-Id"] = "big-1" }, { "x-request-id=big-1" }
    for i = 1, 40 do -- ~6 KB: the block is assembled in a heap buffer
      local value = ("v%02d"):format(i) .. ("."):rep(150)
      headers[("X-Big-%02d"):format(i)] = value
      want[#want + 1] = ("x-big-%02d=%s"):format(i, value)
    end
    table.sort(want)
    local got, id = seen(headers)
    assert.equal("lazy " .. table.concat(want, ","), got)
    assert.equal("big-1", id) -- found by the engine's own lookup
  end)
end)
