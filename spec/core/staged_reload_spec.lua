-- The staged reload (lupin_runtime_stage, _commit, _abort): what a
-- multi-worker host uses to swap every runtime together or none.  A probe
-- plugin counts its generations' init and shutdown calls in a lupin.shared
-- dict, which outlives every generation.
local S = require "support"

local PROBE = [[
local shared = require "lupin.shared"
local counts = shared.dict("staged-probe")
return { type = "staged-probe",
  schema = { tag = { type = "string", default = "" } },
  new = function(p) return { tag = p.tag } end,
  init = function() counts:incr("init", 1, 0) end,
  shutdown = function(self) counts:incr("shutdown " .. self.tag, 1, 0) end,
  score = function(_, _, eps) local s = {} for i = 1, #eps do s[i] = 1 end return s end }]]

local function config(tag, extra)
  return S.json.encode({
    plugins = { { type = "staged-probe", name = "probe", parameters = { tag = tag } },
      { type = extra or "max-score-picker" } },
  })
end

describe("staged reload", function()
  local rt, dir, path
  local function write(text)
    S.write(path, text)
  end
  local function count(key)
    return S.eval(rt, ([[return require("lupin.shared").dict("staged-probe"):get(%q) or 0]])
      :format(key))
  end
  local function tag()
    return S.eval(rt, [[return require("lupin.runtime").current.by_name.probe.obj.tag]])
  end

  before_each(function()
    dir = S.tmpdir()
    path = dir .. "/config.json"
    S.write(dir .. "/staged-probe.lua", PROBE)
    rt = S.runtime({ plugin_dirs = { dir } })
    write(config("one"))
    assert(rt:load(path))
    S.endpoints(rt, 2)
  end)
  after_each(function()
    rt:free()
    os.execute("rm -rf " .. dir)
  end)

  it("stages without serving: the current generation answers until the commit", function()
    write(config("two"))
    assert(rt:stage())
    assert.equal(1, rt:stats().generation)
    assert.equal("one", tag())
    assert.equal(200, S.lifecycle(rt).status)
    assert(rt:commit())
    assert.equal(2, rt:stats().generation)
    assert.equal("two", tag())
    assert.equal(200, S.lifecycle(rt).status)
    assert.equal(1, count("shutdown one")) -- the replaced one, released at the swap
  end)

  it("abort drops the staged generation: its plugins shut down, the current one serves", function()
    write(config("two"))
    assert(rt:stage())
    rt:abort()
    assert.equal(1, count("shutdown two"))
    assert.equal(0, count("shutdown one"))
    assert.equal(1, rt:stats().generation)
    assert.equal(1, rt:stats().generations_alive)
    assert.equal("one", tag())
    local ok, err = rt:commit()
    assert.is_nil(ok)
    assert.matches("no generation is staged", err, 1, true)
  end)

  it("refuses a config that fails, naming the file and field, and keeps serving", function()
    write(config("two", "no-such-picker"))
    local ok, err = rt:stage()
    assert.is_nil(ok)
    assert.matches("config.json:1: plugins[1]", err, 1, true)
    assert.matches("no-such-picker", err, 1, true)
    assert.is_nil((rt:commit()))
    assert.equal("one", tag())
    assert.equal(200, S.lifecycle(rt).status)
  end)

  it("staging again drops the first staged generation", function()
    write(config("two"))
    assert(rt:stage())
    write(config("three"))
    assert(rt:stage())
    assert.equal(1, count("shutdown two"))
    assert(rt:commit())
    assert.equal("three", tag())
    assert.equal(2, rt:stats().generation)
  end)

  it("frees a staged generation with the runtime", function()
    write(config("two"))
    assert(rt:stage())
    rt:free()
    rt = S.runtime({ plugin_dirs = { dir } }) -- for after_each
    assert(rt:load(path))
  end)
end)
