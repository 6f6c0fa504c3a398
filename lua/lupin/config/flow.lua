-- Flow control's configuration (docs/flow-control.md), all of it: the
-- declarations of flowControl and objectives (checked by
-- lupin.config.walk), their references, cfg.flow_control and cfg.objectives,
-- and cfg.flow, what lupin.generation resolves (plugin references) and
-- lupin.flow runs:
--
--   flowControl:            # present (or featureGates: [flowControl]): on
--     maxBytes: 0           # the whole queue; 0: no limit; "1Gi" and such
--     maxRequests: 0
--     defaultRequestTTL: 60s # how long a request may wait; 0s: until its client leaves
--     defaultPriorityBand: { maxBytes, maxRequests, defaultRequestTTL, fairnessPolicyRef, orderingPolicyRef }
--     defaultNegativePriorityBand: { ... }   # the template for priorities < 0
--     priorityBands: [ { priority, maxBytes, ... } ]
--     saturationDetector: { pluginRef }      # llm-d-router's place for it
--     flowGCTimeout: 5m      # lupin's: an idle flow (fairness id) goes after this
--     enableEviction: false  # true: sent sheddable requests make room for higher ones
--   saturationDetector: { pluginRef }        # the EPP's
--   objectives: [ { name, priority } ]
--
-- Upstream's defaults: a band's maxBytes 1 GB (10^9) and maxRequests 5000,
-- 0 or absent meaning the default (a band is always bounded); a listed band
-- starts from these defaults, not from defaultPriorityBand, which shapes
-- only the bands of priorities the config does not list.
local cjson = require "cjson.safe"

local M = {}

