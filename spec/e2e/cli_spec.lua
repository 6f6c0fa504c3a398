-- The command line of `lupin` and `lupin-sim`: help, version, exit codes,
-- `lupin check` doing what a reload does, serve refusing what check refuses,
-- JSON diagnostics, and `make install` putting the binaries and man page in place.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local LUPIN, SIM = P.LUPIN, P.SIM

local function version()
  local h = P.read(support.ROOT .. "/core/lupin.h")
  return h:match('#define LUPIN_VERSION "([^"]+)"')
end

local function write_config(name, text)
  local path = P.dir .. "/" .. name
  support.write(path, text)
  return path
end

-- a scorer that fails on every request, in a plugin directory of its own
local FAILING = [[
local function deep(endpoints)
  return endpoints.missing.field
end
local function helper(endpoints)
  return deep(endpoints)
end
return {
  type = "cli-failing-scorer",
  score = function(_, _, endpoints)
    return helper(endpoints)
  end,
}
]]

-- a plugin (of no extension point) whose instance takes ~30 ms to make:
-- LUPIN_JIT_PROFILE's spec
local BUSY = [[
local function busy()
  local x = 0
  for i = 1, 3e6 do
    x = (x + i) % 1000003
  end
  return x
end
return { type = "cli-busy", new = function() return { spin = busy() } end }
]]

local function failing_config(endpoints)
  os.execute("mkdir -p " .. P.dir .. "/cli-plugins")
  support.write(P.dir .. "/cli-plugins/cli-failing-scorer.lua", FAILING)
  return write_config("cli-failing.json", ('{\n "pluginDirs": ["cli-plugins"],\n'
    .. ' "plugins": [\n  {"type": "cli-failing-scorer"},\n  {"type": "max-score-picker"}\n ]%s\n}\n')
    :format(endpoints and ',\n "endpoints": ' .. json.encode(endpoints) or ""))
end

describe("lupin's help and version", function()
  it("prints the usage on -h, --help and help, exit 0, on stdout", function()
    for _, flag in ipairs({ "-h", "--help", "help" }) do
      local out, rc = P.run(LUPIN .. " " .. flag .. " 2>/dev/null")
      assert.equal(0, rc, flag)
      assert.truthy(out:find("usage: lupin", 1, true), flag)
      assert.truthy(out:find("exit status", 1, true), flag)
    end
  end)

  it("prints each subcommand's own usage on -h and --help", function()
    for _, cmd in ipairs({ "serve", "check" }) do
      for _, flag in ipairs({ "-h", "--help" }) do
        local out, rc = P.run(("%s %s %s 2>/dev/null"):format(LUPIN, cmd, flag))
        assert.equal(0, rc, cmd .. " " .. flag)
        assert.truthy(out:find("usage: lupin " .. cmd, 1, true), out)
      end
    end
    local text = P.run(LUPIN .. " help check")
    assert.truthy(text:find("usage: lupin check", 1, true))
    -- help wins over everything else on the line, even bad arguments
    local out, rc = P.run(LUPIN .. " check --bogus --help 2>/dev/null")
    assert.equal(0, rc)
    assert.truthy(out:find("--format text|json", 1, true))
  end)

  it("prints the version of core/lupin.h on --version, -V and version", function()
    for _, flag in ipairs({ "--version", "-V", "version" }) do
      local out, rc = P.run(LUPIN .. " " .. flag)
      assert.equal(0, rc)
      assert.equal("lupin " .. version() .. "\n", out)
    end
  end)

  it("exits 2 on usage errors, with the usage on stderr", function()
    local cases = { "", "bogus", "serve", "check --format xml --config x",
      "serve --config x --log-format yaml", "check --config x --listen" }
    for _, args in ipairs(cases) do
      local out, rc = P.run(LUPIN .. " " .. args .. " 2>&1 >/dev/null")
      assert.equal(2, rc, args)
      assert.truthy(out:find("usage: lupin", 1, true), args)
    end
  end)

  it("lupin-sim answers --help and --version", function()
    local out, rc = P.run(SIM .. " --help")
    assert.equal(0, rc)
    assert.truthy(out:find("usage: lupin-sim", 1, true))
    assert.truthy(out:find("--version", 1, true))
    out, rc = P.run(SIM .. " --version")
    assert.equal(0, rc)
    assert.equal("lupin-sim " .. version() .. "\n", out)
    out, rc = P.run(SIM .. " -V")
    assert.equal(0, rc)
    assert.equal("lupin-sim " .. version() .. "\n", out)
    local _, bad = P.run(SIM .. " --bogus 2>/dev/null")
    assert.equal(2, bad)
  end)
end)

