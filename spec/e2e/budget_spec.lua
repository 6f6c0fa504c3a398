-- Hostile plugins against the real `lupin serve` and `lupin check`: a scorer
-- that never returns, an init that never returns on reload, a plugin file
-- that reaches for os, io and ffi while being loaded.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local SPIN = [[
return {
  type = "spin-scorer",
  score = function(self, ctx, endpoints)
    if not ctx.request.dry_run then
      while true do end
    end
    local s = {}
    for i = 1, #endpoints do s[i] = 1 end
    return s
  end,
}
]]

local SPIN_INIT = [[
return {
  type = "spin-init",
  init = function() while true do end end,
  score = function(self, ctx, endpoints) return {} end,
}
]]

local function config(sim, dir, first)
  local eps = {}
  for i, port in ipairs(sim.ports) do
    eps[i] = { name = "e" .. i, address = "127.0.0.1", port = port }
  end
  local cfg = {
    pluginDirs = { dir },
    plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
    endpoints = eps, -- the default budgets: 5 ms a call, 1 s for init
  }
  if first then
    table.insert(cfg.plugins, 1, { type = first })
    table.insert(cfg.schedulingProfiles[1].plugins, 1, { pluginRef = first })
  end
  return cfg
end

local function request(gw)
  return P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi", max_tokens = 2 },
    "--max-time 20")
end

describe("a plugin that never returns", function()
  local sim, dir
  setup(function()
    dir = support.tmpdir()
    support.write(dir .. "/spin-scorer.lua", SPIN)
    support.write(dir .. "/spin-init.lua", SPIN_INIT)
    sim = P.sim("--model m --itl-ms 0 --seed 1", 2)
  end)
  teardown(function()
    P.stop(sim)
  end)

  it("is cut: the request is answered, admin answers, SIGTERM stops the gateway", function()
    local gw = P.gateway(config(sim, dir, "spin-scorer"), "--no-watch")
    finally(function() P.stop(gw) end)
    for _ = 1, 3 do
      local status, _, body = request(gw)
      assert.equal(200, status, body) -- the spinning scorer contributes 0
    end
    local status = P.get(gw.admin .. "/healthz", "--max-time 20")
    assert.equal(200, status)
    assert.equal(3, P.metric(gw, 'lupin_plugin_budget_cuts_total{plugin="spin-scorer",'
      .. 'type="spin-scorer",point="score"}'))
    assert.truthy((P.read(gw.err) or ""):find('plugin "spin-scorer" (spin-scorer) exceeded its'
      .. " budget of 5 ms in score", 1, true))
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
  end)

  it("in init on reload: the reload is refused, the old generation serves", function()
    local gw = P.gateway(config(sim, dir), "--no-watch")
    finally(function() P.stop(gw) end)
    support.write(gw.config, json.encode(config(sim, dir, "spin-init")))
    local status, _, body = P.post(gw.admin, "/admin/reload", "", "--max-time 20")
    assert.equal(400, status)
    assert.truthy(body:find("init exceeded its budget of 1000 ms", 1, true), body)
    status = request(gw)
    assert.equal(200, status)
    local _, _, gens = P.get(gw.admin .. "/admin/generations")
    assert.equal(1, json.decode(gens).generations[1].number)
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
  end)
end)

describe("a plugin escaping its sandbox at load", function()
  for name, code in pairs({
    os_execute = "require('os').execute('touch %s')",
    io_open = "require('io').open('%s', 'w'):close()",
    ffi = "local ffi = require('ffi') ffi.cdef('int system(const char *)') ffi.C.system('touch %s')",
  }) do
    it("is refused by lupin check and lupin serve, nothing run: " .. name, function()
      local dir = support.tmpdir()
      local marker = dir .. "/marker"
      support.write(dir .. "/escaper.lua", code:format(marker)
        .. '\nreturn { type = "escaper", score = function() return {} end }\n')
      local cfg = json.encode({ pluginDirs = { dir }, plugins = { { type = "escaper" } } })
      local path = support.write(dir .. "/cfg.json", cfg)
      local out, rc = P.run(P.LUPIN .. " check --config " .. path .. " 2>&1")
      assert.equal(1, rc, out)
      assert.truthy(out:find("is not allowed in a plugin (sandbox)", 1, true), out)
      out, rc = P.run(P.LUPIN .. " serve --config " .. path
        .. " --listen 127.0.0.1:0 --admin 127.0.0.1:0 2>&1")
      assert.equal(1, rc, out)
      assert.truthy(out:find("escaper.lua:1:", 1, true), out)
      assert.is_nil(io.open(marker), "the plugin ran " .. name)
    end)
  end
end)
