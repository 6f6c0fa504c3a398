--- lupin.datalayer: which metrics a host scrapes from each endpoint, and
--- under which names.  The EPP's data layer in lupin's terms: a
--- `metrics-data-source` says where the page is (scheme, path), a
--- `core-metrics-extractor` says how each engine names the quantities
--- plugins read (waiting queue, running requests, KV-cache usage, LoRA
--- adapters, cache geometry), and an endpoint's engine is its
--- `engineLabelKey` label, else the extractor's `defaultEngine`
--- (docs/metrics.md, "Engines").  With neither plugin configured the mapping
--- is the vLLM preset: lupin's behaviour before the data layer existed.
---@class lupin.datalayer
local M = {}

--- The engines lupin knows, as core-metrics-extractor's engineConfigs give
--- them.  vllm, sglang, trtllm-serve, triton-tensorrt-llm and triton are
--- llm-d-router's built-ins (pkg/epp/framework/plugins/datalayer/extractor/
--- metrics/factories.go), with two additions of lupin's: vLLM's legacy KV
--- name (gpu_cache_usage_perc, read when kv_cache_usage_perc is absent) and
--- SGLang's newer page gauges beside its cache_config_info.  tgi is lupin's
--- own, from TGI's metrics reference: TGI publishes no KV-cache usage.
M.PRESETS = {
  vllm = {
    queuedRequestsSpec = "vllm:num_requests_waiting",
    runningRequestsSpec = "vllm:num_requests_running",
    kvUsageSpec = "vllm:kv_cache_usage_perc",
    kvUsageLegacySpec = "vllm:gpu_cache_usage_perc",
    loraSpec = "vllm:lora_requests_info",
    cacheInfoSpec = "vllm:cache_config_info",
  },
  sglang = {
    queuedRequestsSpec = "sglang:num_queue_reqs",
    runningRequestsSpec = "sglang:num_running_reqs",
    kvUsageSpec = "sglang:token_usage",
    cacheInfoSpec = "sglang:cache_config_info",
    cacheBlockSizeLabelName = "page_size",
    cacheNumBlocksLabelName = "num_pages",
    cacheBlockSizeSpec = "sglang:page_size",
    cacheNumBlocksSpec = "sglang:num_pages",
  },
  tgi = {
    queuedRequestsSpec = "tgi_queue_size",
    runningRequestsSpec = "tgi_batch_current_size",
  },
  ["trtllm-serve"] = {
    queuedRequestsSpec = "trtllm_num_requests_waiting",
    runningRequestsSpec = "trtllm_num_requests_running",
    kvUsageSpec = "trtllm_kv_cache_utilization",
    cacheBlockSizeSpec = "trtllm_kv_cache_tokens_per_block",
    cacheNumBlocksSpec = "trtllm_kv_cache_max_blocks",
  },
  ["triton-tensorrt-llm"] = {
    queuedRequestsSpec = "nv_trt_llm_request_metrics{request_type=waiting}",
    runningRequestsSpec = "nv_trt_llm_request_metrics{request_type=scheduled}",
    kvUsageSpec = "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
    cacheBlockSizeSpec = "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
    cacheNumBlocksSpec = "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
  },
  triton = {
    queuedRequestsSpec = "nv_inference_pending_request_count",
    runningRequestsSpec = "nv_inference_exec_count",
  },
}

--- The engine-type label llm-d-router reads (older GIE versions:
--- inference.networking.k8s.io/engine-type; give it as engineLabelKey).
M.ENGINE_LABEL = "llm-d.ai/engine-type"
M.DEFAULT_ENGINE = "vllm"
M.DEFAULT_PATH = "/metrics"

-- The engine config's spec fields, in the host's order (lupin_metric_source).
M.SPECS = { queue = "queuedRequestsSpec", running = "runningRequestsSpec",
  kv_usage = "kvUsageSpec", lora = "loraSpec", cache_info = "cacheInfoSpec",
  block_size = "cacheBlockSizeSpec", num_blocks = "cacheNumBlocksSpec" }
local MAX_LABELS = 4 -- LUPIN_METRIC_LABELS

