-- The host library (host/, liblupin-host.a): what every host of liblupin
-- needs besides lupin.h, with no event loop.  A program linked against it
-- and liblupin.a alone, without libuv or http_parser, uses each piece.
local support = require "support"

local function run(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  local ok = p:close()
  return out, ok
end

describe("the host library", function()
  local build = support.ROOT .. "/" .. support.BUILD

  it("links without libuv: a program on liblupin-host.a and liblupin.a alone", function()
    local out, ok = run(build .. "/host-link")
    assert.truthy(ok, out)
    assert.matches("metrics 0 3 2 0.25", out, 1, true)
    assert.matches("# TYPE lupin_endpoints gauge\nlupin_endpoints 4\n", out, 1, true)
    -- ejected for the base time, back once it is over and scrapes succeed
    assert.matches("health 1 1 0 1 healthy", out, 1, true)
    assert.matches('access {"ts":1.000,"id":"r\\"1","path":"/v1/completions"', out, 1, true)
    assert.matches("secret 1 0", out, 1, true)
    local libs = run("ldd " .. build .. "/host-link")
    assert.falsy(libs:match("libuv"), libs)
    assert.falsy(libs:match("http_parser"), libs)
  end)

  it("defines and uses no libuv or http_parser symbol", function()
    local syms = run("nm " .. build .. "/liblupin-host.a")
    assert.falsy(syms:match("%f[%w_]uv_[%w_]+"), "liblupin-host.a names libuv")
    assert.falsy(syms:match("%f[%w_]http_parser[%w_]*"), "liblupin-host.a names http_parser")
  end)

  it("includes lupin.h from the core and no loop header", function()
    local strange = {}
    local p = io.popen("cd " .. support.ROOT .. " && grep -H '#include' host/*.c host/*.h")
    for line in p:lines() do
      local file, inc = line:match('^([^:]+):#include%s+[<"]([^>"]+)[>"]')
      if inc and (inc:match("uv") or inc:match("http_parser") or inc == "internal.h"
          or inc == "gateway.h" or inc:match("^lua")) then
        strange[#strange + 1] = file .. ": " .. inc
      end
    end
    p:close()
    assert.same({}, strange)
  end)
end)
