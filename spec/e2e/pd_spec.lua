-- Prefill/decode disaggregation end to end: lupin serve with
-- disagg-profile-handler over a pool of lupin-sim endpoints labelled with
-- llm-d's roles (two decode, two prefill), driven with curl.  The decode
-- endpoint serves (lupin-sim names itself in x-sim-endpoint); the prefill
-- endpoint is named in x-prefiller-host-port, which the fixture server
-- spec/fixtures/gateway/upstream.py, standing in for a decode endpoint's
-- sidecar, shows arriving.
local P = require "e2e.procs"
local json = P.json

local ROLE = "llm-d.ai/role"
local SIM = "--model m --itl-ms 1 --seed 7"

-- decode: the endpoints given first; prefill: the rest
local function config(decode, prefill, decider)
  local endpoints = {}
  for i, hp in ipairs(decode) do
    local port = tonumber(hp:match(":(%d+)$"))
    endpoints[#endpoints + 1] = { name = "d" .. i, address = "127.0.0.1", port = port,
      labels = { [ROLE] = "decode" } }
  end
  for i, hp in ipairs(prefill) do
    local port = tonumber(hp:match(":(%d+)$"))
    endpoints[#endpoints + 1] = { name = "p" .. i, address = "127.0.0.1", port = port,
      labels = { [ROLE] = "prefill" } }
  end
  local function profile(role)
    return { name = role, plugins = { { pluginRef = role .. "-filter" },
      { pluginRef = "prefix-cache-scorer", weight = 2 }, { pluginRef = "queue-scorer" },
      { pluginRef = "max-score-picker" } } }
  end
  return {
    kind = "EndpointPickerConfig",
    plugins = { { type = "prefix-cache-scorer", parameters = { autoTune = false } },
      { type = "queue-scorer" }, { type = "prefill-filter" }, { type = "decode-filter" },
      { type = "max-score-picker" }, decider,
      { type = "disagg-profile-handler", parameters = { deciders = { prefill = decider.type } } } },
    schedulingProfiles = { profile("prefill"), profile("decode") },
    endpoints = endpoints,
  }
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do
    s[v] = true
  end
  return s
end

describe("lupin serve: P/D disaggregation (disagg-profile-handler)", function()
  local sim, up, gw
  local decode, prefill
  setup(function()
    sim = P.sim(SIM, 4)
    decode = { sim.hostports[1], sim.hostports[2] }
    prefill = { sim.hostports[3], sim.hostports[4] }
  end)
  teardown(function()
    P.stop(gw)
    P.stop(up)
    P.stop(sim)
  end)
  after_each(function()
    P.stop(gw)
    gw = nil
  end)

  it("serves on a decode endpoint and names a prefill endpoint in x-prefiller-host-port", function()
    gw = P.gateway(config(decode, prefill, { type = "always-disagg-pd-decider" }))
    local decoders, prefillers = set_of(decode), set_of(prefill)
    for i = 1, 4 do
      local status, h, body = P.post(gw.base, "/v1/completions",
        { model = "m", prompt = "tell me a story, number " .. i, max_tokens = 3 })
      assert.equal(200, status, body)
      assert.is_true(decoders[h["x-sim-endpoint"]], h["x-sim-endpoint"])
      assert.equal(h["x-sim-endpoint"], h["x-gateway-destination-endpoint"])
      assert.is_true(#json.decode(body).choices == 1)
    end
    -- what lupin sent is on the wire: the fixture server as the decode
    -- endpoint echoes the request headers it received
    up = P.upstream()
    P.stop(gw)
    gw = P.gateway(config({ up.hostport }, prefill, { type = "always-disagg-pd-decider" }))
    local status, h, body = P.post(gw.base, "/v1/completions",
      { model = "m", prompt = "hello there", max_tokens = 3 })
    assert.equal(200, status, body)
    assert.equal(up.hostport, h["x-gateway-destination-endpoint"])
    local got = json.decode(body).received
    assert.is_true(prefillers[got["x-prefiller-host-port"]], tostring(got["x-prefiller-host-port"]))
  end)

  -- prefix-based-pd-decider: a long new prompt is prefilled apart; sent again,
  -- the decode endpoint that served it holds it, so it is not
  it("prefills apart only what the decode endpoint has not cached (prefix-based-pd-decider)",
    function()
      up = up or P.upstream()
      gw = P.gateway(config({ up.hostport }, prefill,
        { type = "prefix-based-pd-decider", parameters = { nonCachedTokens = 16 } }))
      local prompt = ("a fairly long prompt about prefill and decode. "):rep(4) -- 192 chars
      local _, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = prompt })
      local first = json.decode(body).received
      _, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = prompt })
      local second = json.decode(body).received
      _, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "short" })
      local short = json.decode(body).received
      assert.is_true(set_of(prefill)[first["x-prefiller-host-port"]])
      assert.is_nil(second["x-prefiller-host-port"])
      assert.is_nil(short["x-prefiller-host-port"]) -- 1 token < 16
    end)

  -- disagg_headers_handler_test.go TestPreRequestClearsHeaderWhenNoPrefillResult
  -- and TestPreRequestClearsExistingPrefillHeader: a client cannot name the
  -- hosts a sidecar connects to
  it("drops the routing headers a client sends, keeping the scheduler's", function()
    up = up or P.upstream()
    gw = P.gateway(config({ up.hostport }, prefill,
      { type = "prefix-based-pd-decider", parameters = { nonCachedTokens = 16 } }))
    local forged = "-H 'x-prefiller-host-port: 10.9.9.9:1' -H 'x-encoder-hosts-ports: 10.9.9.9:2'"
      .. " -H 'x-data-parallel-host-port: 10.9.9.9:3'"
    local _, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "short" }, forged)
    local got = json.decode(body).received
    assert.is_nil(got["x-prefiller-host-port"])
    assert.is_nil(got["x-encoder-hosts-ports"])
    assert.is_nil(got["x-data-parallel-host-port"])
    _, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = ("long "):rep(40) },
      forged)
    got = json.decode(body).received
    assert.is_true(set_of(prefill)[got["x-prefiller-host-port"]])
  end)
end)
