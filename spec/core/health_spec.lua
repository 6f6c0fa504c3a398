-- What a host's health checks need from the runtime: taking an endpoint out
-- of the candidates and back (lupin_endpoint_set_healthy), ranked fallbacks
-- for a request whose pick failed (lupin_request_fallbacks), and a
-- collection for idle moments (lupin_runtime_collect).
local S = require "support"

local function config(scores, keep)
  return {
    plugins = {
      { type = "test-filter", parameters = { keep = keep or -1 } },
      { type = "test-scorer", parameters = { byIndex = scores, record = false } },
      { type = "max-score-picker" }, -- the EPP default: one pick
    },
  }
end

local function names(rt)
  return S.eval(rt, [[
    local out = {}
    for i, ep in ipairs(require("lupin.runtime.pool").list) do out[i] = ep.name end
    return out]])
end

describe("endpoint health in the runtime", function()
  local rt
  after_each(function()
    rt:free()
  end)

  it("takes an unhealthy endpoint out of the candidates, keeping its metrics", function()
    rt = S.loaded(config({ 0.5, 0.5, 0.5 }))
    S.endpoints(rt, 3)
    rt:set_metrics("ep2", { waiting_queue_size = 7 })
    assert.is_true(rt:set_healthy("ep2", false))
    assert.same({ "ep1", "ep3" }, names(rt))
    for _ = 1, 5 do
      local req = rt:begin({})
      assert.not_equal("ep2", req:schedule().picks[1].name)
      req:finish("ok")
    end
    assert.is_true(rt:set_healthy("ep2", true))
    assert.same({ "ep1", "ep2", "ep3" }, names(rt))
    assert.equal(7, S.eval(rt, [[return require("lupin.runtime.pool").list[2].waiting_queue_size]]))
    assert.is_false(rt:set_healthy("nope", false))
  end)

  it("answers 503 when no endpoint is healthy", function()
    rt = S.loaded(config({ 1 }))
    S.endpoints(rt, 1)
    rt:set_healthy("ep1", false)
    local req = rt:begin({})
    assert.equal(503, req:schedule().status)
    assert.same({}, req:fallbacks())
    req:finish("ok")
  end)

  it("ranks fallbacks by profile score: filtered, picked and unhealthy ones left out", function()
    -- the filter keeps ep1..ep4; scores 0.1, 0.9, 0.5, 0.7 (ep5 would be best)
    rt = S.loaded(config({ 0.1, 0.9, 0.5, 0.7, 1 }, 4))
    S.endpoints(rt, 5)
    local req = rt:begin({})
    local res = req:schedule()
    assert.same({ "ep2" }, { res.picks[1].name, res.picks[2] })
    rt:set_healthy("ep4", false) -- ejected after scheduling, before the failure
    assert.same({ "ep3", "ep1" }, req:fallbacks())
    assert.same({ "ep3", "ep1" }, req:fallbacks()) -- computed once
    req:finish("upstream_error")
    local st = rt:stats()
    assert.same({ 1, 1, 0 }, { st.requests_begun, st.requests_ended, st.live_requests })
  end)

  it("has no fallbacks for a request that was not scheduled", function()
    rt = S.loaded(config({ 0.5 }))
    S.endpoints(rt, 1)
    local req = rt:begin({})
    assert.same({}, req:fallbacks())
    req:finish("cancelled")
  end)

  it("collects ended requests' tables on demand", function()
    rt = S.loaded(config({ 0.5, 0.5 }))
    S.endpoints(rt, 2)
    rt:eval("collectgarbage('stop')")
    for _ = 1, 20 do
      local req = rt:begin({})
      req:schedule()
      req:finish("ok")
    end
    assert.is_true(rt:stats().live_request_tables > 0)
    rt:collect()
    assert.equal(0, rt:stats().live_request_tables)
    rt:eval("collectgarbage('restart')")
  end)
end)
