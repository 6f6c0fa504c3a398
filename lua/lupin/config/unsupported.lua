--- Upstream plugin types lupin refuses on purpose, each with why and what
--- to use instead: a config naming one fails at its line with "not
--- supported: <why>; use <X>" rather than "unknown plugin type"
--- (docs/epp-compatibility.md).
local M = {}

-- GIE's first SLO-aware router, before the llm-d router split it into the
-- predicted-latency family lupin ports (docs/latency-prediction.md).
local OLD_SLO = "GIE's earlier SLO router was split upstream into the predicted-latency family"

-- The multimodal encoder-cache pair: an index of media items by endpoint.
local MM = "lupin keeps no index of the media items (images, audio, video) each endpoint"
  .. " has encoded; use prefix-cache-scorer: a chat request's messages, media parts"
  .. " included, are part of the prompt it hashes"

-- GPU metrics from NVIDIA's DCGM exporter, and the generic attribute plugins
-- that read them.
local DCGM = "lupin scrapes one metrics page per endpoint, its engine's (metrics-data-source),"
  .. " and no DCGM exporter; use kv-cache-utilization-scorer and queue-scorer, which read"
  .. " the engine's own load"
local ATTR = "lupin's endpoints carry no extractor-made attributes (such as DCGM's"
  .. " GPUUtilization), only the engine's metrics and their labels; use label-selector-filter"
  .. " for labels, and kv-cache-utilization-scorer or queue-scorer for load"

M.TYPES = {
  ["predicted-latency-scorer"] = OLD_SLO .. "; use latency-scorer (with predicted-latency-producer)",
  ["slo-aware-profile-handler"] = OLD_SLO .. "; use single-profile-handler (pd-profile-handler"
    .. " for P/D) with predicted-latency-producer and latency-scorer",
  ["slo-request-tracker"] = OLD_SLO .. "; use predicted-latency-producer, which tracks requests",
  ["slo-scorer"] = OLD_SLO .. "; use latency-scorer (with predicted-latency-producer)",

  ["burst-prefix-cache-producer"] = "it holds every request for a batch window (windowDurationMs)"
    .. " to place prompt-sharing groups together, and lupin's plugins cannot hold a request"
    .. "; use approx-prefix-cache-producer with prefix-cache-scorer, whose index learns a"
    .. " prefix at its first request's pick (or prefix-cache-affinity-filter)",

  ["mm-embeddings-cache-producer"] = MM,
  ["mm-embeddings-cache-scorer"] = MM,

  ["dcgm-data-source"] = DCGM,
  ["dcgm-extractor"] = DCGM,
  ["endpoint-attribute-filter"] = ATTR,
  ["endpoint-attribute-scorer"] = ATTR,

  ["program-aware-fairness"] = "it ranks programs by the tokens each has been served"
    .. " (least attained service, decayed over time), an account lupin's flow control does not"
    .. " keep; use round-robin-fairness-policy, which serves the fairness ids (programs) in"
    .. " turn",

  ["soft-reflective-ceiling-policy"] = "lupin's flow control has no usage-limit policies: its"
    .. " saturation detector holds every band alike; use flowControl's priority bands with a"
    .. " saturation detector, and saturation-detector or probabilistic-admitter to shed"
    .. " sheddable requests first",
}

-- Types upstream registers in its test binaries only: no EPP image runs them.
local TEST_ONLY = "registered only by upstream's test binaries (its config-loader and integration"
  .. " tests), not by any EPP image"
for _, t in ipairs({ "test-one", "test-two", "test-plugin", "test-picker", "test-scorer",
  "test-profile-handler", "test-source", "test-extractor", "test-with-dependencies",
  "test-with-nested-dependencies" }) do
  M.TYPES[t] = TEST_ONLY .. "; use a lupin plugin of the role it stands in for (a scorer, picker,"
    .. " profile handler or data source: plugins/README.md)"
end
M.TYPES["mock-metrics-source"] = TEST_ONLY .. "; use metrics-data-source, which scrapes each"
  .. " endpoint's engine"

--- The message for a refused type, or nil.
function M.why(type_)
  local why = M.TYPES[type_]
  return why and ("plugin type %q is not supported: %s"):format(type_, why)
end

return M
