-- The error policy of DESIGN.md §4: what each kind of plugin error does to the
-- request, and the counters and logs it leaves.
local S = require "support"

local function profile(...)
  local refs = {}
  for i, name in ipairs({ ... }) do
    refs[i] = type(name) == "table" and name or { pluginRef = name }
  end
  return { { name = "default", plugins = refs } }
end

local function stat(rt, plugin, point)
  for _, s in ipairs(rt:plugin_stats()) do
    if s.plugin == plugin and s.point == point then
      return s
    end
  end
  return { calls = 0, errors = 0 }
end

local function last_scores(rt)
  return S.eval(rt, [[return require("lupin.runtime").current.by_name.p.obj.last_scores]])
end

local function log_text(rt)
  local lines = {}
  for _, l in ipairs(rt:logs()) do
    lines[#lines + 1] = l[2]
  end
  return table.concat(lines, "\n")
end

describe("error policy", function()
  local rt
  after_each(function()
    rt:free()
  end)

  describe("scorers", function()
    local function run(bad_params, weight)
      rt = S.loaded({
        plugins = {
          { type = "test-scorer", name = "good", parameters = { byIndex = { 0.25, 0.75 } } },
          { type = "test-scorer", name = "bad", parameters = bad_params },
          { type = "test-picker", name = "p" },
        },
        schedulingProfiles = profile("good", { pluginRef = "bad", weight = weight or 2 }, "p"),
      })
      S.endpoints(rt, 2)
      return S.lifecycle(rt)
    end

    for _, case in ipairs({
      { "raises an error", { fail = true }, "scorer exploded" },
      { "returns a string", { bad = "string" }, "got string" },
      { "returns too few scores", { bad = "short" }, "score 2 of 2 is nil" },
      { "returns non-numbers", { bad = "table" }, "score 1 of 2 is table" },
    }) do
      it("contribute 0 when one " .. case[1] .. ", counted and logged", function()
        local res = run(case[2])
        assert.equal(200, res.status)
        assert.same({ 0.25, 0.75 }, last_scores(rt))
        assert.equal("ep2", res.picks[1].name)
        local st = stat(rt, "bad", "score")
        assert.same({ 1, 1 }, { st.calls, st.errors })
        assert.equal(0, stat(rt, "good", "score").errors)
        local logs = log_text(rt)
        assert.matches("plugin bad (test-scorer) failed in score", logs, 1, true)
        assert.matches(case[3], logs, 1, true)
      end)
    end

    it("count NaN as 0 without an error", function()
      run({ bad = "nan" })
      assert.same({ 0.25, 0.75 }, last_scores(rt))
      assert.equal(0, stat(rt, "bad", "score").errors)
    end)

    it("are clamped to [0, 1] and weighted", function()
      run({ byIndex = { -3, 7 } }, 3)
      assert.same({ 0.25, 0.75 + 3 }, last_scores(rt))
      rt:free()
      run({ byIndex = { 0.5, 0.125 } }, 4)
      assert.same({ 0.25 + 2, 0.75 + 0.5 }, last_scores(rt))
    end)

    it("default to weight 1", function()
      rt = S.loaded({
        plugins = {
          { type = "test-scorer", name = "a", parameters = { byIndex = { 0.5, 0.25 } } },
          { type = "test-scorer", name = "b", parameters = { byIndex = { 0.25, 0.5 } } },
          { type = "test-picker", name = "p" },
        },
        schedulingProfiles = profile("a", "b", "p"),
      })
      S.endpoints(rt, 2)
      S.lifecycle(rt)
      assert.same({ 0.75, 0.75 }, last_scores(rt))
    end)
  end)

  describe("filters", function()
    for _, case in ipairs({
      { "raises an error", { fail = true }, "filter exploded" },
      { "returns something not a list", { bad = true }, "must return a list of endpoints" },
    }) do
      it("are skipped when one " .. case[1], function()
        rt = S.loaded({
          plugins = {
            { type = "test-filter", name = "broken", parameters = case[2] },
            { type = "test-filter", name = "keep2", parameters = { keep = 2 } },
            { type = "test-picker", name = "p" },
          },
          schedulingProfiles = profile("broken", "keep2", "p"),
        })
        S.endpoints(rt, 3)
        local res = S.lifecycle(rt)
        assert.equal(200, res.status)
        assert.equal(2, #res.picks) -- keep2 worked on the unfiltered list
        assert.same({ 1, 1 }, { stat(rt, "broken", "filter").calls,
          stat(rt, "broken", "filter").errors })
        assert.matches(case[3], log_text(rt), 1, true)
      end)
    end
  end)

  describe("pickers", function()
    for _, case in ipairs({
      { "raises an error", { fail = true }, 500, "picker exploded" },
      { "returns something not an endpoint", { bad = true }, 500, "not an endpoint" },
      { "picks nothing", { none = true }, 503, "picked none" },
    }) do
      it("fail the request when one " .. case[1] .. ", naming it", function()
        rt = S.loaded({
          plugins = { { type = "test-picker", name = "p", parameters = case[2] } },
          schedulingProfiles = profile("p"),
        })
        S.endpoints(rt, 2)
        local res = S.lifecycle(rt)
        assert.equal(case[3], res.status)
        assert.equal("p", res.plugin)
        assert.matches('"p"', res.message, 1, true)
        assert.matches(case[4], res.message, 1, true)
        assert.equal(case[3] == 500 and 1 or 0, stat(rt, "p", "pick").errors)
      end)
    end
  end)

  describe("profile handlers", function()
    for _, case in ipairs({
      { "pick_profiles", "handler exploded" },
      { "process_results", "results exploded" },
      { "unknown", 'unknown profile "no-such-profile"' },
      { "twice", 'profile "A" twice' },
    }) do
      it("fail the request with 500 naming the handler: " .. case[1], function()
        rt = S.loaded({
          plugins = {
            { type = "test-handler", name = "h", parameters = { fail = case[1] } },
            { type = "test-picker", name = "p" },
          },
          schedulingProfiles = { { name = "A", plugins = { { pluginRef = "p" } } },
            { name = "B", plugins = { { pluginRef = "p" } } } },
        })
        S.endpoints(rt, 2)
        local res = S.lifecycle(rt)
        assert.equal(500, res.status)
        assert.equal("h", res.plugin)
        assert.matches('profile handler "h" failed', res.message, 1, true)
        assert.matches(case[2], res.message, 1, true)
        assert.equal(0, (rt:check_leaks()))
      end)
    end

    it("fail the request when the primary names a profile that did not run", function()
      rt = S.loaded({
        plugins = {
          { type = "test-handler", name = "h", parameters = { primary = "C" } },
          { type = "test-picker", name = "p" },
        },
        schedulingProfiles = { { name = "A", plugins = { { pluginRef = "p" } } },
          { name = "B", plugins = { { pluginRef = "p" } } } },
      })
      S.endpoints(rt, 1)
      local res = S.lifecycle(rt)
      assert.equal(500, res.status)
      assert.matches("must name a profile that ran", res.message, 1, true)
    end)
  end)

  describe("request-control plugins", function()
    local points = { "admit", "prepare", "pre_request", "response_header", "response_chunk",
      "response_complete", "finish" }
    for _, point in ipairs(points) do
      it("are counted and logged when " .. point .. " fails, and the request proceeds", function()
        rt = S.loaded({
          plugins = {
            { type = "test-observer", name = "obs", parameters = { fail = { point } } },
            { type = "test-picker", name = "p" },
          },
          schedulingProfiles = profile("p"),
        })
        S.endpoints(rt, 1)
        local req = rt:begin({ id = "rc-" .. point })
        local res = req:schedule()
        assert.equal(200, res.status)
        req:response_header(200, {})
        req:response_chunk("data")
        req:response_complete()
        req:finish("ok")
        assert.equal(1, stat(rt, "obs", point).errors)
        local logs = log_text(rt)
        assert.matches("request rc-" .. point .. ": plugin obs (test-observer) failed in "
          .. point, logs, 1, true)
        assert.equal(0, (rt:check_leaks()))
      end)
    end
  end)

  it("rate-limits repeated error logs", function()
    rt = S.loaded({
      plugins = {
        { type = "test-scorer", name = "bad", parameters = { fail = true } },
        { type = "test-picker", name = "p" },
      },
      schedulingProfiles = profile("bad", "p"),
    })
    S.endpoints(rt, 1)
    for _ = 1, 200 do
      S.lifecycle(rt)
    end
    assert.equal(200, stat(rt, "bad", "score").errors)
    local n = 0
    for _, l in ipairs(rt:logs()) do
      if l[2]:find("failed in score", 1, true) then
        n = n + 1
      end
    end
    assert.is_true(n >= 1 and n < 10, "logged " .. n .. " lines for 200 errors")
  end)

  it("counts call time per plugin and extension point", function()
    rt = S.loaded({
      plugins = { { type = "test-scorer", name = "s" }, { type = "test-picker", name = "p" } },
      schedulingProfiles = profile("s", "p"),
    })
    S.endpoints(rt, 4)
    for _ = 1, 10 do
      S.lifecycle(rt)
    end
    local st = stat(rt, "s", "score")
    assert.equal(10, st.calls)
    assert.equal("test-scorer", st.type)
    assert.is_true(st.nanoseconds > 0)
    assert.equal(10, stat(rt, "single-profile-handler", "process_results").calls)
  end)

  describe("the memory limit", function()
    it("fails the plugin call that goes over it, not the process", function()
      local limit = 16 * 1024 * 1024
      rt = S.runtime({ memory_limit = limit })
      assert(rt:load_string(S.json.encode({
        plugins = {
          { type = "test-observer", name = "hog", parameters = { allocate = 64 * 1024 * 1024 } },
          { type = "test-observer", name = "fine" },
          { type = "test-picker", name = "p" },
        },
        schedulingProfiles = profile("p"),
      })))
      S.endpoints(rt, 2)
      for _ = 1, 3 do
        local res = S.lifecycle(rt)
        assert.equal(200, res.status) -- admit failing does not stop the request
      end
      assert.equal(3, stat(rt, "hog", "admit").errors)
      assert.equal(0, stat(rt, "fine", "admit").errors)
      assert.equal(3, stat(rt, "fine", "finish").calls)
      assert.matches("not enough memory", log_text(rt), 1, true)
      local s = rt:stats()
      assert.is_true(s.memory_limit_hits >= 3)
      assert.is_true(s.lua_memory < limit)
      assert.equal(0, (rt:check_leaks()))
    end)

    it("lets the same plugin allocate under the limit", function()
      -- 1 MB of garbage a call waits for the collector, which lets the heap
      -- grow to twice what is live before it runs: 64 MB leaves that room
      -- (at 16 MB one refusal came on a fresh machine's timing)
      rt = S.runtime({ memory_limit = 64 * 1024 * 1024 })
      assert(rt:load_string(S.json.encode({
        plugins = {
          { type = "test-observer", name = "hog", parameters = { allocate = 1024 * 1024 } },
          { type = "test-picker", name = "p" },
        },
        schedulingProfiles = profile("p"),
      })))
      S.endpoints(rt, 1)
      for _ = 1, 20 do
        S.lifecycle(rt)
      end
      assert.equal(0, stat(rt, "hog", "admit").errors)
      assert.equal(0, rt:stats().memory_limit_hits)
    end)
  end)
end)
