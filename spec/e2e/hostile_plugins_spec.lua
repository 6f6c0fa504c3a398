-- A hostile plugin inside the real `lupin serve`: on every request it
-- attacks what plugins share (SDK handles and their C pointers, metatables,
-- module tables, library settings, the endpoint pool, the gateway's own
-- headers).  The process lives, every request is served as it would be
-- without it, prefix affinity still holds, nothing leaks, and a reload that
-- drops it succeeds.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local HOSTILE = [==[
local shared, prefix = require "lupin.shared", require "lupin.prefix"
local ATTACKS = {
  function() local d = shared.dict("h") d.d = nil return d:get("k") end,
  function() rawset(shared.dict("h"), "get", function() return 1 end) end,
  function() getmetatable(prefix.index(10)).__index.match = function() return {} end end,
  function() local h = prefix.hashes(("a"):rep(64), "m", "", 4, 16) return h.h[1e8] end,
  function(ctx) getmetatable(ctx.request).__index = function() error("poisoned") end end,
  function() require("cjson").encode_number_precision(1) end,
  function() require("cjson.safe").decode_max_depth(1) end,
  function(ctx) ctx.upstream_headers["x-request-id"] = "forged" end,
  function(ctx) ctx.upstream_headers["x-gateway-destination-endpoint"] = "6.6.6.6:1" end,
  function(_, eps) eps[1].waiting_queue_size = 1e9 end,
  function(_, eps) return eps[1].c_name[1e8] end,
  function(_, eps) return (eps[1] + 1).running_requests end,
  function(_, eps) table.remove(eps, 1) table.remove(eps, 1) end,
}
return {
  type = "hostile-filter",
  filter = function(_, ctx, endpoints)
    local keep = { unpack(endpoints) } -- what it lets through: all of them
    for _, attack in ipairs(ATTACKS) do
      pcall(attack, ctx, endpoints)
    end
    return keep
  end,
}]==]

local function config(ups, dir, hostile)
  local eps = {}
  for i, up in ipairs(ups) do
    eps[i] = { name = "e" .. i, address = "127.0.0.1", port = up.port }
  end
  local refs = { { pluginRef = "prefix-cache-scorer", weight = 3 },
    { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } }
  local plugins = { { type = "prefix-cache-scorer" }, { type = "queue-scorer" },
    { type = "max-score-picker" } }
  if hostile then
    table.insert(plugins, 1, { type = "hostile-filter" })
    table.insert(refs, 1, { pluginRef = "hostile-filter" })
  end
  return { pluginDirs = { dir }, plugins = plugins, endpoints = eps,
    schedulingProfiles = { { name = "default", plugins = refs } } }
end

-- A completion with its own request id; the fixture answers with where it
-- ran and the headers it received.
local function complete(gw, id, prompt)
  local status, _, body = P.post(gw.base, "/v1/completions",
    { model = "m", prompt = prompt, max_tokens = 2 }, "--max-time 20 -H 'x-request-id: " .. id .. "'")
  assert.equal(200, status, body)
  return json.decode(body)
end

describe("a hostile plugin in lupin serve", function()
  local ups, dir
  setup(function()
    dir = support.tmpdir()
    support.write(dir .. "/hostile-filter.lua", HOSTILE)
    ups = { P.upstream("--name a"), P.upstream("--name b") }
  end)
  teardown(function()
    for _, up in ipairs(ups) do
      P.stop(up)
    end
  end)

  it("degrades nothing: headers, affinity, health, leaks, and a reload that drops it", function()
    local gw = P.gateway(config(ups, dir, true), "--no-watch")
    finally(function() P.stop(gw) end)
    local prompt = ("a long shared system prompt for affinity "):rep(20)
    local first
    for i = 1, 6 do
      local out = complete(gw, "hostile-" .. i, prompt)
      -- the gateway's own headers, not the plugin's forgeries
      assert.equal("hostile-" .. i, out.received["x-request-id"])
      local dest = out.received["x-gateway-destination-endpoint"]
      assert.equal(ups[out.served_by == "a" and 1 or 2].hostport, dest)
      -- the prefix index still works: the same prompt stays where it is cached
      first = first or out.served_by
      assert.equal(first, out.served_by)
    end
    assert.equal(200, (P.get(gw.admin .. "/healthz")))
    local _, _, leaks = P.post(gw.admin, "/admin/leaks", "")
    assert.equal(0, json.decode(leaks).leaked, leaks)

    support.write(gw.config, json.encode(config(ups, dir, false)))
    local status, _, body = P.post(gw.admin, "/admin/reload", "", "--max-time 20")
    assert.equal(200, status, body)
    local out = complete(gw, "after-reload", prompt)
    assert.equal("after-reload", out.received["x-request-id"])
    assert.equal(first, out.served_by)
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
  end)
end)
