-- fcfs-ordering-policy: arrival order within a flow (lupin.flow's items).
local P = dofile("plugins/fcfs-ordering-policy.lua")

describe("fcfs-ordering-policy", function()
  it("serves the earlier arrival first, whatever the deadlines", function()
    local a, b = { seq = 1, deadline = 100 }, { seq = 2, deadline = 1 }
    assert.is_true(P.less(nil, a, b))
    assert.is_false(P.less(nil, b, a))
    assert.is_false(P.less(nil, a, a))
  end)
end)
