-- disagg-profile-handler, with the real role filters, prefix scorer and
-- deciders.  Vectors from llm-d/llm-d-router
-- pkg/epp/framework/plugins/scheduling/profilehandler/disagg/disagg_profile_handler_test.go
-- (named per test below).
local S = require "support"
local P = require "prefix_support"

local ROLE = "llm-d.ai/role"
-- ep1, ep2 decode; ep3 prefill; ep4, ep5 encode
local ROLES = { { labels = { [ROLE] = "decode" } }, { labels = { [ROLE] = "decode" } },
  { labels = { [ROLE] = "prefill" } }, { labels = { [ROLE] = "encode" } },
  { labels = { [ROLE] = "encode" } } }

-- plugins: extra plugin entries; params: the handler's; profiles: names to
-- declare (default decode, prefill, encode)
local function config(params, plugins, profiles)
  local list = {
    { type = "disagg-profile-handler", parameters = params },
    { type = "prefix-cache-scorer", parameters = { blockSize = 4, autoTune = false } },
    { type = "decode-filter" }, { type = "prefill-filter" }, { type = "encode-filter" },
    { type = "spec-scores-picker" },
  }
  for _, p in ipairs(plugins or {}) do
    list[#list + 1] = p
  end
  local out = {}
  for _, name in ipairs(profiles or { "decode", "prefill", "encode" }) do
    local role = name:match("^(%a+)")
    out[#out + 1] = { name = name, plugins = { { pluginRef = role .. "-filter" },
      { pluginRef = "prefix-cache-scorer" }, { pluginRef = "spec-scores-picker" } } }
  end
  return { plugins = list, schedulingProfiles = out }
end

local ALWAYS = { type = "always-disagg-pd-decider" }
local MM = { type = "always-disagg-multimodal-decider" }

local function load_error(cfg)
  local rt = S.runtime()
  local ok, err = rt:load_string(S.json.encode(cfg), "spec.json")
  rt:free()
  assert.is_nil(ok)
  return err
end

local IMAGE = { { role = "user", content = { { type = "text", text = "describe this" },
  { type = "image_url", image_url = { url = "https://example.com/img.jpg" } } } } }
local TEXT = { { role = "user", content = "describe this, in words only" } }

