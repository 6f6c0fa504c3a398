-- global-strict-fairness-policy: the flow holding the band's best head.
local P = dofile("plugins/global-strict-fairness-policy.lua")

local function flow(id, head)
  return { id = id, len = 1, head = function() return head end }
end

describe("global-strict-fairness-policy", function()
  it("picks the flow whose head the band's ordering serves first", function()
    local band = { less = function(_, a, b) return a.seq < b.seq end }
    local flows = { flow("a", { seq = 5 }), flow("b", { seq = 2 }), flow("c", { seq = 9 }) }
    assert.equal("b", P.pick_flow(nil, band, flows).id)
  end)

  it("takes the only flow there is", function()
    local band = { less = function() error("not needed") end }
    assert.equal("a", P.pick_flow(nil, band, { flow("a", { seq = 1 }) }).id)
  end)
end)
