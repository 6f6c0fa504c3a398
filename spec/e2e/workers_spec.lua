-- lupin serve --workers N (issue 16, docs/workers.md): N event loops behind
-- one address, one scrape, one reload, one admin API, one drain.  Real
-- lupin serve, lupin-sim and curl on loopback; every curl is a new
-- connection, which the kernel hands to one of the workers.
local P = require "e2e.procs"
local json = P.json

local MODEL = "meta-llama/Llama-3.1-8B-Instruct"

local function config(sim, extra)
  local cfg = {
    kind = "EndpointPickerConfig",
    plugins = { { type = "prefix-cache-scorer" }, { type = "queue-scorer" },
      { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "prefix-cache-scorer", weight = 3 }, { pluginRef = "queue-scorer" },
      { pluginRef = "max-score-picker" } } } },
    endpoints = P.sim_endpoints(sim),
    gateway = { refreshIntervalMs = 20, explainWithoutToken = 1 },
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local function complete(gw, prompt, extra)
  return P.post(gw.base, "/v1/completions", { model = MODEL, prompt = prompt, max_tokens = 2 },
    extra)
end

local worker_counts = P.worker_requests

describe("lupin serve --workers", function()
  local sim, gw
  before_each(function()
    sim = P.sim("--instant", 4)
  end)
  after_each(function()
    P.stop(gw)
    P.stop(sim)
    gw = nil
  end)

  it("spreads connections over every worker, and /metrics sums what they answered", function()
    gw = P.gateway(config(sim), "--workers 3")
    for i = 1, 60 do
      local status = complete(gw, "spread " .. i)
      assert.equal(200, status)
    end
    local counts, text = worker_counts(gw)
    local total = 0
    for w = 0, 2 do
      assert.is_true((counts[w] or 0) > 0, "worker " .. w .. " answered nothing:\n" .. text)
      total = total + counts[w]
    end
    assert.equal(60, total)
    -- the families every worker counts are one sum (no per-worker duplicates)
    assert.equal(60, P.metric(gw, 'lupin_requests_total{status="200"}'))
    local _, seen = text:gsub("\n# TYPE lupin_requests_total ", "")
    assert.equal(1, seen)
  end)

  it("scores a prefix another worker recorded: one prefix index for the process", function()
    gw = P.gateway(config(sim), "--workers 2")
    local prompt = ("You are a careful assistant. "):rep(40) .. "Question: what is lupin?"
    local picks = {}
    for i = 1, 25 do
      local status, headers = complete(gw, prompt, "-H 'x-lupin-explain: 1'")
      assert.equal(200, status)
      picks[i] = (headers["x-lupin-explain"] or ""):match("picks=([^,;]+)")
      assert.truthy(picks[i], headers["x-lupin-explain"])
    end
    local workers, eps = {}, {}
    for i = 2, 25 do
      eps[picks[i]] = true
    end
    -- every request after the first went where the first one's blocks are,
    -- whichever worker scheduled it
    local n = 0
    for _ in pairs(eps) do
      n = n + 1
    end
    assert.equal(1, n, json.encode(eps))
    local counts = worker_counts(gw)
    for w = 0, 1 do
      workers[w] = counts[w] or 0
      assert.is_true(workers[w] > 0, "worker " .. w .. " scheduled none of the 25")
    end
  end)

  it("reloads every worker together, and a bad config on none", function()
    gw = P.gateway(config(sim), "--workers 2")
    local status, _, body = P.post(gw.admin, "/admin/reload", "")
    assert.equal(200, status, body)
    local _, _, text = P.get(gw.admin .. "/admin/generations")
    local g = json.decode(text)
    assert.equal(2, g.current)
    assert.equal(2, #g.workers)
    for i, w in ipairs(g.workers) do
      assert.equal(i - 1, w.worker)
      assert.equal(2, w.current)
    end
    local cfg = config(sim)
    cfg.plugins[2].type = "no-such-scorer"
    local f = assert(io.open(gw.config, "w"))
    f:write(json.encode(cfg))
    f:close()
    status, _, body = P.post(gw.admin, "/admin/reload", "")
    assert.equal(400, status)
    assert.matches("no%-such%-scorer", body)
    _, _, text = P.get(gw.admin .. "/admin/generations")
    g = json.decode(text)
    for _, w in ipairs(g.workers) do
      assert.equal(2, w.current)
    end
    for i = 1, 10 do
      assert.equal(200, (complete(gw, "still serving " .. i)))
    end
  end)

  it("fails a reload on every worker when one worker's build fails, naming it", function()
    -- a plugin whose fourth init fails: workers 0 and 1 start (1, 2), a
    -- reload stages on worker 0 (3) and then on worker 1 (4)
    local dir = require("support").tmpdir()
    require("support").write(dir .. "/fourth-init-fails.lua", [[
      local inits = require("lupin.shared").dict("fourth-init")
      return { type = "fourth-init-fails",
        init = function() assert(inits:incr("n", 1, 0) ~= 4, "the fourth init fails") end,
        shutdown = function() inits:incr("shutdowns", 1, 0) end,
        score = function(_, _, eps) local s = {} for i = 1, #eps do s[i] = 1 end return s end }]])
    local cfg = config(sim)
    cfg.pluginDirs = { dir }
    table.insert(cfg.plugins, 1, { type = "fourth-init-fails" })
    table.insert(cfg.schedulingProfiles[1].plugins, 1, { pluginRef = "fourth-init-fails" })
    gw = P.gateway(cfg, "--workers 2")
    local status, _, body = P.post(gw.admin, "/admin/reload", "")
    assert.equal(400, status, body)
    assert.matches("worker 1: .*the fourth init fails", body)
    local _, _, text = P.get(gw.admin .. "/admin/generations")
    for _, w in ipairs(json.decode(text).workers) do
      assert.equal(1, w.current)
      assert.equal(1, #w.generations)
    end
    assert.equal(1, P.metric(gw, 'lupin_reloads_total{result="error"}'))
    for i = 1, 10 do
      assert.equal(200, (complete(gw, "after the failed reload " .. i)))
    end
    -- the next reload (inits 5 and 6) goes through on both
    status, _, body = P.post(gw.admin, "/admin/reload", "")
    assert.equal(200, status, body)
    os.execute("rm -rf " .. dir)
  end)

  it("drains every worker on SIGTERM: requests in flight finish, then the process exits 0", function()
    local slow = P.sim("--itl-ms 40", 2)
    gw = P.gateway(config(slow), "--workers 2")
    -- 80 tokens, ~3 s: all six are still streaming when the last curl has
    -- started, however slowly (a loaded machine, a sanitizer build)
    local outs = {}
    for i = 1, 6 do
      outs[i] = P.start(("curl -sS -N %s/v1/completions -H 'content-type: application/json' "
        .. "-d '{\"model\":\"%s\",\"prompt\":\"drain %d\",\"max_tokens\":80,\"stream\":true}'")
        :format(gw.base, MODEL, i))
    end
    P.poll(function()
      local _, _, text = P.get(gw.admin .. "/admin/requests")
      return #json.decode(text).requests == 6
    end, "six requests in flight")
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
    for i = 1, 6 do
      assert.equal(0, P.wait(outs[i]))
      assert.matches("%[DONE%]", P.read(outs[i].out))
    end
    P.stop(slow)
  end)

  it("gives plugins one lupin.shared dict across workers: no count is lost or repeated", function()
    local up = P.upstream()
    local cfg = {
      kind = "EndpointPickerConfig",
      pluginDirs = { require("support").FIXTURES },
      plugins = { { type = "spec-model-counter" }, { type = "random-picker" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "random-picker" } } } },
      endpoints = { { name = "up", address = "127.0.0.1", port = up.port } },
    }
    gw = P.gateway(cfg, "--workers 2")
    -- ten at a time, each on its own connection: sent one after another,
    -- every connection may go to whichever worker wakes first (under TSan
    -- and a loaded machine, all 30 to one)
    local seen = {}
    for wave = 1, 3 do
      local sent = {}
      for i = 1, 10 do
        sent[i] = P.send(gw, ("count-%d-%d"):format(wave, i))
      end
      for i = 1, 10 do
        local status, body = P.result(sent[i])
        assert.equal(200, status, body)
        local n = tonumber(json.decode(body).received["x-model-requests"])
        assert.is_nil(seen[n], "count " .. tostring(n) .. " twice")
        seen[n] = true
      end
    end
    for n = 1, 30 do
      assert.is_true(seen[n], "count " .. n .. " missing")
    end
    local counts = worker_counts(gw)
    assert.is_true((counts[0] or 0) > 0 and (counts[1] or 0) > 0, json.encode(counts))
    P.stop(up)
  end)

  it("refuses a worker count it cannot run, naming the flag", function()
    local p = P.start(("%s serve --config /dev/null --workers 0"):format(P.LUPIN))
    assert.is_not.equal(0, P.wait(p))
    assert.matches("%-%-workers", P.read(p.err) or "")
  end)
end)
