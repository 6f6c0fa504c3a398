--- The per-request state and the `ctx` object plugins receive.
---
--- One table per request (held only by the C request object):
---   shared            request-wide, every plugin reads and writes it
---   ctxs[slot]        one ctx per plugin instance reached; its private table
---                     (ctx.plugin) inside it, across all the instance's points
---   profiles[name]    one per scheduling profile run: that profile's cycle state
--- A plugin never gets the request table itself, only its own ctx, whose
--- fields resolve to its slice of the tree; subtables are made on first use.
---@class lupin.Ctx
---@field name string the plugin instance's name
---@field plugin table private to this plugin instance for this request
---@field cycle table? the current profile's cycle state (nil outside profiles)
---@field profile string? the name of the profile being run
---@field shared table request-wide data
---@field request lupin.RequestView id, model, path, headers, body, prompt, stream
---@field result lupin.Result? the scheduling result (after scheduling)
---@field response lupin.Response? status and headers (after the response starts)
---@field timing lupin.Timing? when the response came (nil in a dry run)
---@field upstream_headers table<string,string> headers set for the upstream request
---@field response_headers table<string,string> headers set for the client's response
---@field log fun(self: lupin.Ctx, level: lupin.Level, fmt: any, ...: any) logs with the request id and plugin name
---@field set_header fun(self: lupin.Ctx, name: string, value: string) a header on the upstream request
---@field set_response_header fun(self: lupin.Ctx, name: string, value: string) a header on the client's response
---@field set_in_flight_tokens fun(self: lupin.Ctx, ep: lupin.Endpoint, n: integer): boolean tokens on ep until the end
---@field set_prefill_tokens fun(self: lupin.Ctx, ep: lupin.Endpoint, n: integer): boolean prefill on ep to its 1st byte
local M = {}

--- When a response came, in seconds of env.now()'s clock (0: not yet).  Kept
--- only for generations with a plugin declaring
--- `times_response = true`.
---@class lupin.Timing
---@field begun_at number the request began (reached the gateway)
---@field head_at number the response head arrived
---@field first_byte_at number the first body byte arrived
---@field last_byte_at number the last body byte so far
---@field bytes integer body bytes so far
---@field chunks integer body pieces the host handed over
---@field events integer server-sent events ended so far (blank lines)

local cjson = require "cjson.safe"
local ffi = require "ffi"
local json = require "lupin.runtime.json"
local new_table = require "table.new"
local capi = require "lupin.runtime.capi"
local leaks = require "lupin.runtime.leaks"
local openai = require "lupin.runtime.openai"
local log = require "lupin.log"
local pool = require "lupin.runtime.pool"

local FIELDS = {}
local current = false -- the request whose plugin call is under way (M.enter)

-- A ctx is a three-slot array: the instance's name, its private table once
-- made, and the instance's slot in its request's ctxs.  A small array part
-- lives in its table's own allocation: a ctx costs one allocation, where
-- named fields took more.
local NAME, PRIVATE, SLOT = 1, 2, 3

-- The private table, made on first use like the cycle and shared tables,
-- with room for two fields: a plugin keeps a few, and each growth of an
-- empty table's hash part is an allocation of its own.
function FIELDS.plugin(r, c)
  local t = new_table(0, 2)
  rawset(c, PRIVATE, t)
  leaks.own(r, t, rawget(c, NAME))
  return t
end

-- The profile of the call under way is the request's (the engine sets it
-- per call), not kept in each ctx: a ctx then holds its name and private
-- table only.
function FIELDS.profile(r)
  return r.profile or nil
end

function FIELDS.cycle(r)
  local p = r.profile
  if not p then
    return nil
  end
  local all = r.profiles
  if not all then
    all = {}
    r.profiles = all
  end
  local t = all[p]
  if not t then
    t = {}
    all[p] = t
    leaks.own(r, t, false)
  end
  return t
end

function FIELDS.shared(r)
  local t = r.shared
  if not t then
    t = new_table(0, 2) -- made for what it will hold, as the private table
    r.shared = t
    leaks.own(r, t, false)
  end
  return t -- not cached in the ctx: a fifth key would double its size
