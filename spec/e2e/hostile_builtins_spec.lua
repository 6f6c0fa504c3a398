-- A hostile filter plugin against the real `lupin serve` with two workers
-- (each runs Lua on its own thread): a backtracking pattern over the
-- client's text, recursion through gsub and through coroutines, a huge
-- string.rep.  The process lives, /healthz answers, the hostile request is
-- answered with the filter skipped (DESIGN §4: a failed filter is skipped),
-- the other requests are not touched, and the cuts are reported in the log,
-- /metrics and the explain record.  Before lupin's bounded built-ins, the
-- pattern held a worker's event loop for minutes and the recursions killed
-- the process with SIGSEGV.
local P = require "e2e.procs"
local support = require "support"
local json = P.json


-- What the filter does is chosen by the prompt's first word; the rest of
-- the prompt is the client's text it works on.
local FILTER = [[
return {
  type = "hostile-filter",
  filter = function(self, ctx, endpoints)
    local prompt = ctx.request.prompt or ""
    local mode, text = prompt:match("^(%a+) (.*)$")
    if mode == "bomb" then -- client text as the subject of a backtracking pattern
      local r = text:find(("a?"):rep(#text) .. text .. "b")
    elseif mode == "gsub" then
      local function f() return (("x"):gsub("x", f)) end
      f()
    elseif mode == "coroutine" then
      local function f() coroutine.resume(coroutine.create(f)) error("unwound") end
      f()
    elseif mode == "wrap" then
      local function f() coroutine.wrap(f)() end
      f()
    elseif mode == "rep" then
      local r = text:rep(4e8)
    end
    return endpoints
  end,
}
]]

local HOSTILE = {
  bomb = { prompt = "bomb " .. ("a"):rep(30), cut = true },
  rep = { prompt = "rep x", cut = true },
  gsub = { prompt = "gsub x", error = "C stack overflow" },
  coroutine = { prompt = "coroutine x", error = "unwound" },
  wrap = { prompt = "wrap x", error = "C stack overflow" },
}

describe("lupin serve with a hostile filter plugin", function()
  local sim, gw, dir

  setup(function()
    dir = support.tmpdir()
    support.write(dir .. "/hostile-filter.lua", FILTER)
    sim = P.sim("--model m --itl-ms 0 --seed 1", 2)
    local eps = {}
    for i, port in ipairs(sim.ports) do
      eps[i] = { name = "e" .. i, address = "127.0.0.1", port = port }
    end
    gw = P.gateway({
      pluginDirs = { dir },
      plugins = { { type = "hostile-filter", name = "hostile" }, { type = "queue-scorer" },
        { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "hostile" },
        { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
      endpoints = eps, -- the default budget: 5 ms a call
      gateway = { explainWithoutToken = 1 },
    }, "--no-watch --workers 2")
  end)

  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  local function request(prompt, id)
    return P.post(gw.base, "/v1/completions", { model = "m", prompt = prompt, max_tokens = 2 },
      ("--max-time 30 -H 'x-request-id: %s' -H 'x-lupin-explain: 1'"):format(id))
  end

  local function healthy()
    local status = P.get(gw.admin .. "/healthz", "--max-time 10")
    assert.equal(200, status)
    local ok, _, body = request("hello", "ok-" .. tostring(math.random(1e9)))
    assert.equal(200, ok, body)
  end

  local cuts = 0
  for name, case in pairs(HOSTILE) do
    it("survives " .. name .. ": the filter is skipped, the process serves on", function()
      -- several times: the connections land on both workers
      for i = 1, 4 do
        local id = ("%s-%d"):format(name, i)
        -- /healthz while the hostile request runs
        local bg = P.start(("curl -sS -o /dev/null -w '%%{http_code}' --max-time 10 %s"):format(
          P.quote(gw.admin .. "/healthz")))
        local status, _, body = request(case.prompt, id)
        assert.equal(200, status, body)
        P.wait(bg)
        assert.equal("200", (P.read(bg.out) or ""):match("%d+"))
        local _, _, text = P.get(gw.admin .. "/admin/explain/" .. id)
        local x = json.decode(text)
        local e = x.errors[1]
        assert.same({ "hostile", "hostile-filter", "filter" }, { e.plugin, e.type, e.point })
        local cut = e.message:find("exceeded its budget of 5 ms in filter", 1, true)
        if case.cut then
          assert.truthy(cut, e.message)
        elseif not cut then
          assert.truthy(e.message:find(case.error, 1, true), e.message)
        end
        -- a recursion may meet the budget before the C stack's end on a
        -- slow build (ThreadSanitizer's): skipped all the same, counted as a cut
        cuts = cuts + (cut and 1 or 0)
        healthy()
      end
      assert.equal(cuts, P.metric(gw, 'lupin_plugin_budget_cuts_total{plugin="hostile",'
        .. 'type="hostile-filter",point="filter"}') or 0)
    end)
  end

  it("keeps serving: other requests answered, no request state leaked, a clean exit", function()
    healthy()
    -- both workers' threads took requests (each runs its own Lua state)
    local counts, text = P.worker_requests(gw)
    assert.truthy((counts[0] or 0) > 0 and (counts[1] or 0) > 0, text)
    local status, _, body = P.post(gw.admin, "/admin/leaks", "")
    assert.equal(200, status, body)
    assert.equal(0, json.decode(body).leaked, body)
    -- the log: a plugin's errors are logged once a second per worker (the
    -- rest counted as suppressed); past that second, a cut is logged
    P.run("sleep 1.2")
    assert.equal(200, (request(HOSTILE.bomb.prompt, "bomb-logged")))
    P.poll(function()
      return (P.read(gw.err) or ""):find("request bomb-logged: plugin hostile (hostile-filter) "
        .. 'failed in filter: plugin "hostile" (hostile-filter) exceeded its budget of 5 ms in'
        .. " filter", 1, true)
    end, "the cut in the log")
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
  end)
end)
