local S = require "support"
local P = require "prefix_support"

-- decode: ep1, ep2; prefill: ep3, ep4.  The prefix scorer and the cycle probe
-- run in both profiles.
local function pd(params, opts)
  opts = opts or {}
  local function profile(name, role)
    return { name = name, plugins = { { pluginRef = role .. "-filter" },
      { pluginRef = "prefix-cache-scorer" }, { pluginRef = "spec-cycle-probe" },
      { pluginRef = "spec-scores-picker" } } }
  end
  return {
    plugins = {
      { type = "pd-profile-handler", parameters = params },
      { type = "prefill-header-handler" },
      { type = "prefix-cache-scorer", parameters = { blockSize = 4, autoTune = false } },
      { type = "spec-role-filter", name = "decode-filter",
        parameters = { role = opts.decode_role or "decode" } },
      { type = "spec-role-filter", name = "prefill-filter",
        parameters = { role = opts.prefill_role or "prefill" } },
      { type = "spec-cycle-probe" },
      { type = "spec-scores-picker" },
    },
    schedulingProfiles = { profile("decode", "decode"), profile("prefill", "prefill") },
  }
end

local ROLES = { { labels = { ["llm-d.ai/role"] = "decode" } }, { labels = { ["llm-d.ai/role"] = "decode" } },
  { labels = { ["llm-d.ai/role"] = "prefill" } }, { labels = { ["llm-d.ai/role"] = "prefill" } } }

local function hashed(rt)
  return S.eval(rt, [[ return require("lupin.prefix").counters.hashed ]])
end

