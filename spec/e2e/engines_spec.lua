-- The data layer end to end: the real gateway in front of a lupin-sim that
-- serves one engine's metric names (--engine) reads that engine's waiting
-- queue, running requests and KV-cache usage (as /admin/endpoints shows),
-- and routes by them.  One case per preset (docs/metrics.md, "Engines").
local P = require "e2e.procs"
local json = P.json

-- Long requests: with one slot per endpoint, three sent straight to the
-- first endpoint leave it one running and two waiting for seconds.
local SIM = "--model m --max-num-seqs 1 --itl-ms 100 --default-max-tokens 200 --seed 3"

local function admin_endpoints(gw)
  local _, _, t = P.get(gw.admin .. "/admin/endpoints")
  local out = {}
  for _, e in ipairs(json.decode(t).endpoints) do
    out[e.name] = e
  end
  return out
end

-- lupin_sim_requests_total of one sim endpoint, from its own page.
local function served(hostport)
  local _, _, t = P.get("http://" .. hostport .. "/metrics")
  return tonumber(t:match('lupin_sim_requests_total{[^}]*} (%S+)'))
end

local function config(sim, extractor, labels)
  local eps = {}
  for i, hp in ipairs(sim.hostports) do
    eps[i] = { name = "e" .. i, address = "127.0.0.1", port = tonumber(hp:match(":(%d+)$")),
      labels = labels }
  end
  local plugins = { { type = "queue-scorer" }, { type = "kv-cache-utilization-scorer" },
    { type = "max-score-picker" } }
  if extractor then
    plugins[#plugins + 1] = { type = "metrics-data-source", parameters = { path = "/metrics" } }
    plugins[#plugins + 1] = { type = "core-metrics-extractor", parameters = extractor }
  end
  return { plugins = plugins, endpoints = eps,
    dataLayer = extractor and { sources = { { pluginRef = "metrics-data-source",
      extractors = { { pluginRef = "core-metrics-extractor" } } } } } or nil,
    gateway = { consecutiveErrors = 0, staleEjectionMs = 0, refreshIntervalMs = 20 } }
end

--- Loads e1 with three long requests, waits until the gateway sees them,
--- then sends short requests through the gateway: all go to e2.
local function check(engine, extractor, labels, want_kv)
  local sim = P.sim("--engine " .. engine .. " " .. SIM, 2)
  local gw = P.gateway(config(sim, extractor, labels))
  local load = {}
  finally(function()
    for _, p in ipairs(load) do
      P.stop(p)
    end
    P.stop(gw)
    P.stop(sim)
  end)
  for i = 1, 3 do
    load[i] = P.start(("curl -sS -o /dev/null -H 'content-type: application/json' -d %s %s")
      :format(P.quote(json.encode({ model = "m", prompt = ("warm %d "):format(i):rep(40) })),
        P.quote("http://" .. sim.hostports[1] .. "/v1/completions")))
  end
  local e1 = P.poll(function()
    local e = admin_endpoints(gw).e1
    return e and e.metrics.waiting_queue_size == 2 and e.metrics.running_requests == 1 and e
  end, engine .. ": the gateway to read e1's queue (2) and running (1)")
  if want_kv then
    assert.is_true(e1.metrics.kv_cache_usage > 0 and e1.metrics.kv_cache_usage <= 1,
      "KV-cache usage read: " .. tostring(e1.metrics.kv_cache_usage))
  else
    assert.equal(0, e1.metrics.kv_cache_usage)
  end
  local e2 = admin_endpoints(gw).e2
  assert.equal(0, e2.metrics.waiting_queue_size)
  assert.equal(0, e2.metrics.running_requests)
  assert.equal(0, e2.scrape_errors)
  local before1, before2 = served(sim.hostports[1]), served(sim.hostports[2])
  for _ = 1, 4 do
    local status = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi",
      max_tokens = 1 })
    assert.equal(200, status)
  end
  assert.equal(before1, served(sim.hostports[1]))
  assert.equal(before2 + 4, served(sim.hostports[2]))
  return e1
end

describe("engines (core-metrics-extractor presets)", function()
  it("vllm, with no data layer configured: today's names", function()
    local e1 = check("vllm", nil, nil, true)
    assert.equal(16, e1.metrics.cache_block_size)
    assert.equal(2048, e1.metrics.num_blocks)
  end)

  it("sglang, as the default engine", function()
    local e1 = check("sglang", { defaultEngine = "sglang" }, nil, true)
    assert.equal(16, e1.metrics.cache_block_size) -- sglang:page_size
    assert.equal(2048, e1.metrics.num_blocks) -- sglang:num_pages
  end)

  it("tgi, chosen by the endpoints' engine-type label (TGI publishes no KV usage)", function()
    check("tgi", {}, { ["llm-d.ai/engine-type"] = "tgi" }, false)
  end)

  it("triton-tensorrt-llm, label series selected by their labels", function()
    local e1 = check("triton", { defaultEngine = "triton-tensorrt-llm" }, nil, true)
    assert.equal(16, e1.metrics.cache_block_size) -- kv_cache_block_type="tokens_per"
    assert.equal(2048, e1.metrics.num_blocks) -- kv_cache_block_type="max"
  end)

  it("trtllm-serve, under a label key of the config's", function()
    check("trtllm-serve", { engineLabelKey = "engine" }, { engine = "trtllm-serve" }, true)
  end)

  it("a custom engine config replaces the names", function()
    check("tgi", { defaultEngine = "mine", engineConfigs = { { name = "mine",
      queuedRequestsSpec = "tgi_queue_size", runningRequestsSpec = "tgi_batch_current_size" } } },
      nil, false)
  end)

  it("reads nothing from a page of another engine, and says so", function()
    local sim = P.sim("--engine sglang --model m", 1)
    local gw = P.gateway(config(sim, { defaultEngine = "tgi" }))
    finally(function()
      P.stop(gw)
      P.stop(sim)
    end)
    local e = P.poll(function()
      local x = admin_endpoints(gw).e1
      return x and x.scrape_errors > 0 and x
    end, "a failed scrape")
    assert.equal(0, e.scrapes)
    assert.matches("no tgi metric in the answer", e.health.last_error, 1, true)
  end)
end)
