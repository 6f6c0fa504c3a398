-- ngx_http_lupin_module routing with lupin's shipped default config and
-- with a hostile plugin: real nginx in front of lupin-sim, curl.
local P = require "e2e.procs"
local S = require "support"
local N = require "e2e.nginx"
local json = P.json

local function default_config(endpoints)
  local cfg = json.decode(P.read(S.ROOT .. "/examples/configs/epp-default.json"))
  cfg.endpoints = endpoints
  return cfg
end

describe("nginx module with the default config", function()
  if not N.available() then
    pending("no " .. N.MODULE .. " (make nginx-module, with nginx-dev installed)")
    return
  end

  local sim, ngx

  setup(function()
    sim = P.sim("--model m --instant", 4)
    ngx = N.start(default_config(P.sim_endpoints(sim)))
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("sends a repeated long prefix home", function()
    -- 6 conversations, each a 4 KB context of its own asked 4 questions:
    -- the prefix-cache scorer sends every question after the first where
    -- the first went (random routing over 4 endpoints: 1 in 64 per context)
    local homes = {}
    for c = 1, 6 do
      local context = ("context %d: "):format(c) .. ("the quick brown fox %d "):format(c):rep(180)
      for q = 1, 4 do
        local code, h = P.post(ngx.base, "/v1/completions", { model = "m", max_tokens = 2,
          prompt = context .. "question " .. q })
        assert.equal(200, code)
        homes[c] = homes[c] or h["x-sim-endpoint"]
        assert.equal(homes[c], h["x-sim-endpoint"], "context " .. c .. " question " .. q)
      end
    end
    -- and the contexts spread: not all at one endpoint
    local distinct = {}
    for _, hp in pairs(homes) do
      distinct[hp] = true
    end
    assert.is_true(next(distinct, next(distinct)) ~= nil, "every context went to one endpoint")
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx module with two workers", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  local sim, ngx

  setup(function()
    sim = P.sim("--model m --instant", 4)
    -- reuseport: the kernel spreads the connections over both workers
    ngx = N.start(default_config(P.sim_endpoints(sim)), { workers = 2, listen = "reuseport" })
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  -- a series of /lupin_status by worker: each scrape answers for the worker
  -- that took it (X-Lupin-Worker), so several are read
  local function per_worker(series)
    local seen = {}
    for _ = 1, 40 do
      local _, h, text = P.get(ngx.base .. "/lupin_status")
      seen[h["x-lupin-worker"]] = tonumber(text:match("\n" .. series:gsub("%p", "%%%0") .. " (%S+)"))
    end
    return seen
  end

  it("share what their prefix indexes learn: a prefix goes home from either", function()
    local homes = {}
    for c = 1, 6 do
      local context = ("shared context %d: "):format(c) .. ("lorem ipsum %d dolor "):format(c):rep(180)
      for q = 1, 4 do
        local code, h = P.post(ngx.base, "/v1/completions", { model = "m", max_tokens = 2,
          prompt = context .. "question " .. q })
        assert.equal(200, code)
        homes[c] = homes[c] or h["x-sim-endpoint"]
        assert.equal(homes[c], h["x-sim-endpoint"], "context " .. c .. " question " .. q)
      end
    end
    -- both workers took requests, and each applied the other's records
    local workers = 0
    for _, applied in pairs(per_worker("lupin_replica_sync_applied_total")) do
      workers = workers + 1
      assert.is_true(applied > 0)
    end
    assert.equal(2, workers)
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

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

describe("nginx module with a scorer that never returns", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  local sim, ngx

  setup(function()
    local dir = S.tmpdir()
    S.write(dir .. "/spin-scorer.lua", SPIN)
    sim = P.sim("--model m --instant", 2)
    local cfg = N.config(P.sim_endpoints(sim))
    table.insert(cfg.pluginDirs, dir)
    table.insert(cfg.plugins, 1, { type = "spin-scorer" })
    table.insert(cfg.schedulingProfiles[1].plugins, 1, { pluginRef = "spin-scorer" })
    ngx = N.start(cfg) -- the default budget: 5 ms a call
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("is cut by its budget on every request while nginx keeps serving", function()
    for i = 1, 4 do
      local code, _, body = P.post(ngx.base, "/v1/completions",
        { model = "m", prompt = "hi", max_tokens = 2 }, "--max-time 20 -H 'x-request-id: spin-"
        .. i .. "'")
      assert.equal(200, code, body) -- the spinning scorer contributes 0
      assert.matches("finish:ok$", N.journal(ngx, "spin-" .. i)[1])
    end
    assert.equal(4, N.status(ngx, 'lupin_plugin_budget_cuts_total{plugin="spin-scorer",'
      .. 'type="spin-scorer",point="score"}'))
    assert.truthy(P.read(ngx.dir .. "/error.log"):find('plugin "spin-scorer" (spin-scorer) '
      .. "exceeded its budget of 5 ms in score", 1, true))
    -- the status location, in the same worker, answers at once
    assert.equal(200, (P.get(ngx.base .. "/lupin_status", "--max-time 2")))
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)
