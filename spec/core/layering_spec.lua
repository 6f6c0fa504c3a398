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
      "gateway host cli nginx"))
    assert.truthy(#grep('#include "lupin\\.h"', "gateway") > 0)
  end)

  it("the nginx module includes lupin.h and lupin_host.h, nothing of the gateway", function()
    assert.same({}, grep('#include [<"](gateway\\.h|uv\\.h|http_parser\\.h|internal\\.h)|gateway/',
      "nginx --exclude=lupin_endpoints.c"))
    -- nginx parses its clients' and upstreams' HTTP and has no parser for a
    -- response outside a request: the scrapes' answers (lupin_endpoints.c,
    -- on nginx's connections) are read with Debian's http_parser, as lupin
    -- serve reads them, and nothing else of the gateway comes in
    assert.same({}, grep('#include [<"](gateway\\.h|uv\\.h|internal\\.h)|gateway/',
      "nginx/lupin_endpoints.c"))
    assert.truthy(#grep('#include "lupin_host\\.h"', "nginx") > 0)
  end)

  it("the host library includes lupin.h from the core, no loop and no gateway", function()
    assert.same({}, grep('#include [<"](uv\\.h|http_parser\\.h|gateway\\.h|internal\\.h)', "host"))
    assert.truthy(#grep('#include "lupin\\.h"', "host") > 0)
  end)

  it("the runtime's Lua side requires no host module", function()
    -- what lua/lupin may require: its own files, the modules the C runtime
    -- preloads (core/runtime.c), and the Debian libraries it depends on
    local preloaded = {}
    for line in io.lines(support.ROOT .. "/core/runtime.c") do
      local name = line:match('lua_setfield%(L, %-2, "(lupin%.[%w_.]+)"%)')
      if name then
        preloaded[name] = true
      end
    end
    assert.truthy(preloaded["lupin.invoke"], "core/runtime.c's preloads were not found")
    local LIBS = { ffi = true, bit = true, cjson = true, ["cjson.safe"] = true,
      ["table.new"] = true, ["table.clear"] = true, yaml = true }
    local strange = {}
    for _, file in ipairs(grep("require", "lua/lupin")) do
      for line in io.lines(support.ROOT .. "/" .. file) do
        local code = line:gsub("%-%-.*$", "")
        for name in code:gmatch('require%s*%(?%s*"([^"]+)"') do
          local own = name:match("^lupin%.([%w_.]+)$")
          own = own and own:gsub("%.", "/")
          local exists = own and (io.open(("%s/lua/lupin/%s.lua"):format(support.ROOT, own))
            or io.open(("%s/lua/lupin/%s/init.lua"):format(support.ROOT, own)))
          if exists then
            exists:close()
          elseif not (preloaded[name] or LIBS[name]) then
            strange[#strange + 1] = file .. ": " .. name
          end
        end
      end
    end
    assert.same({}, strange)
    assert.same({}, grep("gw_|gateway/", "core"))
  end)
end)