describe("disagg-profile-handler", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  local function start(cfg)
    rt = S.loaded(cfg)
    S.endpoints(rt, 5, ROLES)
  end

  local function chat(messages)
    return P.request(rt, nil, { path = "/v1/chat/completions", messages = messages })
  end

  -- TestHandlerFactory "decode only defaults": no decider, no stage, even with
  -- the prefill and encode profiles declared ("prefill without pdDecider is ok
  -- (stage inactive)").
  it("runs decode only without deciders, decode primary", function()
    start(config(nil))
    local pick, _, res = P.request(rt, "hello world hello world hello world")
    assert.equal(200, res.status)
    assert.equal("ep1", pick)
    assert.is_nil(res.headers["x-spec-scores-prefill"])
    assert.is_nil(res.headers["x-prefiller-host-port"])
    assert.is_nil(res.headers["x-encoder-hosts-ports"])
  end)

  -- TestHandlerFactory "PD style"; upstream's PreRequest writes the prefill header.
  it("runs decode then prefill with always-disagg-pd-decider and names the prefiller", function()
    start(config({ deciders = { prefill = "always-disagg-pd-decider" } }, { ALWAYS }))
    local pick, decode, res = P.request(rt, "hello", { profile = "decode" })
    assert.equal("ep1", pick)
    assert.same({ ep1 = 0, ep2 = 0 }, decode)
    assert.same({ ep3 = 0 }, P.scores(res.headers["x-spec-scores-prefill"]))
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    assert.is_nil(res.headers["x-encoder-hosts-ports"])
  end)

  -- The EPP resolves deciders by name; the upstream fixtures declare the
  -- decider before or after the handler (router-pd-epp-config.yaml: after).
  it("finds a decider declared before the handler too", function()
    local cfg = config({ deciders = { prefill = "always-disagg-pd-decider" } })
    table.insert(cfg.plugins, 1, ALWAYS)
    start(cfg)
    local _, _, res = P.request(rt, "hello")
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
  end)

  -- TestHandler_Pick_PD_Series "same request twice: first disaggregates,
  -- second hits cache", through the real prefix scorer: the second time ep1
  -- holds the whole prompt, so nothing is left to prefill apart.
  it("prefills apart the first time only with prefix-based-pd-decider", function()
    start(config({ deciders = { prefill = "prefix-based-pd-decider" } },
      { { type = "prefix-based-pd-decider", parameters = { nonCachedTokens = 2 } } }))
    local prompt = "hello world, hello world!"
    local _, _, res = P.request(rt, prompt)
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    local pick
    pick, _, res = P.request(rt, prompt)
    assert.equal("ep1", pick)
    assert.is_nil(res.headers["x-prefiller-host-port"])
    assert.is_nil(res.headers["x-spec-scores-prefill"])
    -- "short then long: long triggers disaggregation"
    _, _, res = P.request(rt, prompt .. " and some additional padding text here")
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
  end)

  -- TestHandler_Pick_EPD "image → run encode", "no multimodal → skip encode"
  it("runs encode for an image and names every encoder, not for text", function()
    start(config({ deciders = { encode = "always-disagg-multimodal-decider" } }, { MM }))
    local pick, _, res = chat(IMAGE)
    assert.equal(200, res.status)
    assert.equal("ep1", pick)
    assert.same({ ep4 = 0, ep5 = 0 }, P.scores(res.headers["x-spec-scores-encode"]))
    assert.equal("10.0.0.4:8000", res.headers["x-encoder-hosts-ports"])
    assert.is_nil(res.headers["x-prefiller-host-port"])
    _, _, res = chat(TEXT)
    assert.is_nil(res.headers["x-spec-scores-encode"])
    assert.is_nil(res.headers["x-encoder-hosts-ports"])
  end)

  -- TestHandler_Pick_EPD_Full: "multimodal → run encode next", "encode done →
  -- run prefill", and "text-only, high uncached tokens → skip encode, run prefill"
  it("runs decode, encode, then prefill for E/P/D", function()
    start(config({ deciders = { prefill = "always-disagg-pd-decider",
      encode = "always-disagg-multimodal-decider" } }, { ALWAYS, MM }))
    local _, _, res = chat(IMAGE)
    assert.equal("10.0.0.4:8000", res.headers["x-encoder-hosts-ports"])
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    _, _, res = chat(TEXT)
    assert.is_nil(res.headers["x-encoder-hosts-ports"])
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
  end)

  -- TestHandler_Pick_EPD_Full "encode failed → fall through, run prefill"
  it("goes on to prefill when encode finds no endpoint, decode still primary", function()
    start(config({ deciders = { prefill = "always-disagg-pd-decider",
      encode = "always-disagg-multimodal-decider" } }, { ALWAYS, MM }))
    rt:remove("ep4")
    rt:remove("ep5")
    local pick, _, res = chat(IMAGE)
    assert.equal(200, res.status)
    assert.equal("ep1", pick)
    assert.is_nil(res.headers["x-encoder-hosts-ports"])
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
  end)

  -- TestHandler_Pick_CustomProfiles / TestHandlerFactory "PD custom profiles",
  -- and TestHandlerFactory_PdProfileHandlerParams "pd-profile-handler with
  -- deciderPluginName" (the flat names).
  it("reads custom profile names, nested or flat", function()
    local names = { "decode-my", "prefill-my", "encode-my" }
    start(config({ profiles = { decode = "decode-my", prefill = "prefill-my" },
      deciders = { prefill = "always-disagg-pd-decider" } }, { ALWAYS }, names))
    local _, _, res = P.request(rt, "hello")
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    rt:free()
    start(config({ decodeProfile = "decode-my", prefillProfile = "prefill-my",
      deciderPluginName = "always-disagg-pd-decider" }, { ALWAYS }, names))
    local pick
    pick, _, res = P.request(rt, "hello")
    assert.equal("ep1", pick)
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
  end)

  -- TestHandlerFactory_PdProfileHandlerParams "pd-profile-handler with unknown
  -- fields is rejected" (llm-d-router #1068): pd-profile-handler's
  -- prefixPluginType, prefixPluginName and primaryPort are refused here.
  it("refuses pd-profile-handler's prefixPluginType, prefixPluginName and primaryPort", function()
    for k, v in pairs({ prefixPluginType = "prefix-cache-scorer",
      prefixPluginName = "prefix-cache-scorer", primaryPort = 8080 }) do
      assert.matches(k .. " is pd-profile-handler's: disagg-profile-handler refuses it, as"
        .. " llm-d-router does; remove it", load_error(config({ decodeProfile = "decode",
          deciderPluginName = "always-disagg-pd-decider", [k] = v }, { ALWAYS })), 1, true)
    end
  end)

  -- llm-d-router disagg_profile_handler.go, stageOrder (PR 2342): "prefill-first"
  -- runs prefill (no decider), then encode if its decider says so, then decode,
  -- which stays the primary; ParseStageOrder's spellings and errors.
  it("runs prefill, encode, decode in prefill-first stage order", function()
    start(config({ stageOrder = "prefill-first",
      deciders = { encode = "always-disagg-multimodal-decider" } }, { MM }))
    local pick, _, res = chat(IMAGE)
    assert.equal(200, res.status)
    assert.equal("ep1", pick)
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    assert.equal("10.0.0.4:8000", res.headers["x-encoder-hosts-ports"])
    _, _, res = chat(TEXT)
    assert.equal("10.0.0.3:8000", res.headers["x-prefiller-host-port"])
    assert.is_nil(res.headers["x-encoder-hosts-ports"])
    -- the order itself, one call at a time
    local order = S.eval(rt, ([==[
      local loader, schema = require "lupin.generation.loader", require "lupin.schema"
      local m = loader.load(%q, "disagg-profile-handler")
      local self = setmetatable(m.new(assert(schema.validate(m.schema,
        { stageOrder = "Prefill_First" })), { log = function() end }), { __index = m })
      local profiles, results, out = { decode = {}, prefill = {}, encode = {} }, {}, {}
      local ctx = { plugin = {}, request = { body = {} } }
      for _ = 1, 4 do
        local next_ = self:pick_profiles(ctx, profiles, results)
        out[#out + 1] = next_[1] or "done"
        if next_[1] then
          results[next_[1]] = { endpoints = {} }
        end
      end
      return out
    ]==]):format(S.ROOT .. "/plugins/disagg-profile-handler.lua"))
    assert.same({ "prefill", "decode", "done", "done" }, order)
  end)

  it("reads stageOrder as upstream and refuses a prefill decider in prefill-first", function()
    for _, ok in ipairs({ "decode-first", "DECODE_FIRST", "decode", "prefill", "prefillfirst" }) do
      rt = S.loaded(config({ stageOrder = ok }))
      rt:free()
    end
    rt = nil
    assert.matches('invalid stage order "sideways", must be "decode-first" or "prefill-first"',
      load_error(config({ stageOrder = "sideways" })), 1, true)
    assert.matches("deciders.prefill: no prefill decider in prefill-first stage order",
      load_error(config({ stageOrder = "prefill-first",
        deciders = { prefill = "always-disagg-pd-decider" } }, { ALWAYS })), 1, true)
  end)

  -- TestHandler_Pick_PD "decode failed → done"; TestHandler_ProcessResults_PD
  -- "decode failed → error".
  it("fails with decode's reason, without prefill, when decode finds no endpoint", function()
    start(config({ deciders = { prefill = "always-disagg-pd-decider" } }, { ALWAYS }))
    rt:remove("ep1")
    rt:remove("ep2")
    local pick, _, res = P.request(rt, "hello")
    assert.is_nil(pick)
    assert.equal(503, res.status)
    assert.matches('profile "decode"', res.message)
    assert.is_nil(res.headers["x-spec-scores-prefill"])
  end)

  it("fails the request clearly when the config has no decode profile", function()
    start(config(nil, nil, { "prefill" }))
    local _, _, res = P.request(rt, "hello")
    assert.equal(500, res.status)
    assert.matches('no scheduling profile named "decode" %(profiles.decode%)', res.message)
  end)

  -- TestHandlerFactory "unknown pdDecider" / "unknown encodeDecider";
  -- TestHandlerFactory_DeprecatedFlatParams "mixing deprecated and nested
  -- fields is an error" and "mixing deprecated decider and nested deciders".
  it("refuses unknown deciders, non-deciders, mixed formats and unknown keys at load", function()
    assert.matches('spec.json:%d+: plugins%[0%]: plugin "disagg%-profile%-handler" %(disagg%-profile%-handler%)'
      .. ' failed to start: deciders.prefill: no plugin named "INVALID" in this config',
      load_error(config({ deciders = { prefill = "INVALID" } })))
    assert.matches('deciders.encode: no plugin named "INVALID"',
      load_error(config({ deciders = { encode = "INVALID" } })))
    assert.matches('deciders.prefill: plugin "decode%-filter" %(decode%-filter%) is not a decider',
      load_error(config({ deciders = { prefill = "decode-filter" } })))
    assert.matches("cannot mix the deprecated flat parameters %(decodeProfile%) with"
      .. " profiles/deciders", load_error(config({ decodeProfile = "d",
        profiles = { decode = "other" } })))
    assert.matches("cannot mix the deprecated flat parameters %(prefillDeciderPluginName%)",
      load_error(config({ prefillDeciderPluginName = "always-disagg-pd-decider",
        deciders = { prefill = "always-disagg-pd-decider" } }, { ALWAYS })))
    assert.matches("deciders.prefil: unknown; known: prefill, encode",
      load_error(config({ deciders = { prefil = "x" } })))
    assert.matches("profiles.decode: must be a string, got 5",
      load_error(config({ profiles = { decode = 5 } })))
    assert.matches("parameters.deciders: must be an object",
      load_error(config({ deciders = "always-disagg-pd-decider" })))
  end)

  it("leaves no request state behind", function()
    start(config({ deciders = { prefill = "always-disagg-pd-decider",
      encode = "always-disagg-multimodal-decider" } }, { ALWAYS, MM }))
    for i = 1, 50 do
      chat(i % 2 == 0 and IMAGE or TEXT)
    end
    local n, report = rt:check_leaks()
    assert.equal(0, n, report)
  end)
end)
