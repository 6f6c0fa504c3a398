-- round-robin-fairness-policy: flows in turn, in id order, skipping the
-- ones with nothing waiting (they are not in the list it gets).
local P = dofile("plugins/round-robin-fairness-policy.lua")

local function flows(...)
  local out = {}
  for i, id in ipairs({ ... }) do
    out[i] = { id = id, len = 1 }
  end
  return out
end

describe("round-robin-fairness-policy", function()
  it("cycles through the flows in id order", function()
    local self, band = {}, { state = {} }
    local seen = {}
    for _ = 1, 5 do
      seen[#seen + 1] = P.pick_flow(self, band, flows("a", "b", "c")).id
    end
    assert.equal("a b c a b", table.concat(seen, " "))
  end)

  it("goes on after the last one served when flows come and go", function()
    local self, band = {}, { state = {} }
    assert.equal("a", P.pick_flow(self, band, flows("a", "c")).id)
    assert.equal("b", P.pick_flow(self, band, flows("b", "c")).id) -- a emptied, b arrived
    assert.equal("c", P.pick_flow(self, band, flows("a", "c")).id)
    assert.equal("a", P.pick_flow(self, band, flows("a")).id)
  end)

  it("keeps one cursor per instance in a band", function()
    local one, two, band = {}, {}, { state = {} }
    assert.equal("a", P.pick_flow(one, band, flows("a", "b")).id)
    assert.equal("a", P.pick_flow(two, band, flows("a", "b")).id)
  end)
end)
