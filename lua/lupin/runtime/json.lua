--- Request bodies as Lua values.  In a runtime, simdjson decodes them in C
--- (core/json.cpp, several times faster than lua-cjson on a prompt); a text
--- it refuses goes to the lua-cjson instance the caller names, whose value
--- or message stands.  So what is accepted, and every refusal's message, are
--- that instance's: simdjson only makes the common case fast.  Outside a
--- runtime (a spec loading this file in plain LuaJIT), lua-cjson alone.
local ffi = require "ffi"
local ok, native = pcall(require, "lupin.json.native")
local fast = ok and native.decode or nil

local M = {}

--- A text as a Lua string: a string as it is, or the len bytes a pointer
--- into the host's memory points at (a body to check, which the core does
--- not copy into a Lua string: core/request.c).
---@param text string|lightuserdata
---@param len integer? the pointer's bytes
---@return string
function M.text(text, len)
  if type(text) == "string" then
    return text
  end
  return ffi.string(text, len)
end

--- The value of text, or nil and why not (cjson's message).
---@param text string|lightuserdata
---@param cjson table a lua-cjson instance (cjson.safe, or one with its own settings)
---@param len integer? the bytes of a pointer text
---@return any value, string? err
function M.decode(text, cjson, len)
  if fast then
    local v = fast(text, len)
    if v ~= nil then
      return v
    end
  end
  return cjson.decode(M.text(text, len))
end

--- As decode, for a text that must be UTF-8 (RFC 8259): one that is not is
--- refused, with the offset of its first byte that is not as a third value.
--- simdjson validates UTF-8 as it parses, so only a text it refuses is
--- scanned (core/json.cpp).  Outside a runtime the text is not checked.
---@param text string|lightuserdata
---@param cjson table
---@param len integer? the bytes of a pointer text
---@return any value, string? err, integer? bad_utf8_at
function M.decode_utf8(text, cjson, len)
  if fast then
    local v, bad_at = fast(text, len)
    if v ~= nil then
      return v
    elseif bad_at then
      return nil, "not UTF-8", bad_at
    end
  end
  return cjson.decode(M.text(text, len))
end

--- Whether the fast path is there (false outside a runtime).
M.native = fast ~= nil

return M
