-- Weak-keyed registries whose size follows the traffic.  A Lua table keeps
-- the capacity it once needed: a registry that held 100,000 in-flight
-- requests would stay that large, and a larger heap makes the GC run less
-- often, which lets the registries grow between cycles.  Rebuilding one now
-- and then copies only the live entries into a table of the right size.
local M = {}

local WEAK_KEYS = { __mode = "k" }

--- A new weak-keyed table.
function M.keys()
  return setmetatable({}, WEAK_KEYS)
end

--- A fresh weak-keyed table with t's entries.
function M.rebuilt(t)
  local n = setmetatable({}, WEAK_KEYS)
  for k, v in pairs(t) do
    n[k] = v
  end
  return n
end

return M
