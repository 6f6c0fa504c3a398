--- lupin.schema: declarative validation of plugin parameters.
---
--- A schema maps each parameter name to a field description:
---   { type = "number"|"integer"|"string"|"boolean"|"array"|"object"|"any",
---     default = v, required = true, min = n, above = n, max = n, enum = { ... },
---     items = "string"|"number"|..., fallback = v, description = "..." }
--- Parameters not in the schema are refused, so typos surface at load time.
--- A field with a fallback takes a value below its min as the EPP does: it is
--- replaced with the fallback and reported as a warning, not refused.
---@class lupin.schema
local M = {}

local cjson = require "cjson"

---@class lupin.SchemaField
---@field type "number"|"integer"|"string"|"boolean"|"array"|"object"|"any"
---@field default any
---@field required boolean?
---@field min number?
---@field above number? an exclusive min: the value must be greater
---@field max number?
---@field enum any[]?
---@field items string? the type of an array's items
---@field fallback any? what a value below min is replaced with (with a warning), as the EPP does
---@field description string?

local TYPES = {
  number = true, integer = true, string = true, boolean = true,
  array = true, object = true, any = true,
}

local function is_array(t)
  local n = 0
  for k in pairs(t) do
    if type(k) ~= "number" or k < 1 or k % 1 ~= 0 then
      return false
    end
    n = n + 1
  end
  return n == #t
end

local function type_ok(want, v)
  local t = type(v)
  if want == "any" then
    return true
  elseif want == "number" then
    return t == "number" and v == v
  elseif want == "integer" then
    return t == "number" and v % 1 == 0
  elseif want == "array" then
    return t == "table" and is_array(v)
  elseif want == "object" then
    return t == "table"
  end
  return t == want
end

local function show(v)
  if type(v) == "string" then
    return ("%q"):format(v)
  elseif type(v) == "table" then
    local ok, s = pcall(cjson.encode, v)
    return ok and s or "a table"
  elseif v == cjson.null then
    return "null"
  end
  return tostring(v)
end

local function keys(t)
  local list = {}
  for k in pairs(t) do
    list[#list + 1] = k
  end
  table.sort(list)
  return list
end

local function copy(v)
  if type(v) ~= "table" then
    return v
  end
  local t = {}
  for k, x in pairs(v) do
    t[k] = copy(x)
  end
  return t
end

local function bounds(f)
  if f.above then
    return (" > %s%s"):format(f.above, f.max and (" and ≤ %s"):format(f.max) or "")
  elseif f.min and f.max then
    return (" between %s and %s"):format(f.min, f.max)
  elseif f.min then
    return (" ≥ %s"):format(f.min)
  elseif f.max then
    return (" ≤ %s"):format(f.max)
  end
  return ""
end

local function article(t)
  return (t == "integer" or t == "array" or t == "object" or t == "any") and "an " .. t
    or "a " .. t
end

local function check_field(name, f, v)
  if not type_ok(f.type, v) then
    return ("must be %s%s, got %s"):format(article(f.type), bounds(f), show(v))
  end
  if (f.min and v < f.min) or (f.above and v <= f.above) or (f.max and v > f.max) then
    return ("must be %s%s, got %s"):format(article(f.type), bounds(f), show(v))
  end
  if f.enum then
    for _, e in ipairs(f.enum) do
      if e == v then
        return nil
      end
    end
    local opts = {}
    for i, e in ipairs(f.enum) do
      opts[i] = show(e)
    end
    return ("must be one of %s, got %s"):format(table.concat(opts, ", "), show(v))
  end
  if f.items then
    for i, x in ipairs(v) do
      if not type_ok(f.items, x) then
        return ("item %d must be %s, got %s"):format(i - 1, article(f.items), show(x))
      end
    end
  end
  return nil, name
end

--- Checks that a schema itself is well formed (for plugin authors' typos).
---@param schema table<string, lupin.SchemaField>
---@return boolean ok, string? err
function M.check(schema)
  if type(schema) ~= "table" then
    return false, "schema must be a table of parameter descriptions"
  end
  for name, f in pairs(schema) do
    if type(f) ~= "table" or not TYPES[f.type] then
      return false, ("schema field %q needs a type among number, integer, string, boolean,"
        .. " array, object, any"):format(tostring(name))
    end
  end
  return true
end

-- A number below the min of a field with a fallback: the fallback, as the EPP
-- replaces such values with its default.
local function fallback(f, v)
  if f.fallback ~= nil and f.min and type_ok(f.type, v) and v < f.min then
    return f.fallback
  end
end

--- Validates parameters against a schema and fills in defaults.
--- Returns a fresh table, or nil, the message and the name of the bad field.
--- The fourth result lists the fallbacks applied: { field, given, used }.
---@param schema table<string, lupin.SchemaField>?
---@param params table?
---@return table? params, string? err, string? field, table[]? fallbacks
function M.validate(schema, params)
  schema = schema or {}
  if params == nil or params == cjson.null then
    params = {}
  elseif type(params) ~= "table" then
    return nil, ("parameters must be an object, got %s"):format(show(params))
  end
  for k in pairs(params) do
    if schema[k] == nil then
      local known = keys(schema)
      return nil, ("unknown parameter %s; %s"):format(show(k),
        #known > 0 and "known parameters: " .. table.concat(known, ", ")
          or "this plugin takes no parameters"), tostring(k)
    end
  end
  local out, fell = {}, {}
  for _, name in ipairs(keys(schema)) do
    local f, v = schema[name], params[name]
    local used = v ~= nil and fallback(f, v)
    if used then
      fell[#fell + 1] = { field = name, given = v, used = used }
      out[name] = copy(used)
    elseif v == nil or v == cjson.null then
      if f.required then
        return nil, ("missing required parameter %q (%s%s)"):format(name,
          article(f.type), bounds(f)), name
      end
      out[name] = copy(f.default)
    else
      local err = check_field(name, f, v)
      if err then
        return nil, err, name
      end
      out[name] = copy(v)
    end
  end
  return out, nil, nil, fell
end

return M
