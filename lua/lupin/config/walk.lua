--- lupin.config.walk: checks a decoded config against a declaration (the
--- sections' in lupin.config.sections and lupin.config.flow) and reports the
--- first error as "file:line: json.path: message", the line from the
--- decoder's index (lupin.config.jsonpos, lupin.config.yaml).
---
--- A declaration is a table, as lupin.schema's fields are:
---   type      "object"|"array"|"string"|"number"|"integer"|"boolean"|"any",
---             or a unit: "quantity" ("1k", "5Gi") or "duration" ("30s"),
---             read by lupin.config.units (the output holds the number)
---   fields    (object) name -> declaration; a field not there is refused
---   order     (object) the order fields are checked in (else sorted)
---   values    (object) the declaration of every value of a free-form map
---   items     (array) the declaration of each item
---   what      the noun of a wrong-kind error: "<what> must be an array, got object"
---   known     the noun of an unknown-field error: "unknown field "x" in <known>"
---   required  the field must be given; missing: the message (at the
---             object's path) when it is not, else the value's own error
---   or_missing  a value of the wrong type or out of rule counts as missing
---   nullable  null is taken as it is (plugin parameters)
---   nonempty  (string) "" is refused
---   min, max, enum, pattern   bounds, the values allowed, a Lua pattern
---   default   the value when the field is absent
---   convert   function(v) -> v, before the checks (a switch's true -> 1)
---   check     function(v, path, ctx) -> message?, path?: a rule that is
---             truly special, after the others (for an object or array,
---             after its fields or items, with the checked output as v)
---   after     function(out, ctx, parent_out) -> error?: run once the field
---             is walked, given or not (the cross-references of a section,
---             in the order the sections are walked); a whole error text
---   message   the error of any broken rule, with {key} (the field's name)
---             and {got} (the value as JSON); messages = { type, empty,
---             min, max, enum, pattern } for one rule; else a message in
---             lupin.schema's words ("x must be an integer ≥ 0, got -1")
---   description  what the field is, for people
--- walk() returns the checked value (fresh tables, units read, defaults
--- filled) or nil and the error.
local cjson = require "cjson.safe"
local jsonpos = require "lupin.config.jsonpos"
local units = require "lupin.config.units"

local M = {}

--- A config error: "file:line: json.path: message".
local Errors = {}
Errors.__index = Errors

function Errors:at(path, fmt, ...)
  local line = self.index and jsonpos.line(self.index, path) or 1
  local where = path ~= "" and path .. ": " or ""
  return ("%s:%d: %s%s"):format(self.source, line, where, fmt:format(...))
end

--- The errors of a source (a file name) with its decoder's index.
function M.errors(source, index)
  return setmetatable({ source = source, index = index }, Errors)
end

--- A table's keys, sorted, as "a, b, c".
function M.sorted_keys(t)
  local list = {}
  for k in pairs(t) do
    list[#list + 1] = k
  end
  table.sort(list)
  return table.concat(list, ", ")
end

--- A value as an error shows it: its JSON.
function M.show(v)
  return cjson.encode(v) or tostring(v)
end

local function join(path, key)
  return path == "" and key or path .. "." .. key
end

local function article(t)
  return (t == "integer" or t == "array" or t == "object") and "an " .. t or "a " .. t
end

local function bounds(d)
  if d.min and d.max then
    return (" from %s to %s"):format(d.min, d.max)
  elseif d.min then
    return (" ≥ %s"):format(d.min)
  elseif d.max then
    return (" ≤ %s"):format(d.max)
  end
  return ""
end

local SCALAR = {
  string = function(v) return type(v) == "string" end,
  number = function(v) return type(v) == "number" and v == v end,
  integer = function(v) return type(v) == "number" and v == math.floor(v) end,
  boolean = function(v) return type(v) == "boolean" end,
  any = function() return true end,
  quantity = function(v) return units.quantity(v) ~= nil end,
  duration = function(v) return units.duration(v) ~= nil end,
}

-- The message of a broken rule of d for the value v of the field key.
local function message(d, rule, key, v)
  local m = d.messages and d.messages[rule] or d.message
  if not m then
    if rule == "enum" then
      local opts = {}
      for i, e in ipairs(d.enum) do
        opts[i] = M.show(e)
      end
      m = "{key} must be one of " .. table.concat(opts, ", ") .. ", got {got}"
    elseif rule == "empty" then
      m = "{key} must be a non-empty string"
    elseif rule == "pattern" then
      m = "{key} must be like " .. d.pattern .. ", got {got}"
    elseif d.type == "quantity" then
      m = '{key} must be a quantity ≥ 0 such as 1000, "1k" or "5Gi", got {got}'
    elseif d.type == "duration" then
      m = '{key} must be a duration such as "30s" or "1m0s", got {got}'
    else
      m = "{key} must be " .. article(d.type) .. bounds(d) .. ", got {got}"
    end
  end
  return (m:gsub("{(%w+)}", function(name)
    if name == "key" then
      return tostring(key or "the value")
    elseif name == "got" then
      return M.show(v)
    end
  end))
end

-- The first rule of a scalar declaration v breaks, or nil.
local function broken(d, v)
  if not SCALAR[d.type](v) then
    return "type"
  elseif d.nonempty and v == "" then
    return "empty"
  elseif d.min and v < d.min then
    return "min"
  elseif d.max and v > d.max then
    return "max"
  elseif d.pattern and not v:match(d.pattern) then
    return "pattern"
  elseif d.enum then
    for _, e in ipairs(d.enum) do
      if e == v then
        return nil
      end
    end
    return "enum"
  end
end

local walk

local function container(E, d, v, path, key)
  local want = d.type
  local got = E.index.kinds[path]
  if got ~= want then
    if d.messages and d.messages.type then
      return E:at(path, "%s", message(d, "type", key, v))
    end
    return E:at(path, "%s must be %s, got %s", d.what or key or "the config", article(want),
      got or "nothing")
  end
end

local function object(E, d, v, path, key, ctx)
  local err = container(E, d, v, path, key)
  if err then
    return nil, err
  end
  if not d.fields and not d.values then -- free-form: as it is
    return v
  end
  local out = {}
  if d.values then
    for k, x in pairs(v) do
      out[k], err = walk(E, d.values, x, join(path, tostring(k)), tostring(k), ctx, path)
      if err then
        return nil, err
      end
    end
    return out
  end
  for k in pairs(v) do
    if not d.fields[k] then
      return nil, E:at(join(path, tostring(k)), "unknown field %q in %s; known fields: %s",
        tostring(k), d.known or "the config", M.sorted_keys(d.fields))
    end
  end
  local order = d.order
  if not order then
    order = {}
    for k in pairs(d.fields) do
      order[#order + 1] = k
    end
    table.sort(order)
  end
  for _, k in ipairs(order) do
    local f, x = d.fields[k], v[k]
    if x == nil and f.required and f.missing then
      return nil, E:at(path, "%s", f.missing)
    elseif x == nil and not f.required then
      out[k] = f.default
    else
      out[k], err = walk(E, f, x, join(path, k), k, ctx, path)
      if err then
        return nil, err
      end
    end
    if f.after then
      err = f.after(out[k], ctx, out)
      if err then
        return nil, err
      end
    end
  end
  return out
end

local function array(E, d, v, path, key, ctx)
  local err = container(E, d, v, path, key)
  if err then
    return nil, err
  end
  if not d.items then
    return v
  end
  local out = {}
  for i, x in ipairs(v) do
    out[i], err = walk(E, d.items, x, ("%s[%d]"):format(path, i - 1), nil, ctx, path)
    if err then
      return nil, err
    end
  end
  return out
end

--- Checks v, the value at path (its field's name key, its parent's path
--- parent), against the declaration d.  ctx: what custom checks need.
---@return any out, string? err
function walk(E, d, v, path, key, ctx, parent)
  if d.nullable and v == cjson.null then
    return v
  end
  local out, err
  if d.type == "object" then
    out, err = object(E, d, v, path, key, ctx)
  elseif d.type == "array" then
    out, err = array(E, d, v, path, key, ctx)
  else
    if d.convert then
      v = d.convert(v)
    end
    local rule = broken(d, v)
    if rule and d.or_missing then
      return nil, E:at(parent or "", "%s", d.missing)
    elseif rule then
      return nil, E:at(path, "%s", message(d, rule, key, v))
    end
    out = d.type == "quantity" and units.quantity(v) or d.type == "duration"
      and units.duration(v) or v
  end
  if err then
    return nil, err
  end
  if d.check then
    local msg, at = d.check(out, path, ctx)
    if msg then
      return nil, E:at(at or path, "%s", msg)
    end
  end
  return out
end

M.walk = walk

return M
