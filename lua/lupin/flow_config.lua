-- The config's flow-control sections, in the EPP's shape (docs/flow-control.md):
--
--   flowControl:            # present (or featureGates: [flowControl]): on
--     maxBytes: 0           # the whole queue; 0: no limit; "1Gi" and such
--     maxRequests: 0
--     defaultRequestTTL: 0s # how long a request may wait; 0: until its client leaves
--     defaultPriorityBand: { maxBytes, maxRequests, fairnessPolicyRef, orderingPolicyRef }
--     priorityBands: [ { priority, maxBytes, maxRequests, fairnessPolicyRef, orderingPolicyRef } ]
--   saturationDetector: { pluginRef: utilization-detector }
--   objectives: [ { name, priority } ]   # x-gateway-inference-objective -> priority
--
-- This file checks the shape and stores it as cfg.flow; lupin.generation
-- resolves the plugin references, lupin.flow runs it.
local cjson = require "cjson.safe"

local M = {}

M.TOP = { flowControl = true, saturationDetector = true, objectives = true }

local FLOW = { maxBytes = true, maxRequests = true, defaultRequestTTL = true,
  defaultPriorityBand = true, priorityBands = true }
local BAND = { priority = true, maxBytes = true, maxRequests = true, fairnessPolicyRef = true,
  orderingPolicyRef = true }
local DETECTOR = { pluginRef = true }
local OBJECTIVE = { name = true, priority = true }

M.DEFAULT_FAIRNESS = "global-strict-fairness-policy"
M.DEFAULT_ORDERING = "fcfs-ordering-policy"
M.DEFAULT_DETECTOR = "utilization-detector"
M.DEFAULT_BAND_BYTES = 1024 ^ 3 -- the EPP's 1Gi

local SUFFIX = { [""] = 1, k = 1e3, M = 1e6, G = 1e9, T = 1e12, Ki = 1024, Mi = 1024 ^ 2,
  Gi = 1024 ^ 3, Ti = 1024 ^ 4 }
local UNITS = { ns = 1e-9, us = 1e-6, ["µs"] = 1e-6, ms = 1e-3, s = 1, m = 60, h = 3600 }

--- A count or size: an integer ≥ 0, or a Kubernetes quantity ("512Mi", "1k").
function M.quantity(v)
  if type(v) == "number" then
    return v >= 0 and v == math.floor(v) and v or nil
  elseif type(v) ~= "string" then
    return nil
  end
  local num, suf = v:match("^%s*(%d+%.?%d*)%s*(%a*)%s*$")
  local m = num and SUFFIX[suf]
  return m and math.floor(tonumber(num) * m) or nil
end

--- A duration in seconds: a Go duration string ("30s", "1m30s", "250ms"),
--- "0", or a number of milliseconds.
function M.seconds(v)
  if type(v) == "number" then
    return v == v and v >= 0 and v / 1000 or nil
  elseif v == "0" then
    return 0
  elseif type(v) ~= "string" or v == "" then
    return nil
  end
  local total, rest = 0, v
  while rest ~= "" do
    local num, unit, tail = rest:match("^(%d*%.?%d+)(%a+)(.*)$")
    if not num then
      num, unit, tail = rest:match("^(%d*%.?%d+)(µs)(.*)$")
    end
    if not num or not UNITS[unit] then
      return nil
    end
    total, rest = total + tonumber(num) * UNITS[unit], tail
  end
  return total
end

