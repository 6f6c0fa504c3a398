-- The endpoint pool as plugins see it.  Each endpoint is one FFI pointer to
-- the C struct: metrics are plain fields read in place, as are the in-flight
-- counters it shares with every runtime of the process (ep.in_flight,
-- ep.in_flight_tokens); the rest (name, labels, adapters) comes from a side
-- table keyed by the endpoint's id.
local ffi = require "ffi"
local capi = require "lupin.runtime.capi"
local log = require "lupin.log"
local readonly = require "lupin.runtime.readonly"

local M = {}

-- id -> { name, address, port, hostport, labels, ..., objects = n }: an
-- endpoint removed and added again has the id it had while an object of the
-- first time lives on (a request holds it): both share the entry, dropped
-- with the last of them
local info = {}
local by_id = {} -- id -> endpoint object, for endpoints in the pool
local order = {} -- ids in insertion order
local ejected = {} -- id -> true: out of the candidates (the host's health checks)

---@type lupin.Endpoint[] the current pool, healthy endpoints only; replaced,
---never mutated, on change
M.list = {}

-- M.list as published, never handed to plugin code: what M.list must
-- still hold (M.checked).
local pristine = {}

-- Whether list still holds what was published.
local function intact(list)
  local n = #pristine
  if #list ~= n then
    return false
  end
  for i = 1, n do
    if list[i] ~= pristine[i] then
      return false
    end
  end
  return true
end

-- The list plugins get is locked: no appending, and the sandbox's
-- table.insert, table.remove, table.sort and rawset refuse it.  Only an
-- assignment to an index it has gets through (Lua calls no metamethod for
-- that); M.checked finds it.
local LIST = {
  __newindex = function()
    error("the endpoint list is the pool's: a filter returns a new list", 2)
  end,
  __metatable = false,
}

--- The list, checked first: a plugin that replaced an element of it would
--- change the candidates of every later request.  A changed list is put
--- back in place (every request holding it sees the pool again) and the
--- change reaches the requests that read it in between at most.  (A
--- compare per request, where a copy per request was a list's worth of
--- garbage.)
---@return lupin.Endpoint[]
function M.checked()
  local list = M.list
  if intact(list) then
    return list
  end
  log.limited("pool/changed", "warn", "a plugin changed the endpoint list it was given"
    .. " (a filter returns a new list); the pool's list is restored")
  for i = 1, #pristine do
    rawset(list, i, pristine[i])
  end
  for i = #pristine + 1, #list do
    rawset(list, i, nil)
  end
  return list
end

-- Plain aligned 64-bit loads of counters C updates atomically (x86-64);
-- an endpoint object Lua made itself (a pick at another port) has none.
local COUNTERS_PTR = ffi.typeof("const lupin_counters *")
local COUNTERS = {
  in_flight = function(c)
    return tonumber(c.in_flight)
  end,
  in_flight_tokens = function(c)
    return tonumber(c.in_flight_tokens)
  end,
  in_flight_prefill_tokens = function(c)
    return tonumber(c.prefill_tokens)
  end,
}

ffi.metatype("lupin_endpoint", {
  __index = function(ep, k)
    local counter = COUNTERS[k]
    if counter then
      local c = ep.c_counters
      return c ~= 0 and counter(ffi.cast(COUNTERS_PTR, c)) or 0
    end
    local i = info[ep.id]
    return i and i[k]
  end,
  __tostring = function(ep)
    local i = info[ep.id]
    return i and i.name or "endpoint"
  end,
})

local EP_PTR = ffi.typeof("const lupin_endpoint *")

local function release(ep)
  local i = info[ep.id]
  if i then
    i.objects = i.objects - 1
    if i.objects == 0 then
      info[ep.id] = nil
    end
  end
  capi.api.endpoint_free(ep)
end

local function publish()
  local list, copy = {}, {}
  for i = 1, #order do
    local id = order[i]
    if not ejected[id] then
      list[#list + 1] = by_id[id]
      copy[#copy + 1] = by_id[id]
    end
  end
  pristine = list
  M.list = setmetatable(copy, LIST)
end

-- An adapter set is a list and a set at once, so it cannot be a view (# on
-- a view is 0 in Lua 5.1); it is locked as the candidate list is: no new
-- entry, and the sandbox's table functions and rawset refuse it.
local ADAPTERS = {
  __newindex = function()
    error("an endpoint's adapter set is every plugin's and read-only", 2)
  end,
  __metatable = false,
}

local function adapter_set(csv)
  local set = {}
  for name in (csv or ""):gmatch("[^,%s]+") do
    set[#set + 1] = name
    set[name] = true
  end
  return setmetatable(set, ADAPTERS)
end

function M.add(ud, labels)
  -- a const reference: plugin code can neither write its fields (the pool's
  -- metrics, its id) nor do arithmetic on it to read past it
  local ep = ffi.gc(ffi.cast(EP_PTR, ud)[0], release)
  local name = ffi.string(ffi.cast("const char *", ep.c_name))
  local address = ffi.string(ffi.cast("const char *", ep.c_address))
  local old = info[ep.id]
  info[ep.id] = {
    name = name,
    address = address,
    port = ep.port,
    -- an IPv6 address is bracketed, as Go's net.JoinHostPort writes it in the
    -- sidecar headers (x-prefiller-host-port...) and as URLs need it
    hostport = (address:find(":", 1, true) and "[" .. address .. "]" or address) .. ":" .. ep.port,
    labels = labels and readonly.view(labels), -- what plugins read: every request's
    raw_labels = labels,
    active_adapters = adapter_set(),
    waiting_adapters = adapter_set(),
    objects = (old and old.objects or 0) + 1,
  }
  by_id[ep.id] = ep
  order[#order + 1] = ep.id
  publish()
end

function M.remove(id)
  by_id[id] = nil
  ejected[id] = nil
  for i = 1, #order do
    if order[i] == id then
      table.remove(order, i)
      break
    end
  end
  publish()
end

--- The labels of the endpoint of that name, nil when it is not in the pool.
function M.labels_of(name)
  for i = 1, #order do
    local inf = info[order[i]]
    if inf and inf.name == name then
      return inf.raw_labels
    end
  end
end

function M.set_labels(id, labels)
  info[id].labels, info[id].raw_labels = labels and readonly.view(labels), labels
end

--- The labels of endpoint ep as the host gave them (ep.labels is a
--- read-only view of them).
function M.raw_labels(ep)
  local i = info[ep.id]
  return i and i.raw_labels
end

function M.set_adapters(id, running, waiting)
  local i = info[id]
  i.active_adapters = adapter_set(running)
  i.waiting_adapters = adapter_set(waiting)
end

--- The host's verdict on an endpoint (lupin_endpoint_set_healthy): an
--- unhealthy one stays in the pool but is no candidate.
function M.set_health(id, healthy)
  ejected[id] = not healthy or nil
  publish()
end

--- True when ep is in the pool and healthy: a candidate now.
function M.is_candidate(ep)
  return by_id[ep.id] == ep and not ejected[ep.id]
end

local EP = ffi.typeof("lupin_endpoint")

--- True when v is an endpoint object (the pool's references, or a pick at
--- another port: lupin.engine's at_port).
function M.is_endpoint(v)
  return ffi.istype(EP, v)
end

return M
