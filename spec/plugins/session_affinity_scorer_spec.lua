local K = require "plugins.kit"
local S = require "support"

local T = "session-affinity-scorer"

local function codec(rt, fn, s)
  return S.eval(rt, ([[
    local m = require("lupin.generation.loader").load(%q, "session-affinity-scorer")
    local v = m.%s(%q)
    return v == nil and "<nil>" or "=" .. v
  ]]):format(S.ROOT .. "/plugins/session-affinity-scorer.lua", fn, s))
end

describe(T, function()
  it("encodes and decodes standard base64 with padding", function()
    local rt = S.runtime()
    local vectors = { [""] = "", a = "YQ==", ab = "YWI=", abc = "YWJj", ep2 = "ZXAy",
      ["10.0.0.1"] = "MTAuMC4wLjE=", ["ns/pod-7"] = "bnMvcG9kLTc=",
      ["\255\254\253"] = "//79" }
    for plain, encoded in pairs(vectors) do
      assert.equal("=" .. encoded, codec(rt, "encode", plain))
      assert.equal("=" .. plain, codec(rt, "decode", encoded))
    end
  end)

  it("refuses invalid base64: bad length, characters, padding", function()
    local rt = S.runtime()
    for _, bad in ipairs({ "ZXA", "ZXAy=", "Z===", "ZX=y", "ZXAy ", "ZX-y", "ZX_y", "=ZXA",
      "YQ==YQ==" }) do
      assert.equal("<nil>", codec(rt, "decode", bad), bad)
    end
  end)

  -- llm-d-router .../scorer/sessionaffinity/session_affinity_test.go,
  -- TestSessionAffinity_Score "selects correct endpoint": the token is base64 of
  -- the endpoint's namespace/name.
  it("scores 1 for the endpoint the token names (namespace/name), 0 for the others", function()
    local rt = K.pool(3)
    assert.same({ ep1 = 0, ep2 = 1, ep3 = 0 },
      K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZGVmYXVsdC9lcDI=" } }))
  end)

  it("still accepts a token of the bare name, lupin's earlier token", function()
    local rt = K.pool(3)
    assert.same({ ep1 = 0, ep2 = 1, ep3 = 0 },
      K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZXAy" } }))
  end)

  it("takes the namespace from the endpoint's namespace label, else default", function()
    local rt = K.pool(2, { { labels = { namespace = "team-a" } } })
    assert.same({ ep1 = 1, ep2 = 0 },
      K.scores(rt, T, nil, { headers = { ["x-session-token"] = "dGVhbS1hL2VwMQ==" } }))
    assert.same({ ep1 = 0, ep2 = 0 }, -- ep1 is not in "default"
      K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZGVmYXVsdC9lcDE=" } }))
    local out = K.call(rt, { type = T, point = "response_header", result = { "ep1" } })
    assert.same({ ["x-session-token"] = "dGVhbS1hL2VwMQ==" }, out.response_headers)
  end)

  it("scores 0 for a token only close to an endpoint's namespace/name", function()
    local rt = K.pool(2, { {}, {} })
    local zero = { ep1 = 0, ep2 = 0 }
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZGVmYXVsdC9lcDIy" } })) -- default/ep22
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZGVmYXVsdC9lcA==" } })) -- default/ep
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "eGRlZmF1bHQvZXAy" } })) -- xdefault/ep2
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZGVmYXVsdC1lcDI=" } })) -- default-ep2
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZGVmYXVseC9lcDI=" } })) -- defaulx/ep2
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "dGVhbS1hL2VwMg==" } })) -- team-a/ep2
  end)

  -- TestSessionAffinity_Score "custom header selects endpointB" and "custom header
  -- ignores default header"; TestSessionAffinity_ResponseHeader "custom header
  -- carries the token".
  it("reads and writes the header of encodedEndpointHeaderConfig", function()
    local rt = K.pool(2)
    local p = { encodedEndpointHeaderConfig = { header = "X-Custom-Session" } }
    assert.same({ ep1 = 0, ep2 = 1 },
      K.scores(rt, T, p, { headers = { ["x-custom-session"] = "ZGVmYXVsdC9lcDI=" } }))
    assert.same({ ep1 = 0, ep2 = 0 },
      K.scores(rt, T, p, { headers = { ["x-session-token"] = "ZGVmYXVsdC9lcDI=" } }))
    local out = K.call(rt, { type = T, params = p, point = "response_header", result = { "ep2" } })
    assert.same({ ["x-custom-session"] = "ZGVmYXVsdC9lcDI=" }, out.response_headers)
  end)

  -- TestSessionAffinity_ResponseHeader "profile set but absent from results
  -- (decode-only) writes no header".
  it("writes no header when profileName names a profile that did not run", function()
    local rt = K.pool(2)
    local out = K.call(rt, { type = T, params = { profileName = "prefill" },
      point = "response_header", result = { "ep2" } })
    assert.same({}, out.response_headers)
  end)

  -- TestSessionAffinity_ResponseHeader "prefill profile lookup" and "profile set
  -- but TargetEndpoints empty writes no header": with profileName, the token
  -- names that profile's endpoint, not the primary's.
  it("writes the token of profileName's endpoint, none when it chose nothing", function()
    local rt = K.pool(2)
    local out = S.eval(rt, ([[
      local m = require("lupin.generation.loader").load(%q, "session-affinity-scorer")
      local p = assert(require("lupin.schema").validate(m.schema, { profileName = "prefill",
        encodedEndpointHeaderConfig = { header = "x-session-token-prefill" } }))
      local self = setmetatable(m.new(p, { log = function() end, now = function() return 0 end }),
        { __index = m })
      local eps, out = require("lupin.runtime.pool").list, {}
      local function run(profiles)
        local headers = {}
        local ctx = { result = { primary = "decode", profiles = profiles },
          set_response_header = function(_, k, v) headers[k] = v end }
        self:response_header(ctx, { status = 200, headers = {} })
        return headers
      end
      out[1] = run({ decode = { endpoints = { eps[1] } }, prefill = { endpoints = { eps[2] } } })
      out[2] = run({ decode = { endpoints = { eps[1] } }, prefill = { endpoints = {} } })
      return out
    ]]):format(S.ROOT .. "/plugins/session-affinity-scorer.lua"))
    assert.same({ ["x-session-token-prefill"] = "ZGVmYXVsdC9lcDI=" }, out[1]) -- default/ep2
    assert.same({}, out[2])
  end)

  it("scores 0 everywhere without a token, with an empty one, or one naming no candidate",
    function()
    local rt = K.pool(2)
    local zero = { ep1 = 0, ep2 = 0 }
    assert.same(zero, K.scores(rt, T))
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "" } }))
    assert.same(zero, K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZXA5" } }))
    assert.same({}, K.call(rt, { type = T, point = "score", names = {},
      headers = { ["x-session-token"] = "ZXAy" } }).list)
  end)

  it("logs a token that is not base64 and scores 0 everywhere", function()
    local rt = K.pool(2)
    local out = K.call(rt, { type = T, point = "score",
      headers = { ["x-session-token"] = "ep2" } })
    assert.same({ ep1 = 0, ep2 = 0 }, out.scores)
    assert.same({ "warn: ignoring x-session-token: not valid base64" }, out.logs)
  end)

  it("sets x-session-token on the response to the serving endpoint", function()
    local rt = K.pool(3)
    local out = K.call(rt, { type = T, point = "response_header", result = { "ep3", "ep1" } })
    assert.same({ ["x-session-token"] = "ZGVmYXVsdC9lcDM=" }, out.response_headers)
  end)

  it("keeps a session on its endpoint end to end", function()
    local rt = S.loaded(K.config({ { type = T }, { type = "queue-scorer" } },
      { { pluginRef = T, weight = 10 }, { pluginRef = "queue-scorer", weight = 1 } }))
    S.endpoints(rt, 3, { { waiting_queue_size = 5 }, { waiting_queue_size = 0 },
      { waiting_queue_size = 9 } })
    -- no token: the queue decides; the client gets a token for ep2
    local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}' }))
    local res = req:schedule()
    assert.equal("ep2", res.picks[1].name)
    local headers = req:response_header(200, { ["content-type"] = "application/json" })
    req:finish("ok")
    assert.equal("ZGVmYXVsdC9lcDI=", headers["x-session-token"])
    -- a token for ep3 wins over ep3's long queue
    req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}',
      headers = { ["X-Session-Token"] = "ZGVmYXVsdC9lcDM=" } }))
    res = req:schedule()
    assert.equal("ep3", res.picks[1].name)
    headers = req:response_header(200, {})
    req:finish("ok")
    assert.equal("ZGVmYXVsdC9lcDM=", headers["x-session-token"])
  end)

  it("sets no header when scheduling failed", function()
    local rt = S.loaded(K.config({ { type = T } }, { { pluginRef = T } }))
    local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}' }))
    assert.equal(503, req:schedule().status) -- no endpoints
    assert.same({}, req:response_header(503, {}))
    req:finish("no_endpoint")
  end)

  -- TestSessionAffinity_FactoryValidation: which parameters load.
  it("loads upstream's valid strategies and refuses the invalid ones", function()
    for _, ok in ipairs({ "{}", '{"strategy":"encoded_endpoint_header"}',
      '{"strategy":"session_id"}',
      '{"strategy":"session_id","sessionIdConfig":{"sources":[{"attribute":"agent-identity"}]}}',
      '{"strategy":"session_id","sessionIdConfig":{"sources":[{"header":"x-session-id"},'
        .. '{"attribute":"agent-identity"}]}}',
      '{"strategy":"session_id","sessionIdConfig":{"sources":[]}}',
      '{"strategy":"session_id","sessionIdConfig":{"evictionTtlSeconds":0}}' }) do
      local rt = S.runtime()
      assert(rt:load_string(('{"plugins": [{"type": "%s", "parameters": %s}]}'):format(T, ok),
        "spec.json"))
      rt:free()
    end
    local function err(params)
      return K.load_error({ ('{"type": "%s", "parameters": %s}'):format(T, params) })
    end
    assert.matches('parameters%.strategy: must be one of "encoded_endpoint_header", "session_id",'
      .. ' got "bogus"', err('{"strategy":"bogus"}'))
    assert.matches("sessionIdConfig%.sources%[0%]: exactly one of header or attribute must be set",
      err('{"strategy":"session_id","sessionIdConfig":{"sources":[{"header":"h","attribute":"a"}]}}'))
    assert.matches("sessionIdConfig%.evictionTtlSeconds must be a number > 0, got %-1",
      err('{"strategy":"session_id","sessionIdConfig":{"evictionTtlSeconds":-1}}'))
    assert.matches("sessionIdConfig%.evictionSweepSeconds must be a number > 0, got %-1",
      err('{"strategy":"session_id","sessionIdConfig":{"evictionSweepSeconds":-1}}'))
    assert.matches('parameters%.ttl: unknown parameter "ttl"', err('{"ttl": 1}'))
  end)

  it("session_id: binds a session to the endpoint that served it, per session", function()
    local rt = S.loaded(K.config({ { type = T, parameters = { strategy = "session_id",
      sessionIdConfig = { sources = { { header = "X-Conv" } } } } }, { type = "queue-scorer" } },
      { { pluginRef = T, weight = 10 }, { pluginRef = "queue-scorer", weight = 1 } }))
    S.endpoints(rt, 3, { { waiting_queue_size = 5 }, { waiting_queue_size = 0 },
      { waiting_queue_size = 9 } })
    local function send(headers)
      local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}',
        headers = headers }))
      local res = req:schedule()
      local out = req:response_header(200, {})
      req:finish("ok")
      return res.picks[1].name, out
    end
    local first, out = send({ ["x-conv"] = "a" }) -- unbound: the queue decides
    assert.equal("ep2", first)
    assert.same({}, out) -- nothing is written back to the client
    rt:set_metrics("ep2", { waiting_queue_size = 9 })
    rt:set_metrics("ep3", { waiting_queue_size = 0 })
    assert.equal("ep2", (send({ ["x-conv"] = "a" }))) -- bound: stays
    assert.equal("ep3", (send({ ["x-conv"] = "b" }))) -- another session: the queue
    assert.equal("ep3", (send({}))) -- no session id: no preference
    assert.equal("ep3", (send({ ["x-session-id"] = "a" }))) -- not a configured source
  end)
end)
