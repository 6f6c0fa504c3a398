-- predicted-latency-producer against lupin-sim's known latency model
-- (examples/simulator/README.md, "Timing"): TTFT = (overhead + uncached
-- tokens × per-token) × slowness, a decode step = itl × slowness.  Endpoint
-- 1 runs 3 times slower.  The spec trains the predictor with real streamed
-- requests through lupin serve, reads its predictions in explain records
-- (POST /admin/explain decides without forwarding), and checks they follow
-- the model, then a change of an endpoint's speed at run time.  Nothing is
-- timed: the assertions are relations with wide margins.
local P = require "e2e.procs"
local json = P.json

local MODEL = "m"
local OVERHEAD_MS, PER_TOKEN_MS, ITL_MS, SLOW = 10, 0.4, 6, 3

-- A prompt of n tokens (4 characters each, as lupin-sim and lupin count),
-- unique per seed so nothing is cached.
local function prompt(n, seed)
  local words = {}
  for i = 1, n do
    words[i] = ("%03d "):format((seed * 7919 + i * 104729) % 1000)
  end
  return table.concat(words)
end

local function config(sim, params)
  local eps = {}
  for i, port in ipairs(sim.ports) do
    eps[i] = { name = "e" .. i, address = "127.0.0.1", port = port }
  end
  return {
    plugins = {
      { type = "predicted-latency-producer", parameters = params },
      { type = "latency-scorer" },
      { type = "max-score-picker" },
    },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "latency-scorer" }, { pluginRef = "max-score-picker" } } } },
    endpoints = eps,
  }
end

-- One streamed completion to endpoint `to` (its host:port).
local function send(gw, to, tokens, seed, headers)
  return P.post(gw.base, "/v1/completions",
    { model = MODEL, prompt = prompt(tokens, seed), max_tokens = 8, stream = true },
    ("--max-time 30 -H 'x-gateway-destination-endpoint-subset: %s' %s"):format(to,
      headers or ""))
end

-- The producer's published explain for a dry request of `tokens` tokens.
local function predicted(gw, tokens)
  local status, _, text = P.post(gw.admin, "/admin/explain",
    { model = MODEL, prompt = prompt(tokens, 999), max_tokens = 8, stream = true })
  assert.equal(200, status, text)
  for _, step in ipairs(json.decode(text).steps) do
    if step.plugin == "predicted-latency-producer" and step.point == "prepare" then
      return step.published.endpoints
    end
  end
  error("no prepare step of predicted-latency-producer: " .. text)
end

local function near(want, got, tolerance, what)
  assert(got and math.abs(got - want) <= tolerance * want,
    ("%s: predicted %s ms, the simulator's model says %.1f ms (±%d%%)"):format(what,
      tostring(got), want, tolerance * 100))
end

describe("predicted-latency-producer on lupin-sim", function()
  local sim, gw
  setup(function()
    sim = P.sim(("--model %s --seed 1 --prefill-serial --prefill-overhead-ms %d"
      .. " --prefill-ms-per-token %g --itl-ms %d --slow-endpoints 0 --slow-factor %d"):format(
      MODEL, OVERHEAD_MS, PER_TOKEN_MS, ITL_MS, SLOW), 2)
    gw = P.gateway(config(sim, { streamingMode = true, minSamples = 8, halfLifeSeconds = 4 }))
  end)
  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("predicts nothing while cold: the scorer falls back, explain says why", function()
    local eps = predicted(gw, 200)
    assert.equal("none (cold: fallback)", eps.e1.ttft.from)
    assert.equal("none (cold: fallback)", eps.e2.tpot.from)
    assert.equal(0, eps.e1.ttft.group_samples)
  end)

  it("answers a bad objective header with a 400 naming it, and keeps serving", function()
    local status, _, text = send(gw, sim.hostports[2], 10, 1, "-H 'x-llm-d-slo-ttft-ms: soon'")
    assert.equal(400, status)
    assert.matches("x-llm-d-slo-ttft-ms", json.decode(text).error.message, 1, true)
    assert.equal(200, (send(gw, sim.hostports[2], 10, 2)))
  end)

  it("converges on each endpoint's TTFT and TPOT, then follows a change of speed", function()
    local sizes = { 40, 400, 120, 300, 80, 500, 200, 60, 350, 250 }
    for round = 1, 3 do
      for i, n in ipairs(sizes) do
        for e = 1, 2 do
          assert.equal(200, (send(gw, sim.hostports[e], n, round * 100 + i * 2 + e)))
        end
      end
    end
    local eps = predicted(gw, 300)
    local fast = OVERHEAD_MS + 300 * PER_TOKEN_MS
    near(fast * SLOW, eps.e1.ttft.ms, 0.35, "slow endpoint's TTFT")
    near(fast, eps.e2.ttft.ms, 0.35, "fast endpoint's TTFT")
    near(ITL_MS * SLOW, eps.e1.tpot.ms, 0.5, "slow endpoint's TPOT")
    near(ITL_MS, eps.e2.tpot.ms, 0.5, "fast endpoint's TPOT")
    assert.equal("endpoint", eps.e2.ttft.from) -- its own model, warm
    assert.is_true(eps.e2.ttft.samples >= 30)
    assert(eps.e2.ttft.error < 0.25, "the fast endpoint's TTFT model's error " .. eps.e2.ttft.error)
    assert.equal(0.3, eps.e2.features.input_ktokens) -- the features explain shows
    assert.equal(0.3, eps.e2.features.uncached_ktokens)

    -- the fast endpoint becomes as slow as the other: its model follows
    local before = eps.e2.ttft.ms
    assert.equal(200, (P.post("http://" .. sim.hostports[2], "/sim/speed?factor=" .. SLOW, "")))
    for round = 1, 4 do
      for i, n in ipairs(sizes) do
        assert.equal(200, (send(gw, sim.hostports[2], n, 1000 + round * 100 + i)))
      end
    end
    local after = predicted(gw, 300).e2.ttft.ms -- the simulator's: 3x before
    assert(after > 1.8 * before, ("TTFT predicted %.1f ms before the change, %.1f after"):format(
      before, after))
  end)

  it("publishes the error of the predictions it used on /metrics", function()
    -- the error of the predictions used: the group's cold start and the
    -- change of speed are in it, so only its presence is a fact here
    local err = P.metric(gw, 'lupin_latency_prediction_error_ratio{plugin="predicted-latency-producer",'
      .. 'target="ttft",group="all"}')
    assert(err and err >= 0 and err < math.huge, "TTFT error ratio " .. tostring(err))
    local n = P.metric(gw, 'lupin_latency_model_samples_total{plugin="predicted-latency-producer",'
      .. 'target="ttft",group="all"}')
    assert.is_true(n >= 60)
  end)
end)
