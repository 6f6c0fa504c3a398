-- lupin.testing, the plugin authors' harness: every function, on the
-- fixtures of spec/fixtures/testing (real runtimes, the serving sandbox and
-- budgets).
local testing = require "lupin.testing"

local DIR = (os.getenv("PWD") or ".") .. "/spec/fixtures/testing"
local Q = DIR .. "/queue-scorer-x.lua"

-- q: the fixture scorer (threshold 2) in the default profile with max-score-picker
local function q_config(extra)
  local plugins = { { type = "queue-scorer-x", name = "q", parameters = { threshold = 2 } },
    { type = "max-score-picker", name = "pick" } }
  for _, p in ipairs(extra or {}) do
    plugins[#plugins + 1] = p
  end
  return { plugins = plugins, schedulingProfiles = { { name = "default",
    plugins = { { pluginRef = "q" }, { pluginRef = "pick" } } } } }
end

local LOADS = { { name = "a", waiting_queue_size = 3 }, { name = "b", waiting_queue_size = 1 },
  { name = "c" } }

describe("lupin.testing", function()
  local t
  after_each(function()
    if t then
      t:free()
      t = nil
    end
  end)

  describe("new", function()
    it("loads one plugin file alone in the default profile", function()
      t = testing.new { plugins = Q }
      t:endpoints(2)
      assert.same({ 1, 1 }, t:call("queue-scorer-x", "score").scores)
    end)

    it("takes a plugin directory and a config table", function()
      t = testing.new { plugins = DIR, config = q_config() }
      assert.equal(2, t:state("q", "self.params.threshold"))
    end)

    it("takes a YAML config file", function()
      t = testing.new { plugins = DIR, config = DIR .. "/config.yaml" }
      assert.equal(2, t:state("q", "self.params.threshold"))
    end)

    it("loads an operator's config with lupin serve's gateway section as it is", function()
      local cfg = q_config()
      cfg.gateway = { refreshIntervalMs = 100, maxLuaMemoryBytes = 64 * 1024 * 1024 }
      t = testing.new { plugins = DIR, config = cfg }
      assert.equal(2, t:state("q", "self.params.threshold"))
      t:free()
      local file = os.tmpname() .. ".yaml"
      local f = assert(io.open(file, "w"))
      f:write("plugins:\n- {type: queue-scorer-x, name: q, parameters: {threshold: 3}}\n",
        "- {type: max-score-picker, name: pick}\ngateway:\n  poolSize: 0\n")
      f:close()
      t = testing.new { plugins = DIR, config = file }
      os.remove(file)
      assert.equal(3, t:state("q", "self.params.threshold"))
    end)

    it("raises the config's error with file, line and field", function()
      local ok, err = pcall(testing.new, { plugins = DIR, config = DIR .. "/config.json" })
      assert.is_false(ok)
      assert.matches("config.json:3: plugins[0].parameters.threshold: ", err, 1, true)
    end)

    it("finds relative paths in the plugin folders of lupin test", function()
      -- what `lupin test` sets for the author's folder
      local saved = os.getenv("LUPIN_TEST_PLUGINS")
      assert.is_nil(saved) -- run by the repository's busted, not lupin test
      local getenv = os.getenv
      os.getenv = function(k) -- luacheck: ignore 122
        return k == "LUPIN_TEST_PLUGINS" and DIR or getenv(k)
      end
      local ok, res = pcall(testing.new, { plugins = "queue-scorer-x.lua" })
      os.getenv = getenv -- luacheck: ignore 122
      assert.is_true(ok, res)
      t = res
      assert.same({ DIR }, t.plugin_dirs)
    end)

    it("loads no config from a folder alone: calls say so", function()
      t = testing.new { plugins = DIR }
      assert.has_error(function() t:call("q", "score") end,
        "lupin.testing: no config loaded: load one first (testing.new{config = ...} or t:load)")
      assert.is_true(t:load(q_config()))
      assert.is_true(t:call("q", "score").ok)
    end)

    it("refuses bad arguments with a clear error", function()
      local cases = {
        { 42, "new takes a table of options, got number" },
        { { plugins = 7 }, "plugins must be a path or a list of paths, got number" },
        { { plugins = { DIR, false } }, "plugins must be a path or a list of paths, got a boolean" },
        { { plugins = "/nonexistent/x.lua" }, "plugin file /nonexistent/x.lua not found" },
        { { plugins = "/nonexistent" }, "plugin directory /nonexistent not found" },
        { { plugins = DIR, config = 3 }, "config must be a table or a file name, got number" },
        { { plugins = DIR, config = "/nonexistent.json" }, "config file /nonexistent.json not found" },
        { { plugins = DIR, memory_limit = -1 }, "memory_limit must be a number ≥ 0, got -1" },
      }
      for _, c in ipairs(cases) do
        local ok, err = pcall(function() local h = testing.new(c[1]); return h end)
        assert.is_false(ok)
        assert.matches("lupin.testing: " .. c[2], err, 1, true)
        assert.matches("testing_spec.lua:%d+:", err) -- blamed on the caller's line
      end
    end)

    it("reports a sandbox violation when a plugin file loads", function()
      local ok, err = pcall(testing.new, { plugins = DIR .. "/bad/exec-at-load.lua" })
      assert.is_false(ok)
      assert.matches("os.execute is not available to plugins (sandbox", err, 1, true)
      assert.matches("exec-at-load.lua:2:", err, 1, true)
    end)
  end)

  describe("load", function()
    it("reloads with a new config, or returns the error", function()
      t = testing.new { plugins = DIR, config = q_config() }
      local cfg = q_config()
      cfg.plugins[1].parameters.threshold = 9
      assert.is_true(t:load(cfg))
      assert.equal(9, t:state("q", "self.params.threshold"))
      local ok, err = t:load({ plugins = { { type = "no-such-type" } } })
      assert.is_nil(ok)
      assert.matches('unknown plugin type "no-such-type"', err, 1, true)
      assert.equal(9, t:state("q", "self.params.threshold")) -- the old one still serves
      assert.has_error(function() t:load(5) end, "lupin.testing: load takes a table or a file name,"
        .. " got number")
    end)
  end)

  describe("endpoints", function()
    it("makes the pool exactly the list, metrics, labels and health included", function()
      t = testing.new { plugins = DIR, config = q_config() }
      t:endpoints(3)
      t:endpoints { { name = "x", labels = { role = "decode" }, waiting_queue_size = 5,
        running_lora_adapters = { "l1", "l2" } }, { name = "y", healthy = false } }
      local seen = t:call("q", "score", {})
      assert.same({ "x" }, seen.endpoints) -- y is no candidate, ep1..3 are gone
      assert.same({ 1 / 6 }, seen.scores)
      assert.equal("decode", t:state("q", [[
        local pool = require("lupin.runtime.pool")
        return pool.list[1].labels.role .. "", pool.list[1].active_adapters.l2]]))
      t:set_healthy("y", true)
      t:set_metrics("y", { waiting_queue_size = 1 })
      assert.same({ 1 / 6, 0.5 }, t:call("q", "score").scores)
    end)

    it("refuses bad endpoints and unknown names", function()
      t = testing.new { plugins = DIR, config = q_config() }
      assert.has_error(function() t:endpoints("x") end,
        "lupin.testing: endpoints takes a list of endpoints or a number, got string")
      assert.has_error(function() t:endpoints({ 5 }) end,
        "lupin.testing: endpoint 1 must be a table, got number")
      assert.has_error(function() t:endpoints({ { port = 70000 } }) end)
      assert.has_error(function() t:endpoints({ { waiting_queue_size = "3" } }) end,
        "lupin.testing: endpoint ep1: waiting_queue_size must be a number, got string")
      assert.has_error(function() t:set_metrics("nope", {}) end,
        "lupin.testing: no endpoint named nope")
      assert.has_error(function() t:set_healthy("nope", true) end,
        "lupin.testing: no endpoint named nope")
    end)
  end)

  describe("call", function()
    before_each(function()
      t = testing.new { plugins = DIR, config = q_config() }
      t:endpoints(LOADS)
    end)

    it("score: the scores as returned, in candidate order, every digit kept", function()
      local out = t:call("q", "score")
      assert.is_true(out.ok)
      assert.same({ 0.25, 0.5, 1 }, out.scores)
      assert.same({ "a", "b", "c" }, out.endpoints)
      assert.same({ scored = 3 }, out.plugin)
      assert.same({ "debug: request probe-1 [q] scored 3" }, out.logs)
      out = t:call("q", "score", { endpoints = { "c", "a" } })
      assert.same({ 1, 0.25 }, out.scores)
      t:set_metrics("a", { waiting_queue_size = 2 })
      assert.equal(1 / 3, t:call("q", "score").scores[1]) -- not 0.33333333333333
    end)

    it("filter: the names kept, and the profile's cycle table", function()
      local out = t:call("q", "filter")
      assert.same({ "b", "c" }, out.kept)
      assert.same({ filtered = 1 }, out.cycle)
    end)

    it("pick: the names picked from the scores given", function()
      assert.same({ "b" }, t:call("pick", "pick", { scores = { 0.1, 0.9, 0.5 } }).picked)
    end)

    it("admit: the verdict, status and reason from the request's headers", function()
      assert.is_true(t:call("q", "admit").admitted)
      local out = t:call("q", "admit", { request = { headers = { ["X-Block"] = "1" } } })
      assert.is_false(out.admitted)
      assert.equal(403, out.status)
      assert.equal("blocked by x-block", out.reason)
    end)

    it("prepare: what it leaves in ctx.shared", function()
      assert.same({ prompt_len = 5 }, t:call("q", "prepare").shared) -- "Hello" by default
      assert.same({ prompt_len = 5 }, t:call("q", "prepare", { request = { prompt = "hello" } })
        .shared)
      local chat = t:call("q", "prepare", { request = { messages = {
        { role = "user", content = "hi" } } } }).shared
      assert.equal(#'[{"role":"user","content":"hi"}]', chat.prompt_len) -- the messages' JSON
    end)

    it("pre_request and the response points: headers, state, one request kept", function()
      local out = t:call("q", "pre_request", { result = { "b" }, keep = "r1" })
      assert.same({ ["x-picked"] = "b" }, out.upstream_headers)
      assert.same({ b = 1 }, t:state("q", "self.picked"))
      out = t:call("q", "response_header", { keep = "r1", response = { status = 201 } })
      assert.same({ ["x-upstream-status"] = "201" }, out.response_headers)
      t:call("q", "response_chunk", { keep = "r1", chunk = "abc" })
      t:call("q", "response_chunk", { keep = "r1", chunk = "de" })
      out = t:call("q", "response_complete", { keep = "r1" })
      assert.same({ bytes = 5, complete = true }, out.plugin)
      out = t:call("q", "finish", { keep = "r1", outcome = "upstream_error" })
      assert.is_true(out.ok)
      assert.same({ finished = 1, last_outcome = "upstream_error" },
        t:state("q", "{ finished = self.finished, last_outcome = self.last_outcome }"))
      -- finish ended it: the next call with that key starts a new request
      assert.is_nil(t:call("q", "response_complete", { keep = "r1" }).plugin.bytes)
      t:assert_no_leaks()
    end)

    it("pick_profiles: the profiles the handler runs", function()
      assert.same({ "default" }, t:call("single-profile-handler", "pick_profiles").profiles)
      assert.same({}, t:call("single-profile-handler", "pick_profiles",
        { results = { default = { "a" } } }).profiles)
    end)

    it("reports a plugin error without raising it", function()
      t:endpoints({})
      local out = t:call("pick", "pick")
      assert.is_true(out.ok)
      assert.same({}, out.picked)
      out = t:call("q", "pre_request", { result = {} })
      assert.is_false(out.ok)
      assert.matches("queue%-scorer%-x.lua:%d+: attempt to index local 'ep'", out.error)
    end)

    it("refuses unknown plugins, points and endpoints, and bad arguments", function()
      local cases = {
        { { "nope", "score" }, 'no plugin named "nope" in the loaded config; it has q '
          .. "(queue-scorer-x), pick (max-score-picker)" },
        { { "pick", "score" }, 'plugin "pick" (max-score-picker) has no score' },
        { { "q", "score", { endpoints = { "zz" } } }, 'no healthy endpoint named "zz" in the pool' },
        { { 1, "score" }, "call: the plugin name must be a string, got number" },
        { { "q", nil }, "call: the point must be a string, got nil" },
        { { "q", "score", "x" }, "call: args must be a table, got string" },
        { { "q", "score", { request = 1 } }, "a request must be a table, got number" },
        { { "q", "score", { f = print } }, "cannot pass a function to the runtime" },
      }
      for _, c in ipairs(cases) do
        local ok, err = pcall(t.call, t, c[1][1], c[1][2], c[1][3])
        assert.is_false(ok)
        assert.matches("lupin.testing: " .. c[2], err, 1, true)
      end
    end)
  end)

  describe("serving limits", function()
    it("cuts a plugin over its CPU budget, as serving does", function()
      t = testing.new { plugins = DIR, config = { plugins = { { type = "spin-scorer", name = "s" },
        { type = "max-score-picker" } }, budgets = { callMs = 20 } } }
      t:endpoints(2)
      -- in a whole request the scorer contributes 0 and the request goes on
      local res = t:lifecycle()
      assert.equal(200, res.status)
      assert.matches('plugin s (spin-scorer) failed in score: plugin "s" (spin-scorer) exceeded'
        .. " its budget of 20 ms in score", res.errors[1], 1, true)
      local out = t:call("s", "score")
      assert.is_false(out.ok)
      assert.equal('plugin "s" (spin-scorer) exceeded its budget of 20 ms in score', out.error)
      local cuts = 0
      for _, st in ipairs(t:stats()) do
        if st.plugin == "s" then
          cuts = cuts + st.cuts
        end
      end
      assert.equal(2, cuts)
    end)

    it("reports a sandbox violation in a call", function()
      t = testing.new { plugins = DIR .. "/escape-scorer.lua" }
      t:endpoints(1)
      local out = t:call("escape-scorer", "score")
      assert.is_false(out.ok)
      assert.matches("escape-scorer.lua:5: io is not available to plugins (sandbox", out.error, 1,
        true)
    end)

    it("fails an allocation over the memory limit", function()
      t = testing.new { plugins = DIR, memory_limit = 64 * 1024 * 1024,
        config = { plugins = { { type = "hog-scorer", maxCallMs = 60000 } } } }
      t:endpoints(1)
      local out = t:call("hog-scorer", "score")
      assert.is_false(out.ok)
      assert.matches("not enough memory", out.error, 1, true)
      assert.is_true(t:runtime_stats().memory_limit_hits > 0)
      -- the default is serve's limit: 1 GiB
      assert.equal(1024 * 1024 * 1024, testing.DEFAULT_MEMORY_LIMIT)
    end)

    it("catches a plugin that keeps request state, and names it", function()
      t = testing.new { plugins = DIR .. "/stash-scorer.lua" }
      t:endpoints(2)
      t:lifecycle({ id = "leak-1" })
      local n, report = t:leaks()
      assert.equal(1, n)
      assert.matches('plugin "stash-scorer" (stash-scorer) holds state of ended request leak-1 at '
        .. "globals.kept[1]", report, 1, true)
      local ok, err = pcall(t.assert_no_leaks, t)
      assert.is_false(ok)
      assert.matches("1 ended request(s) still held", err, 1, true)
      -- a single call's request is checked too
      t:call("stash-scorer", "score", { request = { id = "leak-2" } })
      assert.equal(2, (t:leaks()))
    end)
  end)

  describe("requests", function()
    before_each(function()
      t = testing.new { plugins = DIR, config = q_config() }
      t:endpoints(LOADS)
    end)

    it("schedule: picks, headers, and each profile's weighted scores", function()
      local res = t:schedule()
      assert.equal(200, res.status)
      assert.same({ "c" }, res.picks)
      assert.same({ ["x-picked"] = "c" }, res.headers)
      assert.equal("default", res.primary)
      assert.same({ "b", "c" }, res.profiles.default.candidates) -- a filtered out
      assert.same({ b = 0.5, c = 1 }, res.profiles.default.scores)
    end)

    it("schedule: a rejected request's status and message", function()
      local res = t:schedule({ headers = { ["x-block"] = "yes" } })
      assert.equal(403, res.status)
      assert.equal("blocked by x-block", res.message)
      assert.equal("q", res.plugin)
      assert.same({}, res.picks)
    end)

    it("lifecycle: every point in order, the client's headers, finish", function()
      local res = t:lifecycle({ body = { model = "m", prompt = "hi" } },
        { status = 200, chunks = { "ab", "cde" }, outcome = "ok" })
      assert.same({ "c" }, res.picks)
      assert.same({ ["x-upstream-status"] = "200" }, res.client_headers)
      assert.same({}, res.errors)
      assert.equal(1, t:state("q", "self.finished"))
      assert.equal("ok", t:state("q", "self.last_outcome"))
      t:assert_no_leaks()
    end)

    it("begin: step by step", function()
      local r = t:begin({ prompt = "step" })
      local res = r:schedule()
      assert.same({ "c" }, res.picks)
      assert.same({ ["x-upstream-status"] = "503" }, r:response_header(503))
      r:response_chunk("x")
      r:response_complete()
      assert.equal(0, t:state("q", "self.finished"))
      r:finish("upstream_error")
      assert.equal("upstream_error", t:state("q", "self.last_outcome"))
    end)

    it("logs and stats accumulate", function()
      t:lifecycle()
      t:call("q", "score")
      local logs = t:logs()
      assert.equal(2, #logs)
      assert.matches("^debug: request .* %[q%] scored 2$", logs[1])
      local calls = {}
      for _, st in ipairs(t:stats()) do
        calls[st.plugin .. "/" .. st.point] = st.calls
      end
      assert.equal(2, calls["q/score"]) -- the probe's call counts too
      assert.equal(1, calls["q/finish"])
    end)
  end)

  describe("state", function()
    it("copies the instance, endpoints as names; refuses bad arguments", function()
      t = testing.new { plugins = DIR, config = q_config() }
      t:endpoints(LOADS)
      t:schedule()
      assert.same({ c = 1 }, t:state("q").picked)
      assert.equal("a", t:state("q", "return require('lupin.runtime.pool').list[1]"))
      assert.has_error(function() t:state(3) end,
        "lupin.testing: state: the plugin name must be a string, got number")
      assert.has_error(function() t:state("q", 3) end,
        "lupin.testing: state: expr must be a string, got number")
      assert.has_error(function() t:state("zz") end)
    end)
  end)

  describe("free", function()
    it("frees once; a freed harness refuses calls", function()
      t = testing.new { plugins = DIR, config = q_config() }
      t:free()
      t:free()
      assert.has_error(function() t:endpoints(1) end)
      t = nil
    end)
  end)
end)
