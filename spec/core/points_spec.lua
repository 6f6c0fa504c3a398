-- One table of extension points (lua/lupin/points.lua): everything that
-- lists points follows it -- the loader, a generation's call lists, the
-- LuaLS types, the host call that drives each, docs/design.md's table, and
-- the specs (each point is exercised by name in spec/core/).
local support = require "support"
local points = require "lupin.points"
local loader = require "lupin.loader"

local function read(path)
  local f = assert(io.open(support.ROOT .. "/" .. path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local LAYER = { scheduler = "scheduler", request = "request control", instance = "instance" }

--- The Markdown table docs/design.md holds, as the rows say it.
local function table_of(rows)
  local out = { "| point | layer | returns | on error | when no plugin has it |",
    "|---|---|---|---|---|" }
  for _, r in ipairs(rows) do
    out[#out + 1] = ("| `%s(%s)` | %s | %s | %s | %s |"):format(r.name, r.args, LAYER[r.layer],
      r.returns, r.on_error, r.absent)
  end
  return table.concat(out, "\n")
end

describe("the extension points table", function()
  it("gives every row every field", function()
    local seen = {}
    for _, r in ipairs(points) do
      for _, k in ipairs({ "name", "layer", "args", "returns", "on_error", "absent", "driver" }) do
        assert.is_string(r[k], ("%s.%s"):format(tostring(r.name), k))
      end
      assert.truthy(LAYER[r.layer], r.layer)
      assert.is_nil(seen[r.name], "twice: " .. r.name)
      seen[r.name] = true
    end
  end)

  it("is what a plugin may define", function()
    local names = {}
    for i, r in ipairs(points) do
      names[i] = r.name
    end
    assert.same(names, loader.POINTS)
  end)

  it("is what lupin.Plugin's LuaLS fields name", function()
    local sdk = read("lua/lupin/sdk.lua")
    for _, r in ipairs(points) do
      assert.truthy(sdk:find("---@field " .. r.name .. " (fun(self: table", 1, true),
        "lua/lupin/sdk.lua has no lupin.Plugin field " .. r.name)
    end
  end)

  it("names host calls lupin.h declares", function()
    local header = read("core/lupin.h")
    for _, r in ipairs(points) do
      assert.truthy(header:find(r.driver .. "(", 1, true), r.name .. ": " .. r.driver)
    end
  end)

  it("is the table in docs/design.md", function()
    local doc = read("docs/design.md")
    local want = table_of(points)
    assert.truthy(doc:find(want, 1, true),
      "docs/design.md's extension points table differs; it should read:\n" .. want)
  end)

  it("has each point exercised by a spec in spec/core/", function()
    local p = io.popen("cat " .. support.ROOT .. "/spec/core/*_spec.lua")
    local specs = p:read("*a")
    p:close()
    for _, r in ipairs(points) do
      assert.truthy(specs:find(r.name .. " = function", 1, true)
        or specs:find('"' .. r.name .. '"', 1, true), "no spec in spec/core/ names " .. r.name)
    end
  end)
end)
