-- Read-only views of tables the runtime shares with every plugin for longer
-- than a request (an endpoint's labels): a write raises, and the sandbox's
-- pairs, next, ipairs and rawlen see through a view to the table behind it
-- (LuaJIT's Lua 5.1 mode has no __pairs or __len for tables).
local M = {}

local behind = setmetatable({}, { __mode = "k" }) -- view -> table

local function refuse(_, k)
  error(("this table is shared by every plugin and read-only (setting %s)"):format(
    tostring(k)), 2)
end

--- A view of t.  One metatable per view: views live as long as what they
--- show, and a direct __index table is the fastest read.
---@param t table
---@return table
function M.view(t)
  local v = setmetatable({}, { __index = t, __newindex = refuse, __metatable = false })
  behind[v] = t
  return v
end

--- The table behind a view, or v itself.
function M.unwrap(v)
  return behind[v] or v
end

return M
