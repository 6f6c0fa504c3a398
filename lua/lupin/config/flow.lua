-- Flow control's configuration (docs/flow-control.md).  lupin.config checks
-- the EPP's sections and keeps them (cfg.flow_control, cfg.saturation,
-- cfg.feature_gates); this file adds the objectives (x-gateway-inference-
-- objective -> priority) and makes cfg.flow, what lupin.generation resolves
-- (plugin references) and lupin.flow runs:
--
--   flowControl:            # present (or featureGates: [flowControl]): on
--     maxBytes: 0           # the whole queue; 0: no limit; "1Gi" and such
--     maxRequests: 0
--     defaultRequestTTL: 0s # how long a request may wait; 0: until its client leaves
--     defaultPriorityBand: { maxBytes, maxRequests, defaultRequestTTL, fairnessPolicyRef, orderingPolicyRef }
--     defaultNegativePriorityBand: { ... }   # the template for priorities < 0
--     priorityBands: [ { priority, maxBytes, ... } ]
--     saturationDetector: { pluginRef }      # llm-d-router's place for it
--     flowGCTimeout: 5m      # lupin's: an idle flow (fairness id) goes after this
--   saturationDetector: { pluginRef }        # the EPP's
--   objectives: [ { name, priority } ]
local cjson = require "cjson.safe"

local M = {}

M.DEFAULT_FAIRNESS = "global-strict-fairness-policy"
M.DEFAULT_ORDERING = "fcfs-ordering-policy"
M.DEFAULT_DETECTOR = "utilization-detector"
M.DEFAULT_BAND_BYTES = 1024 ^ 3 -- the EPP's 1Gi
M.DEFAULT_GC = 300 -- seconds an empty flow is kept (the EPP's flow GC timeout, 5m)

local OBJECTIVE = { name = true, priority = true }

-- A band (or a template) from lupin.config's, the base's values where it
-- leaves them out; paths name its policy references for errors.
local function band(b, path, base)
  b = b or {}
  return { priority = b.priority,
    max_bytes = b.maxBytes or base.max_bytes, max_requests = b.maxRequests or base.max_requests,
    ttl = b.defaultRequestTTL or base.ttl,
    fairness = b.fairnessPolicyRef or base.fairness, ordering = b.orderingPolicyRef or base.ordering,
    fairness_path = b.fairnessPolicyRef and path .. ".fairnessPolicyRef" or base.fairness_path,
    ordering_path = b.orderingPolicyRef and path .. ".orderingPolicyRef" or base.ordering_path }
end

local function integer(v)
  return type(v) == "number" and v == math.floor(v) and v > -2 ^ 31 and v < 2 ^ 31
end

local function parse_objectives(E, root)
  local list, out = root.objectives, {}
  if list == nil then
    return nil, out
  end
  if E.index.kinds.objectives ~= "array" then
    return E:at("objectives", "objectives must be an array of {name, priority}")
  end
  for i, o in ipairs(list) do
    local path = ("objectives[%d]"):format(i - 1)
    local err = E:object(o, path, OBJECTIVE, "an objective")
    if err then
      return err
    end
    if type(o.name) ~= "string" or o.name == "" then
      return E:at(path .. ".name", "name must be a non-empty string (the value of"
        .. " x-gateway-inference-objective)")
    end
    if out[o.name] then
      return E:at(path .. ".name", "duplicate objective %q", o.name)
    end
    if o.priority ~= nil and not integer(o.priority) then
      return E:at(path .. ".priority", "priority must be an integer, got %s",
        cjson.encode(o.priority) or tostring(o.priority))
    end
    out[o.name] = o.priority or 0
  end
  return nil, out
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

--- Adds cfg.objectives and, when flow control is on, cfg.flow.  Returns an
--- error "file:line: path: message", or nil.
function M.parse(E, root, cfg)
  local err, objectives = parse_objectives(E, root)
  if err then
    return err
  end
  cfg.objectives = objectives
  local fc = cfg.flow_control
  if not fc and not (cfg.feature_gates and cfg.feature_gates.flowControl) then
    return nil
  end
  fc = fc or { priority_bands = {} }
  local flow = { bands = {}, objectives = objectives, max_bytes = fc.maxBytes or 0,
    max_requests = fc.maxRequests or 0, ttl = fc.defaultRequestTTL or 0 }
  local base = band(fc.defaultPriorityBand, "flowControl.defaultPriorityBand",
    { max_bytes = M.DEFAULT_BAND_BYTES, max_requests = 0, fairness = M.DEFAULT_FAIRNESS,
      ordering = M.DEFAULT_ORDERING })
  flow.default_band = base
  flow.negative_band = fc.defaultNegativePriorityBand
    and band(fc.defaultNegativePriorityBand, "flowControl.defaultNegativePriorityBand", base)
  for i, b in ipairs(fc.priority_bands) do
    flow.bands[i] = band(b, ("flowControl.priorityBands[%d]"):format(i - 1),
      b.priority < 0 and flow.negative_band or base)
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
  flow.gc = fc.flowGCTimeout or M.DEFAULT_GC
  cfg.flow = flow
end

return M
