local K = require "plugins.kit"
local S = require "support"
local native = require "lupin_native"

local T = "bounded-load-picker"

-- A runtime whose one profile is: the header-based testing filter (the header
-- names the candidates, so a spec can force an endpoint), test-scorer with
-- the given scores by endpoint index, and the picker with the given params.
local function runtime(n, scores, params, metrics)
  local rt = S.loaded(K.config({
    { type = "header-based-testing-filter" },
    { type = "test-scorer", parameters = { byIndex = scores, record = false } },
    { type = T, parameters = params },
  }, { { pluginRef = "header-based-testing-filter" }, { pluginRef = "test-scorer" },
    { pluginRef = T } }), { plugin_dirs = { S.FIXTURES } })
  S.endpoints(rt, n, metrics)
  return rt
end

local function all(n)
  local names = {}
  for i = 1, n do
    names[i] = "ep" .. i
  end
  return table.concat(names, ",")
end

-- Begins and schedules one request among `targets`; returns the request (to
-- be finished) and the endpoints picked.
local function send(rt, targets, body)
  local req = assert(rt:begin({ path = "/v1/completions",
    body = body or '{"model":"m","prompt":"p"}',
    headers = { ["test-epp-endpoint-selection"] = targets } }))
  local res = req:schedule()
  assert.equal(200, res.status, res.reason)
  local names = {}
  for i, ep in ipairs(res.picks) do
    names[i] = ep.name
  end
  return req, names
end

local function inflight(rt) -- ep.in_flight: the core's counts, which the picker reads
  return S.in_flight(rt)
end

local function finish_all(held)
  for _, req in ipairs(held) do
    req:finish("ok")
  end
end