-- A value the EPP replaces with its default (GIE prefixcachescorer/plugin.go,
-- New: "BlockSize is not positive, using default value").
local FALLBACK_CONFIG = '{\n "plugins": [\n  {"type": "prefix-cache-scorer",\n'
  .. '   "parameters": {"blockSize": 0}}\n ]\n}\n'
local FALLBACK_WARNING = ':4: plugins[0].parameters.blockSize: plugin "prefix-cache-scorer"'
  .. ' (prefix-cache-scorer): 0 out of range, using 64 instead, as the EPP does'

describe("lupin check", function()
  it("loads a value the EPP replaces with its default, and warns which value it uses", function()
    local path = write_config("cli-fallback.json", FALLBACK_CONFIG)
    local out, rc = P.run(LUPIN .. " check --config " .. path .. " 2>&1")
    assert.equal(0, rc, out)
    assert.truthy(out:find(path .. FALLBACK_WARNING, 1, true), out)
  end)

  it("runs the dry scheduling cycle over the config's endpoints, as a reload does", function()
    local path = failing_config({ { address = "127.0.0.1", port = 9 } })
    local out, rc = P.run(LUPIN .. " check --config " .. path .. " 2>&1")
    assert.equal(1, rc, out)
    assert.truthy(out:find(path .. ":4: plugins[0]: plugin \"cli-failing-scorer\""
      .. " (cli-failing-scorer) failed in score during the dry scheduling cycle", 1, true), out)
    assert.truthy(out:find("cli-failing-scorer.lua:2: attempt to index field 'missing'", 1,
      true), out)
  end)

  it("runs it over a placeholder endpoint when none is configured", function()
    local path = failing_config(nil)
    local out, rc = P.run(LUPIN .. " check --config " .. path .. " 2>&1")
    assert.equal(1, rc, out)
    assert.truthy(out:find("during the dry scheduling cycle", 1, true), out)
  end)

  it("runs it over the endpoints of --endpoints", function()
    local path = failing_config(nil)
    local eps = write_config("cli-eps.json", '[{"address": "127.0.0.1", "port": 9}]')
    local out, rc = P.run(("%s check --config %s --endpoints %s 2>&1"):format(LUPIN, path, eps))
    assert.equal(1, rc, out)
    assert.truthy(out:find("failed in score", 1, true), out)
  end)

  it("--format json prints one object a pipeline can read, ok or not", function()
    local good = write_config("cli-good.json", json.encode({
      plugins = { { type = "queue-scorer" } },
      endpoints = { { address = "127.0.0.1", port = 9 }, { address = "127.0.0.1", port = 10 } },
    }))
    local out, rc = P.run(LUPIN .. " check --format json --config " .. good)
    assert.equal(0, rc, out)
    local r = json.decode(out)
    assert.is_true(r.ok)
    assert.equal(good, r.config)
    assert.equal(2, r.endpoints)
    assert.truthy(r.digest:match("^%x+$"))

    local bad = write_config("cli-bad.json", '{\n "plugins": [\n  {"type": "queue-scorer",\n'
      .. '   "parameters": {"nope": 1}}\n ]\n}\n')
    out, rc = P.run(LUPIN .. " check --format json --config " .. bad)
    assert.equal(1, rc, out)
    r = json.decode(out)
    assert.is_false(r.ok)
    assert.equal(bad, r.file)
    assert.equal(4, r.line)
    assert.equal("plugins[0].parameters.nope", r.path)
    assert.truthy(r.message:find("nope", 1, true), r.message)
    assert.equal(("%s:%d: %s: %s"):format(r.file, r.line, r.path, r.message), r.error)

    out, rc = P.run(LUPIN .. " check --format json --config " .. P.dir .. "/none.json")
    assert.equal(1, rc)
    r = json.decode(out)
    assert.is_false(r.ok)
    assert.truthy(r.message:find("cannot read config", 1, true))
  end)
end)

