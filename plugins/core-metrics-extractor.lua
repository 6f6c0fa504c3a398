-- The EPP's core-metrics-extractor (llm-d-router's data layer): how each
-- engine names the quantities plugins read.  It schedules nothing: the
-- runtime reads its engines (lupin.datalayer) and hands the host, per
-- endpoint, the names to read from the page the metrics-data-source names
-- (lupin_runtime_metric_source).  Built-in engines: vllm, sglang, tgi,
-- trtllm-serve, triton-tensorrt-llm, triton (docs/metrics.md, "Engines"); an
-- engineConfigs entry of a built-in's name replaces it whole, as upstream.
local datalayer = require "lupin.datalayer"

local FIELDS = { name = true, queuedRequestsSpec = true, runningRequestsSpec = true,
  kvUsageSpec = true, loraSpec = true, cacheInfoSpec = true, cacheBlockSizeLabelName = true,
  cacheNumBlocksLabelName = true, cacheBlockSizeSpec = true, cacheNumBlocksSpec = true,
  customMetrics = true }

---@type lupin.Plugin
return {
  type = "core-metrics-extractor",
  schema = {
    engineLabelKey = { type = "string", default = datalayer.ENGINE_LABEL,
      description = "the endpoint label naming its engine" },
    defaultEngine = { type = "string", default = datalayer.DEFAULT_ENGINE,
      description = "the engine of endpoints without the label" },
    engineConfigs = { type = "array", items = "object", default = {},
      description = "engines' metric names: {name, queuedRequestsSpec, runningRequestsSpec,"
        .. " kvUsageSpec, loraSpec, cacheInfoSpec, ...}" },
  },

  new = function(params, env)
    for i, ec in ipairs(params.engineConfigs) do
      for k in pairs(ec) do
        if not FIELDS[k] then
          local known = {}
          for f in pairs(FIELDS) do
            known[#known + 1] = f
          end
          table.sort(known)
          error(("engineConfigs[%d]: unknown field %q; known fields: %s"):format(i - 1,
            tostring(k), table.concat(known, ", ")), 0)
        end
      end
      if ec.customMetrics ~= nil then
        env.log("warn", "engineConfigs[%d] (%s): customMetrics ignored: lupin's plugins read"
          .. " only the core metrics", i - 1, tostring(ec.name))
      end
    end
    local engines, err = datalayer.engines(params.engineConfigs)
    if not engines then
      error(err, 0)
    end
    if not engines[params.defaultEngine] then
      local names = {}
      for n in pairs(engines) do
        names[#names + 1] = n
      end
      table.sort(names)
      error(("defaultEngine %q not found in engineConfigs; engines: %s"):format(
        params.defaultEngine, table.concat(names, ", ")), 0)
    end
    if params.engineLabelKey == "" then
      error("engineLabelKey must be a non-empty label name", 0)
    end
    return { engines = engines, default_engine = params.defaultEngine,
      label_key = params.engineLabelKey }
  end,
}
