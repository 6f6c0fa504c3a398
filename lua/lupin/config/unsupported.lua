--- Upstream plugin types lupin refuses on purpose, each with why and what
--- to use instead: a config naming one fails at its line with "not
--- supported: <why>; use <X>" rather than "unknown plugin type"
--- (docs/epp-compatibility.md).
local M = {}

-- GIE's first SLO-aware router, before the llm-d router split it into the
-- predicted-latency family lupin ports (docs/latency-prediction.md).
local OLD_SLO = "GIE's earlier SLO router was split upstream into the predicted-latency family"

M.TYPES = {
  ["predicted-latency-scorer"] = OLD_SLO .. "; use latency-scorer (with predicted-latency-producer)",
  ["slo-aware-profile-handler"] = OLD_SLO .. "; use single-profile-handler (pd-profile-handler"
    .. " for P/D) with predicted-latency-producer and latency-scorer",
  ["slo-request-tracker"] = OLD_SLO .. "; use predicted-latency-producer, which tracks requests",
  ["slo-scorer"] = OLD_SLO .. "; use latency-scorer (with predicted-latency-producer)",
}

--- The message for a refused type, or nil.
function M.why(type_)
  local why = M.TYPES[type_]
  return why and ("plugin type %q is not supported: %s"):format(type_, why)
end

return M
