-- `lupin test`: busted on a plugin author's specs from any directory, from
-- the build tree and from an installed tree; exit codes and every error
-- path; lupin.testing from plain busted too.
local P = require "e2e.procs"
local support = require "support"

local PLUGIN = P.read(support.ROOT .. "/examples/plugins/least-loaded-scorer.lua")

local SPEC = [[
local testing = require "lupin.testing"
describe("least-loaded-scorer", function()
  it("scores by load", function()
    local t = testing.new { plugins = "least-loaded-scorer.lua" }
    t:endpoints { { waiting_queue_size = 1 }, {} }
    assert.same({ 0.5, 1 }, t:call("least-loaded-scorer", "score").scores)
    t:free()
  end)
  it("finds the plugin folder in LUPIN_TEST_PLUGINS", function()
    assert.truthy(os.getenv("LUPIN_TEST_PLUGINS"):find("/folder", 1, true))
  end)
end)
]]

-- A plugin folder outside the tree: the example plugin and SPEC in spec/.
local function folder(spec)
  local dir = support.tmpdir() .. "/folder"
  os.execute("mkdir -p " .. P.quote(dir .. "/spec"))
  support.write(dir .. "/least-loaded-scorer.lua", PLUGIN)
  support.write(dir .. "/spec/least-loaded-scorer_spec.lua", spec or SPEC)
  return dir
end

-- Under `make test-asan` the busted that lupin test starts loads the
-- sanitized lupin_native.so: it needs the runtime preloaded, as this one.
local PRELOAD = os.getenv("LD_PRELOAD") and "LD_PRELOAD=" .. P.quote(os.getenv("LD_PRELOAD")) .. " "
  or ""

-- Runs a command from dir (default: the system's temporary directory).
local function run(cmd, dir)
  return P.run("sh -c " .. P.quote(("cd %s && export %s; %s 2>&1"):format(P.quote(dir or "/tmp"),
    PRELOAD ~= "" and PRELOAD or "PATH", cmd)))
end

describe("lupin test", function()
  local LUPIN = P.quote(P.LUPIN)

  it("runs a folder's specs from another directory and from the folder", function()
    local dir = folder()
    local out, rc = run(LUPIN .. " test " .. P.quote(dir))
    assert.equal(0, rc, out)
    assert.matches("2 successes / 0 failures / 0 errors", out, 1, true)
    out, rc = run(LUPIN .. " test", dir)
    assert.equal(0, rc, out)
    out, rc = run(LUPIN .. " test spec/least-loaded-scorer_spec.lua", dir)
    assert.equal(0, rc, out)
    assert.matches("2 successes", out, 1, true)
  end)

  it("takes --plugins and passes options after -- to busted", function()
    local dir = folder()
    local out, rc = run(("%s test --plugins %s %s -- --filter=LUPIN_TEST_PLUGINS -o TAP"):format(
      LUPIN, P.quote(dir), P.quote(dir .. "/spec/least-loaded-scorer_spec.lua")))
    assert.equal(0, rc, out)
    assert.matches("ok 1 - least-loaded-scorer finds the plugin folder", out, 1, true)
    assert.not_matches("scores by load", out, 1, true)
  end)

  it("exits 1 when a spec fails, with busted's report", function()
    local dir = folder(SPEC:gsub("0%.5, 1", "0.5, 0.9"))
    local out, rc = run(LUPIN .. " test " .. P.quote(dir))
    assert.equal(1, rc, out)
    assert.matches("1 success / 1 failure / 0 errors", out, 1, true)
    assert.matches("least-loaded-scorer_spec.lua:6", out, 1, true)
  end)

  it("exits 2 on a missing path, a folder without specs, a bad option", function()
    local empty = support.tmpdir()
    for _, c in ipairs({
      { "test /nonexistent", "lupin test: no such file or directory: /nonexistent" },
      { "test " .. empty, "lupin test: no *_spec.lua files in " .. empty },
      { "test", "lupin test: no *_spec.lua files in ." },
      { "test --plugins /nonexistent .", "lupin test: no such directory: /nonexistent" },
      { "test --bogus", "lupin test: bad argument --bogus" },
    }) do
      local out, rc = run(LUPIN .. " " .. c[1], empty)
      assert.equal(2, rc, c[1])
      assert.matches(c[2], out, 1, true)
      assert.matches("usage: lupin test", out, 1, true)
    end
  end)

  it("exits 3 when busted or luajit is missing", function()
    local dir = folder()
    local out, rc = run(("env PATH=/nonexistent %s test %s"):format(LUPIN, P.quote(dir)))
    assert.equal(3, rc, out)
    assert.matches("lupin test: busted is not installed (Debian: apt-get install lua-busted)",
      out, 1, true)
    local bin = support.tmpdir()
    local busted = run("command -v busted"):match("%S+")
    os.execute(("ln -s %s %s/busted"):format(busted, bin))
    out, rc = run(("env PATH=%s %s test %s"):format(bin, LUPIN, P.quote(dir)))
    assert.equal(3, rc, out)
    assert.matches("lupin test: luajit is not installed", out, 1, true)
  end)

  it("prints its usage with --help and lupin help test", function()
    local out, rc = run(LUPIN .. " test --help")
    assert.equal(0, rc)
    assert.matches("^usage: lupin test %[%-%-plugins DIR%]", out)
    assert.equal(out, (run(LUPIN .. " help test")))
    assert.matches("  test     run plugin specs", (run(LUPIN .. " --help")), 1, true)
    local man = P.read(support.ROOT .. "/docs/lupin.1")
    assert.truthy(man:find(".B lupin test", 1, true))
    assert.truthy(man:find("\\-\\-plugins", 1, true))
    assert.truthy(man:find("LUPIN_TEST_PLUGINS", 1, true))
  end)

  it("works on an installed tree, wherever it was installed", function()
    local dest = support.tmpdir()
    local out, rc = P.run(("make -s -C %s install B=%s DESTDIR=%s 2>&1"):format(
      support.ROOT, support.BUILD, dest))
    assert.equal(0, rc, out)
    local prefix = dest .. "/usr/local"
    for _, f in ipairs({ "share/lupin/lua/lupin/testing.lua", "share/lupin/lua/lupin/runtime/probe.lua" }) do
      assert.truthy(P.read(prefix .. "/" .. f), f)
    end
    local dir = folder()
    out, rc = run(("env -u LUPIN_HOME %s/bin/lupin test %s"):format(prefix, P.quote(dir)))
    assert.equal(0, rc, out)
    assert.matches("2 successes / 0 failures", out, 1, true)
  end)
end)

describe("lupin.testing from plain busted", function()
  it("needs only LUA_PATH and LUA_CPATH", function()
    local dir = folder()
    local out, rc = run(("env LUA_PATH='%s/lua/?.lua;;' LUA_CPATH='%s/%s/?.so;;' "
      .. "LUPIN_TEST_PLUGINS=%s busted --lua=luajit ."):format(support.ROOT, support.ROOT,
      support.BUILD, P.quote(dir)), dir)
    assert.equal(0, rc, out)
    assert.matches("2 successes / 0 failures", out, 1, true)
  end)
end)