describe("lupin serve", function()
  it("serves a config with a value the EPP replaces, and logs the warning", function()
    local gw = P.gateway(FALLBACK_CONFIG, "--no-watch")
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
    assert.truthy(P.read(gw.err):find(gw.config .. FALLBACK_WARNING, 1, true), P.read(gw.err))
  end)

  it("refuses to start on what check refuses: exit 1, the plugin named", function()
    local path = failing_config({ { address = "127.0.0.1", port = 9 } })
    local out, rc = P.run(("%s serve --config %s --listen 127.0.0.1:0 --admin 127.0.0.1:0"
      .. " --no-watch 2>&1"):format(LUPIN, path))
    assert.equal(1, rc, out)
    assert.truthy(out:find("not starting: " .. path .. ":4: plugins[0]: plugin"
      .. " \"cli-failing-scorer\"", 1, true), out)
    assert.falsy(out:find("listening on", 1, true))
  end)

  it("exits 3 when its address is taken", function()
    local gw = P.gateway({ plugins = { { type = "queue-scorer" } } }, "--no-watch")
    local port = gw.base:match(":(%d+)$")
    local out, rc = P.run(("%s serve --config %s --listen 127.0.0.1:%s --admin 127.0.0.1:0"
      .. " --no-watch 2>&1"):format(LUPIN, gw.config, port))
    P.stop(gw)
    assert.equal(3, rc, out)
    assert.truthy(out:find("127.0.0.1:" .. port, 1, true), out)
  end)

  it("--log-format json writes each diagnostic as a JSON object", function()
    local gw = P.gateway({ plugins = { { type = "queue-scorer" } },
      endpoints = { { name = "far", address = "127.0.0.1", port = 9 } } },
      "--no-watch --log-format json --log-level debug")
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
    local n = 0
    for line in P.read(gw.err):gmatch("[^\n]+") do
      local entry = json.decode(line)
      assert.truthy(entry.level:match("^%a+$"), line)
      assert.is_number(entry.ts)
      assert.is_string(entry.msg)
      n = n + 1
    end
    assert.truthy(n >= 2)
    assert.truthy(P.read(gw.err):find('"msg":"endpoint far (127.0.0.1:9) added"', 1, true))
  end)

  it("LUPIN_JIT_PROFILE and LUPIN_JIT_LOG report a runtime's Lua from its start to its end",
    function()
      local prof, log = P.dir .. "/jit.prof", P.dir .. "/jit.log"
      os.remove(prof)
      os.remove(log)
      -- a plugin that works ~30 ms at load: a 1 ms sampling profiler sees
      -- it however fast the rest of the check is
      os.execute("mkdir -p " .. P.dir .. "/cli-plugins")
      support.write(P.dir .. "/cli-plugins/cli-busy.lua", BUSY)
      local config = write_config("cli-busy.json", '{ "pluginDirs": ["cli-plugins"],'
        .. ' "plugins": [ { "type": "cli-busy" } ] }')
      local out, rc = P.run(("LUPIN_JIT_PROFILE=vi1 LUPIN_JIT_PROFILE_OUT=%s LUPIN_JIT_LOG=%s "
        .. "%s check --config %s 2>&1"):format(prof, log, LUPIN, config))
      assert.equal(0, rc, out)
      -- jit.p's VM-state report: "100%  C code", "12%  Compiled", ...
      assert.matches("%d+%%%s+%a", P.read(prof) or "")
      -- jit.v's trace log: the config checks loop enough to compile
      assert.matches("[TRACE", P.read(log) or "", 1, true)
    end)
end)

describe("make install", function()
  it("installs lupin, lupin-sim and the man page, which documents every option", function()
    local dest = P.dir .. "/destdir"
    local out, rc = P.run(("make -s -C %s install B=%s DESTDIR=%s 2>&1"):format(
      support.ROOT, support.BUILD, dest))
    assert.equal(0, rc, out)
    local prefix = dest .. "/usr/local"
    for _, f in ipairs({ "bin/lupin", "bin/lupin-sim", "share/man/man1/lupin.1",
      "share/lupin/lua/lupin/runtime/init.lua" }) do
      assert.truthy(P.read(prefix .. "/" .. f), f)
    end
    local v
    v, rc = P.run(prefix .. "/bin/lupin-sim --version")
    assert.equal(0, rc)
    assert.equal("lupin-sim " .. version() .. "\n", v)
    local man = P.read(prefix .. "/share/man/man1/lupin.1")
    assert.truthy(man:find('.TH LUPIN 1', 1, true))
    local usage = P.run(LUPIN .. " serve --help") .. P.run(LUPIN .. " check --help")
    for opt in usage:gmatch("%-%-[%a-]+") do
      assert.truthy(man:find(opt:gsub("%-", "\\-"), 1, true), opt .. " is not in lupin.1")
    end
    for code = 0, 4 do
      assert.truthy(man:find("\n.B " .. code .. "\n", 1, true), "exit status " .. code)
    end
  end)
end)
