-- lupin serve's rooms (gateway/loop/loop.h): cli/ -> gateway/ (the process)
-- -> admin/ -> epp/ -> proxy/ -> endpoints/ -> http/ -> loop/ -> host/.  Read from
-- the object files (nm, spec/gateway/rooms.lua): a room uses only symbols
-- of rooms below it, so the room graph has no cycle.
local support = require "support"
package.path = support.ROOT .. "/spec/gateway/?.lua;" .. package.path
local rooms = require "rooms"

describe("the gateway's rooms", function()
  local edges = rooms.edges(support.BUILD, false, support.ROOT)

  it("are all found in the build", function()
    local seen = {}
    for _, e in ipairs(edges) do
      seen[e.caller], seen[e.callee] = true, true
    end
    for _, r in ipairs(rooms.ORDER) do
      assert.truthy(seen[r], "no call from or to room " .. r .. " in " .. support.BUILD)
    end
  end)

  it("call only rooms below them", function()
    local upward = {}
    for _, e in ipairs(edges) do
      if rooms.upward(e) then
        upward[#upward + 1] = rooms.describe(e)
      end
    end
    assert.same({}, upward, "upward calls (order: " .. table.concat(rooms.ORDER, " -> ") .. ")")
  end)

  it("form no cycle", function()
    local c = rooms.cycle(edges)
    assert.falsy(c, c and ("cycle: " .. table.concat(c, " -> ")))
  end)

  it("each include their own room's header or one below, never one above", function()
    local header = { ["cli.h"] = "cli", ["gateway.h"] = "process", ["admin/admin.h"] = "admin",
      ["proxy/proxy.h"] = "proxy", ["endpoints/endpoints.h"] = "endpoints",
      ["http/http.h"] = "http", ["loop/loop.h"] = "loop", ["lupin_host.h"] = "host" }
    local wrong = {}
    local p = io.popen("cd " .. support.ROOT ..
      " && grep -H '#include \"' gateway/*.[ch] gateway/*/*.[ch] cli/*.[ch] host/*.[ch]")
    for line in p:lines() do
      local file, inc = line:match('^([^:]+):#include "([^"]+)"')
      local obj = ("x/" .. file):gsub("/gateway/", "/gw/"):gsub("%.[ch]$", ".o")
      local from = rooms.room(obj)
      local to = header[inc]
      if from and to and rooms.RANK[to] < rooms.RANK[from] then
        wrong[#wrong + 1] = ("%s (%s) includes %s (%s)"):format(file, from, inc, to)
      end
    end
    p:close()
    assert.same({}, wrong)
  end)
end)