end

function FIELDS.request(r)
  return r.request
end

function FIELDS.result(r) return r.result end
function FIELDS.response(r) return r.response end

local timing = ffi.new("lupin_response_timing")

-- When the response came, as the core saw it (a new table each read; nil
-- without a C request: the dry run, lupin.testing's calls).  All zeros
-- unless a plugin of the generation has times_response = true.
function FIELDS.timing(r)
  local creq = r.creq
  if not creq then
    return nil
  end
  capi.api.request_timing(creq, timing)
  local t = timing
  return { begun_at = t.begun_at, head_at = t.head_at, first_byte_at = t.first_byte_at,
    last_byte_at = t.last_byte_at, bytes = tonumber(t.bytes), chunks = tonumber(t.chunks),
    events = tonumber(t.events) }
end

-- ctx.upstream_headers and ctx.response_headers are views: a write goes
-- through the same checks as ctx:set_header, so a plugin cannot forge a
-- header the gateway owns by assigning it.  The view finds its table through
-- the request whose call is under way (no reference of its own to keep).
local HEADER_FIELDS = {} -- the request's field of a view -> the view's metatable

local function headers_view(r, field, view_field)
  local v = r[view_field]
  if not v then
    r[field] = r[field] or {}
    v = setmetatable({}, HEADER_FIELDS[view_field])
    r[view_field] = v
  end
  return v
end

function FIELDS.upstream_headers(r)
  return headers_view(r, "upstream_headers", "upstream_headers_view")
end

function FIELDS.response_headers(r)
  return headers_view(r, "response_headers", "response_headers_view")
end

local METHODS = {}

--- Logs with the request id and plugin name: ctx:log("warn", "x=%d", x)
---@param level "error"|"warn"|"info"|"debug"
function METHODS.log(c, level, fmt, ...)
  log.log(level, "request " .. c.request.id .. " [" .. rawget(c, NAME) .. "] " .. tostring(fmt),
    ...)
end

-- Headers a plugin may not set: the hop-by-hop and framing ones each side of
-- the proxy writes for itself (a second content-length or transfer-encoding
-- would let one request be read as two), and the ones the host sets (the EPP convention).
local RESERVED = { connection = true, ["keep-alive"] = true, ["proxy-connection"] = true,
  te = true, ["transfer-encoding"] = true, upgrade = true, trailer = true,
  ["content-length"] = true, host = true, expect = true, ["x-request-id"] = true,
  ["x-gateway-destination-endpoint"] = true }
M.RESERVED_HEADERS = RESERVED

-- A string for a log line: quoted, control characters as \ddd, at most 60
-- bytes of it (%q would keep a newline).
local function shown(s)
  local cut = #s > 60 and s:sub(1, 60) .. "..." or s
  return '"' .. cut:gsub('[%c"\\]', function(ch)
    return ("\\%d"):format(ch:byte())
  end) .. '"'
end

--- Checks a header a plugin sets (RFC 9110 §5): the name a token, the value
--- free of control characters but tab (CR or LF would end the header and
--- start another, or a second request).  Returns the lower-case name and the
--- value, or nil and why not.
---@return string? name, string value_or_error
function M.check_header(name, value)
  if type(name) ~= "string" or name == "" or name:find("[^%w!#$%%&'*+%-.^_`|~]") then
    return nil, ("invalid header name %s: a name is letters, digits and !#$%%&'*+-.^_`|~"):format(
      type(name) == "string" and shown(name) or tostring(name))
  end
  local lower = name:lower()
  if RESERVED[lower] then
    return nil, ("header %s is the gateway's to set (hop-by-hop, framing or its own)"):format(
      lower)
  end
  if type(value) == "number" then
    value = tostring(value)
  elseif type(value) ~= "string" then
    return nil, ("header %s: the value must be a string, got %s"):format(lower, type(value))
  end
  if value:find("[%z\1-\8\10-\31\127]") then
    return nil, ("header %s: the value %s holds a control character (CR, LF, NUL...)"):format(
      lower, shown(value))
  end
  return lower, value
end

local function set(h, name, value)
  local n, v = M.check_header(name, value)
  if not n then
    error(v, 3) -- a plugin error for the call that set it, at the plugin's line
  end
  h[n] = v
end


--- Sets a header on the upstream request (from pre_request and before).  A
--- bad name or value (see check_header) is an error of the calling plugin.
---@param name string a token, not a hop-by-hop or framing header
---@param value string|number no control characters but tab
function METHODS.set_header(c, name, value)
  local _ = c.upstream_headers -- made on first use (and c checked)
  set(current.upstream_headers, name, value)
end

--- Sets a header on the response to the client (e.g. a session cookie).
---@param name string a token, not a hop-by-hop or framing header
---@param value string|number no control characters but tab
function METHODS.set_response_header(c, name, value)
  local _ = c.response_headers
  set(current.response_headers, name, value)
end

local count -- capi's request_count, looked up once bound

--- Sets what a live request counts on ep's shared in-flight counters
--- (ep.in_flight, ep.in_flight_tokens: every runtime of the process adds
--- to the same): requests (0 or 1) and tokens, each nil to leave as it is.
--- The core takes it all off when the request ends, whatever the outcome
--- (core/request.c); r.held keeps ep alive until then, and with it the
--- counters.  False when nothing was counted: a dry run, a request that is
--- ending, or out of memory.
function M.count(r, ep, requests, tokens)
  if r.dry or not r.creq or r.outcome then
    return false
  end
  -- r.held: the one endpoint, or a list once there are more (one table
  -- less per request in the common case)
  local held = r.held
  if not held then
    r.held = ep
  elseif type(held) ~= "table" then
    if held ~= ep then
      r.held = { held, ep }
    end
  else
    local n = #held
    for i = 1, n do
      if held[i] == ep then
        n = -1
        break
      end
    end
    if n >= 0 then
      held[n + 1] = ep
    end
  end
  count = count or capi.api.request_count
  return count(r.creq, ep, requests or -1, tokens or -1) == 0
end

--- The request as plugins read it; body and prompt are decoded on first use.
--- prompt, by route: completions the prompt (arrays joined by a space); chat
--- the JSON of messages; embeddings, pooling, classify the input; responses
--- the instructions and input; messages the system and messages; rerank and
--- score the query; "" for tokenize, detokenize and audio.
---@class lupin.RequestView
---@field id string
---@field model string?
---@field path string
---@field headers table<string,string> lower-case names
---@field body table|false the decoded JSON body, false when it is not JSON
---@field prompt string what the prefix scorer hashes, by route (lupin.openai.prompt)
---@field stream boolean
---@field priority integer its objective's priority, as flow control reads it (0: none)
---@field dry_run boolean? true for the synthetic request that checks a new generation before it serves
---@field explained boolean? true when the request keeps an explain record (what a plugin publishes for it may say more)

local found_len = ffi.new("size_t[1]")

--- The value of the header named name (in lower case) in a header block
--- (the begin hook's: core/request.c), or nil: the last one of that name.
---@param block string
---@param name string
---@return string?
function M.header(block, name)
  local p = capi.api.header_find(block, #block, name, #name, found_len)
  if p ~= nil then
    return ffi.string(p, found_len[0])
  end
end

--- The headers of a block as the table plugins read, name to value.
---@param block string
---@return table<string,string>
function M.header_table(block)
  local t = {}
  for name, value in block:gmatch("(%Z*)%z(%Z*)%z") do
    t[name] = value
  end
  return t
end

local LAZY = {}

-- Made from the block the request came with on first use: a default
-- request's plugins never read its headers.
function LAZY.headers(v)
  local block = rawget(v, "raw_headers")
  return block and M.header_table(block) or {}
end

-- The response as plugins read it: the status, and the headers made from
-- the core's header block on first use, as the request's.
local RESPONSE = {
  __metatable = false, -- shared by every response: read-only to plugins
  __index = function(v, k)
    if k == "headers" then
      local t = LAZY.headers(v)
      rawset(v, k, t)
      return t
    end
  end,
}

--- ctx.response from the core's status and header block.
---@param status integer
---@param block string
function M.response_view(status, block)
  return setmetatable({ status = status, raw_headers = block }, RESPONSE)
end

function LAZY.body(v)
  local raw = rawget(v, "raw_body")
  local body = raw and json.decode(raw, cjson)
  return type(body) == "table" and body or false
end

function LAZY.prompt(v)
  return openai.prompt(rawget(v, "path"), v.body)
end

function LAZY.model(v)
  local body = v.body
  return body and type(body.model) == "string" and body.model or nil
end

-- As flow control reads it (its objective's, lupin.runtime.flow), which
-- needs the request's generation: known during its own plugin calls.
function LAZY.priority(v)
  local r = current
  if r and r.request == v then
    return require("lupin.runtime.flow").priority_of(r.gen, v.headers)
  end
end

function LAZY.stream(v)
  local body = v.body
  return body and body.stream == true or false
end

local VIEW = {
  __metatable = false, -- shared by every request: read-only to plugins
  __index = function(v, k)
    local f = LAZY[k]
    if f then
      local x = f(v)
      rawset(v, k, x)
      return x
    end
  end,
}

-- A ctx answers for its request only during a plugin call that request
-- makes: engine.call names the request whose call is under way (M.enter),
-- and a ctx is that request's when the request keeps it at its slot.  A ctx
-- kept past its request, or used in another request's call, finds nothing
-- and raises.  So a ctx holds no reference to its request, and nothing
-- maps ctxs to requests: no registry to insert into per ctx.
-- Everything a ctx touches is shared across requests -- one metatable, one
-- __index function -- because LuaJIT traces embed the identity of the
-- closures they call and of the metatables they guard on: a per-request
-- closure or metatable caught in a trace would keep that request's table
-- alive.

--- Makes r the request whose plugin call is under way; returns the one
--- before, for M.leave (calls may nest).
function M.enter(r)
  local prev = current
  current = r
  return prev
end

--- Ends the call M.enter started.
function M.leave(prev)
  current = prev
end

for view_field, field in pairs({ upstream_headers_view = "upstream_headers",
  response_headers_view = "response_headers" }) do
  -- the request's table behind view v, which must be that request's
  local function headers_of(v)
    local r = current
    if not r or r[view_field] ~= v then
      error("ctx." .. field .. " used after its request ended", 3)
    end
    return r[field]
  end
  HEADER_FIELDS[view_field] = {
    __index = function(v, k)
      return headers_of(v)[type(k) == "string" and k:lower() or k]
    end,
    __newindex = function(v, k, value)
      local h = headers_of(v)
      if value == nil and type(k) == "string" then
        h[k:lower()] = nil
      else
        set(h, k, value)
      end
    end,
    __metatable = false,
  }
end

-- The request of ctx c, which must be the one whose call is under way.
local function request_of(c)
  local r = current
  if not r or r.ctxs[rawget(c, SLOT)] ~= c then
    error("ctx used after its request ended (or outside the plugin calls of its request)", 3)
  end
  return r
end

--- Sets this request's tokens in flight on ep to n: ep.in_flight_tokens,
--- the process's, includes them until the request ends, when the core takes
--- them off again on every path (a plugin never releases them itself).
--- Setting again replaces the request's count there, so two plugins, or two
--- profiles choosing the same endpoint, count it once.  Returns false when
--- nothing was counted (a dry run, a request in its finish hooks).
---@param ep lupin.Endpoint
---@param n integer tokens, at least 0 (0: none any more)
---@return boolean
function METHODS.set_in_flight_tokens(c, ep, n)
  if not pool.is_endpoint(ep) then
    error(("set_in_flight_tokens: ep must be an endpoint, got %s"):format(type(ep)), 2)
  end
  if type(n) ~= "number" or n < 0 or n % 1 ~= 0 or n == math.huge then
    error(("set_in_flight_tokens: n must be a whole number from 0, got %s"):format(
      tostring(n)), 2)
  end
  return M.count(request_of(c), ep, nil, n)
end

--- Sets this request's prefill tokens on ep to n: ep.in_flight_prefill_tokens,
--- the process's, includes them until the response's first body byte comes
--- back (the core takes them off then, or at the end on every path), so it
--- is the prefill work queued there: what TTFT waits for.  The first byte
--- is seen when a plugin of the generation has times_response or
--- response_chunk; else they count until the end.  Returns false when
--- nothing was counted (a dry run, a response already started).
---@param ep lupin.Endpoint
---@param n integer tokens, at least 0
---@return boolean
function METHODS.set_prefill_tokens(c, ep, n)
  if not pool.is_endpoint(ep) then
    error(("set_prefill_tokens: ep must be an endpoint, got %s"):format(type(ep)), 2)
  end
  if type(n) ~= "number" or n < 0 or n % 1 ~= 0 or n == math.huge then
    error(("set_prefill_tokens: n must be a whole number from 0, got %s"):format(
      tostring(n)), 2)
  end
  local r = request_of(c)
  if not M.count(r, ep) then -- held (kept alive) like the in-flight counts
    return false
  end
  return capi.api.request_prefill(r.creq, ep, n) == 0
end

local CTX = {
  __index = function(c, k)
    if k == "name" then
      return rawget(c, NAME)
    elseif k == "plugin" then
      local t = rawget(c, PRIVATE)
      if t then
        return t
      end
    end
    local f = FIELDS[k]
    if f then
      return f(request_of(c), c)
    end
    return METHODS[k]
  end,
  __metatable = "ctx",
}

--- A request's state table.
---@param gen table the generation it is pinned to
---@param creq number|false|nil the C request's address (nil: the dry run, false: a probe)
---@param id string
---@param path string
---@param body string|lightuserdata|nil the raw body: kept when a string, to
--- decode on first use; a pointer (a checked body, decoded already) is not
---@param model string?
---@param headers table<string,string>|string lower-case names, or a header block (M.header)
---@param body_len integer? the body's bytes (flow control counts them)
function M.new_request(gen, creq, id, path, body, model, headers, body_len)
  -- every field the engine sets later is here from the start (false until
  -- then, or nil where plugins see it: result, response, shared): the table
  -- is made at its final size, with no rehash on the way
  local r = {
    id = id,
    gen = gen,
    creq = creq,
    request = setmetatable({ id = id, path = path, model = model,
      raw_body = type(body) == "string" and body or nil,
      body_bytes = type(body) == "string" and #body or body_len or 0,
      headers = type(headers) == "table" and headers or nil,
      raw_headers = type(headers) == "string" and headers or nil }, VIEW),
    profiles = false, -- made on first use (FIELDS.cycle)
    profile = false, -- the profile of the plugin call under way (engine.call)
    ctxs = new_table(#gen.instances, 0), -- by the instance's slot: an array
    outcome = false, -- set when the request ends (by the core: no allocation)
    manifest = false,
    candidates = false,
    subset = false,
    held = false, -- the endpoint(s) counted on (M.count), kept alive until the end
    results_view = false, -- the profile handler's view of the results (engine)
    failures = false, -- the profiles that failed, by name (engine; made at the first)
  }
  r.manifest = leaks.track(r, id, creq == nil, #gen.instances)
  return r
end

--- The ctx of one plugin instance for a request; creating it marks the
--- plugin as reached, so its finish hook will run.
function M.of(r, rec)
  local slot = rec.slot or rec -- (an instance outside gen.instances: by itself)
  local c = r.ctxs[slot]
  if not c then
    c = setmetatable(new_table(3, 0), CTX)
    c[NAME], c[SLOT] = rec.name, slot
    r.ctxs[slot] = c
    leaks.own(r, c, rec.name)
  end
  return c
end

--- The private table of rec's instance in request r, if it made one.
function M.private(r, rec)
  local c = r.ctxs[rec.slot or rec]
  return c and rawget(c, PRIVATE) or nil
end

return M
