--- Upstream plugin types lupin refuses on purpose, each with why and what
--- to use instead: a config naming one fails at its line with "not
--- supported: <why>; use <X>" rather than "unknown plugin type"
--- (docs/epp-compatibility.md).
local M = {}

local LATENCY = "it needs a trained latency predictor (a sidecar model) lupin does not run"
local KV_EVENTS = "it needs the model servers' KV-cache events (ZMQ) lupin does not subscribe to"

M.TYPES = {
  ["predicted-latency-scorer"] = LATENCY .. "; use load-aware-scorer, or queue-scorer with"
    .. " kv-cache-utilization-scorer",
  ["slo-aware-profile-handler"] = LATENCY .. "; use single-profile-handler (pd-profile-handler"
    .. " for P/D)",
  ["predicted-latency-producer"] = LATENCY .. "; remove it",
  ["precise-prefix-cache-scorer"] = KV_EVENTS .. "; use prefix-cache-scorer (lupin's own index"
    .. " of what it sent where)",
  ["precise-prefix-cache-producer"] = KV_EVENTS .. "; use approx-prefix-cache-producer, or"
    .. " prefix-cache-scorer alone",
  ["endpoint-notification-source"] = KV_EVENTS .. " (it feeds the precise producer pod events);"
    .. " remove it with the precise producer",
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
