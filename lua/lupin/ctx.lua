--- The per-request state and the `ctx` object plugins receive.
---
--- One table per request (held only by the C request object):
---   shared            request-wide, every plugin reads and writes it
---   plugins[name]     private to one plugin instance, across all its points
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
---@field upstream_headers table<string,string> headers set for the upstream request
---@field response_headers table<string,string> headers set for the client's response
---@field log fun(self: lupin.Ctx, level: lupin.Level, fmt: any, ...: any) logs with the request id and plugin name
---@field set_header fun(self: lupin.Ctx, name: string, value: string) a header on the upstream request
---@field set_response_header fun(self: lupin.Ctx, name: string, value: string) a header on the client's response
local M = {}

local cjson = require "cjson.safe"
local new_table = require "table.new"
local gateway = require "lupin.gateway"
local leaks = require "lupin.leaks"
local log = require "lupin.log"
local weak = require "lupin.weak"

local FIELDS = {}

function FIELDS.plugin(r, c)
  local name = rawget(c, "name")
  local t = r.plugins[name]
  if not t then
    t = {}
    r.plugins[name] = t
    leaks.own(r, t, name)
  end
  rawset(c, "plugin", t)
  return t
end

function FIELDS.cycle(r, c)
  local p = rawget(c, "profile")
  if not p then
    return nil
  end
  local t = r.profiles[p]
  if not t then
    t = {}
    r.profiles[p] = t
    leaks.own(r, t, false)
  end
  rawset(c, "cycle", t)
  return t
end

function FIELDS.shared(r, c)
  local t = r.shared
  if not t then
    t = {}
    r.shared = t
    leaks.own(r, t, false)
  end
  rawset(c, "shared", t)
  return t
end

function FIELDS.request(r, c)
  rawset(c, "request", r.request)
  return r.request
end

function FIELDS.result(r) return r.result end
function FIELDS.response(r) return r.response end

function FIELDS.upstream_headers(r)
  local h = r.upstream_headers
  if not h then
    h = {}
    r.upstream_headers = h
  end
  return h
end

function FIELDS.response_headers(r)
  local h = r.response_headers
  if not h then
    h = {}
    r.response_headers = h
  end
  return h
end

local METHODS = {}

--- Logs with the request id and plugin name: ctx:log("warn", "x=%d", x)
---@param level "error"|"warn"|"info"|"debug"
function METHODS.log(c, level, fmt, ...)
  log.log(level, "request " .. c.request.id .. " [" .. rawget(c, "name") .. "] " .. tostring(fmt),
    ...)
end

--- Sets a header on the upstream request (from pre_request and before).
---@param name string
---@param value string
function METHODS.set_header(c, name, value)
  c.upstream_headers[tostring(name):lower()] = tostring(value)
end

--- Sets a header on the response to the client (e.g. a session cookie).
---@param name string
---@param value string
function METHODS.set_response_header(c, name, value)
  local h = c.response_headers
  h[tostring(name):lower()] = tostring(value)
end

--- The request as plugins read it; body and prompt are decoded on first use.
---@class lupin.RequestView
---@field id string
---@field model string?
---@field path string
---@field headers table<string,string> lower-case names
---@field body table|false the decoded JSON body, false when it is not JSON
---@field prompt string completions: the prompt (arrays joined by a space); chat: the JSON of messages
---@field stream boolean
---@field dry_run boolean? true for the synthetic request that checks a new generation before it serves

local function prompt_of(body)
  if type(body) ~= "table" then
    return ""
  end
  local p = body.prompt
  if type(p) == "string" then
    return p
  elseif type(p) == "table" then
    local parts = {}
    for i, s in ipairs(p) do
      parts[i] = tostring(s)
    end
    return table.concat(parts, " ")
  elseif type(body.messages) == "table" then
    return cjson.encode(body.messages) or ""
  end
  return ""
end

local LAZY = {}

function LAZY.body(v)
  local raw = rawget(v, "raw_body")
  local body = raw and (gateway.take_decoded(raw) or cjson.decode(raw))
  return type(body) == "table" and body or false
end

function LAZY.prompt(v)
  return prompt_of(v.body)
end

function LAZY.model(v)
  local body = v.body
  return body and type(body.model) == "string" and body.model or nil
end

function LAZY.stream(v)
  local body = v.body
  return body and body.stream == true or false
end

local VIEW = {
  __index = function(v, k)
    local f = LAZY[k]
    if f then
      local x = f(v)
      rawset(v, k, x)
      return x
    end
  end,
}

-- A ctx finds its request through a box that holds it weakly: the
-- request's leak manifest, whose first slot is the request (lupin.leaks).
-- Everything a ctx touches is shared across requests -- one metatable, one
-- __index function -- because LuaJIT traces embed the identity of the
-- closures they call and of the metatables they guard on: a per-request
-- closure or metatable caught in a trace would keep that request's table
-- alive.
local box_of = weak.keys() -- ctx -> box

local CTX = {
  __index = function(c, k)
    local f = FIELDS[k]
    if f then
      local r = box_of[c][1]
      if not r then
        error("ctx used after its request ended", 2)
      end
      return f(r, c)
    end
    return METHODS[k]
  end,
  __metatable = "ctx",
}

--- Resizes the ctx registry to what it holds now (see lupin.weak).
function M.compact()
  box_of = weak.rebuilt(box_of)
end

--- A request's state table.
---@param gen table the generation it is pinned to
---@param creq ffi.cdata* the C request
---@param id string
---@param path string
---@param body string? the raw body
---@param model string?
---@param headers table<string,string> lower-case names
function M.new_request(gen, creq, id, path, body, model, headers)
  -- every field the engine sets later is here from the start (false until
  -- then, or nil where plugins see it: result, response, shared): the table
  -- is made at its final size, with no rehash on the way
  local r = {
    id = id,
    gen = gen,
    creq = creq,
    request = setmetatable({ id = id, path = path, raw_body = body, model = model,
      headers = headers }, VIEW),
    plugins = {},
    profiles = {},
    ctxs = new_table(0, #gen.instances),
    outcome = false, -- set when the request ends (by the core: no allocation)
    manifest = false,
    candidates = false,
    subset = false,
  }
  r.manifest = leaks.track(r, id, creq == nil, #gen.instances)
  return r
end

--- The ctx of one plugin instance for a request; creating it marks the
--- plugin as reached, so its finish hook will run.
function M.of(r, rec)
  local c = r.ctxs[rec]
  if not c then
    -- room for the fields it caches (plugin, profile, cycle, request)
    c = setmetatable(new_table(0, 4), CTX)
    c.name = rec.name
    box_of[c] = r.manifest
    r.ctxs[rec] = c
    leaks.own(r, c, rec.name)
  end
  return c
end

return M
