-- lupin.schema, used directly: defaults, types, bounds, messages.
local schema = require "lupin.schema"

describe("lupin.schema", function()
  local s = {
    n = { type = "number", default = 1.5, min = 0, max = 2 },
    i = { type = "integer", default = 3, min = 1 },
    name = { type = "string", required = true },
    on = { type = "boolean", default = false },
    list = { type = "array", items = "string", default = { "a" } },
    mode = { type = "string", enum = { "x", "y" }, default = "x" },
    opts = { type = "object", default = {} },
    pos = { type = "number", default = 1, above = 0 },
    frac = { type = "number", default = 0.5, above = 0, max = 1 },
  }

  it("fills defaults and returns a fresh table", function()
    local p = assert(schema.validate(s, { name = "q" }))
    assert.same({ n = 1.5, i = 3, name = "q", on = false, list = { "a" }, mode = "x", opts = {}, pos = 1,
      frac = 0.5 }, p)
    p.list[1] = "changed"
    assert.same({ "a" }, s.list.default) -- defaults are copied, never shared
  end)

  local cases = {
    { { name = "q", n = 3 }, "n", "must be a number between 0 and 2, got 3" },
    { { name = "q", n = 0 / 0 }, "n", "must be a number between 0 and 2, got nan" },
    { { name = "q", i = 0 }, "i", "must be an integer ≥ 1, got 0" },
    { { name = "q", i = 2.5 }, "i", "must be an integer ≥ 1, got 2.5" },
    { { name = "q", pos = 0 }, "pos", "must be a number > 0, got 0" },
    { { name = "q", pos = -1 }, "pos", "must be a number > 0, got -1" },
    { { name = "q", frac = 0 }, "frac", "must be a number > 0 and ≤ 1, got 0" },
    { { name = "q", frac = 1.5 }, "frac", "must be a number > 0 and ≤ 1, got 1.5" },
    { {}, "name", 'missing required parameter "name" (a string)' },
    { { name = 1 }, "name", "must be a string, got 1" },
    { { name = "q", on = "yes" }, "on", 'must be a boolean, got "yes"' },
    { { name = "q", list = { 1 } }, "list", "item 0 must be a string, got 1" },
    { { name = "q", list = { a = 1 } }, "list", 'must be an array, got {"a":1}' },
    { { name = "q", mode = "z" }, "mode", 'must be one of "x", "y", got "z"' },
    { { name = "q", extra = 1 }, "extra",
      'unknown parameter "extra"; known parameters: frac, i, list, mode, n, name, on, opts, pos' },
  }
  for _, c in ipairs(cases) do
    it("refuses " .. c[3], function()
      local p, err, field = schema.validate(s, c[1])
      assert.is_nil(p)
      assert.equal(c[2], field)
      assert.equal(c[3], err)
    end)
  end

  it("takes a value just above an exclusive min, and the max itself", function()
    local p = assert(schema.validate(s, { name = "q", pos = 1e-9, frac = 1 }))
    assert.equal(1e-9, p.pos)
    assert.equal(1, p.frac)
  end)

  it("refuses parameters that are not an object", function()
    local p, err = schema.validate(s, "x")
    assert.is_nil(p)
    assert.equal('parameters must be an object, got "x"', err)
  end)

  it("checks schemas themselves", function()
    assert.is_true(schema.check(s))
    local ok, err = schema.check({ x = { type = "float" } })
    assert.is_false(ok)
    assert.matches('schema field "x" needs a type', err, 1, true)
  end)
end)
