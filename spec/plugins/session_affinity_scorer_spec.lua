local K = require "plugins.kit"
local S = require "support"

local T = "session-affinity-scorer"

local function codec(rt, fn, s)
  return S.eval(rt, ([[
    local m = require("lupin.loader").load(%q, "session-affinity-scorer")
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

  it("scores 1 for the endpoint the token names, 0 for the others", function()
    local rt = K.pool(3)
    assert.same({ ep1 = 0, ep2 = 1, ep3 = 0 },
      K.scores(rt, T, nil, { headers = { ["x-session-token"] = "ZXAy" } }))
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
    assert.same({ ["x-session-token"] = "ZXAz" }, out.response_headers)
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
    assert.equal("ZXAy", headers["x-session-token"])
    -- a token for ep3 wins over ep3's long queue
    req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}',
      headers = { ["X-Session-Token"] = "ZXAz" } }))
    res = req:schedule()
    assert.equal("ep3", res.picks[1].name)
    headers = req:response_header(200, {})
    req:finish("ok")
    assert.equal("ZXAz", headers["x-session-token"])
  end)

  it("sets no header when scheduling failed", function()
    local rt = S.loaded(K.config({ { type = T } }, { { pluginRef = T } }))
    local req = assert(rt:begin({ path = "/v1/completions", body = '{"model":"m"}' }))
    assert.equal(503, req:schedule().status) -- no endpoints
    assert.same({}, req:response_header(503, {}))
    req:finish("no_endpoint")
  end)

  it("takes no parameters", function()
    local err = K.load_error({ '{"type": "session-affinity-scorer", "parameters": {"ttl": 1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.ttl: unknown parameter \"ttl\"", err)
  end)
end)
