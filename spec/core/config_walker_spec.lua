-- lupin.config.walk: each keyword of a declaration and the error it gives,
-- "file:line: json.path: message", the line from the decoder's index.
local config = require "lupin.config"
local walk = require "lupin.config.walk"

-- Walks the JSON text against the declaration d: the output, or nil and the error.
local function run(d, text, ctx)
  local root, index = assert(config.decode(text, "w.json"))
  return walk.walk(walk.errors("w.json", index), d, root, "", nil, ctx)
end

local function fails(d, text, want)
  local out, err = run(d, text)
  assert.is_nil(out)
  assert.equal(want, err)
end

local function obj(fields, extra)
  local d = { type = "object", fields = fields, known = "a thing", what = "the thing" }
  for k, v in pairs(extra or {}) do
    d[k] = v
  end
  return d
end

describe("lupin.config.walk", function()
  it("takes a value that keeps every rule, defaults filled", function()
    local d = obj({ n = { type = "integer", min = 0 }, s = { type = "string", default = "x" },
      b = { type = "boolean", default = true } })
    assert.same({ n = 3, s = "x", b = false }, run(d, '{"n": 3, "b": false}'))
  end)

  it("refuses an unknown field at its line, listing the known ones", function()
    fails(obj({ a = { type = "any" }, b = { type = "any" } }), '{"a": 1,\n "c": 2}',
      'w.json:2: c: unknown field "c" in a thing; known fields: a, b')
  end)

  it("refuses a container of the wrong kind with its noun", function()
    fails(obj({ list = { type = "array", what = "the list" } }), '{"list": {}}',
      "w.json:1: list: the list must be an array, got object")
    fails(obj({}), "[1]", "w.json:1: the thing must be an object, got array")
    fails(obj({ m = { type = "object", messages = { type = "m must be a map" } } }), '{"m": 1}',
      "w.json:1: m: m must be a map")
  end)

  it("gives each scalar rule its message in lupin.schema's words", function()
    local d = obj({
      i = { type = "integer", min = 1, max = 9 },
      n = { type = "number", min = 0 },
      s = { type = "string", nonempty = true },
      e = { type = "string", enum = { "a", "b" } },
      p = { type = "string", pattern = "^%d+$" },
      q = { type = "quantity" },
      t = { type = "duration" },
      b = { type = "boolean" },
    })
    fails(d, '{"i": 1.5}', "w.json:1: i: i must be an integer from 1 to 9, got 1.5")
    fails(d, '{"i": 10}', "w.json:1: i: i must be an integer from 1 to 9, got 10")
    fails(d, '{"n": -1}', "w.json:1: n: n must be a number ≥ 0, got -1")
    fails(d, '{"s": ""}', "w.json:1: s: s must be a non-empty string")
    fails(d, '{"e": "c"}', 'w.json:1: e: e must be one of "a", "b", got "c"')
    fails(d, '{"p": "x1"}', 'w.json:1: p: p must be like ^%d+$, got "x1"')
    fails(d, '{"q": "1X"}', 'w.json:1: q: q must be a quantity ≥ 0 such as 1000, "1k" or "5Gi",'
      .. ' got "1X"')
    fails(d, '{"t": "5 s"}', 'w.json:1: t: t must be a duration such as "30s" or "1m0s",'
      .. ' got "5 s"')
    fails(d, '{"b": 1}', "w.json:1: b: b must be a boolean, got 1")
  end)

  it("reads units: quantities and durations become numbers", function()
    local d = obj({ q = { type = "quantity" }, t = { type = "duration" } })
    assert.same({ q = 2 ^ 30, t = 0.5 }, run(d, '{"q": "1Gi", "t": "500ms"}'))
  end)

  it("takes a message template, or one per rule", function()
    local d = obj({ w = { type = "number", min = 0, message = "weight is {got}, {key}?" },
      x = { type = "integer", min = 0, max = 1, messages = { max = "{key} too big" } } })
    fails(d, '{"w": -2}', "w.json:1: w: weight is -2, w?")
    fails(d, '{"x": 2}', "w.json:1: x: x too big")
    fails(d, '{"x": -1}', "w.json:1: x: x must be an integer from 0 to 1, got -1")
  end)

  it("reports a required field missing at the object, or as its own error", function()
    local d = obj({ name = { type = "string", required = true, missing = "give it a name" },
      port = { type = "integer", required = true } }, { order = { "name", "port" } })
    fails(d, '{\n"port": 1}', "w.json:1: give it a name")
    fails(d, '{"name": "a"}', "w.json:1: port: port must be an integer, got null")
  end)

  it("counts a wrong value as missing with or_missing", function()
    local d = obj({ ref = { type = "string", nonempty = true, or_missing = true,
      missing = 'missing "ref"' } })
    fails({ type = "array", items = d }, '[{},\n {"ref": ""}]', 'w.json:2: [1]: missing "ref"')
  end)

  it("walks nested arrays of objects, naming each item's path and line", function()
    local d = obj({ groups = { type = "array",
      items = obj({ members = { type = "array", items = obj({ n = { type = "integer" } }) } }) } })
    fails(d, '{"groups": [\n {"members": []},\n {"members": [{"n": 1},\n {"n": "2"}]}]}',
      'w.json:4: groups[1].members[1].n: n must be an integer, got "2"')
    assert.same({ groups = { { members = {} }, { members = { { n = 1 } } } } },
      run(d, '{"groups": [{"members": []}, {"members": [{"n": 1}]}]}'))
  end)

  it("checks a free-form map's values", function()
    local d = obj({ labels = { type = "object", values = { type = "string",
      message = "label values must be strings" } } })
    fails(d, '{"labels": {"a": "x",\n "b": 2}}', "w.json:2: labels.b: label values must be strings")
  end)

  it("runs a custom check, with the context, at its path or the one it names", function()
    local d = obj({ dir = { type = "string", check = function(v, path, ctx)
      if v ~= ctx.want then
        return ("%s is not %s"):format(v, ctx.want), path .. ".x"
      end
    end } }, { check = function(out)
      if out.dir == "b" then
        return "not b"
      end
    end })
    local _, err = run(d, '{\n"dir": "a"}', { want = "c" })
    assert.equal("w.json:2: dir.x: a is not c", err)
    assert.same({ dir = "c" }, run(d, '{"dir": "c"}', { want = "c" }))
    _, err = run(d, '{"dir": "b"}', { want = "b" })
    assert.equal("w.json:1: not b", err)
  end)

  it("keeps null where nullable, converts before checking", function()
    local d = obj({ p = { type = "object", nullable = true },
      s = { type = "integer", min = 0, max = 1, convert = function(v)
        return v == true and 1 or v
      end } })
    local out = run(d, '{"p": null, "s": true}')
    assert.equal(require("cjson").null, out.p)
    assert.equal(1, out.s)
  end)
end)
