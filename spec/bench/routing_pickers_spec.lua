-- The routing benchmark's own pickers (bench/routing/plugins), called
-- directly: they use no runtime service, only the endpoints' hostport and
-- the request's headers.
local function load(type_)
  local mod = dofile("bench/routing/plugins/" .. type_ .. ".lua")
  assert.equal(type_, mod.type)
  local obj = setmetatable(mod.new({}), { __index = mod })
  return obj
end

-- Endpoints listed out of ip:port order, as a pool may list them.
local function endpoints()
  return { { hostport = "127.0.0.1:8003" }, { hostport = "127.0.0.1:8001" },
    { hostport = "127.0.0.1:8002" } }
end

local function ctx(headers)
  return { request = { headers = headers or {} } }
end

describe("round-robin-picker", function()
  it("rotates over the candidates in ip:port order, ignoring scores", function()
    local p = load("round-robin-picker")
    local got = {}
    for i = 1, 7 do
      local eps = endpoints()
      local picks = p:pick(ctx(), { endpoints = eps, scores = { 9, 0, 0 } })
      assert.equal(1, #picks)
      got[i] = picks[1].hostport:sub(-4)
    end
    assert.same({ "8001", "8002", "8003", "8001", "8002", "8003", "8001" }, got)
  end)
end)

describe("group-oracle-picker", function()
  it("sends group g to the (g mod n)-th candidate by ip:port", function()
    local p = load("group-oracle-picker")
    local function pick(g)
      return p:pick(ctx({ ["x-bench-group"] = tostring(g) }),
        { endpoints = endpoints(), scores = { 0, 0, 0 } })[1].hostport:sub(-4)
    end
    assert.same({ "8001", "8002", "8003", "8001", "8003" },
      { pick(0), pick(1), pick(2), pick(3), pick(5) })
    assert.equal(pick(4), pick(4)) -- the same group always lands on the same endpoint
  end)

  it("falls back to round-robin without the header", function()
    local p = load("group-oracle-picker")
    local got = {}
    for i = 1, 4 do
      got[i] = p:pick(ctx(), { endpoints = endpoints(), scores = { 0, 0, 0 } })[1].hostport:sub(-4)
    end
    assert.same({ "8001", "8002", "8003", "8001" }, got)
  end)
end)
