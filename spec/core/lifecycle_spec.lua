-- The request lifecycle: extension points in order, finish exactly once on
-- every path, the state table gone after the end.
local S = require "support"

local function config(extra)
  local c = {
    plugins = {
      { type = "test-filter", name = "f" },
      { type = "test-scorer", name = "s" },
      { type = "test-picker", name = "p" },
      { type = "test-observer", name = "obs", parameters = extra and extra.observer },
    },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "f" }, { pluginRef = "s" }, { pluginRef = "p" } } } },
  }
  if extra and extra.filter then
    c.plugins[1].parameters = extra.filter
  end
  if extra and extra.picker then
    c.plugins[3].parameters = extra.picker
  end
  return c
end

local function journal(rt, id)
  return S.eval(rt, ([[return require("lupin.runtime").current.by_name.obs.obj.journals[%q]
    or {}]]):format(id))
end

local function finished(rt, id)
  return S.eval(rt, ([[return require("lupin.runtime").current.by_name.obs.obj.finished[%q]
    or 0]]):format(id))
end

local function weak_count(rt)
  return S.eval(rt, [[collectgarbage() collectgarbage()
    local n = 0
    for _ in pairs(require("lupin.runtime").current.by_name.obs.obj.weak) do n = n + 1 end
    return n]])
end

