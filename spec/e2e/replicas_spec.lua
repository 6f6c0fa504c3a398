-- Replicas of lupin serve sharing their prefix indexes through Redis (issue
-- 17, docs/replicas.md): a real redis-server with no persistence on a free
-- loopback port, lupin-sim, two or three `lupin serve` on loopback.  Which
-- endpoint a request went to, and what the prefix scorer gave it, are read
-- from the x-lupin-explain header.
local P = require "e2e.procs"
local json = P.json

local MODEL = "meta-llama/Llama-3.1-8B-Instruct"

-- redis-server on a random free port (a taken port makes it exit: another
-- is tried).  Returns the process with its port.
local function redis(port)
  for _ = 1, 10 do
    local p_ = port or P.port()
    local p = P.start(("redis-server --port %d --bind 127.0.0.1 --save '' --appendonly no"):format(
      p_))
    local up = P.poll(function()
      if (P.read(p.out) or ""):find("Ready to accept connections", 1, true) then
        return "up"
      end
      return P.read(p.rc) and "failed"
    end, "redis-server to listen")
    if up == "up" then
      p.port = p_
      return p
    end
    assert(not port, "redis-server did not start again on its port: " .. (P.read(p.out) or ""))
  end
  error("redis-server did not start")
end

local function redis_cli(r, args)
  return P.run(("redis-cli -p %d %s"):format(r.port, args))
end

-- Only the prefix scorer: its score is the whole total, so a total above 0
-- means the index holds the prompt's blocks for that endpoint.
local function config(sim, r, extra)
  local eps = P.sim_endpoints(sim)
  local cfg = {
    kind = "EndpointPickerConfig",
    plugins = { { type = "prefix-cache-scorer" }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "prefix-cache-scorer" }, { pluginRef = "max-score-picker" } } } },
    endpoints = eps,
    gateway = { refreshIntervalMs = 20, explainWithoutToken = 1 },
    replicas = r and { enabled = 1, address = "127.0.0.1:" .. r.port, batchIntervalMs = 2,
      timeoutMs = 300 } or nil,
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local function prompt(i)
  return ("You are a careful assistant, conversation %d. "):format(i):rep(30) .. "Question?"
end

-- The pick and its total (the prefix score) of one request.
local function ask(gw, text)
  local status, headers = P.post(gw.base, "/v1/completions",
    { model = MODEL, prompt = text, max_tokens = 2 }, "-H 'x-lupin-explain: 1'")
  local h = headers["x-lupin-explain"] or ""
  local pick = h:match("picks=([^,;]+)")
  local total = pick and tonumber(h:match("totals=[^;]*" .. pick:gsub("%-", "%%-") .. ":([%d.]+)"))
  return status, pick, total, h
end

local function view(gw)
  local status, _, body = P.get(gw.admin .. "/admin/replicas")
  assert.equal(200, status, body)
  return json.decode(body)
end

local function wait_view(gw, what, fn)
  return P.poll(function()
    local v = view(gw)
    return fn(v) and v
  end, what)
end

