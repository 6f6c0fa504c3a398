-- edf-ordering-policy: earliest deadline first, no deadline last, arrival
-- order between equals.
local P = dofile("plugins/edf-ordering-policy.lua")

describe("edf-ordering-policy", function()
  it("serves the earliest deadline first", function()
    assert.is_true(P.less(nil, { seq = 2, deadline = 1 }, { seq = 1, deadline = 5 }))
    assert.is_false(P.less(nil, { seq = 1, deadline = 5 }, { seq = 2, deadline = 1 }))
  end)

  it("puts requests without a deadline last, in arrival order", function()
    local none1, none2 = { seq = 1, deadline = math.huge }, { seq = 3, deadline = math.huge }
    local some = { seq = 2, deadline = 10 }
    assert.is_true(P.less(nil, some, none1))
    assert.is_true(P.less(nil, none1, none2))
    assert.is_false(P.less(nil, none2, none1))
  end)
end)
