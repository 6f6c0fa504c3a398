-- Where each value of a JSON text sits: maps JSON paths ("plugins[2].type")
-- to line numbers and kinds, so config errors can name a line.  It runs only
-- on text cjson has already accepted, so it tracks structure and nothing else.
local M = {}

local byte = string.byte
local B = { ["{"] = 123, ["}"] = 125, ["["] = 91, ["]"] = 93, ['"'] = 34, ["\\"] = 92,
  ["\n"] = 10, [","] = 44, [":"] = 58 }

local function scanner(text)
  local s = { pos = 1, line = 1, lines = {}, kinds = {} }

  local function ws()
    while true do
      local c = byte(text, s.pos)
      if c == B["\n"] then
        s.line = s.line + 1
      elseif c ~= 32 and c ~= 9 and c ~= 13 then
        return c
      end
      s.pos = s.pos + 1
    end
  end

  local function str()
    local i = s.pos + 1
    while true do
      local c = byte(text, i)
      if not c or c == B['"'] then
        break
      end
      i = i + (c == B["\\"] and 2 or 1)
    end
    local raw = text:sub(s.pos + 1, i - 1)
    s.pos = i + 1
    return raw
  end

  local value

  local function object(path)
    s.pos = s.pos + 1
    if ws() == B["}"] then
      s.pos = s.pos + 1
      return
    end
    while true do
      ws()
      local key = str()
      ws()
      s.pos = s.pos + 1 -- ':'
      value(path == "" and key or path .. "." .. key)
      local c = ws()
      s.pos = s.pos + 1
      if c == B["}"] then
        return
      end
    end
  end

  local function array(path)
    s.pos = s.pos + 1
    if ws() == B["]"] then
      s.pos = s.pos + 1
      return
    end
    local i = 0
    while true do
      value(("%s[%d]"):format(path, i))
      i = i + 1
      local c = ws()
      s.pos = s.pos + 1
      if c == B["]"] then
        return
      end
    end
  end

  function value(path)
    local c = ws()
    s.lines[path] = s.line
    if c == B["{"] then
      s.kinds[path] = "object"
      object(path)
    elseif c == B["["] then
      s.kinds[path] = "array"
      array(path)
    elseif c == B['"'] then
      s.kinds[path] = "string"
      str()
    else
      local lit = text:match("^[^,%]}%s]+", s.pos)
      s.kinds[path] = (lit == "true" or lit == "false") and "boolean"
        or lit == "null" and "null" or "number"
      s.pos = s.pos + #lit
    end
  end

  return s, value
end

--- Indexes a JSON text that cjson has decoded without error.
---@param text string
---@return {lines: table<string, integer>, kinds: table<string, string>}
function M.index(text)
  local s, value = scanner(text)
  value("")
  return { lines = s.lines, kinds = s.kinds }
end

--- The line of a path, or of its nearest ancestor present in the text.
function M.line(index, path)
  while path do
    local l = index.lines[path]
    if l then
      return l
    end
    path = path:match("^(.*)%.[^.%[]+$") or path:match("^(.*)%[%d+%]$")
  end
  return 1
end

--- The line of the character at a byte offset (for cjson's syntax errors).
function M.line_of_offset(text, offset)
  local _, n = text:sub(1, math.max(0, offset - 1)):gsub("\n", "")
  return n + 1
end

return M