local function keys(t)
  local list = {}
  for k in pairs(t) do
    list[#list + 1] = k
  end
  table.sort(list)
  return table.concat(list, ", ")
end

local function fields(E, obj, path, allowed, what)
  if type(obj) ~= "table" or E.index.kinds[path] ~= "object" then
    return E:at(path, "%s must be an object, got %s", what, E.index.kinds[path] or type(obj))
  end
  for k in pairs(obj) do
    if not allowed[k] then
      return E:at(path .. "." .. tostring(k), "unknown field %q in %s; known fields: %s",
        tostring(k), what, keys(allowed))
    end
  end
end

local function limit(E, obj, path, key, default)
  local v = obj[key]
  if v == nil then
    return nil, default
  end
  local n = M.quantity(v)
  if not n then
    return E:at(path .. "." .. key, "%s must be an integer ≥ 0 or a quantity such as \"1Gi\","
      .. " got %s", key, cjson.encode(v) or tostring(v))
  end
  return nil, n
end

local function ref(E, obj, path, key, default)
  local v = obj[key]
  if v == nil then
    return nil, default
  end
  if type(v) ~= "string" or v == "" then
    return E:at(path .. "." .. key, "%s must name a plugin, got %s", key,
      cjson.encode(v) or tostring(v))
  end
  return nil, v
end

-- A band (or the template): limits and policy references, the template's
-- values where it leaves them out.
local function band(E, b, path, base)
  local err = fields(E, b, path, BAND, "a priority band")
  if err then
    return err
  end
  local out = { path = path }
  err, out.max_bytes = limit(E, b, path, "maxBytes", base.max_bytes)
  if err then return err end
  err, out.max_requests = limit(E, b, path, "maxRequests", base.max_requests)
  if err then return err end
  err, out.fairness = ref(E, b, path, "fairnessPolicyRef", base.fairness)
  if err then return err end
  err, out.ordering = ref(E, b, path, "orderingPolicyRef", base.ordering)
  if err then return err end
  out.fairness_path = b.fairnessPolicyRef and path .. ".fairnessPolicyRef" or base.fairness_path
  out.ordering_path = b.orderingPolicyRef and path .. ".orderingPolicyRef" or base.ordering_path
  return nil, out
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
    local err = fields(E, o, path, OBJECTIVE, "an objective")
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

local function gated(root)
  for _, g in ipairs(type(root.featureGates) == "table" and root.featureGates or {}) do
    if g == "flowControl" then
      return true
    end
  end
end

--- Checks the sections; sets cfg.flow (nil: flow control off) and
--- cfg.objectives.  Returns an error "file:line: path: message", or nil.
function M.parse(E, root, cfg)
  local err, objectives = parse_objectives(E, root)
  if err then
    return err
  end
  cfg.objectives = objectives
  local fc, sd = root.flowControl, root.saturationDetector
  if sd ~= nil then
    err = fields(E, sd, "saturationDetector", DETECTOR, "saturationDetector")
    if err then
      return err
    end
  end
  if fc == nil and not gated(root) then
    return nil
  end
  fc = fc or {}
  if E.index.kinds.flowControl ~= nil then
    err = fields(E, fc, "flowControl", FLOW, "flowControl")
    if err then
      return err
    end
  end
  local flow = { bands = {}, objectives = objectives }
  err, flow.max_bytes = limit(E, fc, "flowControl", "maxBytes", 0)
  if err then return err end
  err, flow.max_requests = limit(E, fc, "flowControl", "maxRequests", 0)
  if err then return err end
  if fc.defaultRequestTTL ~= nil then
    flow.ttl = M.seconds(fc.defaultRequestTTL)
    if not flow.ttl then
      return E:at("flowControl.defaultRequestTTL", "defaultRequestTTL must be a duration such as"
        .. " \"30s\" or \"0s\" (no TTL), got %s", cjson.encode(fc.defaultRequestTTL))
    end
  end
  flow.ttl = flow.ttl or 0
  local base = { max_bytes = M.DEFAULT_BAND_BYTES, max_requests = 0,
    fairness = M.DEFAULT_FAIRNESS, ordering = M.DEFAULT_ORDERING }
  if fc.defaultPriorityBand ~= nil then
    err, base = band(E, fc.defaultPriorityBand, "flowControl.defaultPriorityBand", base)
    if err then
      return err
    end
  end
  flow.default_band = base
  if fc.priorityBands ~= nil then
    if E.index.kinds["flowControl.priorityBands"] ~= "array" then
      return E:at("flowControl.priorityBands", "priorityBands must be an array of bands")
    end
    local seen = {}
    for i, b in ipairs(fc.priorityBands) do
      local path = ("flowControl.priorityBands[%d]"):format(i - 1)
      local out
      err, out = band(E, b, path, base)
      if err then
        return err
      end
      if not integer(b.priority) then
        return E:at(path .. ".priority", "priority must be an integer (higher: served first),"
          .. " got %s", cjson.encode(b.priority) or "nothing")
      end
      if seen[b.priority] then
        return E:at(path .. ".priority", "priority %d has a band already (%s)", b.priority,
          seen[b.priority])
      end
      seen[b.priority] = path
      out.priority = b.priority
      flow.bands[#flow.bands + 1] = out
    end
  end
  flow.detector = sd and sd.pluginRef or M.DEFAULT_DETECTOR
  if type(flow.detector) ~= "string" or flow.detector == "" then
    return E:at("saturationDetector.pluginRef", "pluginRef must name a plugin")
  end
  flow.detector_path = sd and sd.pluginRef and "saturationDetector.pluginRef" or nil
  cfg.flow = flow
end

return M
