-- slo-deadline-ordering-policy: arrival plus the request's TTFT objective
-- (x-llm-d-slo-ttft-ms, else x-slo-ttft-ms) first; none or a bad value
-- after all with one; arrival order between equals.  Then through the real
-- flow-control queue, which hands the policy the request's headers.
local S = require "support"
local P = dofile("plugins/slo-deadline-ordering-policy.lua")

local TTFT = "x-llm-d-slo-ttft-ms"

local function item(seq, enqueued_at, headers)
  return { seq = seq, enqueued_at = enqueued_at, deadline = math.huge, headers = headers }
end

describe("slo-deadline-ordering-policy", function()
  it("serves the earliest arrival + TTFT objective first", function()
    -- 10 s + 100 ms before 9.7 s + 500 ms, though it came later
    local a, b = item(2, 10, { [TTFT] = "100" }), item(1, 9.7, { [TTFT] = "500" })
    assert.is_true(P.less(nil, a, b))
    assert.is_false(P.less(nil, b, a))
    -- decimals count
    local c, d = item(3, 10, { [TTFT] = "100.5" }), item(4, 10, { [TTFT] = "100.25" })
    assert.is_true(P.less(nil, d, c))
  end)

  it("reads the older header when the canonical one is absent, the canonical first", function()
    local old, new = item(1, 10, { ["x-slo-ttft-ms"] = "300" }), item(2, 10, { [TTFT] = "200" })
    assert.is_true(P.less(nil, new, old))
    local both = item(3, 10, { [TTFT] = "400", ["x-slo-ttft-ms"] = "1" })
    assert.is_true(P.less(nil, old, both))
  end)

  it("puts requests without a valid objective behind every one with one, in arrival order", function()
    local with = item(9, 1000, { [TTFT] = "60000" })
    local bad = {}
    for i, v in ipairs({ "", "abc", "0", "-3", "nan", "inf", "1e400" }) do
      bad[i] = item(i, 1, { [TTFT] = v })
    end
    bad[#bad + 1] = item(#bad + 1, 1, {})
    bad[#bad + 1] = item(#bad + 1, 1, { ["x-llm-d-slo-tpot-ms"] = "5" }) -- TPOT is not a deadline
    bad[#bad + 1] = item(#bad + 1, 1, nil) -- no headers at all
    for i, x in ipairs(bad) do
      assert.is_true(P.less(nil, with, x), i)
      assert.is_false(P.less(nil, x, with), i)
      if i > 1 then
        assert.is_true(P.less(nil, bad[i - 1], x), i)
        assert.is_false(P.less(nil, x, bad[i - 1]), i)
      end
    end
  end)

  it("orders equal deadlines by arrival, and a bad TPOT leaves the TTFT deadline", function()
    local a, b = item(1, 10, { [TTFT] = "100" }), item(2, 9.9, { [TTFT] = "200" })
    assert.is_true(P.less(nil, a, b))
    assert.is_false(P.less(nil, b, a))
    local c = item(3, 9, { [TTFT] = "50", ["x-llm-d-slo-tpot-ms"] = "bad" })
    assert.is_true(P.less(nil, c, a))
  end)

  it("works a deadline out once per item", function()
    local a, b = item(1, 10, { [TTFT] = "100" }), item(2, 10, { [TTFT] = "200" })
    assert.is_true(P.less(nil, a, b))
    a.headers[TTFT], a.enqueued_at = "900", 20 -- not read again
    assert.is_true(P.less(nil, a, b))
  end)

  describe("in the flow-control queue", function()
    -- one endpoint taking one request at a time, so the others wait
    local function config(ordering, listed)
      local plugins = { { type = "queue-scorer" }, { type = "max-score-picker" },
        { type = "concurrency-detector", parameters = { maxConcurrency = 1 } } }
      if listed then
        plugins[#plugins + 1] = { type = ordering }
      end
      return { plugins = plugins,
        schedulingProfiles = { { name = "default", plugins = { { pluginRef = "queue-scorer" },
          { pluginRef = "max-score-picker" } } } },
        saturationDetector = { pluginRef = "concurrency-detector" },
        flowControl = { defaultPriorityBand = { orderingPolicyRef = ordering } } }
    end

    local function order(ordering, listed)
      local rt = S.loaded(config(ordering, listed))
      S.endpoints(rt, 1)
      local got = {}
      rt:set_dispatch(function(id)
        got[#got + 1] = id
      end)
      local function begin(id, headers)
        return assert(rt:begin({ id = id, path = "/v1/completions", headers = headers,
          body = '{"model":"m","prompt":"hello"}' }))
      end
      local first = begin("first")
      assert.equal(200, first:schedule().status)
      local reqs = {}
      for _, x in ipairs({ { "none", {} }, { "loose", { [TTFT] = "60000" } }, { "bad", { [TTFT] = "soon" } },
        { "tight", { [TTFT] = "30" } }, { "old", { ["x-slo-ttft-ms"] = "40000" } } }) do
        reqs[x[1]] = begin(x[1], x[2])
        assert.equal(0, reqs[x[1]]:schedule().status)
      end
      first:finish("ok")
      while #got < 5 do
        reqs[got[#got]]:finish("ok")
      end
      reqs[got[#got]]:finish("ok")
      rt:free()
      return table.concat(got, " ")
    end

    it("serves the tightest objective first, requests without a valid one last", function()
      assert.equal("tight old loose none bad", order("slo-deadline-ordering-policy", true))
      assert.equal("none loose bad tight old", order("fcfs-ordering-policy", true))
    end)

    it("is a default instance when orderingPolicyRef names it and plugins do not list it", function()
      assert.equal("tight old loose none bad", order("slo-deadline-ordering-policy", false))
    end)
  end)
end)