describe(T, function()
  it("spreads requests without affinity evenly over the endpoints, by requests in flight",
    function()
      local rt = runtime(4, { 0, 0, 0, 0 })
      local held = {}
      for i = 1, 12 do
        held[i] = send(rt, all(4))
      end
      assert.same({ ep1 = 3, ep2 = 3, ep3 = 3, ep4 = 3 }, inflight(rt))
      finish_all(held)
      assert.same({}, inflight(rt))
      rt:free()
    end)

  it("follows the best score while its load stays within the bound, then the next best",
    function()
      -- rel 0, abs 1: eligible while load + 1 ≤ (total + 1) / 4 + 1
      local rt = runtime(4, { 1, 0.5, 0, 0 }, { balanceRelThreshold = 0, balanceAbsThreshold = 1 })
      local held, order = {}, {}
      for i = 1, 4 do
        local req, picks = send(rt, all(4))
        held[i], order[i] = req, picks[1]
      end
      -- 1: bound 1.25, ep1 takes it; 2: bound 1.5, ep1 (2) is over, ep2 is next
      -- best; 3: bound 1.75, both over, the least loaded of ep3/ep4; 4: bound
      -- 2, ep1 again
      assert.equal("ep1", order[1])
      assert.equal("ep2", order[2])
      assert.truthy(order[3] == "ep3" or order[3] == "ep4", order[3])
      assert.equal("ep1", order[4])
      -- once ep1's requests end, it is the pick again
      held[1]:finish("ok")
      held[4]:finish("ok")
      local req, picks = send(rt, all(4))
      assert.equal("ep1", picks[1])
      req:finish("ok")
      finish_all({ held[2], held[3] })
      rt:free()
    end)

  -- ep2 holds 4 requests; unforced requests with affinity for ep1 go there
  -- until one does not: returns how many ep1 took.
  local function taken(params)
    local rt = runtime(2, { 1, 0 }, params)
    local held = {}
    for i = 1, 4 do
      held[i] = send(rt, "ep2")
    end
    local n = 0
    while true do
      local req, picks = send(rt, all(2))
      held[#held + 1] = req
      if picks[1] ~= "ep1" then
        break
      end
      n = n + 1
    end
    finish_all(held)
    rt:free()
    return n
  end

  it("balanceRelThreshold and balanceAbsThreshold set the bound over the mean", function()
    -- ep1 with k in flight is eligible while k + 1 ≤ (1 + rel) × (k + 5) / 2 + abs
    -- rel 0, abs 0: k ≤ 3, then once more at k = 4, where both are least loaded
    assert.equal(5, taken({ balanceRelThreshold = 0, balanceAbsThreshold = 0 }))
    assert.equal(6, taken({ balanceRelThreshold = 0, balanceAbsThreshold = 1 }))
    -- rel 1: the mean's bound never binds; maxLoadSpread (4) stops ep1 at 4 over ep2
    assert.equal(8, taken({ balanceRelThreshold = 1, balanceAbsThreshold = 0 }))
  end)

  it("maxLoadSpread caps the load over the least loaded endpoint", function()
    assert.equal(6, taken({ balanceRelThreshold = 1, maxLoadSpread = 2 }))
  end)

  it("at light load the spread is at most 1 + the mean: no pile-up beside an idle endpoint",
    function()
      local rt = runtime(4, { 1, 0, 0, 0 },
        { balanceRelThreshold = 100, balanceAbsThreshold = 100, maxLoadSpread = 100 })
      local held = {}
      for i = 1, 4 do
        held[i] = send(rt, all(4))
      end
      -- 1st: ep1 (1 ≤ 0 + 1.25); 2nd and 3rd: ep1 is over 0 + 1.5 and 0 + 1.75;
      -- 4th: ep1 again (2 ≤ 0 + 2)
      local c = inflight(rt)
      assert.equal(2, c.ep1)
      assert.equal(2, (c.ep2 or 0) + (c.ep3 or 0) + (c.ep4 or 0))
      finish_all(held)
      rt:free()
    end)

  it("the least loaded endpoint is always eligible, even with both thresholds 0", function()
    local rt = runtime(2, { 1, 0 }, { balanceRelThreshold = 0, balanceAbsThreshold = 0 })
    local held = {}
    for i = 1, 6 do
      held[i] = send(rt, all(2))
    end
    assert.same({ ep1 = 3, ep2 = 3 }, inflight(rt))
    finish_all(held)
    rt:free()
  end)

  it("counts scores at or below affinityThreshold as no affinity", function()
    for _, case in ipairs({ { threshold = 0, ep1 = true }, { threshold = 0.2, ep1 = false } }) do
      -- ep1 holds 3 requests, the others 2: ep1 is eligible (4 ≤ 1.25 × 2.5 + 2)
      local rt = runtime(4, { 0.2, 0, 0, 0 }, { affinityThreshold = case.threshold })
      local held = {}
      for i = 1, 4 do
        for _ = 1, i == 1 and 3 or 2 do
          held[#held + 1] = send(rt, "ep" .. i)
        end
      end
      local req, picks = send(rt, all(4))
      held[#held + 1] = req
      -- 0.2 > 0: affinity; at or below the threshold: the least loaded
      assert.equal(case.ep1, picks[1] == "ep1", picks[1])
      finish_all(held)
      rt:free()
    end
  end)

  it("adds fresh scraped load and what was sent since that scrape; ignores stale metrics",
    function()
      for _, case in ipairs({ { age = 2000, want = "ep2" }, { age = 0, want = "ep1" } }) do
        -- ep1 scraped with 2 running, ep2 with none, both just now
        local rt = runtime(2, { 0, 0 }, { metricsMaxAgeMs = case.age },
          { { running_requests = 2 }, { running_requests = 0 } })
        local held = {}
        for _ = 1, 3 do
          held[#held + 1] = send(rt, "ep1")
        end
        for _ = 1, 4 do
          held[#held + 1] = send(rt, "ep2")
        end
        -- fresh: ep1 2 scraped + 3 sent since = 5 against ep2's 4; in-flight
        -- counts only (metricsMaxAgeMs 0): 3 against 4
        local req, picks = send(rt, all(2))
        assert.equal(case.want, picks[1])
        held[#held + 1] = req
        finish_all(held)
        rt:free()
      end
      -- metrics scraped 10 s ago are older than the default 2 s: ignored
      local rt = runtime(2, { 0, 0 }, nil,
        { { running_requests = 50, scraped_at = native.now() - 10 }, { running_requests = 0 } })
      local held = {}
      for _ = 1, 2 do
        held[#held + 1] = send(rt, "ep2")
      end
      local req, picks = send(rt, all(2))
      assert.equal("ep1", picks[1])
      req:finish("ok")
      finish_all(held)
      rt:free()
    end)

  it("does not count a request the scrape caught running once it has ended", function()
    -- ep1 holds the affinity; a load of 1 on ep1 beside three idle endpoints
    -- is over the light-load bound (1 + mean 0.5 over the least), 0 is not
    local function case(scrape_while_running, finish_first)
      local rt = runtime(4, { 1, 0, 0, 0 })
      local req = send(rt, "ep1")
      local at = native.now()
      if not scrape_while_running then
        req:finish("ok")
        at = native.now() + 0.001
      end
      rt:set_metrics("ep1", { running_requests = 1, scraped_at = at })
      if scrape_while_running and finish_first then
        req:finish("ok")
      end
      local last, picks = send(rt, all(4))
      last:finish("ok")
      if scrape_while_running and not finish_first then
        req:finish("ok")
      end
      rt:free()
      return picks[1]
    end
    -- the scrape saw our request; it ended since: ep1 is idle again
    assert.equal("ep1", case(true, true))
    -- still running: it counts once (scraped and in flight are the same one)
    assert.are_not.equal("ep1", case(true, false))
    -- ended before the scrape: the running request is someone else's
    assert.are_not.equal("ep1", case(false))
  end)

  it("counts an end that comes after a pick has read the same scrape", function()
    local rt = runtime(4, { 1, 0, 0, 0 })
    local req = send(rt, "ep1")
    rt:set_metrics("ep1", { running_requests = 1, scraped_at = native.now() })
    -- this scrape is read with our request still running on ep1: loaded
    local other, picks = send(rt, all(4))
    assert.are_not.equal("ep1", picks[1])
    other:finish("ok")
    -- it ends; the scrape is the same, its count of our ended requests is not
    req:finish("ok")
    local last
    last, picks = send(rt, all(4))
    assert.equal("ep1", picks[1])
    last:finish("ok")
    rt:free()
  end)

  it("remembers at most 4096 ended requests per endpoint until a scrape", function()
    local rt = runtime(2, { 1, 0 }, { balanceAbsThreshold = 10000, maxLoadSpread = 10000 })
    local held = {}
    for i = 1, 4100 do
      held[i] = send(rt, "ep1")
    end
    rt:set_metrics("ep1", { running_requests = 4100, scraped_at = native.now() })
    finish_all(held)
    local probe = S.eval(rt, [[
      local gen = require("lupin.runtime").current
      for _, rec in ipairs(gen.instances) do
        if rec.type == "bounded-load-picker" then
          local d = rec.obj.ended.ep1
          return { d.n }
        end
      end
    ]])
    assert.same({ 4096 }, probe)
    rt:free()
  end)

  it("returns maxNumOfEndpoints distinct endpoints: eligible by score, then the rest by load",
    function()
      local rt = runtime(4, { 0, 0.5, 1, 0 }, { maxNumOfEndpoints = 3 })
      local req, picks = send(rt, all(4))
      assert.equal(3, #picks)
      assert.equal("ep3", picks[1])
      assert.equal("ep2", picks[2])
      assert.truthy(picks[3] == "ep1" or picks[3] == "ep4")
      req:finish("ok")
      rt:free()
      rt = runtime(2, { 1, 0 }, { maxNumOfEndpoints = 5 })
      req, picks = send(rt, all(2))
      assert.same({ "ep1", "ep2" }, picks)
      req:finish("ok")
      rt:free()
    end)

  it("releases its counts on every path and keeps them across a hot reload", function()
    local rt = runtime(3, { 0, 0, 0 })
    local live = {}
    for i, outcome in ipairs({ "ok", "upstream_error", "cancelled", "timeout", "ok", "ok" }) do
      live[i] = { req = send(rt, all(3)), outcome = outcome }
    end
    assert.same({ ep1 = 2, ep2 = 2, ep3 = 2 }, inflight(rt))
    local config = K.config({ { type = "header-based-testing-filter" },
      { type = "test-scorer", parameters = { byIndex = { 0, 0, 0 }, record = false } }, { type = T } },
      { { pluginRef = "header-based-testing-filter" }, { pluginRef = "test-scorer" },
        { pluginRef = T } })
    assert(rt:load_string(S.json.encode(config), "spec.json"))
    assert.same({ ep1 = 2, ep2 = 2, ep3 = 2 }, inflight(rt)) -- what the new instance reads
    for _, l in ipairs(live) do
      l.req:finish(l.outcome)
    end
    assert.same({}, inflight(rt))
    assert.equal(0, (rt:check_leaks()))
    rt:free()
  end)

  it("counts each profile's endpoint of a P/D request and releases both", function()
    local rt = S.loaded({
      plugins = { { type = "kit-two-profile-handler" }, { type = "decode-filter" },
        { type = "prefill-filter" }, { type = T } },
      schedulingProfiles = {
        { name = "a", plugins = { { pluginRef = "decode-filter" }, { pluginRef = T } } },
        { name = "b", plugins = { { pluginRef = "prefill-filter" }, { pluginRef = T } } },
      },
    }, { plugin_dirs = { S.FIXTURES } })
    S.endpoints(rt, 3, { { labels = { ["llm-d.ai/role"] = "prefill" } },
      { labels = { ["llm-d.ai/role"] = "decode" } }, { labels = { ["llm-d.ai/role"] = "decode" } } })
    local held = {}
    for i = 1, 4 do
      held[i] = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}' }))
      assert.equal(200, held[i]:schedule().status)
    end
    assert.same({ ep1 = 4, ep2 = 2, ep3 = 2 }, inflight(rt))
    finish_all(held)
    assert.same({}, inflight(rt))
    rt:free()
  end)

  it("defaults: rel 0.25, abs 2, spread 4, affinity 0, metrics 2 s, one endpoint", function()
    local rt = S.runtime()
    assert.same({ balanceRelThreshold = 0.25, balanceAbsThreshold = 2, maxLoadSpread = 4,
      affinityThreshold = 0,
      metricsMaxAgeMs = 2000, maxNumOfEndpoints = 1 }, K.params(rt, T))
    rt:free()
  end)

  it("refuses parameters out of bounds with file, line and path", function()
    local err = K.load_error({ '{"type": "bounded-load-picker", "parameters": {"balanceRelThreshold": -1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.balanceRelThreshold: must be a number"
      .. " ≥ 0, got %-1", err)
    err = K.load_error({ '{"type": "queue-scorer"}',
      '{"type": "bounded-load-picker", "parameters": {"balanceAbsThreshold": "2"}}' })
    assert.matches("^spec%.json:4: plugins%[1%]%.parameters%.balanceAbsThreshold: ", err)
    err = K.load_error({ '{"type": "bounded-load-picker", "parameters": {"affinityThreshold": -0.5}}' })
    assert.matches("plugins%[0%]%.parameters%.affinityThreshold: must be a number ≥ 0", err)
    err = K.load_error({ '{"type": "bounded-load-picker", "parameters": {"metricsMaxAgeMs": 1.5}}' })
    assert.matches("plugins%[0%]%.parameters%.metricsMaxAgeMs: must be an integer", err)
    err = K.load_error({ '{"type": "bounded-load-picker", "parameters": {"maxLoadSpread": -1}}' })
    assert.matches("plugins%[0%]%.parameters%.maxLoadSpread: must be a number ≥ 0", err)
    err = K.load_error({ '{"type": "bounded-load-picker", "parameters": {"balance": 1}}' })
    assert.matches("plugins%[0%]%.parameters", err)
  end)
end)
