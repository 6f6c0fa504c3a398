-- One table of extension points (lua/lupin/generation/points.lua): everything that
-- lists points follows it -- the loader, a generation's call lists, the
-- LuaLS types, the host call that drives each, docs/design.md's table, and
-- the specs (each point is exercised by name in spec/core/).
local support = require "support"
local points = require "lupin.generation.points"

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
  it("names each point as the endpoint picker does in the plugin stats a host reads", function()
    local rt = support.runtime()
    assert(rt:load(support.ROOT .. "/examples/configs/epp-default.json"))
    support.endpoints(rt, 3)
    support.lifecycle(rt)
    local epp = {}
    for _, r in ipairs(points) do
      epp[r.name] = r.epp or r.name
    end
    local seen = {}
    for _, st in ipairs(rt:plugin_stats()) do
      assert.equal(epp[st.point], st.epp_point, st.point)
      seen[st.point] = st.epp_point
    end
    rt:free()
    assert.equal("Scorer", seen.score)
    assert.equal("Picker", seen.pick)
  end)

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

  it("makes a new point one row plus the call that drives it", function()
    -- a point added to the table in a live runtime: the next generation
    -- records it, the engine calls it under the request-control policy, and
    -- its calls and errors are counted like any other point's
    local dir = support.tmpdir()
    support.write(dir .. "/dummy-plugin.lua", [[
      return { type = "dummy-plugin",
        new = function() return { seen = {} } end,
        dummy = function(self, ctx, x)
          self.seen[#self.seen + 1] = x
          if x == "boom" then error("dummy failed") end
        end }]])
    local rt = support.runtime({ plugin_dirs = { dir } })
    support.eval(rt, [[
      table.insert(require "lupin.generation.points", { name = "dummy", layer = "request", args = "ctx, x",
        returns = "nothing", on_error = "counted and logged", absent = "nothing",
        driver = "none" })
      return true]])
    assert(rt:load_string(support.json.encode({
      plugins = { { type = "dummy-plugin" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "d", plugins = { { pluginRef = "max-score-picker" } } } } }),
      "dummy.json"))
    local r = support.eval(rt, [[
      local rt, ctx, engine = require "lupin.runtime", require "lupin.runtime.ctx", require "lupin.runtime.engine"
      local gen = rt.current
      local req = ctx.new_request(gen, nil, "d-1", "/v1/completions", nil, nil, {})
      engine.point(req, "dummy", "hello")
      engine.point(req, "dummy", "boom")
      local rec = gen.by_name["dummy-plugin"]
      local points = require "lupin.generation.points"
      table.remove(points)
      return { seen = rec.obj.seen, calls = rec.stats.dummy.calls, errors = rec.stats.dummy.errors,
        listed = #gen.points.dummy }]])
    rt:free()
    os.execute("rm -rf " .. dir)
    assert.same({ "hello", "boom" }, r.seen)
    assert.equal(1, r.listed)
    assert.equal(2, r.calls)
    assert.equal(1, r.errors)
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
