-- What the topology plugins' specs share: a pool laid out like upstream's
-- unit tests (a peer on h1/r1/z1/reg1 and candidates one level looser each),
-- with the Kubernetes topology labels, and calls of one instance with a
-- peer put where disagg-profile-handler puts it.
local S = require "support"

local T = {}

local HOST, RACK, ZONE, REGION = "kubernetes.io/hostname", "topology.kubernetes.io/rack",
  "topology.kubernetes.io/zone", "topology.kubernetes.io/region"

local function at(h, r, z, g)
  return { [HOST] = h, [RACK] = r, [ZONE] = z, [REGION] = g }
end

-- name -> labels, in pool order
T.POOL = {
  { "peer", at("h1", "r1", "z1", "reg1") },
  { "same-host", at("h1", "r1", "z1", "reg1") },
  { "same-rack", at("h2", "r1", "z1", "reg1") },
  { "same-zone", at("h2", "r2", "z1", "reg1") },
  { "same-region", at("h2", "r2", "z2", "reg1") },
  { "no-match", at("h3", "r3", "z3", "reg3") },
  { "rack-only", at(nil, "r1") },
  { "host-only", at("h1") },
  { "bare", {} },
  { "empty", at("", "", "", "") },
}

--- A runtime loaded with `config` (a Lua table) over T.POOL.
function T.runtime(config)
  local rt = S.loaded(config)
  for i, e in ipairs(T.POOL) do
    assert(rt:upsert({ name = e[1], address = "10.0.1." .. i, port = 8000, labels = e[2] }))
  end
  return rt
end

-- Runs `call` (Lua ending in a return; `self` the instance, `ctx` a request
-- whose ctx.shared holds the peer a.peer names, `eps` the endpoints a.names
-- names) inside the runtime.
local PRELUDE = [[
local a = require("cjson").decode(%q)
local by = {}
for _, ep in ipairs(require("lupin.runtime.pool").list) do
  by[ep.name] = ep
end
local eps = {}
for i, n in ipairs(a.names or {}) do eps[i] = by[n] end
local ctx = { shared = {}, plugin = {}, request = { id = "spec", headers = {} } }
if a.peer then
  ctx.shared[require("lupin.disagg").PEER] = by[a.peer]
end
local function names(list)
  local out = {}
  for i, ep in ipairs(list) do out[i] = ep.name end
  return out
end
]]

function T.call(rt, instance, a, call)
  return require("plugins.kit").instance(rt, instance, PRELUDE:format(S.json.encode(a)) .. call)
end

T.HOST, T.RACK, T.ZONE, T.REGION = HOST, RACK, ZONE, REGION
return T