describe("pd-profile-handler", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  local function start(params, opts)
    rt = S.loaded(pd(params, opts))
    S.endpoints(rt, 4, ROLES)
  end

  it("has llm-d's defaults", function()
    assert.same({ decodeProfile = "decode", prefillProfile = "prefill",
      prefixPluginName = "prefix-cache-scorer", hashBlockSize = 64, primaryPort = 0 },
      P.defaults("pd-profile-handler"))
  end)

  it("refuses parameters out of bounds with config errors", function()
    local function err(params)
      local r = S.runtime()
      local ok, e = r:load_string(S.json.encode(pd(params)), "spec.json")
      r:free()
      assert.is_nil(ok)
      return e
    end
    assert.matches("parameters.threshold: must be an integer ≥ 0, got %-1", err({ threshold = -1 }))
    assert.matches("parameters.hashBlockSize: must be an integer ≥ 1, got 0", err({ hashBlockSize = 0 }))
    assert.matches("parameters.decodeProfile: must be a string, got 5", err({ decodeProfile = 5 }))
    assert.matches("parameters.primaryPort: must be an integer between 0 and 65535, got 65536",
      err({ primaryPort = 65536 }))
    assert.matches("parameters.primaryPort: must be an integer between 0 and 65535, got %-10",
      err({ primaryPort = -10 }))
    assert.matches("parameters.primaryPort: must be an integer", err({ primaryPort = 8080.5 }))
  end)

  it("runs decode then prefill, decode primary, each profile with its own cycle state", function()
    start({ threshold = 1 })
    local before = hashed(rt)
    local pick, decode, res = P.request(rt, "aaaabbbb", { profile = "decode" })
    assert.equal(200, res.status)
    assert.equal("ep1", pick)
    assert.same({ ep1 = 0, ep2 = 0 }, decode)
    assert.same({ ep3 = 0, ep4 = 0 }, P.scores(res.headers["x-spec-scores-prefill"]))
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    -- the probe found its profile's cycle state empty in both profiles
    assert.equal("decode:nil,prefill:nil", res.headers["x-spec-cycle"])
    -- the prefix scorer hashed the prompt once for both profiles
    assert.equal(before + 1, hashed(rt))
  end)

  it("records the prompt on the decode and the prefill endpoint (state from score to pre_request)",
    function()
      start({ threshold = 1 })
      P.request(rt, "aaaabbbb")
      -- one uncached character more, so that prefill runs again
      local _, decode, res = P.request(rt, "aaaabbbbX", { profile = "decode" })
      assert.same({ ep1 = 1, ep2 = 0 }, decode)
      assert.same({ ep3 = 1, ep4 = 0 }, P.scores(res.headers["x-spec-scores-prefill"]))
      local n, report = rt:check_leaks()
      assert.equal(0, n, report)
    end)

  it("leaves no request state behind after many requests, JIT-compiled paths included", function()
    start({ threshold = 1 })
    for i = 1, 300 do
      P.request(rt, ("p%d-aaaabbbb"):format(i % 7))
    end
    local n, report = rt:check_leaks()
    assert.equal(0, n, report)
    assert.equal(0, rt:stats().live_requests)
  end)

  -- llm-d-inference-scheduler v0.4 pkg/plugins/profile/pd_profile_handler.go, Pick:
  -- `if h.pdThreshold > 0 { ...decide... }`, else the prefill profile runs;
  -- pd_profile_handler_test.go TestPdProfileHandlerFactory "threshold = 0 is allowed".
  it("always runs prefill with threshold 0, the default, cached or not", function()
    start({})
    for _ = 1, 2 do -- the second time the whole prompt is cached on ep1
      local pick, _, res = P.request(rt, "aaaabbbbcccc")
      assert.equal(200, res.status)
      assert.equal("ep1", pick)
      assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    end
  end)

  -- TestPdProfileHandler_Pick "pd threshold triggered (short non-cached suffix)" and
  -- "NOT triggered": prompt "hello world" (11 characters), 16-character blocks,
  -- threshold 5 and 100.  Upstream discounts the first matched block as "the model
  -- name" (a leftover of a hash layout it no longer has); lupin counts every
  -- matched block (plugins/README.md), so one matched block already covers it.
  it("counts every matched block as cached (no block discounted for the model)", function()
    local function pick(threshold, matches)
      return S.eval(rt, ([[
        local m = require("lupin.generation.loader").load(%q, "pd-profile-handler")
        local self = m.new(assert(require("lupin.schema").validate(m.schema,
          { threshold = %d, hashBlockSize = 16 })))
        local ep = { id = 7 }
        local ctx = { request = { prompt = "hello world" }, shared = { ["prefix-cache-scorer"] =
          { block_size = 16, prompt_length = 11, matches = { [7] = %d } } } }
        local profiles = { decode = {}, prefill = {} }
        return m.pick_profiles(self, ctx, profiles, { decode = { endpoints = { ep } } })
      ]]):format(S.ROOT .. "/plugins/pd-profile-handler.lua", threshold, matches))
    end
    rt = S.runtime()
    assert.same({}, pick(100, 5)) -- upstream too: decode only
    assert.same({}, pick(5, 1)) -- upstream: prefill (it counts 1 - 1 = 0 blocks)
    assert.same({ "prefill" }, pick(5, 0))
    assert.same({ "prefill" }, pick(0, 5))
  end)

  -- llm-d-router .../profilehandler/disagg/pd_profile_handler_test.go,
  -- TestPdProfileHandler_Pick with its prefix-based-pd-decider (nonCachedTokens
  -- 4): prompt "hello world hello world hello world" (35 characters, 8 tokens),
  -- 2 tokens cached on the decode endpoint → prefill, 5 → decode only; and the
  -- decode-not-run, decode-failed and all-done cases.
  it("asks the decider deciderPluginName names, as TestPdProfileHandler_Pick", function()
    rt = S.runtime()
    local out = S.eval(rt, ([[
      local loader, schema = require "lupin.generation.loader", require "lupin.schema"
      local d = loader.load(%q, "prefix-based-pd-decider")
      local dec = setmetatable(d.new(assert(schema.validate(d.schema, { nonCachedTokens = 4 })),
        { log = function() end }), { __index = d })
      local m = loader.load(%q, "pd-profile-handler")
      local self = setmetatable(m.new(assert(schema.validate(m.schema,
        { deciderPluginName = "dec" })), { plugin = function(name)
          if name == "dec" then return dec, "prefix-based-pd-decider" end
        end }), { __index = m })
      self:init()
      local ep = { id = 7 }
      local function pick(cached, results)
        local ctx = { request = { prompt = "hello world hello world hello world" },
          shared = { ["prefix-cache-scorer"] = { block_size = 4, matches = { [7] = cached } } } }
        return self:pick_profiles(ctx, { decode = {}, prefill = {} }, results)
      end
      local ran = { decode = { endpoints = { ep } } }
      return { pick(2, ran), pick(5, ran), pick(2, {}), pick(2, { decode = false }),
        pick(2, { decode = ran.decode, prefill = ran.decode }) }
    ]]):format(S.ROOT .. "/plugins/prefix-based-pd-decider.lua",
      S.ROOT .. "/plugins/pd-profile-handler.lua"))
    assert.same({ { "prefill" }, {}, { "decode" }, {}, {} }, out)
  end)

  it("loads deciderPluginName end to end and refuses it with threshold or unknown", function()
    local conf = pd({ deciderPluginName = "dec" })
    table.insert(conf.plugins, { type = "prefix-based-pd-decider", name = "dec",
      parameters = { nonCachedTokens = 1 } })
    rt = S.loaded(conf)
    S.endpoints(rt, 4, ROLES)
    local _, _, res = P.request(rt, "aaaabbbb")
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"]) -- 2 tokens uncached
    _, _, res = P.request(rt, "aaaabbbb") -- all cached on ep1 now
    assert.is_nil(res.headers["x-prefiller-host-port"])
    rt:free()
    rt = nil
    local function err(params)
      local r = S.runtime()
      local ok, e = r:load_string(S.json.encode(pd(params)), "spec.json")
      r:free()
      assert.is_nil(ok)
      return e
    end
    assert.matches("threshold and deciderPluginName are two ways to decide when prefill runs: give"
      .. " one", err({ deciderPluginName = "dec", threshold = 4 }), 1, true)
    assert.matches('deciderPluginName: no plugin named "nope" in this config',
      err({ deciderPluginName = "nope" }), 1, true)
  end)

  -- TestPdProfileHandler_ProcessResults "with primaryPort → port updated and header set"
  -- and TestPdProfileHandlerFactory's primaryPort bounds.
  it("sends decode to primaryPort and names the rank in x-data-parallel-host-port", function()
    start({ primaryPort = 9000 })
    local pick, _, res = P.request(rt, "aaaabbbb")
    assert.equal("ep1", pick)
    assert.equal(9000, res.picks[1].port)
    assert.equal("10.0.0.1", res.picks[1].address)
    assert.equal("10.0.0.1:8000", res.headers["x-data-parallel-host-port"])
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"]) -- prefill unchanged
    rt:free()
    start({ primaryPort = 0 })
    _, _, res = P.request(rt, "aaaabbbb")
    assert.equal(8000, res.picks[1].port)
    assert.is_nil(res.headers["x-data-parallel-host-port"])
  end)

  it("skips prefill when the decode endpoint's uncached part is under threshold", function()
    start({ threshold = 8 })
    local _, _, res = P.request(rt, "aaaabbbbcccc") -- nothing cached: 12 ≥ 8
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    _, _, res = P.request(rt, "aaaabbbbcccc") -- all cached on ep1: 0 < 8
    assert.is_nil(res.headers["x-prefiller-host-port"])
    assert.is_nil(res.headers["x-spec-scores-prefill"])
    assert.equal("ep1", res.picks[1].name)
    _, _, res = P.request(rt, "aaaabbbbccccdddddddd") -- 20 - 3 blocks x 4 = 8 ≥ 8
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
  end)

  it("runs decode only when the uncached part is one character short", function()
    start({ threshold = 9 })
    P.request(rt, "aaaabbbbcccc")
    local _, _, res = P.request(rt, "aaaabbbbccccdddddddd") -- 8 < 9
    assert.is_nil(res.headers["x-prefiller-host-port"])
  end)

  it("fails clearly, without prefill, when decode finds no endpoint", function()
    start({}, { decode_role = "none" })
    local pick, _, res = P.request(rt, "aaaabbbb")
    assert.is_nil(pick)
    assert.equal(503, res.status)
    assert.matches('profile "decode": filter "decode%-filter" removed the last 4', res.message)
    assert.is_nil(res.headers["x-spec-scores-prefill"])
    assert.equal(0, (rt:check_leaks()))
  end)

  it("serves on decode without the header when prefill finds no endpoint", function()
    start({ threshold = 1 }, { prefill_role = "none" })
    local pick, _, res = P.request(rt, "aaaabbbb")
    assert.equal(200, res.status)
    assert.equal("ep1", pick)
    assert.is_nil(res.headers["x-prefiller-host-port"])
  end)

  it("names a missing decode profile", function()
    start({ decodeProfile = "dec" })
    local _, _, res = P.request(rt, "aaaabbbb")
    assert.equal(500, res.status)
    assert.matches('no scheduling profile named "dec" %(decodeProfile%)', res.message)
  end)
end)
