-- lupin serve when endpoints fail: nothing is sent twice unless provably
-- safe or allowed, failed attempts go to the next ranked endpoint, failing
-- endpoints are ejected and come back, and odd upstream answers (1xx,
-- invalid statuses, 204 with a body) are handled.  The real binaries:
-- lupin serve, lupin-sim, and the fixture server where exact bytes matter.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local SIM = "--model m --itl-ms 1 --seed 7"

-- health checks off unless a spec turns them on: ejections driven by
-- scrapes would otherwise race what a spec looks at
local QUIET = { consecutiveErrors = 0, staleEjectionMs = 0 }

local function merge(a, b)
  local c = {}
  for k, v in pairs(a or {}) do
    c[k] = v
  end
  for k, v in pairs(b or {}) do
    c[k] = v
  end
  return c
end

local function ep(name, port)
  return { name = name, address = "127.0.0.1", port = port }
end

-- the default picker's parameters (EPP: maxNumOfEndpoints 1): one pick
local function config(endpoints, gateway, plugins)
  return {
    plugins = plugins or { { type = "queue-scorer" }, { type = "max-score-picker" } },
    endpoints = endpoints,
    gateway = gateway,
    pluginDirs = { support.FIXTURES },
  }
end

local function post(gw, text, id)
  return P.post(gw.base, "/v1/completions", { model = "m", prompt = text, max_tokens = 3 },
    "-H " .. P.quote("x-request-id: " .. id))
end

--- The access-log line of request id (stdout, one JSON object a line).
local function access(gw, id)
  return P.poll(function()
    for line in (P.read(gw.out) or ""):gmatch("[^\n]+") do
      if line:sub(1, 1) == "{" then
        local rec = json.decode(line)
        if rec.id == id then
          return rec
        end
      end
    end
  end, "the access-log line of " .. id)
end

local function posts(up)
  local _, _, body = P.get("http://" .. up.hostport .. "/stats")
  return json.decode(body).posts
end

local function endpoints(gw)
  local _, _, t = P.get(gw.admin .. "/admin/endpoints")
  local by = {}
  for _, e in ipairs(json.decode(t).endpoints) do
    by[e.name] = e
  end
  return by
end

