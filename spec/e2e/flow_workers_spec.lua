-- Flow control over lupin serve --workers 2 (docs/flow-control.md, "With
-- several workers"): each worker queues the requests of its own
-- connections, yet a band full anywhere is full everywhere and a higher
-- band waiting on one worker goes before a lower one on the other.  Every
-- curl is a new connection that either worker may accept; each case keeps
-- sending until a request has landed on the worker that does not hold the
-- queued one, so that what it shows is across workers.
local P = require "e2e.procs"
local json = P.json

-- one request at a time (concurrency-detector): 50 ms a token, 2 tokens
-- unless a request asks for more
local SIM = "--model m --itl-ms 50 --default-max-tokens 2 --seed 1"
local LONG = 80 -- tokens: ~4 s at the endpoint, while the others are sent

local function config(sim, fc, extra)
  local cfg = {
    plugins = { { type = "queue-scorer" }, { type = "max-score-picker" },
      { type = "concurrency-detector", parameters = { maxConcurrency = 1 } } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
    saturationDetector = { pluginRef = "concurrency-detector" },
    flowControl = fc or {},
    endpoints = { { name = "e1", address = "127.0.0.1", port = sim.ports[1] } },
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

-- The worker that holds request id (queued or running), once it shows.
local function worker_of(gw, id)
  return P.poll(function()
    local _, _, body = P.get(gw.admin .. "/admin/requests")
    for _, r in ipairs(json.decode(body).requests) do
      if r.id == id then
        return r.worker
      end
    end
  end, id .. " in /admin/requests")
end

local function band(gw, priority)
  local _, _, body = P.get(gw.admin .. "/admin/flows")
  for _, b in ipairs(json.decode(body).bands) do
    if b.priority == priority then
      return b
    end
  end
end

local function until_queued(gw, n, priority)
  return P.poll(function()
    local b = band(gw, priority or 0)
    return b and b.queued == n and b
  end, n .. " queued")
end

local answered = P.worker_requests

describe("flow control over two workers", function()
  local sim, gw
  setup(function()
    sim = P.sim(SIM, 1)
  end)
  teardown(function()
    P.stop(sim)
  end)
  after_each(function()
    P.stop(gw)
    gw = nil
  end)

  it("answers queue_full on either worker once the band is full on one", function()
    gw = P.gateway(config(sim, { defaultPriorityBand = { maxRequests = 1 } }), "--workers 2")
    local a = P.send(gw, "a", { max_tokens = LONG })
    P.until_running(gw, "a")
    local b = P.send(gw, "b")
    until_queued(gw, 1)
    local holder = worker_of(gw, "b")
    local other = 1 - holder
    -- a request answered by the worker whose own queue is empty proves the count is shared
    local tries, seen = 0, 0
    while seen == 0 and tries < 40 do
      tries = tries + 1
      local before = answered(gw)
      local c = P.send(gw, "c" .. tries)
      local code, body = P.result(c)
      assert.equal(429, code, body)
      assert.matches("flow-control queue is full for priority 0 (band: 1 requests", body, 1, true)
      local after = P.poll(function() -- counted as the exchange ends, maybe after curl is done
        local now = answered(gw)
        return (now[0] or 0) + (now[1] or 0) > (before[0] or 0) + (before[1] or 0) and now
      end, "c" .. tries .. " counted")
      seen = (after[other] or 0) - (before[other] or 0)
    end
    assert.equal(1, seen, "no request reached worker " .. other .. " in " .. tries .. " tries")
    local full = P.metric(gw, 'lupin_flow_control_requests_total{priority="0",outcome="queue_full"}')
    assert.equal(tries, full)
    assert.equal(tries, band(gw, 0).evicted.queue_full) -- /admin/flows sums the workers too
    assert.equal(200, (P.result(a)))
    assert.equal(200, (P.result(b)))
  end)

  it("sends a higher band waiting on one worker before a lower band on the other", function()
    gw = P.gateway(config(sim, {}, { objectives = { { name = "gold", priority = 5 } } }),
      "--workers 2")
    local a = P.send(gw, "a", { max_tokens = LONG })
    P.until_running(gw, "a")
    local plain = P.send(gw, "plain")
    until_queued(gw, 1)
    local holder = worker_of(gw, "plain")
    -- connections one after another go to worker 0 about three times in
    -- four (whichever worker wakes first accepts), more under TSan: up to 40
    local golds, ids, elsewhere = {}, {}, false
    while not elsewhere and #golds < 40 do
      local id = "gold" .. (#golds + 1)
      golds[#golds + 1] = P.send(gw, id,
        { headers = { ["x-gateway-inference-objective"] = "gold" } })
      ids[#ids + 1] = id
      until_queued(gw, #golds, 5)
      elsewhere = worker_of(gw, id) ~= holder
    end
    assert.is_true(elsewhere, "every gold request landed on worker " .. holder)
    assert.is_true(P.poll(function()
      local _, _, body = P.get(gw.admin .. "/admin/flows")
      return json.decode(body).saturated
    end, "saturated"))
    assert.equal(200, (P.result(a)))
    for _, p in ipairs(golds) do
      assert.equal(200, (P.result(p)))
    end
    assert.equal(200, (P.result(plain)))
    -- the gold band in arrival order, whichever worker held each, then plain
    assert.equal("a " .. table.concat(ids, " ") .. " plain", P.access_log_ids(gw, #ids + 2))
  end)
end)