describe("replicas sharing prefix indexes through Redis", function()
  local sim, r, gws

  before_each(function()
    sim = P.sim("--instant", 4)
    r = redis()
    gws = {}
  end)

  after_each(function()
    for _, g in pairs(gws) do
      P.stop(g)
    end
    P.stop(sim)
    P.stop(r)
  end)

  local function replica(extra_cfg, args)
    local g = P.gateway(config(sim, r, extra_cfg), args)
    gws[#gws + 1] = g
    wait_view(g, "the replica to connect and catch up", function(v)
      return v.connected and v.caught_up
    end)
    return g
  end

  -- prompts recorded through a, by the endpoint a picked
  local function record(a, from, to)
    local picks = {}
    for i = from, to do
      local status, pick = ask(a, prompt(i))
      assert.equal(200, status)
      picks[i] = pick
    end
    return picks
  end

  local function scores_all(b, picks, from, to)
    for i = from, to do
      local status, pick, total, h = ask(b, prompt(i))
      assert.equal(200, status)
      assert.equal(picks[i], pick, h)
      assert.is_true(total > 0, "no prefix score on the other replica: " .. h)
    end
  end

  it("scores on replica B a prefix recorded through replica A", function()
    local a, b = replica(), replica(nil, "--workers 2")
    local picks = record(a, 1, 5)
    -- the bound: B applied A's five records (P.poll gives up after 15 s)
    wait_view(b, "B to apply A's records", function(v) return v.applied >= 5 end)
    scores_all(b, picks, 1, 5)
    local va = view(a)
    assert.is_true(va.published >= 5 and va.skipped_own >= 1 and va.bad == 0, json.encode(va))
    assert.equal(1, P.metric(b, "lupin_replica_sync_connected"))
    assert.is_true(P.metric(a, "lupin_replica_sync_published_total") >= 5)
    assert.is_true(P.metric(b, "lupin_replica_sync_lag_seconds") > 0)
    -- the exposition stays valid with the replica families in it
    local _, _, text = P.get(b.admin .. "/metrics")
    local err = P.promtool(text)
    assert(err == nil, err)
  end)

  it("does not share without the section: the control", function()
    local a = P.gateway(config(sim, nil))
    local b = P.gateway(config(sim, nil))
    gws = { a, b }
    record(a, 1, 3)
    for i = 1, 3 do
      local _, _, total, h = ask(b, prompt(i))
      assert.equal(0, total, h)
    end
    local v = view(b)
    assert.is_false(v.enabled)
  end)

  it("keeps serving while Redis is down, then reconnects and syncs again", function()
    local a, b = replica(), replica()
    local port = r.port
    P.signal(r, "KILL")
    P.wait(r)
    for i = 1, 20 do
      local status = ask(a, prompt(100 + i))
      assert.equal(200, status, "a request failed while Redis was down")
    end
    wait_view(a, "A to see Redis gone", function(v) return not v.connected end)
    assert.equal(0, P.metric(a, "lupin_replica_sync_connected"))
    assert.truthy((P.read(a.err) or ""):find("replicas: Redis at", 1, true))
    r = redis(port)
    wait_view(a, "A to reconnect", function(v) return v.connected end)
    wait_view(b, "B to reconnect", function(v) return v.connected end)
    local applied = view(b).applied
    local picks = record(a, 200, 202)
    wait_view(b, "B to apply A's records after the restart", function(v)
      return v.applied >= applied + 3
    end)
    scores_all(b, picks, 200, 202)
    -- every request answered 200, none failed
    assert.equal(23, P.metric(a, 'lupin_requests_total{status="200"}'))
    local _, _, text = P.get(a.admin .. "/metrics")
    assert.is_nil(text:match('lupin_requests_total{status="[^2]'), text)
  end)

  it("lets a restarted replica catch up from the stream", function()
    local a = replica()
    local picks = record(a, 1, 4)
    wait_view(a, "A to publish", function(v) return v.published >= 4 and v.pending == 0 end)
    local c = replica() -- a new process: reads the retained stream first
    local v = view(c)
    assert.is_true(v.applied >= 4, json.encode(v))
    scores_all(c, picks, 1, 4)
  end)

  it("counts and skips garbage and other versions on the stream", function()
    local a = replica()
    assert.equal(0, select(2, redis_cli(r, "XADD lupin:prefix '*' v 2 r someone t 0 b x")))
    assert.equal(0, select(2, redis_cli(r, "XADD lupin:prefix '*' v 1 r someone t 0 b garbage")))
    assert.equal(0, select(2, redis_cli(r, "XADD lupin:prefix '*' hello world")))
    wait_view(a, "A to skip three bad entries", function(v) return v.bad >= 3 end)
    assert.equal(3, P.metric(a, "lupin_replica_sync_bad_total"))
    local status = ask(a, prompt(1))
    assert.equal(200, status)
    assert.is_true(view(a).connected)
  end)

  it("names file, line and field of a bad replicas section; --redis too", function()
    local path = P.dir .. "/bad-replicas.json"
    local cfg = config(sim, r)
    cfg.replicas.address = "nowhere"
    require("support").write(path, json.encode(cfg))
    local out, rc = P.run(P.LUPIN .. " check --config " .. P.quote(path) .. " 2>&1")
    assert.equal(1, rc, out)
    assert.truthy(out:find('bad-replicas.json:1: replicas.address: address must be HOST:PORT, '
      .. 'got "nowhere"', 1, true), out)
    cfg.replicas.address, cfg.replicas.batchIntervalMs = "127.0.0.1:6379", 0
    require("support").write(path, json.encode(cfg))
    out, rc = P.run(P.LUPIN .. " check --config " .. P.quote(path) .. " 2>&1")
    assert.equal(1, rc, out)
    assert.truthy(out:find("replicas.batchIntervalMs: batchIntervalMs must be an integer ≥ 1",
      1, true), out)
    cfg.replicas = nil
    require("support").write(path, json.encode(cfg))
    out, rc = P.run(P.LUPIN .. " serve --config " .. P.quote(path)
      .. " --listen 127.0.0.1:0 --admin 127.0.0.1:0 --redis 127.0.0.1:99999 2>&1")
    assert.equal(1, rc, out)
    assert.truthy(out:find("--redis: the Redis address must be HOST:PORT with a port from 1 to "
      .. '65535, got "127.0.0.1:99999"', 1, true), out)
  end)

  it("drains and exits 0 with the sync on, Redis up or gone", function()
    local a = replica(nil, "--workers 2")
    record(a, 1, 2)
    P.signal(a, "TERM")
    assert.equal(0, P.wait(a), P.read(a.err))
    local b = replica()
    P.signal(r, "KILL")
    P.wait(r)
    wait_view(b, "B to see Redis gone", function(v) return not v.connected end)
    P.signal(b, "TERM")
    assert.equal(0, P.wait(b), P.read(b.err))
  end)

  it("turns on with --redis alone", function()
    local g = P.gateway(config(sim, nil), "--redis 127.0.0.1:" .. r.port)
    gws[1] = g
    local v = wait_view(g, "the replica to connect", function(x) return x.connected end)
    assert.equal("127.0.0.1:" .. r.port, v.address)
  end)
end)