--- Parses a metric spec as upstream writes them, a PromQL instant selector
--- with equality matchers only, quotes optional: `name`,
--- `name{label=value,other="v"}`.  Returns { name, labels = { k, v, ... } }
--- (pairs flat, in order), nil for "", or nil and a message.
function M.parse_spec(s)
  if s == nil or s == "" then
    return nil
  end
  if type(s) ~= "string" then
    return nil, ("a metric spec is a string such as \"vllm:num_requests_waiting\", got %s")
      :format(type(s))
  end
  local name, rest = s:match("^%s*([%a_:][%w_:]*)%s*(.-)%s*$")
  if not name then
    return nil, ("%q is not a metric spec: it must begin with a metric name"):format(s)
  end
  local spec = { name = name, labels = {} }
  if rest == "" then
    return spec
  end
  local body = rest:match("^{(.*)}$")
  if not body then
    return nil, ("%q is not a metric spec: after the name only {label=value,...} may follow")
      :format(s)
  end
  for item in (body .. ","):gmatch("([^,]*),") do
    if item:match("%S") then
      local k, op, v = item:match("^%s*([%a_][%w_]*)%s*([=!~]+)%s*(.-)%s*$")
      if not k or op ~= "=" then
        return nil, ("%q: %q is not a label=value matcher (only equality is supported, as"
          .. " upstream)"):format(s, item)
      end
      v = v:match('^"(.*)"$') or v
      if #spec.labels >= 2 * MAX_LABELS then
        return nil, ("%q: at most %d labels"):format(s, MAX_LABELS)
      end
      spec.labels[#spec.labels + 1] = k
      spec.labels[#spec.labels + 1] = v
    end
  end
  return spec
end

--- One engine config (upstream's engineConfigs entry, or a preset) checked
--- and compiled: what lupin_runtime_metric_source returns.  Returns the
--- mapping, or nil, the message and the offending field.
function M.compile(name, ec)
  local m = { engine = name,
    block_size_label = ec.cacheBlockSizeLabelName or "block_size",
    num_blocks_label = ec.cacheNumBlocksLabelName or "num_gpu_blocks" }
  for key, field in pairs(M.SPECS) do
    local spec, err = M.parse_spec(ec[field])
    if err then
      return nil, err, field
    end
    m[key] = spec
  end
  if m.kv_usage and ec.kvUsageLegacySpec then
    m.kv_usage.legacy = ec.kvUsageLegacySpec
  end
  return m
end

--- The engines of a core-metrics-extractor's parameters: the presets, each
--- replaced whole by an engineConfigs entry of its name (as upstream).
function M.engines(configs)
  local out = {}
  for name, ec in pairs(M.PRESETS) do
    out[name] = assert(M.compile(name, ec))
  end
  for i, ec in ipairs(configs or {}) do
    if type(ec) ~= "table" then
      return nil, ("engineConfigs[%d] must be an object"):format(i - 1)
    end
    if type(ec.name) ~= "string" or ec.name == "" then
      return nil, ("engineConfigs[%d]: engine config name cannot be empty"):format(i - 1)
    end
    if ec.name == "default" then
      return nil, ("engineConfigs[%d]: engine config name cannot be \"default\" (reserved)")
        :format(i - 1)
    end
    local m, err, field = M.compile(ec.name, ec)
    if not m then
      return nil, ("engineConfigs[%d].%s: %s"):format(i - 1, field, err)
    end
    out[ec.name] = m
  end
  return out
end

--- Plugins that read another instance's data by name (upstream's
--- prefixMatchInfoProducerName, inFlightLoadProducerName) must name an
--- instance of a type that produces it: checked at load, as the EPP does,
--- rather than at the first request.  readers: the types whose parameter
--- is read (others accept it with a warning of their own).
local PRODUCER_TYPES = { ["approx-prefix-cache-producer"] = true,
  ["precise-prefix-cache-producer"] = true }
local INFLIGHT = "inflight-load-producer"
local PRODUCERS = {
  prefixMatchInfoProducerName = { types = PRODUCER_TYPES,
    what = "approx- or precise-prefix-cache-producer" },
  inFlightLoadProducerName = { types = { [INFLIGHT] = true }, what = INFLIGHT,
    readers = { ["token-load-scorer"] = true, ["active-request-scorer"] = true,
      ["prefix-cache-affinity-filter"] = true } },
}

local metric_sources -- below

-- The one instance of a type, if there is exactly one.
local function only_of(gen, types)
  local only
  for _, rec in ipairs(gen.instances) do
    if types[rec.type] then
      only = only == nil and rec or false
    end
  end
  return only or nil
end

-- The in-flight load producer a reader without inFlightLoadProducerName
-- reads: the one of upstream's default name, else the only one there is.
local function default_inflight(gen)
  local rec = gen.by_name[INFLIGHT]
  if rec and rec.type == INFLIGHT then
    return rec
  end
  return only_of(gen, PRODUCERS.inFlightLoadProducerName.types)
end

local function check_producers(E, gen)
  -- the EPP runs data producers before anything else: their prepare first,
  -- so a reader's prepare (or the profile handler) finds their data; the
  -- in-flight load producer's last, as it discounts what the others matched
  local producers, others, last = {}, {}, {}
  for _, rec in ipairs(gen.points.prepare or {}) do
    local list = PRODUCER_TYPES[rec.type] and producers or rec.type == INFLIGHT and last or others
    list[#list + 1] = rec
  end
  for _, list in ipairs({ others, last }) do
    for _, rec in ipairs(list) do
      producers[#producers + 1] = rec
    end
  end
  gen.points.prepare = producers
  -- a prefix-cache-scorer without a producer name reads the one producer
  -- there is, as upstream's "empty selects the default producer"
  local only = only_of(gen, PRODUCER_TYPES)
  for _, rec in ipairs(gen.instances) do
    if only and rec.type == "prefix-cache-scorer" and not rec.obj.producer then
      rec.obj.producer = only.name
    end
  end
  for _, rec in ipairs(gen.instances) do
    for param, p in pairs(PRODUCERS) do
      local ref = type(rec.params) == "table" and rec.params[param]
      if ref and (not p.readers or p.readers[rec.type]) then
        local target = gen.by_name[ref]
        if not target or not p.types[target.type] then
          return E:at(rec.path .. ".parameters." .. param, "plugin %q (%s): %s %q names no"
            .. " %s instance%s", rec.name, rec.type, param, ref, p.what,
            target and (" (it is a %s)"):format(target.type) or "")
        end
      end
    end
  end
  -- the in-flight load producer token-load-scorer reads
  local inflight = default_inflight(gen)
  for _, rec in ipairs(gen.instances) do
    if rec.type == "token-load-scorer" then
      rec.obj.inflight = rec.params.inFlightLoadProducerName or (inflight and inflight.name)
    end
  end
end

-- The sources of the data section that are scraped: an
-- endpoint-notification-source is not (the pool's endpoints are what it
-- would notify; the precise plugins it feeds subscribe through the host),
-- but what it names as extractors must be precise plugins.
local PRECISE = { ["precise-prefix-cache-producer"] = true, ["precise-prefix-cache-scorer"] = true }

metric_sources = function(E, section, gen)
  local out = {}
  for _, src in ipairs(section and section.sources or {}) do
    local rec = gen.by_name[src.ref]
    if rec and rec.type == "endpoint-notification-source" then
      for _, x in ipairs(src.extractors) do
        local xr = gen.by_name[x.ref]
        if not PRECISE[xr.type] then
          return nil, E:at(x.path .. ".pluginRef", "plugin %q (%s) cannot read endpoint"
            .. " notifications; an endpoint-notification-source feeds"
            .. " precise-prefix-cache-producer or -scorer", xr.name, xr.type)
        end
      end
    else
      out[#out + 1] = src
    end
  end
  return out
end

--- The data layer of a generation: the source and the extractor in use,
--- from the config's data/dataLayer section or the plugins configured.
--- Returns { path, engines, default, label_key }, or nil and an error at
--- the config's line.
function M.build(cfg, gen)
  local E = cfg.errors
  local perr = check_producers(E, gen)
  if perr then
    return nil, perr
  end
  local source, extractor
  local section = cfg.data
  local sources, nerr = metric_sources(E, section, gen)
  if nerr then
    return nil, nerr
  end
  if #sources > 0 then
    if #sources > 1 then
      return nil, E:at(sources[2].path, "lupin scrapes one metrics source per endpoint;"
        .. " keep one entry in %s.sources", section.key)
    end
    local src = sources[1]
    source = gen.by_name[src.ref]
    if source.type ~= "metrics-data-source" then
      return nil, E:at(src.path .. ".pluginRef", "plugin %q (%s) is not a data source; lupin's"
        .. " only source type is metrics-data-source", source.name, source.type)
    end
    for _, x in ipairs(src.extractors) do
      local rec = gen.by_name[x.ref]
      if rec.type ~= "core-metrics-extractor" then
        return nil, E:at(x.path .. ".pluginRef", "plugin %q (%s) is not an extractor lupin has;"
          .. " its only extractor type is core-metrics-extractor", rec.name, rec.type)
      end
      extractor = extractor or rec
    end
  else
    -- no sources: the EPP injects its defaults and pairs the configured ones
    for _, rec in ipairs(gen.instances) do
      if rec.type == "metrics-data-source" then
        source = source or rec
      elseif rec.type == "core-metrics-extractor" then
        extractor = extractor or rec
      end
    end
  end
  local kv_events, kerr = M.kv_events(E, gen)
  if kerr then
    return nil, kerr
  end
  local x = extractor and extractor.obj
  local engines = x and x.engines or M.engines()
  return { path = source and source.obj.path or M.DEFAULT_PATH, engines = engines,
    default = engines[x and x.default_engine or M.DEFAULT_ENGINE],
    label_key = x and x.label_key or M.ENGINE_LABEL, kv_events = kv_events }
end

--- The engines' KV-cache events the generation's plugins want: what a
--- precise plugin's instance puts in its `kv_events` field (the host
--- subscribes once per endpoint, so every instance must want the same).
--- Returns the settings or nil, or nil and an error at the config's line.
function M.kv_events(E, gen)
  local first
  for _, rec in ipairs(gen.instances) do
    local want = type(rec.obj) == "table" and rec.obj.kv_events
    if want then
      if not first then
        first = rec
      else
        for k, v in pairs(want) do
          if first.obj.kv_events[k] ~= v then
            return nil, E:at(rec.path .. ".parameters", "plugin %q (%s) subscribes to the"
              .. " engines' KV events with %s = %s, plugin %q with %s: a gateway subscribes"
              .. " once; give both the same kvEventsConfig and tokenProcessorConfig", rec.name,
              rec.type, k, tostring(v), first.name, tostring(first.obj.kv_events[k]))
          end
        end
      end
    end
  end
  return first and first.obj.kv_events
end

--- The mapping for an endpoint with these labels: its engine's, else the
--- default engine's.
function M.resolve(data, labels)
  local engine = labels and labels[data.label_key]
  local m = engine and data.engines[engine] or data.default
  if m.path ~= data.path then -- the host reads the path with the mapping
    m.path = data.path
  end
  return m
end

return M
