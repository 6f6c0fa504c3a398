-- Flow control through the real gateway and lupin-sim: a saturated pool
-- holds requests on their connections and releases them as it frees, by
-- fairness; a request that waits too long, a full queue, a client that
-- leaves and a drain each get their answer.  One endpoint that takes one
-- request at a time (concurrency-detector) makes "saturated" exact.
local P = require "e2e.procs"
local json = P.json

local SLOW = "--model m --itl-ms 100 --default-max-tokens 8 --seed 1" -- ~0.8 s a request
-- ~3 s at the endpoint: the request that saturates it runs while the others
-- are sent and queue behind it, however slowly curl starts (a loaded
-- machine, a sanitizer build: at 0.8 s a late curl found the endpoint free)
local HOLD = { max_tokens = 30 }
local DROPPED = "x-llm-d-request-dropped-reason" -- llm-d's, on every drop

local function config(sim, fc, extra)
  local cfg = {
    plugins = { { type = "queue-scorer" }, { type = "max-score-picker" },
      { type = "concurrency-detector", parameters = { maxConcurrency = 1 } },
      { type = "round-robin-fairness-policy" } },
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

local function flows(gw)
  local code, _, body, rc = P.get(gw.admin .. "/admin/flows")
  local ok, v = pcall(json.decode, body)
  if not ok then -- what curl saw and what the gateway said, for a failure in CI
    error(("GET /admin/flows: status %s, curl exit %s, body %q; the gateway's stderr:\n%s")
      :format(code, tostring(rc), body, P.read(gw.err) or ""), 2)
  end
  return v
end

-- Polls /admin/flows until band priority holds n requests waiting.
local function until_queued(gw, n, priority)
  return P.poll(function()
    for _, b in ipairs(flows(gw).bands) do
      if b.priority == (priority or 0) and b.queued == n then
        return b
      end
    end
  end, n .. " queued")
end

describe("flow control through lupin serve", function()
  local sim
  setup(function()
    sim = P.sim(SLOW, 1)
  end)
  teardown(function()
    P.stop(sim)
  end)

  it("holds a request while the endpoint is busy and sends it when it frees", function()
    local gw = P.gateway(config(sim))
    local a = P.send(gw, "a", HOLD)
    P.until_running(gw, "a")
    local b = P.send(gw, "b")
    local band = until_queued(gw, 1)
    assert.equal("global-strict-fairness-policy", band.fairness)
    assert.equal("fcfs-ordering-policy", band.ordering)
    assert.is_true(flows(gw).saturated)
    assert.equal(200, (P.result(a)))
    local code, body, headers = P.result(b)
    assert.equal(200, code, body)
    assert.is_nil(headers[DROPPED])
    assert.equal("a b", P.access_log_ids(gw, 2))
    assert.equal(1, P.metric(gw, 'lupin_flow_control_requests_total{priority="0",outcome="dispatched"}'))
    assert.equal(1, P.metric(gw,
      'inference_extension_flow_control_request_queue_duration_seconds_count{priority="0",outcome="dispatched"}'))
    assert.equal(0, P.metric(gw, 'inference_extension_flow_control_queue_size{priority="0"}'))
    P.stop(gw)
  end)

  it("answers 429 past the TTL, sheddable or not, with a message and reason", function()
    local gw = P.gateway(config(sim, { defaultRequestTTL = "100ms" }))
    local a = P.send(gw, "a", HOLD)
    P.until_running(gw, "a")
    local b = P.send(gw, "b")
    local s = P.send(gw, "s", { headers = { ["x-gateway-inference-objective"] = "-1" } })
    local code, body, headers = P.result(b)
    assert.equal(429, code) -- upstream's: the pool has endpoints, back off and retry
    local err = json.decode(body).error
    assert.matches("past its TTL of 0.1s", err.message, 1, true)
    assert.equal("rejected-ttl-expired", headers[DROPPED])
    code, body, headers = P.result(s)
    assert.equal(429, code)
    assert.matches("past its TTL", json.decode(body).error.message, 1, true)
    assert.equal("rejected-ttl-expired", headers[DROPPED])
    assert.equal(200, (P.result(a)))
    assert.equal(1, P.metric(gw, 'lupin_flow_control_requests_total{priority="0",outcome="queue_ttl"}'))
    assert.equal(1, P.metric(gw, 'lupin_flow_control_requests_total{priority="-1",outcome="queue_ttl"}'))
    assert.equal(2, P.metric(gw, 'lupin_request_outcomes_total{outcome="queue_ttl"}'))
    P.stop(gw)
  end)

  it("answers queue_full at once when the band is full", function()
    local gw = P.gateway(config(sim, { defaultPriorityBand = { maxRequests = 1 } }))
    local a = P.send(gw, "a", HOLD)
    P.until_running(gw, "a")
    local b = P.send(gw, "b")
    until_queued(gw, 1)
    local c = P.send(gw, "c")
    local code, body, headers = P.result(c)
    assert.equal(429, code)
    assert.matches("flow-control queue is full for priority 0", json.decode(body).error.message,
      1, true)
    assert.equal("rejected-saturated", headers[DROPPED])
    assert.equal(200, (P.result(a)))
    assert.equal(200, (P.result(b)))
    assert.equal(1, P.metric(gw, 'lupin_flow_control_requests_total{priority="0",outcome="queue_full"}'))
    P.stop(gw)
  end)

  -- Each worker holds its own queue and its own sent requests, and a
  -- connection lands on either: these three run on one worker, where which
  -- request meets which is known (flow_workers_spec covers two).
  it("sheds the newest sheddable request for a higher one when the queue is full", function()
    local gw = P.gateway(config(sim, { maxRequests = 1 }), "--workers 1")
    local a = P.send(gw, "a", HOLD)
    P.until_running(gw, "a")
    local s = P.send(gw, "s", { headers = { ["x-llm-d-inference-objective"] = "-1" } })
    until_queued(gw, 1, -1)
    local b = P.send(gw, "b")
    local code, body, headers = P.result(s)
    assert.equal(429, code)
    assert.matches("to make room for a request of priority 0", json.decode(body).error.message,
      1, true)
    assert.equal("rejected-saturated", headers[DROPPED])
    assert.equal(200, (P.result(a)))
    assert.equal(200, (P.result(b)))
    assert.equal(1, P.metric(gw, 'lupin_flow_control_requests_total{priority="-1",outcome="shed"}'))
    P.stop(gw)
  end)

  it("with enableEviction, stops a sent sheddable request for a higher one: 429, evicted", function()
    local gw = P.gateway(config(sim, { enableEviction = true }), "--workers 1")
    local low = P.send(gw, "low", { max_tokens = 30,
      headers = { ["x-llm-d-inference-objective"] = "-1" } })
    P.until_running(gw, "low")
    local high = P.send(gw, "high")
    local code, body, headers = P.result(low)
    assert.equal(429, code, body)
    assert.matches("evicted by flow control after it was sent", json.decode(body).error.message,
      1, true)
    assert.equal("evicted", headers[DROPPED])
    code, body = P.result(high)
    assert.equal(200, code, body)
    local rec = P.access_records(gw, "low")[1]
    assert.equal("evicted", rec.outcome)
    assert.equal(1, P.metric(gw, 'lupin_request_outcomes_total{outcome="evicted"}'))
    P.stop(gw)
  end)

  it("with enableEviction, cuts the stream of an evicted request already answering", function()
    local gw = P.gateway(config(sim, { enableEviction = true }), "--workers 1")
    local out = require("support").tmpdir() .. "/slow.out"
    local low = P.start(("curl -sS -N -o %s -H 'x-request-id: slow' -H 'content-type: application/json'"
      .. " -H 'x-llm-d-inference-objective: -1' -d %s %s"):format(out, P.quote(json.encode(
      { model = "m", prompt = "hello", max_tokens = 30, stream = true })),
      P.quote(gw.base .. "/v1/completions")))
    P.poll(function()
      return (P.read(out) or ""):find("data:", 1, true)
    end, "the stream under way")
    local high = P.send(gw, "high")
    assert.not_equal(0, P.wait(low)) -- cut short: curl reports the transfer incomplete
    assert.is_nil((P.read(out) or ""):find("[DONE]", 1, true))
    assert.equal(200, (P.result(high)))
    local rec = P.access_records(gw, "slow")[1]
    assert.equal("evicted", rec.outcome)
    assert.equal(200, rec.status)
    P.stop(gw)
  end)

  -- upstream's distinction: a queue refusing in a pool with no endpoints is
  -- "no-endpoints", not the TTL's or saturation's
  it("names no endpoints as the reason when the pool has none", function()
    local cfg = config(sim, { defaultRequestTTL = "100ms" })
    cfg.endpoints = json.empty_array
    local gw = P.gateway(cfg)
    local code, body, headers = P.result(P.send(gw, "empty"))
    assert.equal(503, code)
    assert.matches("past its TTL", json.decode(body).error.message, 1, true)
    assert.equal("rejected-no-endpoints", headers[DROPPED])
    P.stop(gw)
  end)

  -- Arrival order holds across workers (the worker holding the band's oldest
  -- request sends next); round-robin's turns are each worker's own
  -- (docs/flow-control.md, "With several workers"): that case runs on one.
  it("serves tenants in turn with round-robin, in arrival order without it", function()
    for _, case in ipairs({ { "round-robin-fairness-policy", "first a1 b1 a2 a3", "--workers 1" },
      { "global-strict-fairness-policy", "first a1 a2 a3 b1" } }) do
      local gw = P.gateway(config(sim, { defaultPriorityBand = { fairnessPolicyRef = case[1] } }),
        case[3])
      local procs = { P.send(gw, "first", HOLD) }
      P.until_running(gw, "first")
      for i, id in ipairs({ "a1", "a2", "a3", "b1" }) do
        procs[#procs + 1] = P.send(gw, id,
          { headers = { ["x-gateway-inference-fairness-id"] = id:sub(1, 1) } })
        until_queued(gw, i)
      end
      local f = flows(gw).bands[1].flows
      assert.same({ { id = "a", queued = 3 }, { id = "b", queued = 1 } },
        { { id = f[1].id, queued = f[1].queued }, { id = f[2].id, queued = f[2].queued } })
      for _, p in ipairs(procs) do
        assert.equal(200, (P.result(p)))
      end
      assert.equal(case[2], P.access_log_ids(gw, #procs), case[1])
      P.stop(gw)
    end
  end)

  it("serves the higher band first", function()
    local gw = P.gateway(config(sim, {}, { objectives = { { name = "gold", priority = 5 } } }))
    local procs = { P.send(gw, "first", HOLD) }
    P.until_running(gw, "first")
    procs[#procs + 1] = P.send(gw, "plain")
    until_queued(gw, 1)
    procs[#procs + 1] = P.send(gw, "gold",
      { headers = { ["x-gateway-inference-objective"] = "gold" } })
    until_queued(gw, 1, 5)
    for _, p in ipairs(procs) do
      assert.equal(200, (P.result(p)))
    end
    assert.equal("first gold plain", P.access_log_ids(gw, 3))
    P.stop(gw)
  end)

  it("drops a queued request whose client leaves, at once", function()
    local gw = P.gateway(config(sim))
    local a = P.send(gw, "a", HOLD)
    P.until_running(gw, "a")
    local b = P.send(gw, "b", { max_time = 0.3 })
    until_queued(gw, 1)
    assert.is_not.equal(200, (P.result(b))) -- curl gave up
    P.poll(function()
      local band = flows(gw).bands[1]
      return band.queued == 0 and band.evicted.cancelled == 1
    end, "the queue to drop b")
    assert.equal(200, (P.result(a)))
    assert.matches('"id":"b".-"status":499.-"outcome":"cancelled"', P.read(gw.out))
    P.stop(gw)
  end)

  it("answers the queue 503 on SIGTERM and finishes what runs", function()
    local gw = P.gateway(config(sim))
    local a = P.send(gw, "a", HOLD)
    P.until_running(gw, "a")
    local b = P.send(gw, "b")
    until_queued(gw, 1)
    P.signal(gw, "TERM")
    local code, body, headers = P.result(b)
    assert.equal(503, code)
    assert.matches("shutting down", json.decode(body).error.message, 1, true)
    assert.equal("rejected-shutting-down", headers[DROPPED])
    assert.equal(200, (P.result(a)))
    assert.equal(0, P.wait(gw))
  end)

  it("reports flow control off at /admin/flows without the section", function()
    local cfg = config(sim)
    cfg.flowControl, cfg.saturationDetector = nil, nil
    local gw = P.gateway(cfg)
    assert.same({ enabled = false, bands = {} }, flows(gw))
    local _, _, text = P.get(gw.admin .. "/metrics")
    assert.is_nil(text:find("flow_control", 1, true))
    P.stop(gw)
  end)
end)
