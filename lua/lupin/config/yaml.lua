-- YAML configs: libyaml's events (Debian's lua-yaml, the C module `yaml`)
-- built into the same values cjson gives for JSON, and the same index of
-- paths to lines and kinds lupin.jsonpos gives, so both forms of a config get
-- the same checks and the same "file:line: path: message" errors.
--
-- Plain scalars resolve by the YAML 1.2 core schema: null, true/false, ints
-- (decimal, 0o octal, 0x hex), floats (.inf, .nan); everything else is a
-- string, so `yes`, `no`, `on`, `off` stay strings, as YAML 1.2 says.
local cjson = require "cjson.safe"
local libyaml = require "yaml"

local M = {}

local TAG = "tag:yaml.org,2002:"

local NULLS = { [""] = true, ["~"] = true, null = true, Null = true, NULL = true }
local BOOLS = { ["true"] = true, True = true, TRUE = true, ["false"] = false, False = false,
  FALSE = false }

local function number(s)
  if s:match("^[-+]?%d+$") then
    return tonumber(s)
  elseif s:match("^0o[0-7]+$") then
    return tonumber(s:sub(3), 8)
  elseif s:match("^0x%x+$") then
    return tonumber(s:sub(3), 16)
  end
  local body = s:match("^[-+]?(.*)$")
  local mantissa, exp = body:match("^(%.%d+)(.*)$")
  if not mantissa then
    mantissa, exp = body:match("^(%d+%.?%d*)(.*)$")
  end
  if mantissa and (exp == "" or exp:match("^[eE][-+]?%d+$")) then
    return tonumber(s)
  end
  local sign, inf = body ~= s and s:sub(1, 1), body:match("^%.(%a+)$")
  if inf == "inf" or inf == "Inf" or inf == "INF" then
    return sign == "-" and -math.huge or math.huge
  elseif s == ".nan" or s == ".NaN" or s == ".NAN" then
    return 0 / 0
  end
end