describe("lupin serve: no silent replays", function()
  local up, gw, procs

  setup(function()
    up = P.upstream("--name A")
    procs = { up }
  end)

  teardown(function()
    for _, p in ipairs(procs) do
      P.stop(p)
    end
  end)

  local function gateway(settings)
    gw = P.gateway(config({ ep("a", up.port) }, merge(QUIET, settings)))
    procs[#procs + 1] = gw
    return gw
  end

  it("sends a request the endpoint closed without answering once, and says so", function()
    gateway()
    assert.equal(200, (post(gw, "warm up", "warm"))) -- a pooled connection to reuse
    local before = posts(up)
    local status, _, body = post(gw, "close", "once-1")
    assert.equal(1, posts(up) - before) -- the endpoint saw it once
    assert.equal(502, status)
    local msg = json.decode(body).error.message
    assert.truthy(msg:find("closed the connection without answering", 1, true), msg)
    assert.truthy(msg:find("retryNonIdempotent", 1, true), msg)
    local rec = access(gw, "once-1")
    assert.equal(1, #rec.attempts)
    assert.equal(up.hostport, rec.attempts[1].endpoint)
    assert.equal("closed_without_response", rec.attempts[1].reason)
    assert.equal("upstream_error", rec.outcome)
    assert.equal(1, P.metric(gw,
      'lupin_upstream_failures_total{endpoint="a",reason="closed_without_response"}'))
    assert.is_nil(P.metric(gw,
      'lupin_upstream_retries_total{endpoint="a",reason="closed_without_response"}'))
  end)

  it("replays it as often as retryNonIdempotent allows, visibly", function()
    gateway({ retryNonIdempotent = 2 })
    local before = posts(up)
    local status = post(gw, "close", "replay-1")
    assert.equal(502, status)
    assert.equal(3, posts(up) - before) -- the endpoint's count agrees with the gateway's
    local rec = access(gw, "replay-1")
    assert.equal(3, #rec.attempts)
    for _, a in ipairs(rec.attempts) do
      assert.equal("closed_without_response", a.reason)
      assert.is_number(a.ms)
    end
    assert.equal(2, P.metric(gw,
      'lupin_upstream_retries_total{endpoint="a",reason="closed_without_response"}'))
    local _, n = (P.read(gw.err) or ""):gsub("request replay%-1: attempt %d to [^\n]* sending it again", "")
    assert.equal(2, n)
  end)

  it("rejects settings out of range with the path", function()
    local path = P.dir .. "/bad-health.json"
    support.write(path, json.encode(config({ ep("a", 8000) }, { retryBudgetPercent = 101 })))
    local out, rc = P.run(P.LUPIN .. " check --config " .. path .. " 2>&1")
    assert.equal(1, rc)
    assert.truthy(out:find("gateway.retryBudgetPercent: retryBudgetPercent must be an integer ≤ 100",
      1, true), out)
  end)
end)

describe("lupin serve: odd upstream answers", function()
  local up, gw

  setup(function()
    up = P.upstream("--name A")
    gw = P.gateway(config({ ep("a", up.port) }, QUIET))
  end)

  teardown(function()
    P.stop(gw)
    P.stop(up)
  end)

  it("skips 100 Continue: the client gets the final 200", function()
    local status, _, body = post(gw, "continue", "c-1")
    assert.equal(200, status)
    assert.equal("hi from A", json.decode(body).choices[1].text)
    assert.equal(200, (post(gw, "after", "c-2"))) -- the connection stays usable
  end)

  it("answers 502 for a status outside 100..599", function()
    local status, _, body = post(gw, "status999", "s-1")
    assert.equal(502, status)
    local msg = json.decode(body).error.message
    assert.truthy(msg:find("invalid HTTP status 999", 1, true), msg)
  end)

  it("answers 502 for 101 Switching Protocols", function()
    local status, _, body = post(gw, "switch", "s-2")
    assert.equal(502, status)
    assert.truthy(json.decode(body).error.message:find("switched protocols", 1, true))
  end)

  it("relays 204 without the body the endpoint sent", function()
    local status, h, body = post(gw, "nocontent", "n-1")
    assert.equal(204, status)
    assert.equal("", body)
    assert.is_nil(h["content-length"])
    assert.is_nil(h["transfer-encoding"])
    assert.equal(200, (post(gw, "after", "n-2")))
  end)
end)

describe("lupin serve: failover and endpoint health", function()
  local procs = {}

  after_each(function()
    for _, p in ipairs(procs) do
      P.stop(p)
    end
    procs = {}
  end)

  local function start(p)
    procs[#procs + 1] = p
    return p
  end

  it("retries a refused connect on the next ranked endpoint, with one pick", function()
    local sim = start(P.sim(SIM))
    -- a fixed scorer ranks the dead endpoint (port 1) first
    local gw = start(P.gateway(config({ ep("dead", 1), ep("live", sim.ports[1]) }, QUIET, {
      { type = "test-scorer", parameters = { byIndex = { 1, 0 }, record = false } },
      { type = "max-score-picker" } })))
    local status, h, body = post(gw, "hello", "f-1")
    assert.equal(200, status, body)
    assert.equal(sim.hostports[1], h["x-sim-endpoint"])
    local rec = access(gw, "f-1")
    assert.equal(2, #rec.attempts)
    assert.same({ "127.0.0.1:1", "connect_failed" }, { rec.attempts[1].endpoint, rec.attempts[1].reason })
    assert.same({ sim.hostports[1], 200 }, { rec.attempts[2].endpoint, rec.attempts[2].status })
    assert.equal(sim.hostports[1], rec.endpoint)
    assert.equal(1, P.metric(gw, 'lupin_upstream_retries_total{endpoint="dead",reason="connect_failed"}'))
  end)

  it("does not retry past the retry budget, and says so", function()
    local sim = start(P.sim(SIM))
    local gw = start(P.gateway(config({ ep("dead", 1), ep("live", sim.ports[1]) },
      merge(QUIET, { retryBudgetPercent = 0, retryBudgetMin = 0 }), {
      { type = "test-scorer", parameters = { byIndex = { 1, 0 }, record = false } },
      { type = "max-score-picker" } })))
    local status, _, body = post(gw, "hello", "b-1")
    assert.equal(502, status)
    assert.truthy(json.decode(body).error.message:find("retry budget", 1, true))
    assert.equal(1, P.metric(gw, "lupin_upstream_retries_denied_total"))
    assert.equal(1, #access(gw, "b-1").attempts)
  end)

  it("ejects an endpoint after consecutive 5xx answers", function()
    local up = start(P.upstream("--name A"))
    -- one worker: each worker counts its own consecutive errors (docs/workers.md)
    local gw = start(P.gateway(config({ ep("a", up.port) },
      { consecutiveErrors = 2, staleEjectionMs = 0 }), "--workers 1"))
    assert.equal(500, (post(gw, "fail500", "x-1")))
    assert.equal(500, (post(gw, "fail500", "x-2")))
    local e = endpoints(gw).a.health
    assert.equal("ejected", e.state)
    assert.truthy(e.last_error:find("answered 500", 1, true))
    assert.equal(2, P.metric(gw, 'lupin_upstream_failures_total{endpoint="a",reason="status_5xx"}'))
    local status, _, body = post(gw, "hello", "x-3")
    assert.equal(503, status)
    assert.truthy(json.decode(body).error.message:find("no healthy endpoint", 1, true))
  end)

  it("ejects a killed endpoint of four: no request fails, it gets none", function()
    local sims, list = {}, {}
    for i = 1, 4 do
      sims[i] = start(P.sim(SIM))
      list[i] = ep("e" .. i, sims[i].ports[1])
    end
    local gw = start(P.gateway(config(list)))
    P.poll(function()
      return (P.get(gw.admin .. "/readyz")) == 200
    end, "readiness")
    local function loop(n, tag)
      local served = {}
      for i = 1, n do
        local status, h, body = post(gw, "hello", tag .. i)
        assert.equal(200, status, body)
        served[h["x-sim-endpoint"]] = true
      end
      return served
    end
    loop(8, "before-")
    P.signal(sims[2], "KILL")
    P.wait(sims[2])
    loop(8, "during-")
    P.poll(function()
      return endpoints(gw).e2.health.state == "ejected"
    end, "e2's ejection")
    local served = loop(24, "after-")
    assert.is_nil(served[sims[2].hostports[1]])
    assert.equal(1, P.metric(gw, 'lupin_endpoint_ejections_total{endpoint="e2"}'))
    assert.equal(0, P.metric(gw, 'lupin_endpoint_healthy{endpoint="e2"}'))
    assert.equal(3, P.metric(gw, "lupin_endpoints_healthy"))
    assert.truthy((P.read(gw.err) or ""):find("%[warn%] endpoint e2 %(127%.0%.0%.1:%d+%) ejected for"))
  end)

  it("/readyz says 503 while every endpoint is down, 200 once one is back", function()
    local sim = start(P.sim(SIM))
    local port = sim.ports[1]
    local gw = start(P.gateway(config({ ep("only", port) },
      { baseEjectionTimeMs = 100, staleEjectionMs = 500, metricsStalenessMs = 500 })))
    local function ready()
      return (P.get(gw.admin .. "/readyz"))
    end
    P.poll(function()
      return ready() == 200
    end, "readiness")
    P.signal(sim, "KILL")
    P.wait(sim)
    P.poll(function()
      return ready() == 503
    end, "/readyz 503")
    local status, _, body = post(gw, "hello", "down-1")
    assert.equal(503, status)
    assert.truthy(json.decode(body).error.message:find("no healthy endpoint", 1, true))
    assert.truthy((P.read(gw.err) or ""):find("[warn] no healthy endpoint", 1, true))
    start(P.start(("%s --port %d --endpoints 1 %s"):format(P.SIM, port, SIM)))
    P.poll(function()
      return ready() == 200
    end, "/readyz 200 again")
    assert.equal(200, (post(gw, "hello", "up-1")))
    assert.truthy((P.read(gw.err) or ""):find("[warn] recovered: 1 of 1 endpoints healthy", 1, true))
    assert.equal("healthy", endpoints(gw).only.health.state)
  end)

  it("collects ended requests' state once idle: live_request_tables drops to 0", function()
    local sim = start(P.sim(SIM))
    local gw = start(P.gateway(config({ ep("a", sim.ports[1]) }, QUIET)))
    for i = 1, 5 do
      assert.equal(200, (post(gw, "hello", "gc-" .. i)))
    end
    -- nothing may run Lua meanwhile (reading /metrics does): the gateway
    -- collects within a second of going idle
    os.execute("sleep 2.5")
    assert.equal(0, P.metric(gw, "lupin_live_request_tables"))
    assert.equal(0, P.metric(gw, "lupin_live_requests"))
  end)
end)
