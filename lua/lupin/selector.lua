--- lupin.selector: Kubernetes label selectors (metav1.LabelSelector) over
--- endpoint labels, as llm-d's by-label-selector filter applies them:
--- matchLabels (each key equal) and matchExpressions (In, NotIn, Exists,
--- DoesNotExist), all ANDed; an empty selector matches every endpoint.
---@class lupin.selector
local M = {}

local OPS = { In = true, NotIn = true, Exists = true, DoesNotExist = true }

--- Compiles {matchLabels, matchExpressions}; returns a match function, or
--- nil and the message (Kubernetes' rules: In/NotIn need values,
--- Exists/DoesNotExist take none).
function M.compile(sel)
  local labels, exprs = sel.matchLabels or {}, {}
  for k, v in pairs(labels) do
    if type(k) ~= "string" or type(v) ~= "string" then
      return nil, "matchLabels maps label names to string values"
    end
  end
  for i, e in ipairs(sel.matchExpressions or {}) do
    local where = ("matchExpressions[%d]"):format(i - 1)
    if type(e) ~= "table" or type(e.key) ~= "string" or e.key == "" then
      return nil, where .. ": key must be a label name"
    end
    if not OPS[e.operator] then
      return nil, ("%s: %q is not a valid label selector operator (In, NotIn, Exists,"
        .. " DoesNotExist)"):format(where, tostring(e.operator))
    end
    local values = e.values or {}
    if type(values) ~= "table" then
      return nil, where .. ": values must be a list of strings"
    end
    local set = {}
    for _, v in ipairs(values) do
      if type(v) ~= "string" then
        return nil, where .. ": values must be a list of strings"
      end
      set[v] = true
    end
    local needs = e.operator == "In" or e.operator == "NotIn"
    if needs and #values == 0 then
      return nil, ("%s: for 'in', 'notin' operators, values set can't be empty"):format(where)
    elseif not needs and #values > 0 then
      return nil, ("%s: values set must be empty for exists and does not exist"):format(where)
    end
    exprs[#exprs + 1] = { key = e.key, op = e.operator, set = set }
  end
  return function(ep_labels)
    ep_labels = ep_labels or {}
    for k, v in pairs(labels) do
      if ep_labels[k] ~= v then
        return false
      end
    end
    for _, e in ipairs(exprs) do
      local v = ep_labels[e.key]
      if e.op == "In" and not (v and e.set[v]) or e.op == "NotIn" and v and e.set[v]
        or e.op == "Exists" and v == nil or e.op == "DoesNotExist" and v ~= nil then
        return false
      end
    end
    return true
  end
end

return M
