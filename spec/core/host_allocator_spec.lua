-- A host's allocator under the Lua heap (lupin_options.allocator, as
-- `lupin serve` gives mimalloc): spec/core/host_allocator.c, built by make,
-- runs lifecycles on a counting allocator and checks the blocks, the
-- runtime's count, the memory limit and a refused state.
local S = require "support"

describe("a host's allocator under the Lua heap", function()
  it("serves every block, is counted exactly and stays under the memory limit", function()
    local out = S.program("host-allocator", S.FIXTURES)
    assert.matches("host-allocator: every block from the host's allocator and back, counted "
      .. "exactly, limit applied above it\nrc=0", out, 1, true)
  end)
end)