M.DEFAULT_FAIRNESS = "global-strict-fairness-policy"
M.DEFAULT_ORDERING = "fcfs-ordering-policy"
M.DEFAULT_DETECTOR = "utilization-detector"
M.DEFAULT_BAND_BYTES = 1e9 -- upstream's 1 GB
M.DEFAULT_BAND_REQUESTS = 5000 -- upstream's: with the 60 s TTL it binds past ~83 requests/s
M.DEFAULT_TTL = 60 -- seconds a request may wait when the config does not say
M.DEFAULT_GC = 300 -- seconds an empty flow is kept (the EPP's flow GC timeout, 5m)

-- --- the declarations (lupin.config.walk) ---

local function quantity(description)
  return { type = "quantity", description = description }
end

local function duration(description)
  return { type = "duration", description = description }
end

local function policy(description)
  return { type = "string", nonempty = true, message = "{key} must be a policy name",
    description = description }
end

local function band_fields(priority)
  return {
    priority = priority,
    maxBytes = quantity("the band's queue, in bytes (0: the default, 1 GB)"),
    maxRequests = quantity("the band's queue, in requests (0: the default, 5000)"),
    defaultRequestTTL = duration("how long a request may wait (0: until its client leaves)"),
    fairnessPolicyRef = policy("which flow is served next"),
    orderingPolicyRef = policy("which of a flow's requests is served next"),
  }
end

local BAND_ORDER = { "priority", "maxBytes", "maxRequests", "defaultRequestTTL",
  "fairnessPolicyRef", "orderingPolicyRef" }

local PRIORITY = { type = "integer", message = "priority must be an integer, got {got}" }

--- A band's template (defaultPriorityBand, defaultNegativePriorityBand).
M.BAND = { type = "object", what = "a priority band", known = "a priority band",
  order = BAND_ORDER, fields = band_fields(PRIORITY) }

--- A band of priorityBands: its priority is required.
M.PRIORITY_BAND = { type = "object", what = "a priority band", known = "a priority band",
  order = BAND_ORDER, fields = band_fields({ type = "integer", required = true,
    message = PRIORITY.message }) }

local function plugin_name(description)
  return { type = "string", message = '{key} must name a plugin defined under "plugins", got {got}',
    description = description }
end

--- flowControl, in llm-d-router's shape.
M.FLOW_CONTROL = { type = "object", what = "flowControl", known = "the flowControl section",
  order = { "maxBytes", "maxRequests", "defaultRequestTTL", "noEndpointRequestTTL",
    "flowGCTimeout", "usageLimitPolicyPluginRef", "bandSelectionPolicyPluginRef",
    "saturationDetector", "enableEviction", "defaultPriorityBand",
    "defaultNegativePriorityBand", "priorityBands" },
  fields = {
    maxBytes = quantity("the whole queue, in bytes (0: no limit)"),
    maxRequests = quantity("the whole queue, in requests (0: no limit)"),
    defaultRequestTTL = duration("how long a request may wait (default 60s; 0s: until its"
      .. " client leaves)"),
    noEndpointRequestTTL = duration("accepted, no effect"),
    flowGCTimeout = duration("an idle flow (fairness id) goes after this"),
    usageLimitPolicyPluginRef = plugin_name("accepted, no effect"),
    bandSelectionPolicyPluginRef = plugin_name("accepted, no effect"),
    saturationDetector = { type = "object", what = "saturationDetector",
      known = "flowControl.saturationDetector", order = { "pluginRef", "metricsStalenessThreshold" },
      fields = { pluginRef = { type = "string", nonempty = true,
        message = 'pluginRef must name the saturation detector, a plugin defined under "plugins"',
        description = "the detector (default: a utilization-detector with its defaults)" },
        metricsStalenessThreshold = duration("accepted, no effect: the detector's own parameter") } },
    enableEviction = { type = "boolean", message = "enableEviction must be true or false",
      description = "end sent sheddable requests to make room for higher ones" },
    defaultPriorityBand = M.BAND,
    defaultNegativePriorityBand = M.BAND,
    priorityBands = { type = "array", what = "priorityBands", items = M.PRIORITY_BAND },
  } }

--- objectives: [{name, priority}], x-gateway-inference-objective -> priority.
M.OBJECTIVES = { type = "array", messages = { type = "objectives must be an array of {name, priority}" },
  items = { type = "object", what = "an objective", known = "an objective",
    order = { "name", "priority" },
    fields = {
      name = { type = "string", required = true, nonempty = true,
        message = "name must be a non-empty string (the value of x-gateway-inference-objective)" },
      priority = { type = "integer", min = -2 ^ 31 + 1, max = 2 ^ 31 - 1,
        message = "priority must be an integer, got {got}" },
    } } }

-- --- what the walk does not check: references, duplicates ---

-- The flowControl fields lupin checks but does not act on, and why: a
-- config ported from the EPP loads, and its operator is told what differs.
local IGNORED_FLOW = {
  { "noEndpointRequestTTL", "a request that finds no endpoint waits as any other, up to its"
    .. " band's defaultRequestTTL" },
  { "usageLimitPolicyPluginRef", "lupin has no usage-limit policies; the bands' maxBytes and"
    .. " maxRequests bound the queue" },
  { "bandSelectionPolicyPluginRef", "bands are served strictly by priority, highest first" },
}

--- Checks the references of a walked flowControl f (root, the config as
--- given) and keeps it as cfg.flow_control.  Returns an error or nil.
function M.check(E, f, root, cfg)
  if f == nil then
    return
  end
  for _, k in ipairs({ "usageLimitPolicyPluginRef", "bandSelectionPolicyPluginRef" }) do
    if f[k] ~= nil and not cfg.plugin_paths[f[k]] then
      return E:at("flowControl." .. k, '%s must name a plugin defined under "plugins", got %s',
        k, cjson.encode(f[k]))
    end
  end
  local sd = root.flowControl.saturationDetector
  if type(sd) == "table" and sd.metricsStalenessThreshold ~= nil then
    -- upstream's test config sets it here, where its loader has no such field
    require("lupin.log").warn("%s", E:at("flowControl.saturationDetector.metricsStalenessThreshold",
      "accepted, no effect in lupin (upstream's loader ignores it too): set metricsStalenessThreshold"
      .. " in the detector plugin's parameters"))
  end
  if f.saturationDetector and f.saturationDetector.pluginRef == nil then
    f.saturationDetector = nil -- upstream's default detector
  elseif f.saturationDetector then
    local ref = f.saturationDetector.pluginRef
    if not cfg.plugin_paths[ref] then
      return E:at("flowControl.saturationDetector.pluginRef", "undefined pluginRef %q: no plugin"
        .. ' of that name under "plugins"', ref)
    end
    f.saturationDetector = ref
  end
  local seen = {}
  for i, band in ipairs(f.priorityBands or {}) do
    local p = ("flowControl.priorityBands[%d]"):format(i - 1)
    if seen[band.priority] then
      return E:at(p .. ".priority", "duplicate priority %d (also %s)", band.priority,
        seen[band.priority])
    end
    seen[band.priority] = p
  end
  f.priority_bands, f.priorityBands = f.priorityBands or {}, nil
  f.enableEviction = f.enableEviction == true
  cfg.flow_control = f
  for _, k in ipairs(IGNORED_FLOW) do
    local v = root.flowControl[k[1]]
    if v ~= nil and v ~= false then
      local log = require "lupin.log"
      log.warn("%s", E:at("flowControl." .. k[1], "accepted, no effect in lupin: %s", k[2]))
    end
  end
end

-- A limit of a band: 0 or absent is the default, as upstream's.
local function limit(v, default)
  return v and v > 0 and v or default
end

-- A band (or a template) from lupin.config's, upstream's defaults where it
-- leaves them out; paths name its policy references for errors.  Its TTL,
-- lupin's, is nil when it has none: the whole queue's applies.
local function band(b, path)
  b = b or {}
  return { priority = b.priority,
    max_bytes = limit(b.maxBytes, M.DEFAULT_BAND_BYTES),
    max_requests = limit(b.maxRequests, M.DEFAULT_BAND_REQUESTS),
    ttl = b.defaultRequestTTL,
    fairness = b.fairnessPolicyRef or M.DEFAULT_FAIRNESS,
    ordering = b.orderingPolicyRef or M.DEFAULT_ORDERING,
    fairness_path = b.fairnessPolicyRef and path .. ".fairnessPolicyRef",
    ordering_path = b.orderingPolicyRef and path .. ".orderingPolicyRef" }
end

--- The priorities a request can have, highest first: 0, each objective's,
--- each configured band's, and -1 when none of those is negative (the
--- sheddable band a client asks for with "-1").  A client's integer
--- objective is clamped into this set (lupin.flow), so the bands — and the
--- keys the process's shared dict holds for them — are bounded by the config.
function M.levels(objectives, bands)
  local set, out = { [0] = true }, {}
  for _, p in pairs(objectives) do
    set[p] = true
  end
  for _, b in ipairs(bands) do
    set[b.priority] = true
  end
  local negative = false
  for p in pairs(set) do
    out[#out + 1] = p
    negative = negative or p < 0
  end
  if not negative then
    out[#out + 1] = -1
  end
  table.sort(out, function(a, b) return a > b end)
  return out
end

--- Adds cfg.objectives from the walked list (nil: none) and, when flow
--- control is on, cfg.flow.  Returns an error "file:line: path: message", or nil.
function M.build(E, list, cfg)
  local objectives = {}
  for i, o in ipairs(list or {}) do
    if objectives[o.name] then
      return E:at(("objectives[%d].name"):format(i - 1), "duplicate objective %q", o.name)
    end
    objectives[o.name] = o.priority or 0
  end
  cfg.objectives = objectives
  local fc = cfg.flow_control
  if not fc and not (cfg.feature_gates and cfg.feature_gates.flowControl) then
    return nil
  end
  fc = fc or { priority_bands = {} }
  local flow = { bands = {}, objectives = objectives, max_bytes = fc.maxBytes or 0,
    max_requests = fc.maxRequests or 0, ttl = fc.defaultRequestTTL or M.DEFAULT_TTL }
  flow.default_band = band(fc.defaultPriorityBand, "flowControl.defaultPriorityBand")
  flow.negative_band = fc.defaultNegativePriorityBand
    and band(fc.defaultNegativePriorityBand, "flowControl.defaultNegativePriorityBand")
  for i, b in ipairs(fc.priority_bands) do
    flow.bands[i] = band(b, ("flowControl.priorityBands[%d]"):format(i - 1))
  end
  -- the detector: llm-d-router's place, the EPP's, or GIE v1's thresholds
  -- (a utilization-detector with them), else the default
  local sat = cfg.saturation
  if fc.saturationDetector then
    flow.detector, flow.detector_path = fc.saturationDetector, "flowControl.saturationDetector.pluginRef"
  elseif sat and sat.ref then
    flow.detector, flow.detector_path = sat.ref, "saturationDetector.pluginRef"
  else
    flow.detector = M.DEFAULT_DETECTOR
    flow.detector_params = sat and sat.params
    flow.detector_path = sat and "saturationDetector" or nil
  end
  flow.levels = M.levels(objectives, flow.bands)
  flow.eviction = fc.enableEviction == true
  flow.gc = fc.flowGCTimeout or M.DEFAULT_GC
  cfg.flow = flow
end

return M