describe("request lifecycle", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  it("runs every extension point in order with the right data", function()
    rt = S.loaded(config())
    S.endpoints(rt, 3)
    local req = rt:begin({ id = "r1", body = '{"model":"m","prompt":"hi"}' })
    local res = req:schedule()
    assert.equal(200, res.status)
    assert.equal("ep1", res.picks[1].name)
    assert.equal("10.0.0.1", res.picks[1].address)
    assert.equal(8000, res.picks[1].port)
    assert.equal(3, #res.picks) -- fallbacks follow the primary
    assert.equal("r1", res.headers["x-observed"])
    local client = req:response_header(200, { ["Content-Type"] = "text/event-stream" })
    assert.equal("ep1", client["x-served-by"])
    req:response_chunk("data: 1\n\n")
    req:response_chunk("data: [DONE]\n\n")
    req:response_complete()
    req:finish("ok")
    assert.same({
      "prepare", "admit", "filter:f:default", "score:s:default", "pick:p:default",
      "pre_request:default:ep1", "response_header:200", "response_chunk:9",
      "response_chunk:14", "response_complete",
      "finish:f:ok", "finish:s:ok", "finish:p:ok", "finish:obs:ok",
    }, journal(rt, "r1"))
  end)

  it("tells the host whether a plugin observes the response's chunks", function()
    -- the observer has response_chunk; the same profile without it has none
    for _, case in ipairs({ { config(), true }, { { plugins = { { type = "test-scorer", name = "s" },
      { type = "test-picker", name = "p" } }, schedulingProfiles = { { name = "default",
      plugins = { { pluginRef = "s" }, { pluginRef = "p" } } } } }, false } }) do
      rt = S.loaded(case[1])
      S.endpoints(rt, 2)
      local req = rt:begin({ id = "w", body = '{"model":"m","prompt":"hi"}' })
      assert.equal(200, req:schedule().status)
      assert.equal(case[2], req:wants_chunks())
      req:finish("ok")
      rt:free()
      rt = nil
    end
  end)

  local paths = {
    { name = "scheduled and completed", outcome = "ok", want = "ok", status = 200 },
    { name = "rejected by admit", cfg = { observer = { reject = true } }, want = "rejected",
      status = 429, reached = { "obs" } },
    { name = "no endpoint left", cfg = { filter = { keep = 0 } }, want = "no_endpoint",
      status = 503, reached = { "f", "obs" } },
    { name = "picker error", cfg = { picker = { fail = true } }, want = "plugin_error",
      status = 500 },
    { name = "upstream error", outcome = "upstream_error", want = "upstream_error",
      status = 200 },
    { name = "client cancel", outcome = "cancelled", want = "cancelled", status = 200 },
    { name = "timeout", outcome = "timeout", want = "timeout", status = 200 },
  }

  for _, path in ipairs(paths) do
    it("runs finish exactly once per reached plugin and drops the state: " .. path.name, function()
      rt = S.loaded(config(path.cfg))
      S.endpoints(rt, 2)
      local req = rt:begin({ id = "r-" .. path.want, body = '{"model":"m","prompt":"x"}' })
      local res = req:schedule()
      assert.equal(path.status, res.status)
      -- the host says "ok" whenever scheduling failed: the core's outcome wins
      req:finish(path.outcome or "ok")
      local j = journal(rt, "r-" .. path.want)
      local finishes = {}
      for _, e in ipairs(j) do
        local who, outcome = e:match("^finish:([^:]+):(.+)$")
        if who then
          assert.equal(path.want, outcome)
          assert.is_nil(finishes[who], "finish ran twice for " .. who)
          finishes[who] = true
        end
      end
      local reached = path.reached or { "f", "s", "p", "obs" }
      for _, who in ipairs(reached) do
        assert.is_true(finishes[who], "finish did not run for " .. who)
      end
      local n = 0
      for _ in pairs(finishes) do
        n = n + 1
      end
      assert.equal(#reached, n, "finish ran for a plugin the request never reached")
      assert.equal(1, finished(rt, "r-" .. path.want))
      assert.equal(0, weak_count(rt)) -- ctx and private tables collected
      assert.equal(0, (rt:check_leaks()))
      assert.equal(0, rt:stats().live_request_tables)
      assert.equal(0, rt:stats().live_requests)
    end)
  end

  it("schedules once: a repeated schedule call gets the same answer, no plugin runs again",
    function()
      rt = S.loaded(config())
      S.endpoints(rt, 2)
      local req = rt:begin({ id = "twice" })
      local first = req:schedule()
      local second = req:schedule()
      assert.same(first, second)
      req:finish("ok")
      local scores = 0
      for _, e in ipairs(journal(rt, "twice")) do
        scores = scores + (e:find("^score:") and 1 or 0)
      end
      assert.equal(1, scores)
      rt:free()
      rt = S.loaded(config({ filter = { keep = 0 } }))
      S.endpoints(rt, 2)
      req = rt:begin({})
      assert.same(req:schedule(), req:schedule())
      req:finish("ok")
    end)

  it("names the filter that removed the last endpoint", function()
    rt = S.loaded(config({ filter = { keep = 0 } }))
    S.endpoints(rt, 2)
    local res = S.lifecycle(rt)
    assert.equal(503, res.status)
    assert.equal("f", res.plugin)
    assert.matches('filter "f" removed the last 2', res.message, 1, true)
  end)

  it("answers 503 when the pool is empty or the subset matches nothing", function()
    rt = S.loaded(config())
    local res = S.lifecycle(rt)
    assert.equal(503, res.status)
    assert.matches("no endpoints in the pool", res.message, 1, true)
    S.endpoints(rt, 2)
    local req = rt:begin({ subset = { "10.9.9.9:1" } })
    res = req:schedule()
    req:finish("ok")
    assert.equal(503, res.status)
    assert.matches("subset", res.message, 1, true)
  end)

  it("restricts candidates to the subset, by address:port or name", function()
    rt = S.loaded(config())
    S.endpoints(rt, 3)
    for _, subset in ipairs({ { "10.0.0.3:8000" }, { "ep3" } }) do
      local req = rt:begin({ subset = subset })
      local res = req:schedule()
      req:finish("ok")
      assert.equal(1, #res.picks)
      assert.equal("ep3", res.picks[1].name)
    end
  end)

  it("takes the request id from x-request-id, else generates distinct ones", function()
    rt = S.loaded(config())
    S.endpoints(rt, 1)
    local a = rt:begin({ headers = { ["X-Request-Id"] = "from-header" } })
    assert.equal("from-header", a:id())
    a:finish("ok")
    local seen = {}
    for _ = 1, 100 do
      local r = rt:begin({})
      assert.is_nil(seen[r:id()])
      assert.is_true(#r:id() > 0)
      seen[r:id()] = true
      r:finish("ok")
    end
  end)

  it("ends requests still alive when the runtime is freed, running finish", function()
    rt = S.loaded(config())
    S.endpoints(rt, 1)
    local req = rt:begin({ id = "orphan" })
    req:schedule()
    assert.equal(1, rt:stats().live_requests)
    local logs = {}
    rt:free()
    rt = nil
    assert.has_error(function() req:schedule() end, "its runtime was freed")
    assert.same({}, logs)
  end)

  it("refuses to begin a request before a config is loaded", function()
    rt = S.runtime()
    local req, err = rt:begin({})
    assert.is_nil(req)
    assert.matches("no config loaded", err, 1, true)
  end)
end)
