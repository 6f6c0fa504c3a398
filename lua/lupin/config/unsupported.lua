--- Upstream plugin types lupin refuses on purpose, each with why and what
--- to use instead: a config naming one fails at its line with "not
--- supported: <why>; use <X>" rather than "unknown plugin type"
--- (docs/epp-compatibility.md).
local M = {}

local LATENCY = "it needs a trained latency predictor (a sidecar model) lupin does not run"

M.TYPES = {
  ["predicted-latency-scorer"] = LATENCY .. "; use load-aware-scorer, or queue-scorer with"
    .. " kv-cache-utilization-scorer",
  ["slo-aware-profile-handler"] = LATENCY .. "; use single-profile-handler (pd-profile-handler"
    .. " for P/D)",
  ["predicted-latency-producer"] = LATENCY .. "; remove it",
  ["slo-request-tracker"] = LATENCY .. "; remove it",
  ["slo-scorer"] = LATENCY .. "; use load-aware-scorer, or queue-scorer with"
    .. " kv-cache-utilization-scorer",
}

--- The message for a refused type, or nil.
function M.why(type_)
  local why = M.TYPES[type_]
  return why and ("plugin type %q is not supported: %s"):format(type_, why)
end

return M
