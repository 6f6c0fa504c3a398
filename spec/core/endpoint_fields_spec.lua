-- Endpoint objects give plugins Lua strings for name and address (the C
-- struct's own char pointers must not shadow them).
local S = require "support"

describe("endpoint objects", function()
  it("give name, address and hostport as Lua strings", function()
    local rt = S.runtime()
    S.endpoints(rt, 2)
    local out = S.eval(rt, [[
      local ep = require("lupin.runtime.pool").list[2]
      return { type(ep.name), ep.name, type(ep.address), ep.address, ep.hostport }
    ]])
    assert.same({ "string", "ep2", "string", "10.0.0.2", "10.0.0.2:8000" }, out)
  end)

  it("let the destination subset hint name an endpoint by its name", function()
    local rt = S.loaded({ plugins = { { type = "max-score-picker" } } })
    S.endpoints(rt, 3)
    local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}',
      subset = { "ep3" } }))
    local res = req:schedule()
    req:finish("ok")
    assert.equal(200, res.status)
    assert.equal("ep3", res.picks[1].name)
  end)
end)
