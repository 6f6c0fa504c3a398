-- Explain records (LUPIN_REQUEST_EXPLAIN, lupin_request_explain): what a
-- request's record holds -- profiles, filters' kept sets, weighted scores,
-- totals, picks, fallbacks, times, errors with tracebacks -- and that a
-- request without the flag has none.  The dry-run flag decides without
-- pre_request.
local S = require "support"

local BODY = '{"model":"m","prompt":"hello"}'

-- A filter keeping 3 of 4 endpoints, two weighted scorers, a picker.
local function config(extra)
  local plugins = {
    { type = "test-filter", name = "first3", parameters = { keep = 3 } },
    { type = "test-scorer", name = "fit", parameters = { byIndex = { 0.2, 0.9, 0.5 } } },
    { type = "test-scorer", name = "flat", parameters = { value = 0.5 } },
    { type = "max-score-picker", name = "best" },
  }
  local refs = { { pluginRef = "first3" }, { pluginRef = "fit", weight = 2 },
    { pluginRef = "flat", weight = 1 }, { pluginRef = "best" } }
  for _, p in ipairs(extra or {}) do
    plugins[#plugins + 1] = p.plugin
    if p.ref then
      table.insert(refs, #refs, p.ref)
    end
  end
  return { plugins = plugins, schedulingProfiles = { { name = "default", plugins = refs } } }
end

local function explained(rt, opts)
  local desc = { path = "/v1/completions", body = BODY, explain = true }
  for k, v in pairs(opts or {}) do
    desc[k] = v
  end
  local req = assert(rt:begin(desc))
  local res = req:schedule()
  local text = req:explain()
  return S.json.decode(text), req, res, text
end

local function names(list, field)
  local out = {}
  for i, v in ipairs(list) do
    out[i] = v[field]
  end
  return out
end

describe("an explain record", function()
  local rt
  before_each(function()
    rt = S.loaded(config())
    S.endpoints(rt, 4)
  end)
  after_each(function()
    rt:free()
  end)

  it("holds each filter's kept set, each scorer's scores and weight, the totals, the picks",
    function()
      local x, req = explained(rt)
      assert.equal(200, x.status)
      assert.equal("ok", x.outcome)
      assert.equal("default", x.primary)
      assert.same({ "ep2" }, x.picks)
      assert.same({ "ep1", "ep2", "ep3", "ep4" }, names(x.candidates, "name"))
      assert.equal("10.0.0.1:8000", x.candidates[1].address)

      assert.equal(1, #x.profiles)
      local p = x.profiles[1]
      assert.equal("default", p.name)
      assert.same({ "ep1", "ep2", "ep3", "ep4" }, p.candidates)
      assert.equal(1, #p.filters)
      local f = p.filters[1]
      assert.same({ "first3", "test-filter", 4 }, { f.plugin, f.type, f["in"] })
      assert.same({ "ep1", "ep2", "ep3" }, f.kept)
      assert.same({ "ep4" }, f.removed)

      assert.same({ "fit", "flat" }, names(p.scorers, "plugin"))
      local fit, flat = p.scorers[1], p.scorers[2]
      assert.same({ 2, 1 }, { fit.weight, flat.weight })
      assert.same({ "ep1", "ep2", "ep3" }, names(fit.scores, "endpoint"))
      assert.same({ 0.2, 0.9, 0.5 }, names(fit.scores, "raw"))
      assert.same({ 0.4, 1.8, 1.0 }, names(fit.scores, "weighted"))
      assert.same({ 0.5, 0.5, 0.5 }, names(flat.scores, "weighted"))

      -- totals best first: 2*0.9+0.5, 2*0.5+0.5, 2*0.2+0.5
      assert.same({ "ep2", "ep3", "ep1" }, names(p.totals, "endpoint"))
      local totals = names(p.totals, "total")
      assert.near(2.3, totals[1], 1e-9)
      assert.near(1.5, totals[2], 1e-9)
      assert.near(0.9, totals[3], 1e-9)
      assert.same({ "best", "max-score-picker" }, { p.picker.plugin, p.picker.type })
      assert.same({ "ep2" }, p.picker.picks)

      -- the handler's choices: run default, then done
      assert.equal(2, #x.cycles)
      assert.same({ "default" }, x.cycles[1].profiles)
      assert.same({}, x.cycles[2].profiles)
      assert.same({}, x.errors)
      req:finish("ok")
    end)

  it("times every plugin call in microseconds", function()
    local x, req = explained(rt)
    local p = x.profiles[1]
    for _, call in ipairs({ p.filters[1], p.scorers[1], p.scorers[2], p.picker, x.cycles[1] }) do
      assert.is_number(call.us)
      assert.truthy(call.us >= 0, call.us)
    end
    assert.truthy(x.scheduling_us >= p.picker.us)
    req:finish("ok")
  end)

  it("lists the fallbacks lupin_request_fallbacks gives, best total first", function()
    local x, req = explained(rt)
    assert.same({ "ep3", "ep1" }, x.fallbacks)
    assert.same(req:fallbacks(), x.fallbacks)
    req:finish("ok")
  end)

  it("names a failing scorer's error with its traceback; the scorer adds nothing", function()
    local failing = S.loaded(config({ {
      plugin = { type = "test-scorer", name = "broken", parameters = { fail = true } },
      ref = { pluginRef = "broken", weight = 5 } } }))
    S.endpoints(failing, 4)
    local x, req = explained(failing)
    assert.equal(200, x.status)
    assert.equal(1, #x.errors)
    local e = x.errors[1]
    assert.same({ "broken", "test-scorer", "score" }, { e.plugin, e.type, e.point })
    assert.truthy(e.message:find("scorer exploded", 1, true), e.message)
    assert.truthy(e.traceback:find("test%-scorer%.lua:%d+"), e.traceback)
    local broken = x.profiles[1].scorers[3]
    assert.same({ "broken", true }, { broken.plugin, broken.error })
    assert.is_nil(broken.scores)
    assert.near(2.3, x.profiles[1].totals[1].total, 1e-9) -- weight 5 added nothing
    req:finish("ok")
    failing:free()
  end)

  it("keeps a NaN score readable as JSON, counted as 0", function()
    local nan = S.loaded(config({ {
      plugin = { type = "test-scorer", name = "nan", parameters = { bad = "nan" } },
      ref = { pluginRef = "nan", weight = 1 } } }))
    S.endpoints(nan, 4)
    local x, req = explained(nan)
    local s = x.profiles[1].scorers[3]
    assert.same({ "NaN", 0 }, { s.scores[1].raw, s.scores[1].weighted })
    req:finish("ok")
    nan:free()
  end)

  it("names what a filter returned without running its metamethods", function()
    local dir = S.tmpdir()
    S.write(dir .. "/explain-odd-filter.lua", [[
local odd = setmetatable({}, { __tostring = function() error("must not run") end,
  __index = function() error("must not run") end })
return {
  type = "explain-odd-filter",
  filter = function(_, ctx, endpoints)
    if ctx.request.dry_run then return endpoints end
    return { endpoints[2], odd }
  end,
}
]])
    local odd = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
    assert(odd:load_string(S.json.encode({
      plugins = { { type = "explain-odd-filter", name = "odd" },
        { type = "test-picker", name = "first" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "odd" },
        { pluginRef = "first" } } } } }), "odd.json"))
    S.endpoints(odd, 3)
    local x, req = explained(odd)
    local f = x.profiles[1].filters[1]
    assert.same({ "ep2", "(table)" }, f.kept)
    assert.same({ "ep1", "ep3" }, f.removed)
    req:finish("ok")
    odd:free()
  end)

  it("tells which profile failed and why when scheduling fails", function()
    local none = S.loaded({
      plugins = { { type = "test-filter", name = "none", parameters = { keep = 0 } },
        { type = "max-score-picker", name = "best" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "none" },
        { pluginRef = "best" } } } } })
    S.endpoints(none, 2)
    local x, req, res = explained(none)
    assert.equal(503, res.status)
    assert.same({ 503, "no_endpoint", "none" }, { x.status, x.outcome, x.plugin })
    assert.truthy(x.message:find('filter "none" removed the last 2', 1, true), x.message)
    assert.same({}, x.profiles[1].filters[1].kept)
    assert.equal(x.message, x.profiles[1].failure)
    assert.is_nil(x.picks)
    assert.is_nil(x.fallbacks)
    req:finish("ok")
    none:free()
  end)

  it("renders as text for a person and as a one-line summary", function()
    local _, req = explained(rt)
    local text = req:explain("text")
    assert.truthy(text:find("profile default (4 candidates): primary", 1, true), text)
    assert.truthy(text:find("filter first3 %(test%-filter%) [%d.]+ us: kept 3 of 4: ep1, ep2, ep3;"
      .. " removed ep4"), text)
    assert.truthy(text:find("ep2%s+0.9 %-> 1.8%s+0.5 %-> 0.5%s+2.3%s+picked\n"), text)
    assert.truthy(text:find("primary profile default: picks ep2; fallbacks ep3, ep1", 1, true),
      text)
    local summary = req:explain("summary")
    assert.truthy(summary:find("^profile=default; picks=ep2; totals=ep2:2.3,ep3:1.5,ep1:0.9;"
      .. " fallbacks=ep3,ep1; errors=0; us=[%d.]+$"), summary)
    assert.falsy(summary:find("[%c]"), summary)
    req:finish("ok")
  end)

  it("takes the path of a body sent without one: chat when it has messages", function()
    for body, path in pairs({
      ['{"model":"m","messages":[{"role":"user","content":"hi"}]}'] = "/v1/chat/completions",
      ['{"model":"m","prompt":"hi"}'] = "/v1/completions",
      ["not json"] = "/v1/completions",
    }) do
      local req = assert(rt:begin({ body = body, explain = true }))
      assert.equal(path, S.json.decode(req:explain()).path, body)
      req:finish("ok")
    end
  end)

  it("is not kept when not asked for", function()
    local req = assert(rt:begin({ path = "/v1/completions", body = BODY }))
    assert.equal(200, req:schedule().status)
    assert.is_nil(req:explain())
    assert.same({ 1, 0 }, S.eval(rt, [[
      local live, explained = 0, 0
      require("lupin.runtime.leaks").each_live(function(r)
        live = live + 1
        explained = explained + (rawget(r, "explain") and 1 or 0)
      end)
      return { live, explained }]]))
    req:finish("ok")
  end)

  it("can be asked for before scheduling, and again after", function()
    local req = assert(rt:begin({ path = "/v1/completions", body = BODY, explain = true }))
    local before = S.json.decode(req:explain())
    assert.same({}, before.profiles)
    assert.is_nil(before.status)
    req:schedule()
    assert.equal(200, S.json.decode(req:explain()).status)
    req:finish("ok")
  end)
end)

describe("a dry-run request", function()
  it("is decided without pre_request; finish hooks see dry_run", function()
    local rt = S.loaded(config({ { plugin = { type = "test-observer", name = "obs" } } }))
    S.endpoints(rt, 4)
    local x, req, res = explained(rt, { id = "dry-1", dry_run = true })
    assert.equal(200, res.status)
    assert.same({ "ep2" }, names(res.picks, "name"))
    assert.is_true(x.dry_run)
    assert.same({ "prepare", "admit", "process_results" }, names(x.steps, "point"))
    req:finish("ok")
    local journal = S.eval(rt, [[return require("lupin.runtime").current.by_name.obs.obj
      .journals["dry-1"] ]])
    local seen = table.concat(journal, " ")
    assert.falsy(seen:find("pre_request", 1, true), seen)
    assert.truthy(seen:find("finish:obs:dry_run", 1, true), seen)
    rt:free()
  end)

  it("runs pre_request when not dry, and the record says so", function()
    local rt = S.loaded(config({ { plugin = { type = "test-observer", name = "obs" } } }))
    S.endpoints(rt, 4)
    local x, req = explained(rt, { id = "wet-1" })
    assert.same({ "prepare", "admit", "process_results", "pre_request" },
      names(x.steps, "point"))
    assert.is_false(x.dry_run)
    req:finish("ok")
    local journal = S.eval(rt, [[return require("lupin.runtime").current.by_name.obs.obj
      .journals["wet-1"] ]])
    local seen = table.concat(journal, " ")
    assert.truthy(seen:find("pre_request:default:ep2", 1, true), seen)
    assert.truthy(seen:find("finish:obs:ok", 1, true), seen)
    rt:free()
  end)
end)
