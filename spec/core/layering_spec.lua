-- The layers of docs/architecture.md hold: the gateway embeds the runtime
-- through lupin.h alone, as any host would, and the runtime's Lua side
-- knows no host.
local support = require "support"

local function grep(pattern, paths)
  local p = io.popen(("cd %s && grep -rlE %s %s 2>/dev/null"):format(support.ROOT,
    ("%q"):format(pattern), paths))
  local found = {}
  for line in p:lines() do
    found[#found + 1] = line
  end
  p:close()
  return found
end

describe("layering", function()
  it("the gateway includes lupin.h, never the runtime's internals or Lua", function()
    assert.same({}, grep('#include [<"](internal\\.h|lua\\.h|lauxlib\\.h|lualib\\.h|luajit\\.h)',
      "gateway"))
    assert.truthy(#grep('#include "lupin\\.h"', "gateway") > 0)
  end)

  it("the runtime's Lua side requires no host module", function()
    assert.same({}, grep('require[ (]*"lupin\\.gateway"', "lua"))
    assert.same({}, grep("gw_|gateway/", "core"))
  end)
end)
