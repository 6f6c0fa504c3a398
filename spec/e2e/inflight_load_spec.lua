-- inflight-load-producer end to end: lupin serve over one lupin-sim endpoint
-- with a slow prefill and a slow stream, driven with curl.  The fixture
-- e2e-load-probe answers, in x-load, the tokens in flight on the endpoint as
-- each request is sent: a streamed request's input counts until its first
-- byte, and nothing after, while the request itself is still in flight.
local P = require "e2e.procs"
local support = require "support"

-- 500 ms to the first token, then 20 tokens 300 ms apart
local SIM = "--model m --prefill-overhead-ms 500 --itl-ms 300 --seed 3"

local function config(sim)
  return {
    plugins = { { type = "e2e-load-probe" }, { type = "inflight-load-producer" },
      { type = "token-load-scorer" }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "token-load-scorer" },
      { pluginRef = "max-score-picker" } } } },
    endpoints = P.sim_endpoints(sim),
    pluginDirs = { support.FIXTURES },
  }
end

-- A streamed completion of a 400-character (100-token) prompt in the
-- background, as request id.
local function stream(gw, id)
  local body = os.tmpname()
  support.write(body, P.json.encode({ model = "m", prompt = ("x"):rep(400), max_tokens = 20,
    stream = true }))
  local out = os.tmpname()
  local p = P.start(("curl -sS -N -o %s -H 'x-request-id: %s' -H 'content-type:"
    .. " application/json' --data-binary @%s %s"):format(out, id, body,
    P.quote(gw.base .. "/v1/completions")))
  p.body_file, p.files = out, { body, out }
  return p
end

local function running(gw, id)
  local _, _, text = P.get(gw.admin .. "/admin/requests")
  for _, r in ipairs(P.json.decode(text).requests) do
    if r.id == id then
      return true
    end
  end
  return false
end

-- The x-load a small request not streamed is answered with.
local function load(gw)
  local status, h = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi",
    max_tokens = 1 })
  assert.equal(200, status)
  return tonumber(h["x-load"])
end

describe("lupin serve: inflight-load-producer", function()
  local sim, gw
  setup(function()
    sim = P.sim(SIM, 1)
    gw = P.gateway(config(sim))
  end)
  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("counts a streamed request's input until its first byte, then nothing", function()
    assert.equal(0, load(gw))
    local a = stream(gw, "long")
    P.until_running(gw, "long")
    assert.equal(100, load(gw)) -- sent during long's prefill
    local after = P.poll(function()
      local n = load(gw)
      return n == 0 and running(gw, "long") and "released" or n ~= 100 and tostring(n)
    end, "long's tokens released while it streams")
    assert.equal("released", after)
    P.wait(a)
    local text = P.read(a.body_file) or ""
    assert.matches("data: %[DONE%]", text)
    for _, f in ipairs(a.files) do
      os.remove(f)
    end
    assert.equal(0, load(gw))
  end)
end)
