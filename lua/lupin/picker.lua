--- lupin.picker: what the built-in pickers share.
---@class lupin.picker
local M = {}

--- The pickers' one parameter, named as in the EPP.
M.schema = {
  maxNumOfEndpoints = { type = "integer", default = 1,
    description = "how many endpoints to return, best first (values ≤ 0 mean 1)" },
}

--- How many endpoints a picker returns: maxNumOfEndpoints, values ≤ 0 meaning 1.
---@param params {maxNumOfEndpoints: integer}
---@return integer
function M.count(params)
  return math.max(1, params.maxNumOfEndpoints)
end

return M