--- A scalar event's value and kind.
local function scalar(ev)
  local s, tag = ev.value, ev.tag
  if tag then
    tag = tag:sub(1, #TAG) == TAG and tag:sub(#TAG + 1) or tag
    if tag == "str" then
      return s, "string"
    elseif tag == "null" then
      return cjson.null, "null"
    elseif tag == "bool" and BOOLS[s] ~= nil then
      return BOOLS[s], "boolean"
    elseif (tag == "int" or tag == "float") and number(s) then
      return number(s), "number"
    end
    return nil, nil, ("cannot read %q as !!%s"):format(s, tag)
  end
  if ev.style ~= "PLAIN" then
    return s, "string"
  elseif NULLS[s] then
    return cjson.null, "null"
  elseif BOOLS[s] ~= nil then
    return BOOLS[s], "boolean"
  end
  local n = number(s)
  if n then
    return n, "number"
  end
  return s, "string"
end

local function join(path, key)
  return path == "" and key or path .. "." .. key
end

-- The documents of a YAML stream: a list of { value, index, line } (line:
-- where the document starts), or nil and "source:line: invalid YAML: ...".
-- line0 is added to every line (a text that sits inside another file, such
-- as a ConfigMap's data).  One index per document: the paths of each are
-- its own.  An index also keeps, for each scalar, the line its value starts
-- at (starts) and whether it is a block scalar, | or > (blocks), so the
-- text of a ConfigMap's data can be read with its own lines.
local function documents(text, source, line0)
  local next_event = libyaml.parser(text)
  local lines, kinds, anchors, starts, blocks
  local function fail(line, fmt, ...)
    error({ ("%s:%d: invalid YAML: " .. fmt):format(source, line0 + line, ...) }, 0)
  end
  local function event()
    local ok, ev = pcall(next_event)
    if not ok then
      local msg = tostring(ev):match("^[^\n]*")
      local what, line, col = msg:match("^(.-) at document: %d+, line: (%d+), column: (%d+)")
      fail(tonumber(line) or 1, "%s", what and ("%s (column %s)"):format(what, col) or msg)
    end
    return ev
  end

  local value
  -- a node starting with ev, at path; `line` is where its key stands
  function value(ev, path, line)
    local at = ev.start_mark.line + 1
    lines[path] = line0 + (line or at)
    if ev.type == "ALIAS" then
      local a = anchors[ev.anchor]
      if not a then
        fail(at, "unknown alias *%s", ev.anchor)
      end
      local under = {} -- the kinds below the anchor, re-rooted here
      for p, k in pairs(kinds) do
        local rest = p:sub(#a.path + 1)
        if p:sub(1, #a.path) == a.path and (rest == "" or rest:match("^[.%[]")) then
          under[path .. rest] = k
        end
      end
      for p, k in pairs(under) do
        kinds[p] = k
      end
      return a.value
    end
    local v, kind
    if ev.type == "SCALAR" then
      local err
      v, kind, err = scalar(ev)
      if err then
        fail(at, "%s", err)
      end
      starts[path] = line0 + at
      blocks[path] = ev.style == "LITERAL" or ev.style == "FOLDED" or nil
    elseif ev.type == "SEQUENCE_START" then
      v, kind = {}, "array"
      while true do
        local item = event()
        if item.type == "SEQUENCE_END" then
          break
        end
        v[#v + 1] = value(item, ("%s[%d]"):format(path, #v))
      end
    elseif ev.type == "MAPPING_START" then
      v, kind = {}, "object"
      while true do
        local k = event()
        if k.type == "MAPPING_END" then
          break
        elseif k.type ~= "SCALAR" then
          fail(k.start_mark.line + 1, "a mapping key must be a plain value")
        end
        local key = k.value
        if key == "<<" then
          fail(k.start_mark.line + 1, "merge keys (<<) are not YAML 1.2; write the fields out")
        elseif v[key] ~= nil then
          fail(k.start_mark.line + 1, "duplicate key %q", key)
        end
        v[key] = value(event(), join(path, key), k.start_mark.line + 1)
      end
    else
      fail(at, "unexpected %s", ev.type)
    end
    kinds[path] = kind
    if ev.anchor then
      anchors[ev.anchor] = { value = v, kind = kind, path = path }
    end
    return v
  end

  local ok, docs = pcall(function()
    local out = {}
    event() -- STREAM_START
    while true do
      local doc = event()
      if doc.type == "STREAM_END" then
        return out
      end
      lines, kinds, anchors, starts, blocks = {}, {}, {}, {}, {}
      local v = value(event(), "")
      event() -- DOCUMENT_END
      out[#out + 1] = { value = v, line = lines[""], -- where its content starts
        start = line0 + doc.start_mark.line + 1, -- its "---", if any
        index = { lines = lines, kinds = kinds, starts = starts, blocks = blocks } }
    end
  end)
  if not ok then
    return nil, type(docs) == "table" and docs[1] or tostring(docs)
  end
  return docs
end

--- Decodes one YAML document.  Returns the value and its index
--- ({lines = {path = line}, kinds = {path = kind}}), or nil and
--- "source:line: invalid YAML: ...".
---@param text string
---@param source string the file name, for errors
---@param line0? integer added to every line (a text inside another file)
function M.decode(text, source, line0)
  local docs, err = documents(text, source, line0 or 0)
  if not docs then
    return nil, err
  elseif #docs == 0 then
    return nil, ("%s:%d: invalid YAML: the file holds no document"):format(source, 1 + (line0 or 0))
  elseif #docs > 1 then
    return nil, ("%s:%d: invalid YAML: a config is one YAML document; this is a second")
      :format(source, docs[2].start)
  end
  return docs[1].value, docs[1].index
end

--- Every document of a YAML stream (a Kubernetes manifest): a list of
--- { value, index, line }, or nil and the error.
function M.decode_all(text, source)
  return documents(text, source, 0)
end

return M
