-- Upstream example configs, mirrored under spec/fixtures/upstream-configs/
-- (each file's first line names the file it mirrors): every one loads and
-- schedules a request, or fails with the documented "not supported" error
-- of a type lupin refuses on purpose (lua/lupin/config/unsupported.lua: why
-- and what to use), or the one plugin lupin lacks yet
-- (dp-rank-header-handler; docs/epp-compatibility.md).
local S = require "support"

local DIR = S.ROOT .. "/spec/fixtures/upstream-configs"

local LATENCY = "split upstream into the predicted-latency family"
local DP_RANK = 'unknown plugin type "dp-rank-header-handler"'
-- refused on purpose (lua/lupin/config/unsupported.lua): the type and its alternative
local function refused(type_, use)
  return ('plugin type "%s" is not supported: '):format(type_), "; use " .. use
end

-- What each fixture does: "loads", or the refusal it must fail with.
local EXPECT = {
  ["gie-chart-default-plugins.yaml"] = "loads",
  ["gie-chart-latency-predictor.yaml"] = LATENCY,
  ["gie-slo-routing-example.yaml"] = LATENCY,
  ["gie-flow-control-guide.yaml"] = "loads",
  ["gie-loader-saturation-detector.yaml"] = "loads",
  ["llmd-epp-config.yaml"] = "loads",
  ["llmd-epp-precise-prefix-cache-config.yaml"] = "loads",
  ["llmd-session-affinity-config.yaml"] = "loads",
  ["llmd-pd-epp-config.yaml"] = "loads",
  ["router-sim-epp-config.yaml"] = "loads",
  ["router-sim-epp-decode-config.yaml"] = "loads",
  ["router-pd-epp-config.yaml"] = "loads",
  ["router-sim-pd-epp-config.yaml"] = "loads",
  ["router-sim-epp-kvcache-config.yaml"] = "loads",
  ["router-epp-precise-prefix-cache-config.yaml"] = "loads",
  ["router-sim-epp-no-hit-lru.yaml"] = "loads",
  ["router-dp-kvcache-epp-config.yaml"] = DP_RANK,
  ["router-core-metrics-extractor-readme.yaml"] = "loads",
  ["router-chart-latency-predictor.yaml"] = "loads",
  ["router-probabilistic-admitter-epp-config.yaml"] = "loads",
  ["router-pd-topology-epp-config.yaml"] = "loads",
  ["router-epp-burst-prefix-cache-config.yaml"] = { refused("burst-prefix-cache-producer",
    "approx-prefix-cache-producer") },
  ["router-epp-mm-embeddings-cache-config.yaml"] = { refused("mm-embeddings-cache-producer",
    "prefix-cache-scorer") },
  ["router-sim-epp-gpu-config.yaml"] = { refused("dcgm-data-source", "kv-cache-utilization-scorer") },
  ["router-sim-program-aware-config.yaml"] = { refused("program-aware-fairness",
    "round-robin-fairness-policy") },
  ["router-soft-reflective-ceiling-epp-config.yaml"] = { refused("soft-reflective-ceiling-policy",
    "flowControl's priority bands") },
  ["router-chart-payload-agnostic.yaml"] = "loads",
  ["router-perf-optimized-baseline-values.yaml"] = "loads", -- router: chart values
  ["router-perf-precise-prefix-values.yaml"] = "loads",
  ["router-integration-default-config.yaml"] = "loads", -- requestHandler
  ["llmd-v0.4-sim-epp-kvcache-config.yaml"] = "loads", -- mode cache_tracking
  ["gie-request-attribute-reporter-config.yaml"] = "loads", -- a reporter in a profile
  ["gie-leader-election-e2e-manifest.yaml"] = "loads", -- a manifest, v1alpha2 fields in v1
  ["router-inflight-load-readme.yaml"] = "loads", -- inflight-load-producer
}

local function files()
  local list = {}
  local p = io.popen("ls " .. DIR)
  for name in p:lines() do
    list[#list + 1] = name
  end
  p:close()
  return list
end

local function read(name)
  local f = assert(io.open(DIR .. "/" .. name, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

describe("upstream configs", function()
  it("every fixture names the upstream file it mirrors and has an expectation", function()
    local names = files()
    assert.is_true(#names >= 25)
    for _, name in ipairs(names) do
      assert.matches("^# Mirrors [%w._-]+/[%w._-]+ %S+", read(name), nil, false, name)
      assert.is_not_nil(EXPECT[name], name .. " has no expectation in this spec")
    end
    for name in pairs(EXPECT) do
      assert.is_not_nil(io.open(DIR .. "/" .. name), name .. " is missing")
    end
  end)

  for _, name in ipairs(files()) do
    local want = EXPECT[name]
    it(name .. (want == "loads" and " loads and schedules" or " is refused: not supported"),
      function()
        local rt = S.runtime()
        finally(function() rt:free() end)
        local ok, err = rt:load(DIR .. "/" .. name)
        if want == "loads" then
          assert(ok, err)
          S.endpoints(rt, 2)
          local res = S.lifecycle(rt, '{"model":"m","prompt":"' .. ("hello "):rep(40) .. '"}')
          assert.equal(200, res.status)
        else
          assert.is_nil(ok, "the config loaded")
          local at = (DIR .. "/" .. name):gsub("%p", "%%%0")
          assert.matches("^" .. at .. ":%d+: plugins%[%d+%]", err)
          for _, w in ipairs(type(want) == "table" and want or { want }) do
            assert.matches(w, err, 1, true)
          end
          if want ~= DP_RANK then -- refused on purpose: why, and what to use
            assert.matches("is not supported: ", err, 1, true)
            assert.matches("; (%a+) ", err)
          end
        end
      end)
  end

  it("the chart's requestHandler.parsers lists are taken as given", function()
    for name, names in pairs({
      ["router-chart-latency-predictor.yaml"] = "openai-parser (openai-parser)",
      ["router-chart-payload-agnostic.yaml"] = "passthrough-parser (passthrough-parser)",
      ["router-sim-epp-config.yaml"] = "openai-parser (openai-parser), anthropic-parser"
        .. " (anthropic-parser), vllmhttp-parser (vllmhttp-parser), passthrough-parser"
        .. " (passthrough-parser)",
    }) do
      local rt = S.runtime()
      assert(rt:load(DIR .. "/" .. name))
      assert.equal(names, S.eval(rt, "return require('lupin.runtime').current.parsers.names"), name)
      rt:free()
    end
  end)
end)
