-- Reading and checking a config: JSON in the shape of the EPP's
-- EndpointPickerConfig.  This file checks structure and names; what needs the
-- plugins themselves (roles, parameters) is checked by lupin.generation.
local cjson = require "cjson.safe"
local flow_config = require "lupin.config.flow"
local jsonpos = require "lupin.config.jsonpos"
local yaml = require "lupin.config.yaml"

local M = {}

local TOP = { apiVersion = true, kind = true, plugins = true, schedulingProfiles = true,
  featureGates = true, pluginDirs = true, endpoints = true, budgets = true,
  data = true, dataLayer = true, saturationDetector = true, flowControl = true, parser = true,
  objectives = true }
local PLUGIN = { type = true, name = true, parameters = true, maxCallMs = true,
  maxLifecycleMs = true }
local PROFILE = { name = true, plugins = true }
local REF = { pluginRef = true, weight = true }
local ENDPOINT = { name = true, address = true, port = true, labels = true, metrics = true }
-- An endpoint's metrics as an endpoints file may give them: what `lupin
-- explain` schedules over (lupin serve scrapes them and ignores these).
local METRICS = { waiting_queue_size = "number", running_requests = "number",
  kv_cache_usage = "number", max_lora = "number", cache_block_size = "number",
  num_blocks = "number", running_lora_adapters = "adapters", waiting_lora_adapters = "adapters" }

--- The top-level sections hosts declared (lupin_runtime_declare_section;
--- lupin serve's "gateway"): name -> { order = { field names },
--- fields = { name -> { default, min, max } } }: integers, or strings
--- ({ default, text = true, pattern, what }) where the host said so.
M.sections = {}

--- Declares a host's section; nil and a message when the declaration is wrong.
function M.declare_section(name, list)
  if type(name) ~= "string" or not name:match("^%a%w*$") then
    return nil, ("a section name must be a word, got %q"):format(tostring(name))
  end
  if TOP[name] then
    return nil, ("%q is a section of the runtime's own config"):format(name)
  end
  local fields, order = {}, {}
  for i, f in ipairs(list) do
    if type(f.name) ~= "string" or f.name == "" or fields[f.name] then
      return nil, ("section %s: setting %d needs a name of its own"):format(name, i)
    end
    if f.text then -- a string setting
      fields[f.name] = { default = f.text, text = true, pattern = f.pattern, what = f.what }
    elseif f.default < f.min or (f.max and f.default > f.max) then
      return nil, ("section %s: %s's default %s is out of its bounds"):format(name, f.name,
        f.default)
    else
      fields[f.name] = { default = f.default, min = f.min, max = f.max }
    end
    order[i] = f.name
  end
  M.sections[name] = { fields = fields, order = order }
  return true
end

--- Plugin call budgets (docs/plugins.md): the config's "budgets" section.
--- callMs: each call on the request path; lifecycleMs: file load, new, init,
--- migrate, shutdown; disableAfterCuts: cuts before an instance is disabled
--- until the next reload (0: never).  Plugins override the first two with
--- maxCallMs and maxLifecycleMs.
M.BUDGETS = {
  callMs = { default = 5, min = 0.01, max = 3600000 },
  lifecycleMs = { default = 1000, min = 0.01, max = 3600000 },
  disableAfterCuts = { default = 0, min = 0, max = 1e9, integer = true },
}

local function sorted_keys(t)
  local list = {}
  for k in pairs(t) do
    list[#list + 1] = k
  end
  table.sort(list)
  return table.concat(list, ", ")
end

--- A config error: "file:line: json.path: message".
local Errors = {}
Errors.__index = Errors

function Errors:at(path, fmt, ...)
  local line = self.index and jsonpos.line(self.index, path) or 1
  local where = path ~= "" and path .. ": " or ""
  return ("%s:%d: %s%s"):format(self.source, line, where, fmt:format(...))
end

function M.errors(source, index)
  return setmetatable({ source = source, index = index }, Errors)
end

local function join(path, key)
  return path == "" and key or path .. "." .. key
end

local function check_fields(E, obj, path, allowed, what)
  for k in pairs(obj) do
    if not allowed[k] then
      return E:at(join(path, tostring(k)), "unknown field %q in %s; known fields: %s",
        tostring(k), what, sorted_keys(allowed))
    end
  end
end

local function kind(E, path)
  return E.index.kinds[path]
end

local function need(E, path, want, what)
  local k = kind(E, path)
  if k ~= want then
    return E:at(path, "%s must be %s %s, got %s", what, (want == "array" or want == "object") and "an" or "a",
      want, k or "nothing")
  end
end

--- An object at path with only the allowed fields, or the error saying
--- otherwise (for the modules that check sections of their own).
function Errors:object(obj, path, allowed, what)
  return need(self, path, "object", what) or check_fields(self, obj, path, allowed, what)
end

-- The first number of a decoded JSON value that is not finite (NaN,
-- Infinity, or a literal out of range such as 1e309), with its path.
local function non_finite(v, path)
  if type(v) == "number" then
    if v ~= v or v - v ~= 0 then
      return path, v
    end
  elseif type(v) == "table" then
    for k, x in pairs(v) do
      local p, bad = non_finite(x, type(k) == "number" and ("%s[%d]"):format(path, k - 1)
        or join(path, k))
      if p then
        return p, bad
      end
    end
  end
end

-- RFC 8259 JSON, finite numbers only: lua-cjson's default decoder takes NaN,
-- Infinity and hex numbers, and reads 1e309 as infinity.  The permissive
-- decode finds where a non-finite number sits (a path, hence a line); the
-- strict one refuses the rest (hex).  Returns the root and the error index.
local strict = cjson.new()
strict.decode_invalid_numbers(false)

local function read(path)
  local f, err = io.open(path, "rb")
  if not f then
    return nil, ("cannot read config %s"):format(err)
  end
  local text = f:read("*a")
  f:close()
  return text
end

local function parse_plugins(E, root, cfg)
  local list = root.plugins or {}
  if root.plugins ~= nil then
    local err = need(E, "plugins", "array", "plugins")
    if err then
      return err
    end
  end
  local names = {}
  for i, p in ipairs(list) do
    local path = ("plugins[%d]"):format(i - 1)
    local err = need(E, path, "object", "each plugin")
      or check_fields(E, p, path, PLUGIN, "a plugin")
    if err then
      return err
    end
    if p.type == nil then
      return E:at(path, 'missing "type": name the plugin type, e.g. "type": "queue-scorer"')
    end
    if type(p.type) ~= "string" or p.type == "" then
      return E:at(path .. ".type", "type must be a non-empty string")
    end
    if p.name ~= nil and (type(p.name) ~= "string" or p.name == "") then
      return E:at(path .. ".name", "name must be a non-empty string")
    end
    local name = p.name or p.type
    if names[name] then
      return E:at(p.name and path .. ".name" or path .. ".type",
        'duplicate plugin name %q (also %s); give each instance its own "name"', name,
        names[name])
    end
    names[name] = path
    if p.parameters ~= nil and p.parameters ~= cjson.null then
      local perr = need(E, path .. ".parameters", "object", "parameters")
      if perr then
        return perr
      end
    end
    local limits = {}
    for _, k in ipairs({ "maxCallMs", "maxLifecycleMs" }) do
      local v = p[k]
      if v ~= nil and (type(v) ~= "number" or v ~= v or v < 0.01 or v > 3600000) then
        return E:at(path .. "." .. k, "%s must be a number of milliseconds from 0.01 to 3600000,"
          .. " got %s", k, cjson.encode(v) or tostring(v))
      end
      limits[k] = v
    end
    cfg.plugins[#cfg.plugins + 1] = { name = name, type = p.type, params = p.parameters,
      path = path, max_call_ms = limits.maxCallMs, max_lifecycle_ms = limits.maxLifecycleMs }
  end
  cfg.plugin_paths = names
end

local function parse_ref(E, r, path, cfg, refs)
  local err = need(E, path, "object", "each profile plugin")
    or check_fields(E, r, path, REF, "a profile plugin")
  if err then
    return err
  end
  if type(r.pluginRef) ~= "string" then
    return E:at(path, 'missing "pluginRef": name a plugin defined under "plugins"')
  end
  if not cfg.plugin_paths[r.pluginRef] then
    local defined = {}
    for _, p in ipairs(cfg.plugins) do
      defined[#defined + 1] = p.name
    end
    return E:at(path .. ".pluginRef", "undefined pluginRef %q; defined plugins: %s",
      r.pluginRef, #defined > 0 and table.concat(defined, ", ") or "none")
  end
  if r.weight ~= nil and (type(r.weight) ~= "number" or r.weight < 0 or r.weight ~= r.weight) then
    return E:at(path .. ".weight", "weight must be a number ≥ 0, got %s",
      cjson.encode(r.weight) or tostring(r.weight))
  end
  refs[#refs + 1] = { ref = r.pluginRef, weight = r.weight, path = path }
end

local function parse_profiles(E, root, cfg)
  if root.schedulingProfiles == nil then
    return
  end
  local err = need(E, "schedulingProfiles", "array", "schedulingProfiles")
  if err then
    return err
  end
  local names = {}
  for i, p in ipairs(root.schedulingProfiles) do
    local path = ("schedulingProfiles[%d]"):format(i - 1)
    err = need(E, path, "object", "each profile") or check_fields(E, p, path, PROFILE, "a profile")
    if err then
      return err
    end
    if type(p.name) ~= "string" or p.name == "" then
      return E:at(path, 'missing "name": give the profile a name, e.g. "default"')
    end
    if names[p.name] then
      return E:at(path .. ".name", "duplicate profile name %q (also %s); profile names must be unique",
        p.name, names[p.name])
    end
    names[p.name] = path
    local refs = {}
    if p.plugins ~= nil then
      err = need(E, path .. ".plugins", "array", "a profile's plugins")
      if err then
        return err
      end
      for j, r in ipairs(p.plugins) do
        err = parse_ref(E, r, ("%s.plugins[%d]"):format(path, j - 1), cfg, refs)
        if err then
          return err
        end
      end
    end
    cfg.profiles[#cfg.profiles + 1] = { name = p.name, refs = refs, path = path }
  end
end

local function parse_dirs(E, root, cfg)
  if root.pluginDirs == nil then
    return
  end
  local err = need(E, "pluginDirs", "array", "pluginDirs")
  if err then
    return err
  end
  for i, d in ipairs(root.pluginDirs) do
    if type(d) ~= "string" then
      return E:at(("pluginDirs[%d]"):format(i - 1), "each plugin directory must be a string")
    end
    local dir = d:sub(1, 1) == "/" and d or cfg.dir .. "/" .. d
    local f, ferr = io.open(dir, "rb")
    local is_dir = f and select(3, f:read(0)) == 21 -- EISDIR
    if f then
      f:close()
    end
    if not is_dir then
      return E:at(("pluginDirs[%d]"):format(i - 1), "plugin directory %q %s%s", d,
        dir ~= d and ("(%s) "):format(dir) or "",
        f and "is not a directory" or tostring(ferr):find("No such file", 1, true)
          and "does not exist" or "cannot be read: " .. tostring(ferr))
    end
    cfg.plugin_dirs[i] = dir
  end
end

local function parse_section(E, root, name, decl)
  local g = root[name]
  local out = {}
  for k, f in pairs(decl.fields) do
    out[k] = f.default
  end
  if g == nil then
    return nil, out
  end
  local err = need(E, name, "object", name)
    or check_fields(E, g, name, decl.fields, "the " .. name .. " section")
  if err then
    return err
  end
  for k, v in pairs(g) do
    local f = decl.fields[k]
    if type(v) == "boolean" and f.min == 0 and f.max == 1 then -- a switch: true or 1
      v = v and 1 or 0
    end
    if f.text then
      if type(v) ~= "string" then
        return E:at(name .. "." .. k, "%s must be a string, got %s", k, cjson.encode(v) or tostring(v))
      end
      if f.pattern and not v:match(f.pattern) then
        return E:at(name .. "." .. k, "%s must be %s, got %s", k, f.what or ("like " .. f.pattern),
          cjson.encode(v))
      end
    elseif type(v) ~= "number" or v ~= math.floor(v) or v < f.min then
      return E:at(name .. "." .. k, "%s must be an integer ≥ %d, got %s", k, f.min,
        cjson.encode(v) or tostring(v))
    end
    if f.max and v > f.max then
      return E:at(name .. "." .. k, "%s must be an integer ≤ %d, got %s", k, f.max,
        cjson.encode(v) or tostring(v))
    end
    out[k] = v
  end
  return nil, out
end

-- The hosts' sections: cfg.sections[name] = { field -> value }.
local function parse_sections(E, root, cfg)
  cfg.sections = {}
  for name, decl in pairs(M.sections) do
    local err, values = parse_section(E, root, name, decl)
    if err then
      return err
    end
    cfg.sections[name] = values
  end
end

local function parse_budgets(E, root, cfg)
  local b = root.budgets
  local out = {}
  for k, spec in pairs(M.BUDGETS) do
    out[k] = spec.default
  end
  if b ~= nil then
    local err = need(E, "budgets", "object", "budgets")
      or check_fields(E, b, "budgets", M.BUDGETS, "the budgets section")
    if err then
      return err
    end
    for k, v in pairs(b) do
      local spec = M.BUDGETS[k]
      if type(v) ~= "number" or v ~= v or v < spec.min or v > spec.max
        or (spec.integer and v ~= math.floor(v)) then
        return E:at("budgets." .. k, "%s must be a%s from %s to %s, got %s", k,
          spec.integer and "n integer" or " number", spec.min, spec.max,
          cjson.encode(v) or tostring(v))
      end
      out[k] = v
    end
  end
  cfg.budgets = { call_ms = out.callMs, lifecycle_ms = out.lifecycleMs,
    disable_after = out.disableAfterCuts }
end

-- --- the EPP's data, saturation, flow-control sections and feature gates ---
-- (docs/epp-compatibility.md, "Config sections").  Checked here in the
-- EPP's shape; what the referenced plugins are is checked by the generation.

local function plugin_ref(E, cfg, obj, path, what)
  if type(obj) ~= "table" or type(obj.pluginRef) ~= "string" or obj.pluginRef == "" then
    return E:at(path, 'missing "pluginRef": name the %s, a plugin defined under "plugins"', what)
  end
  if not cfg.plugin_paths[obj.pluginRef] then
    return E:at(path .. ".pluginRef", "undefined pluginRef %q: no plugin of that name under"
      .. ' "plugins"', obj.pluginRef)
  end
end

local NOT_SUPPORTED_DATA = {
  discovery = "lupin reads endpoints from the config's \"endpoints\" or an --endpoints file;"
    .. " use those",
  crossReplica = "lupin runs one picker per gateway process and shares no state between"
    .. " replicas; remove it",
}
local DATA = { sources = true, injectDefaults = true, discovery = true, crossReplica = true }

-- data (GIE) or dataLayer (llm-d-router): { sources = [{pluginRef,
-- extractors = [{pluginRef}]}], injectDefaults } -> cfg.data.
local function parse_data(E, root, cfg)
  local key = root.dataLayer ~= nil and "dataLayer" or "data"
  if root.data ~= nil and root.dataLayer ~= nil then
    return E:at("dataLayer", 'both "data" and "dataLayer": they are the same section (GIE\'s and'
      .. " llm-d-router's name); keep one")
  end
  local d = root[key]
  if d == nil then
    return
  end
  local err = need(E, key, "object", key) or check_fields(E, d, key, DATA, "the " .. key
    .. " section")
  if err then
    return err
  end
  for field, why in pairs(NOT_SUPPORTED_DATA) do
    if d[field] ~= nil then
      return E:at(key .. "." .. field, "not supported: %s", why)
    end
  end
  if d.injectDefaults ~= nil and type(d.injectDefaults) ~= "boolean" then
    return E:at(key .. ".injectDefaults", "injectDefaults must be true or false")
  end
  local out = { key = key, sources = {}, inject_defaults = d.injectDefaults ~= false }
  if d.sources ~= nil then
    err = need(E, key .. ".sources", "array", "sources")
    if err then
      return err
    end
    for i, s in ipairs(d.sources) do
      local p = ("%s.sources[%d]"):format(key, i - 1)
      err = need(E, p, "object", "each source")
        or check_fields(E, s, p, { pluginRef = true, extractors = true }, "a source")
        or plugin_ref(E, cfg, s, p, "data source")
      if err then
        return err
      end
      local src = { ref = s.pluginRef, path = p, extractors = {} }
      if s.extractors ~= nil then
        err = need(E, p .. ".extractors", "array", "extractors")
        if err then
          return err
        end
      end
      for j, x in ipairs(s.extractors or {}) do
        local xp = ("%s.extractors[%d]"):format(p, j - 1)
        err = need(E, xp, "object", "each extractor")
          or check_fields(E, x, xp, { pluginRef = true }, "an extractor")
          or plugin_ref(E, cfg, x, xp, "extractor")
        if err then
          return err
        end
        src.extractors[#src.extractors + 1] = { ref = x.pluginRef, path = xp }
      end
      out.sources[#out.sources + 1] = src
    end
  end
  cfg.data = out
end

local SATURATION = { queueDepthThreshold = true, kvCacheUtilThreshold = true,
  metricsStalenessThreshold = true, pluginRef = true }

-- saturationDetector: GIE v1's thresholds (made a saturation-detector
-- plugin by the generation) or llm-d-router's { pluginRef }.
local function parse_saturation(E, root, cfg)
  local s = root.saturationDetector
  if s == nil then
    return
  end
  local err = need(E, "saturationDetector", "object", "saturationDetector")
    or check_fields(E, s, "saturationDetector", SATURATION, "the saturationDetector section")
  if err then
    return err
  end
  if s.pluginRef ~= nil then
    if next(s, nil) ~= "pluginRef" or next(s, "pluginRef") ~= nil then
      return E:at("saturationDetector", "give either pluginRef or the thresholds"
        .. " (queueDepthThreshold, kvCacheUtilThreshold, metricsStalenessThreshold), not both")
    end
    err = plugin_ref(E, cfg, s, "saturationDetector", "saturation detector")
    if err then
      return err
    end
    cfg.saturation = { ref = s.pluginRef, path = "saturationDetector" }
  else
    local params = {}
    for k, v in pairs(s) do
      params[k] = v
    end
    cfg.saturation = { params = params, path = "saturationDetector" }
  end
end

local QUANTITY = { [""] = 1, k = 1e3, M = 1e6, G = 1e9, T = 1e12, P = 1e15, E = 1e18,
  Ki = 2 ^ 10, Mi = 2 ^ 20, Gi = 2 ^ 30, Ti = 2 ^ 40, Pi = 2 ^ 50, Ei = 2 ^ 60, m = 1e-3 }

--- A Kubernetes resource quantity ("100", "1k", "5Gi", 1000) as a number.
function M.quantity(v)
  if type(v) == "number" then
    return v >= 0 and v or nil
  elseif type(v) ~= "string" then
    return nil
  end
  local num, suffix = v:match("^%+?(%d*%.?%d+)([%a]*)$")
  local mult = num and QUANTITY[suffix]
  if not mult then
    local mant, exp = v:match("^%+?(%d*%.?%d+)[eE]([-+]?%d+)$")
    return mant and tonumber(mant) * 10 ^ tonumber(exp)
  end
  return tonumber(num) * mult
end

local DURATION = { ns = 1e-9, us = 1e-6, ["µs"] = 1e-6, ms = 1e-3, s = 1, m = 60, h = 3600 }

--- A Go duration ("30s", "1m0s", "500ms", "0") in seconds.
function M.duration(v)
  if v == "0" or v == 0 then
    return 0
  elseif type(v) ~= "string" or v == "" then
    return nil
  end
  local total, rest = 0, v
  while rest ~= "" do
    local num, unit, tail = rest:match("^(%d*%.?%d+)([%aµ]+)(.*)$")
    if not num or not DURATION[unit] then
      return nil
    end
    total, rest = total + tonumber(num) * DURATION[unit], tail
  end
  return total
end

local BAND = { priority = true, maxBytes = true, maxRequests = true, defaultRequestTTL = true,
  fairnessPolicyRef = true, orderingPolicyRef = true }
local FLOW = { maxBytes = true, maxRequests = true, defaultRequestTTL = true,
  noEndpointRequestTTL = true, defaultPriorityBand = true, defaultNegativePriorityBand = true,
  priorityBands = true, usageLimitPolicyPluginRef = true, bandSelectionPolicyPluginRef = true,
  saturationDetector = true, enableEviction = true, flowGCTimeout = true }

-- The value fields flow control and its bands share: quantities, durations,
-- names.
local function flow_values(E, obj, path, out)
  for _, k in ipairs({ "maxBytes", "maxRequests" }) do
    if obj[k] ~= nil then
      out[k] = M.quantity(obj[k])
      if not out[k] then
        return E:at(path .. "." .. k, '%s must be a quantity ≥ 0 such as 1000, "1k" or "5Gi",'
          .. " got %s", k, cjson.encode(obj[k]) or tostring(obj[k]))
      end
    end
  end
  for _, k in ipairs({ "defaultRequestTTL", "noEndpointRequestTTL", "flowGCTimeout" }) do
    if obj[k] ~= nil then
      out[k] = M.duration(obj[k])
      if not out[k] then
        return E:at(path .. "." .. k, '%s must be a duration such as "30s" or "1m0s", got %s',
          k, cjson.encode(obj[k]) or tostring(obj[k]))
      end
    end
  end
  for _, k in ipairs({ "fairnessPolicyRef", "orderingPolicyRef" }) do
    if obj[k] ~= nil and (type(obj[k]) ~= "string" or obj[k] == "") then
      return E:at(path .. "." .. k, "%s must be a policy name", k)
    end
    out[k] = obj[k]
  end
end

local function parse_band(E, b, path, need_priority)
  local err = need(E, path, "object", "a priority band") or check_fields(E, b, path, BAND,
    "a priority band")
  if err then
    return nil, err
  end
  local out = {}
  if b.priority ~= nil or need_priority then
    if type(b.priority) ~= "number" or b.priority ~= math.floor(b.priority) then
      return nil, E:at(path .. ".priority", "priority must be an integer, got %s",
        cjson.encode(b.priority) or "nothing")
    end
    out.priority = b.priority
  end
  err = flow_values(E, b, path, out)
  if err then
    return nil, err
  end
  return out
end

-- The flowControl fields lupin checks but does not act on, and why: a
-- config ported from the EPP loads, and its operator is told what differs.
local IGNORED_FLOW = {
  { "noEndpointRequestTTL", "a request that finds no endpoint waits as any other, up to its"
    .. " band's defaultRequestTTL" },
  { "usageLimitPolicyPluginRef", "lupin has no usage-limit policies; the bands' maxBytes and"
    .. " maxRequests bound the queue" },
  { "bandSelectionPolicyPluginRef", "bands are served strictly by priority, highest first" },
  { "enableEviction", "lupin never evicts a request it has sent to an endpoint" },
}

local function warn_ignored_flow(E, f)
  for _, k in ipairs(IGNORED_FLOW) do
    local v = f[k[1]]
    if v ~= nil and v ~= false then
      local log = require "lupin.log"
      log.warn("%s", E:at("flowControl." .. k[1], "accepted, no effect in lupin: %s", k[2]))
    end
  end
end

-- flowControl, in llm-d-router's shape: checked and kept as cfg.flow_control;
-- lupin.flow_config makes it what lupin.flow runs (docs/flow-control.md).
local function parse_flow_control(E, root, cfg)
  local f = root.flowControl
  if f == nil then
    return
  end
  local err = need(E, "flowControl", "object", "flowControl")
    or check_fields(E, f, "flowControl", FLOW, "the flowControl section")
  if err then
    return err
  end
  local out = { priority_bands = {} }
  err = flow_values(E, f, "flowControl", out)
  if err then
    return err
  end
  for _, k in ipairs({ "usageLimitPolicyPluginRef", "bandSelectionPolicyPluginRef" }) do
    if f[k] ~= nil then
      if type(f[k]) ~= "string" or not cfg.plugin_paths[f[k]] then
        return E:at("flowControl." .. k, '%s must name a plugin defined under "plugins", got %s',
          k, cjson.encode(f[k]) or tostring(f[k]))
      end
      out[k] = f[k]
    end
  end
  if f.saturationDetector ~= nil then
    err = need(E, "flowControl.saturationDetector", "object", "saturationDetector")
      or check_fields(E, f.saturationDetector, "flowControl.saturationDetector",
        { pluginRef = true }, "flowControl.saturationDetector")
      or plugin_ref(E, cfg, f.saturationDetector, "flowControl.saturationDetector",
        "saturation detector")
    if err then
      return err
    end
    out.saturationDetector = f.saturationDetector.pluginRef
  end
  if f.enableEviction ~= nil and type(f.enableEviction) ~= "boolean" then
    return E:at("flowControl.enableEviction", "enableEviction must be true or false")
  end
  out.enableEviction = f.enableEviction == true
  for _, k in ipairs({ "defaultPriorityBand", "defaultNegativePriorityBand" }) do
    if f[k] ~= nil then
      out[k], err = parse_band(E, f[k], "flowControl." .. k, false)
      if err then
        return err
      end
    end
  end
  if f.priorityBands ~= nil then
    err = need(E, "flowControl.priorityBands", "array", "priorityBands")
    if err then
      return err
    end
    local seen = {}
    for i, b in ipairs(f.priorityBands) do
      local p = ("flowControl.priorityBands[%d]"):format(i - 1)
      local band
      band, err = parse_band(E, b, p, true)
      if err then
        return err
      end
      if seen[band.priority] then
        return E:at(p .. ".priority", "duplicate priority %d (also %s)", band.priority,
          seen[band.priority])
      end
      seen[band.priority] = p
      out.priority_bands[#out.priority_bands + 1] = band
    end
  end
  cfg.flow_control = out
  warn_ignored_flow(E, f)
end

--- The feature gates upstream knows, and what lupin does with each
--- (docs/epp-compatibility.md, "featureGates").
M.FEATURE_GATES = {
  dataLayer = "lupin's data layer is always on: accepted, no effect",
  prepareDataPlugins = "lupin always runs prepare plugins: accepted, no effect",
  flowControl = "turns flow control on (docs/flow-control.md), as a flowControl section does",
}

local function parse_feature_gates(E, root, cfg)
  cfg.feature_gates = {}
  local g = root.featureGates
  if g == nil then
    return
  end
  local err = need(E, "featureGates", "array", "featureGates")
  if err then
    return err
  end
  for i, name in ipairs(g) do
    local p = ("featureGates[%d]"):format(i - 1)
    if type(name) ~= "string" or name == "" then
      return E:at(p, "each feature gate is a name such as \"flowControl\"")
    end
    cfg.feature_gates[name] = true
    if not M.FEATURE_GATES[name] then
      local log = require "lupin.log"
      log.warn("%s", E:at(p, "feature gate %q is unknown to lupin and has no effect; known: %s",
        name, sorted_keys(M.FEATURE_GATES)))
    end
  end
end

-- The EPP's "parser" section: {pluginRef: a plugin of type openai-parser
-- (the default, also when absent) or passthrough-parser}.  cfg.parser: nil
-- for openai, else { passthrough = true, model_header, model }.
local PARSERS = { ["openai-parser"] = true, ["passthrough-parser"] = true }

local function parse_parser(E, root, cfg)
  local p = root.parser
  if p == nil then
    return
  end
  local err = need(E, "parser", "object", "parser")
    or check_fields(E, p, "parser", { pluginRef = true }, "the parser section")
  if err then
    return err
  end
  if type(p.pluginRef) ~= "string" then
    return E:at("parser", 'missing "pluginRef": name a plugin of type openai-parser or'
      .. " passthrough-parser defined under \"plugins\"")
  end
  local plugin
  for _, q in ipairs(cfg.plugins) do
    if q.name == p.pluginRef then
      plugin = q
    end
  end
  if not plugin then
    return E:at("parser.pluginRef", "undefined pluginRef %q: add {type: openai-parser} or"
      .. " {type: passthrough-parser} to \"plugins\"", p.pluginRef)
  end
  if not PARSERS[plugin.type] then
    return E:at("parser.pluginRef", "plugin %q is a %s, not a parser; lupin has openai-parser"
      .. " and passthrough-parser", p.pluginRef, plugin.type)
  end
  if plugin.type == "passthrough-parser" then
    local params = type(plugin.params) == "table" and plugin.params or {}
    local header = params.modelHeader
    if header == nil then
      header = "x-gateway-model-name"
    end
    cfg.parser = { passthrough = true, model = type(params.model) == "string" and params.model
      or nil, model_header = type(header) == "string" and header ~= "" and header:lower() or nil }
  end
end

-- An endpoint's metrics: numbers ≥ 0, adapters a list of names or a
-- comma-separated string (kept as the latter, lupin_metrics' form).
local function parse_metrics(E, m, path)
  local err = need(E, path, "object", "metrics") or check_fields(E, m, path, METRICS, "metrics")
  if err then
    return nil, err
  end
  local out = {}
  for k, v in pairs(m) do
    if METRICS[k] == "number" then
      if type(v) ~= "number" or v < 0 then
        return nil, E:at(path .. "." .. k, "%s must be a number ≥ 0, got %s", k,
          cjson.encode(v) or tostring(v))
      end
      out[k] = v
    else
      if type(v) == "table" then
        for i, a in ipairs(v) do
          if type(a) ~= "string" then
            return nil, E:at(("%s.%s[%d]"):format(path, k, i - 1), "adapter names are strings")
          end
        end
        v = table.concat(v, ",")
      elseif type(v) ~= "string" then
        return nil, E:at(path .. "." .. k, "%s must be a list of adapter names or a"
          .. " comma-separated string", k)
      end
      out[k] = v
    end
  end
  return out
end

--- Checks a list of endpoints at path ("endpoints" in a config, "" for an
--- endpoints file).  Returns the list, or nil and an error.
function M.parse_endpoints(E, list, path)
  local err = need(E, path, "array", path == "" and "an endpoints file" or "endpoints")
  if err then
    return nil, err
  end
  local out, names = {}, {}
  for i, ep in ipairs(list) do
    local p = ("%s[%d]"):format(path, i - 1)
    err = need(E, p, "object", "each endpoint") or check_fields(E, ep, p, ENDPOINT, "an endpoint")
    if err then
      return nil, err
    end
    if type(ep.address) ~= "string" or ep.address == "" then
      return nil, E:at(p, 'missing "address": the endpoint\'s IP address, e.g. "127.0.0.1"')
    end
    local port = ep.port
    if type(port) ~= "number" or port ~= math.floor(port) or port < 1 or port > 65535 then
      return nil, E:at(p .. ".port", "port must be an integer from 1 to 65535, got %s",
        cjson.encode(port) or tostring(port))
    end
    if ep.name ~= nil and (type(ep.name) ~= "string" or ep.name == "") then
      return nil, E:at(p .. ".name", "name must be a non-empty string")
    end
    local name = ep.name or ("%s:%d"):format(ep.address, port)
    if names[name] then
      return nil, E:at(p, "duplicate endpoint %q (also %s)", name, names[name])
    end
    names[name] = p
    local labels = {}
    if ep.labels ~= nil then
      err = need(E, p .. ".labels", "object", "labels")
      if err then
        return nil, err
      end
      for k, v in pairs(ep.labels) do
        if type(v) ~= "string" then
          return nil, E:at(p .. ".labels." .. k, "label values must be strings")
        end
        labels[k] = v
      end
    end
    local metrics
    if ep.metrics ~= nil then
      metrics, err = parse_metrics(E, ep.metrics, p .. ".metrics")
      if err then
        return nil, err
      end
    end
    out[#out + 1] = { name = name, address = ep.address, port = port, labels = labels,
      metrics = metrics }
  end
  return out
end

--- YAML when the name says so or the text does not begin as JSON does.
function M.is_yaml(text, source)
  return source:match("%.ya?ml$") ~= nil or not text:match("^%s*[{%[]")
end

--- Decodes a config or endpoints text, JSON or YAML.  Returns the value and
--- its index of lines and kinds, or nil and "source:line: invalid ...".
function M.decode(text, source)
  local root, index
  if M.is_yaml(text, source) then
    root, index = yaml.decode(text, source)
    if root == nil then
      return nil, index
    end
  else
    local jerr
    root, jerr = cjson.decode(text)
    if root ~= nil then
      index = jsonpos.index(text)
    end
    if root ~= nil and not non_finite(root, "") then
      root, jerr = strict.decode(text) -- refuses hex numbers too
    end
    if root == nil then
      local offset = tonumber(tostring(jerr):match("character (%d+)")) or 1
      return nil, ("%s:%d: invalid JSON: %s"):format(source, jsonpos.line_of_offset(text, offset),
        tostring(jerr))
    end
  end
  local path, v = non_finite(root, "")
  if path then
    return nil, M.errors(source, index):at(path, "numbers must be finite, got %s", v ~= v and "NaN"
      or v > 0 and "Infinity (or a number too large for a double)" or "-Infinity")
  end
  return root, index
end

--- The config as one canonical JSON text (keys sorted): what the generation
--- digest hashes, so the JSON and YAML forms of a config digest alike.
local function canonical(v, path, kinds, out)
  local k = kinds[path]
  if k == "object" then
    local keys = {}
    for key in pairs(v) do
      keys[#keys + 1] = key
    end
    table.sort(keys)
    out[#out + 1] = "{"
    for i, key in ipairs(keys) do
      out[#out + 1] = (i > 1 and "," or "") .. cjson.encode(key) .. ":"
      canonical(v[key], path == "" and key or path .. "." .. key, kinds, out)
    end
    out[#out + 1] = "}"
  elseif k == "array" then
    out[#out + 1] = "["
    for i, item in ipairs(v) do
      out[#out + 1] = i > 1 and "," or ""
      canonical(item, ("%s[%d]"):format(path, i - 1), kinds, out)
    end
    out[#out + 1] = "]"
  elseif type(v) == "number" then
    out[#out + 1] = ("%.17g"):format(v)
  else
    out[#out + 1] = cjson.encode(v)
  end
  return out
end

--- Reads an endpoints file: a JSON or YAML list of {name, address, port, labels,
--- metrics}.
function M.endpoints_file(path)
  local text, err = read(path)
  if not text then
    return nil, err
  end
  local root, index = M.decode(text, path)
  if root == nil then
    return nil, index
  end
  return M.parse_endpoints(M.errors(path, index), root, "")
end

--- Parses and checks a config.  text nil: read the file named by source.
---@return table? cfg, string? err
function M.parse(text, source)
  if text == nil then
    local err
    text, err = read(source)
    if not text then
      return nil, err
    end
  end
  local root, index = M.decode(text, source)
  if root == nil then
    return nil, index
  end
  local E = M.errors(source, index)
  if E.index.kinds[""] ~= "object" then
    return nil, E:at("", "the config must be a %s object (mapping) with \"plugins\" and"
      .. " \"schedulingProfiles\"", M.is_yaml(text, source) and "YAML" or "JSON")
  end
  local cfg = { source = source, dir = source:match("^(.*)/[^/]*$") or ".", errors = E,
    plugins = {}, profiles = {}, plugin_dirs = {},
    text = table.concat(canonical(root, "", index.kinds, {})) }
  local known = {}
  for k in pairs(TOP) do
    known[k] = true
  end
  for k in pairs(M.sections) do
    known[k] = true
  end
  local err = check_fields(E, root, "", known, "the config")
  if not err and root.kind ~= nil and root.kind ~= "EndpointPickerConfig" then
    err = E:at("kind", 'kind must be "EndpointPickerConfig", got %s', cjson.encode(root.kind))
  end
  err = err or parse_dirs(E, root, cfg) or parse_plugins(E, root, cfg)
    or parse_profiles(E, root, cfg) or parse_sections(E, root, cfg) or parse_budgets(E, root, cfg)
    or parse_data(E, root, cfg) or parse_saturation(E, root, cfg)
    or parse_flow_control(E, root, cfg) or parse_feature_gates(E, root, cfg)
    or parse_parser(E, root, cfg) or flow_config.parse(E, root, cfg)
  if not err and root.endpoints ~= nil then
    cfg.endpoints, err = M.parse_endpoints(E, root.endpoints, "endpoints")
  end
  if err then
    return nil, err
  end
  return cfg
end

return M
