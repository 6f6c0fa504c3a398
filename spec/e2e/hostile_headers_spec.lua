-- How many headers a client may send is the gateway's bound, not the
-- client's choice (issue 51, item 9): the lists built from a request's
-- headers are arrays on the stack, once sized by the client's count.  More
-- than GW_MAX_HEADERS (100, Envoy's default) is refused with 431 and a
-- message naming the bound, on the public and the admin listener; the
-- gateway serves on.
local P = require "e2e.procs"
local json = P.json

-- curl's -H arguments for n headers of its own (curl adds host, user-agent,
-- accept, and content-type and content-length on a POST)
local function headers(n)
  local h = {}
  for i = 1, n do
    h[#h + 1] = ("-H 'x-many-%d: %d'"):format(i, i)
  end
  return table.concat(h, " ")
end

describe("lupin serve, a request with many headers", function()
  local up, gw

  setup(function()
    up = P.upstream("--name A")
    gw = P.gateway({
      kind = "EndpointPickerConfig",
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "queue-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
      endpoints = { { name = "a", address = "127.0.0.1", port = up.port } },
    })
  end)

  teardown(function()
    P.stop(gw)
    P.stop(up)
  end)

  local function completion(extra)
    return P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi" }, extra)
  end

  it("takes 95 headers and curl's five, and forwards them", function()
    -- (not 100 of one's own: the fixture, Python's http.server, takes no
    -- more than 100 and the gateway adds its own)
    local status, _, body = completion(headers(90))
    assert.equal(200, status, body)
    local received = json.decode(body).received
    assert.equal("90", received["x-many-90"])
  end)

  it("refuses 101 and more with 431 naming the bound, and serves on", function()
    -- 96 and curl's five: one too many
    for _, n in ipairs({ 96, 1000, 5000 }) do
      local status, _, body = completion(headers(n))
      assert.equal(431, status, body)
      local err = json.decode(body).error
      assert.equal("the request has more than 100 headers, the most the gateway takes: send fewer",
        err.message)
      assert.equal("invalid_request_error", err.type)
      status, _, body = completion()
      assert.equal(200, status, body)
    end
  end)

  it("refuses them on the admin listener too", function()
    local status, _, body = P.get(gw.admin .. "/healthz", headers(200))
    assert.equal(431, status, body)
    assert.equal(200, (P.get(gw.admin .. "/healthz")))
  end)
end)
