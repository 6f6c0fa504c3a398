-- Endpoint addresses through the real lupin serve and lupin-sim: a host name
-- stands for every address it has (tried in order, the one that worked
-- remembered), IPv6 both ways.  `--resolve NAME=ADDR,...` gives a name
-- several addresses without touching /etc/hosts, so these pass whether or
-- not the machine maps localhost to ::1.
local P = require "e2e.procs"
local json = P.json

local SIM = "--model m --itl-ms 1 --seed 7"
local COMPLETION = { model = "m", prompt = "hello there", max_tokens = 5 }

local function config(endpoints)
  return {
    kind = "EndpointPickerConfig",
    plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
    endpoints = endpoints,
    gateway = { refreshIntervalMs = 50 },
  }
end

local function addresses(gw, name)
  local _, _, body = P.get(gw.admin .. "/admin/endpoints")
  for _, e in ipairs(json.decode(body).endpoints) do
    if e.name == name then
      return e.addresses
    end
  end
end

describe("lupin serve, endpoint addresses", function()
  local procs

  before_each(function()
    procs = {}
  end)

  after_each(function()
    for _, p in ipairs(procs) do
      P.stop(p)
    end
  end)

  local function sim(host)
    local p = P.sim(SIM, 1, host)
    procs[#procs + 1] = p
    return p
  end

  local function gateway(cfg, args)
    local gw = P.gateway(cfg, args)
    procs[#procs + 1] = gw
    return gw
  end

  it("tries a name's next address when the first refuses, and remembers the one that worked",
    function()
      local s = sim("127.0.0.1") -- IPv4 only: [::1] refuses, as a stock localhost does
      local gw = gateway(config({ { name = "e1", address = "model.test", port = s.ports[1] } }),
        "--resolve model.test=[::1],127.0.0.1")
      -- both addresses kept (the first scrape may already have moved the good one first)
      local addrs = addresses(gw, "e1")
      table.sort(addrs)
      assert.same({ "127.0.0.1:" .. s.ports[1], "[::1]:" .. s.ports[1] }, addrs)
      for _ = 1, 3 do
        local status, h, body = P.post(gw.base, "/v1/completions", COMPLETION)
        assert.equal(200, status, body)
        assert.equal("model.test:" .. s.ports[1], h["x-gateway-destination-endpoint"])
      end
      -- the address that connected is tried first from now on
      assert.same({ "127.0.0.1:" .. s.ports[1], "[::1]:" .. s.ports[1] }, addresses(gw, "e1"))
    end)

  it("502 naming every address when none of them answers", function()
    local s = sim("127.0.0.1")
    P.stop(s) -- nothing listens on that port any more
    local gw = gateway(config({ { name = "e1", address = "gone.test", port = s.ports[1] } }),
      "--resolve gone.test=127.0.0.1,[::1]")
    local status, _, body = P.post(gw.base, "/v1/completions", COMPLETION)
    assert.equal(502, status, body)
    assert.truthy(json.decode(body).error.message:find("each of its 2 addresses", 1, true), body)
  end)

  it("a plain localhost endpoint works whatever /etc/hosts lists first", function()
    local s = sim("127.0.0.1")
    local gw = gateway(config({ { name = "e1", address = "localhost", port = s.ports[1] } }))
    local status, _, body = P.post(gw.base, "/v1/completions", COMPLETION)
    assert.equal(200, status, body)
    assert.truthy(#addresses(gw, "e1") >= 1)
  end)

  it("reaches an IPv6 endpoint and listens on IPv6", function()
    local s = sim("::1")
    local gw = gateway(config({ { name = "e1", address = "::1", port = s.ports[1] } }),
      "--listen [::1]:0")
    assert.truthy(gw.base:find("^http://%[::1%]:%d+$"), gw.base)
    local status, h, body = P.post(gw.base, "/v1/completions", COMPLETION)
    assert.equal(200, status, body)
    assert.equal("[::1]:" .. s.ports[1], h["x-gateway-destination-endpoint"])
  end)

  it("lupin-sim on :: answers on both families", function()
    local s = sim("::")
    for _, host in ipairs({ "127.0.0.1", "[::1]" }) do
      local status, _, body = P.get(("http://%s:%d/v1/models"):format(host, s.ports[1]))
      assert.equal(200, status, body)
    end
  end)

  it("refuses a --resolve without an address it can read", function()
    local out, rc = P.run(P.LUPIN .. " serve --config /dev/null --resolve nothing 2>&1")
    assert.equal(2, rc)
    assert.truthy(out:find("--resolve", 1, true), out)
  end)
end)
