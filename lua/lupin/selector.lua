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

-- The label-selector filter's parts (llm-d's by-label-selector and
-- label-selector-filter are the same filter under two names).

M.SCHEMA = {
  matchLabels = { type = "object", default = {}, description = "label -> value, all equal" },
  matchExpressions = { type = "array", items = "object", default = {},
    description = "{key, operator, values}, all true" },
}

function M.new(params)
  local match, err = M.compile(params)
  if not match then
    error(err, 0)
  end
  return { match = match }
end

function M.filter(self, _, endpoints)
  local kept = {}
  for _, ep in ipairs(endpoints) do
    if self.match(ep.labels) then
      kept[#kept + 1] = ep
    end
  end
  return kept
end

return M
