-- Reading and checking a config: JSON in the shape of the EPP's
-- EndpointPickerConfig.  This file checks structure and names; what needs the
-- plugins themselves (roles, parameters) is checked by lupin.generation.
local cjson = require "cjson.safe"
local flow_config = require "lupin.flow_config"
local jsonpos = require "lupin.jsonpos"
local yaml = require "lupin.yaml"

local M = {}

local TOP = { apiVersion = true, kind = true, plugins = true, schedulingProfiles = true,
  featureGates = true, pluginDirs = true, endpoints = true, budgets = true }
for k in pairs(flow_config.TOP) do TOP[k] = true end -- flowControl, saturationDetector, objectives
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
--- fields = { name -> { default, min, max } } }.  Every field an integer.
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
    if f.default < f.min or (f.max and f.default > f.max) then
      return nil, ("section %s: %s's default %s is out of its bounds"):format(name, f.name,
        f.default)
    end
    fields[f.name] = { default = f.default, min = f.min, max = f.max }
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
    if type(v) ~= "number" or v ~= math.floor(v) or v < f.min then
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
    or flow_config.parse(E, root, cfg)
  if not err and root.endpoints ~= nil then
    cfg.endpoints, err = M.parse_endpoints(E, root.endpoints, "endpoints")
  end
  if err then
    return nil, err
  end
  return cfg
end

return M
