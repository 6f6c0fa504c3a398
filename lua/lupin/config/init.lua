-- Reading and checking a config: JSON or YAML in the shape of the EPP's
-- EndpointPickerConfig.  This file is the orchestrator: it decodes the text,
-- walks it against the sections' declarations (lupin.config.sections,
-- lupin.config.flow; lupin.config.walk), checks what refers across sections
-- (pluginRefs, duplicate names) and builds the cfg.  What needs the plugins
-- themselves (roles, parameters) is checked by lupin.generation.
local cjson = require "cjson.safe"
local flow_config = require "lupin.config.flow"
local jsonpos = require "lupin.config.jsonpos"
local manifest = require "lupin.config.manifest"
local sections = require "lupin.config.sections"
local units = require "lupin.config.units"
local walk = require "lupin.config.walk"
local yaml = require "lupin.config.yaml"
local parsers = require "lupin.runtime.parsers"

local M = {}

--- The top-level sections hosts declared (lupin_runtime_declare_section;
--- lupin serve's "gateway"): name -> { order = { field names },
--- fields = { name -> { default, min, max } } }: integers, or strings
--- ({ default, text = true, pattern, what }) where the host said so.
M.sections = sections.host

--- Declares a host's section; nil and a message when the declaration is wrong.
M.declare_section = sections.declare_section

--- Plugin call budgets (docs/plugins.md): lupin.config.sections.BUDGETS.
M.BUDGETS = sections.BUDGETS

--- A config error: "file:line: json.path: message" (lupin.config.walk).
M.errors = walk.errors

--- Units (lupin.config.units): a Kubernetes quantity, a Go duration.
M.quantity = units.quantity
M.duration = units.duration

local join = function(path, key)
  return path == "" and key or path .. "." .. key
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


-- --- after the walk: what refers across sections, and the cfg ---

-- llm-d up to v0.4 ran its precise mode as prefix-cache-scorer with
-- mode: cache_tracking; it is precise-prefix-cache-scorer now, with the
-- same parameters.  Loaded as that type, under the name it had.
local function renamed_precise(p, path, cfg)
  local params = p.parameters
  if p.type ~= "prefix-cache-scorer" or type(params) ~= "table"
    or params.mode ~= "cache_tracking" then
    return p
  end
  local moved = {}
  for k, v in pairs(params) do
    moved[k] = k ~= "mode" and v or nil
  end
  require("lupin.log").warn("%s", cfg.errors:at(path .. ".parameters.mode", "mode \"cache_tracking\" is llm-d's"
    .. " earlier precise mode: loaded as precise-prefix-cache-scorer (rename the type to"
    .. " silence this)"))
  return { name = p.name or p.type, type = "precise-prefix-cache-scorer", parameters = moved,
    maxCallMs = p.maxCallMs, maxLifecycleMs = p.maxLifecycleMs }
end

local function build_plugins(list, cfg)
  local names = {}
  for i, p in ipairs(list) do
    local path = ("plugins[%d]"):format(i - 1)
    p = renamed_precise(p, path, cfg)
    local name = p.name or p.type
    if names[name] then
      return cfg.errors:at(p.name and path .. ".name" or path .. ".type",
        'duplicate plugin name %q (also %s); give each instance its own "name"', name,
        names[name])
    end
    names[name] = path
    cfg.plugins[#cfg.plugins + 1] = { name = name, type = p.type, params = p.parameters,
      path = path, max_call_ms = p.maxCallMs, max_lifecycle_ms = p.maxLifecycleMs }
  end
  cfg.plugin_paths = names
end

local function build_profiles(list, cfg)
  local E, names = cfg.errors, {}
  for i, p in ipairs(list) do
    local path = ("schedulingProfiles[%d]"):format(i - 1)
    if names[p.name] then
      return E:at(path .. ".name", "duplicate profile name %q (also %s); profile names must be"
        .. " unique", p.name, names[p.name])
    end
    names[p.name] = path
    local refs = {}
    for j, r in ipairs(p.plugins or {}) do
      local rpath = ("%s.plugins[%d]"):format(path, j - 1)
      if not cfg.plugin_paths[r.pluginRef] then
        local defined = {}
        for _, q in ipairs(cfg.plugins) do
          defined[#defined + 1] = q.name
        end
        return E:at(rpath .. ".pluginRef", "undefined pluginRef %q; defined plugins: %s",
          r.pluginRef, #defined > 0 and table.concat(defined, ", ") or "none")
      end
      refs[#refs + 1] = { ref = r.pluginRef, weight = r.weight, path = rpath }
    end
    cfg.profiles[#cfg.profiles + 1] = { name = p.name, refs = refs, path = path }
  end
end

-- A pluginRef that names no plugin.
local function undefined(cfg, ref, path)
  if not cfg.plugin_paths[ref] then
    return cfg.errors:at(path .. ".pluginRef", "undefined pluginRef %q: no plugin of that name"
      .. ' under "plugins"', ref)
  end
end

-- data (GIE) or dataLayer (llm-d-router) -> cfg.data.
local function build_data(c, cfg)
  local key = c.dataLayer ~= nil and "dataLayer" or "data"
  local d = c[key]
  if d == nil then
    return
  end
  local out = { key = key, sources = {}, inject_defaults = d.injectDefaults }
  for i, s in ipairs(d.sources or {}) do
    local p = ("%s.sources[%d]"):format(key, i - 1)
    local err = undefined(cfg, s.pluginRef, p)
    if err then
      return err
    end
    local src = { ref = s.pluginRef, path = p, extractors = {} }
    for j, x in ipairs(s.extractors or {}) do
      local xp = ("%s.extractors[%d]"):format(p, j - 1)
      err = undefined(cfg, x.pluginRef, xp)
      if err then
        return err
      end
      src.extractors[#src.extractors + 1] = { ref = x.pluginRef, path = xp }
    end
    out.sources[#out.sources + 1] = src
  end
  cfg.data = out
end

-- saturationDetector: GIE v1's thresholds (made a saturation-detector
-- plugin by the generation) or llm-d-router's { pluginRef }.
local function build_saturation(s, cfg)
  if s == nil then
    return
  elseif s.pluginRef ~= nil then
    local err = undefined(cfg, s.pluginRef, "saturationDetector")
    if err then
      return err
    end
    cfg.saturation = { ref = s.pluginRef, path = "saturationDetector" }
  else
    cfg.saturation = { params = s, path = "saturationDetector" }
  end
end

--- The feature gates upstream knows, and what lupin does with each
--- (docs/epp-compatibility.md, "featureGates").
M.FEATURE_GATES = {
  dataLayer = "lupin's data layer is always on: accepted, no effect",
  prepareDataPlugins = "lupin always runs prepare plugins: accepted, no effect",
  flowControl = "turns flow control on (docs/flow-control.md), as a flowControl section does",
  haPopulateNonLeaderDatastore = "lupin has no leader election: every replica keeps its"
    .. " endpoints; accepted, no effect",
}

--- Gates upstream removed: loaded with a warning saying so.
M.REMOVED_GATES = {
  enableLegacyMetrics = "llm-d-router removed it (2026-05): every metric comes from the data"
    .. " layer; remove it",
}

local function build_feature_gates(list, cfg)
  cfg.feature_gates = {}
  for i, name in ipairs(list or {}) do
    cfg.feature_gates[name] = true
    if not M.FEATURE_GATES[name] then
      local log = require "lupin.log"
      local at, removed = ("featureGates[%d]"):format(i - 1), M.REMOVED_GATES[name]
      if removed then
        log.warn("%s", cfg.errors:at(at, "feature gate %q has no effect: %s", name, removed))
      else
        log.warn("%s", cfg.errors:at(at, "feature gate %q is unknown to lupin and has no effect;"
          .. " known: %s", name, walk.sorted_keys(M.FEATURE_GATES)))
      end
    end
  end
end

-- --- requestHandler.parsers (and the older top-level parser) ---

-- The parser an entry at path names: a plugin of a parser type, else an
-- instance of the parser type it names (upstream's loader makes one).
local function parser_spec(cfg, ref, path)
  local plugin
  for _, q in ipairs(cfg.plugins) do
    if q.name == ref then
      plugin = q
    end
  end
  local types = table.concat(parsers.types(), ", ")
  if not plugin then
    if parsers.CLAIMS[ref] then
      return { name = ref, type = ref, path = path }
    end
    return nil, cfg.errors:at(path .. ".pluginRef", 'undefined pluginRef %q: define a parser'
      .. ' plugin of that name under "plugins", or name a parser type (%s)', ref, types)
  end
  if not parsers.CLAIMS[plugin.type] then
    return nil, cfg.errors:at(path .. ".pluginRef", "plugin %q is a %s, not a parser; the parser"
      .. " types are %s", ref, plugin.type, types)
  end
  return { name = plugin.name, type = plugin.type, params = plugin.params, path = path }
end

-- cfg.parsers: the registry (lupin.runtime.parsers) of requestHandler.parsers;
-- else of the top-level parser, as upstream maps it; else of the defaults.
local function build_parsers(rh, cfg)
  local log = require "lupin.log"
  local E, list = cfg.errors, {}
  local entries = rh and rh.parsers or {}
  local function add(ref, path)
    local spec, err = parser_spec(cfg, ref, path)
    if not spec then
      return err
    end
    list[#list + 1] = spec
  end
  if #entries > 0 and cfg.legacy_parser then
    log.warn("%s", E:at("parser", 'both "parser" and "requestHandler.parsers": the parsers'
      .. ' list is used and "parser" ignored, as upstream; remove "parser"'))
  end
  local err
  for i, e in ipairs(entries) do
    err = err or add(e.pluginRef, ("requestHandler.parsers[%d]"):format(i - 1))
  end
  if #entries == 0 and cfg.legacy_parser then
    err = add(cfg.legacy_parser.pluginRef, "parser")
  elseif #entries == 0 then
    for _, t in ipairs(parsers.DEFAULT) do
      err = err or add(t, "requestHandler")
    end
  end
  if err then
    return err
  end
  cfg.parsers = parsers.registry(list, function(path, message)
    log.warn("%s", E:at(path, "%s", message))
  end)
end

-- A walked list of endpoints at path: duplicates refused, adapters kept as
-- a comma-separated string (lupin_metrics' form).
local function build_endpoints(E, list, path)
  local names = {}
  for i, ep in ipairs(list) do
    local p = ("%s[%d]"):format(path, i - 1)
    ep.name = ep.name or ("%s:%d"):format(ep.address, ep.port)
    if names[ep.name] then
      return nil, E:at(p, "duplicate endpoint %q (also %s)", ep.name, names[ep.name])
    end
    names[ep.name] = p
    ep.labels = ep.labels or {}
    for _, k in ipairs({ "running_lora_adapters", "waiting_lora_adapters" }) do
      local v = ep.metrics and ep.metrics[k]
      if type(v) == "table" then
        ep.metrics[k] = table.concat(v, ",")
      end
    end
  end
  return list
end

--- Checks a list of endpoints at path ("endpoints" in a config, "" for an
--- endpoints file).  Returns the list, or nil and an error.
function M.parse_endpoints(E, list, path)
  local out, err = walk.walk(E, path == "" and sections.ENDPOINTS_FILE or sections.ENDPOINTS,
    list, path, path ~= "" and path or nil)
  if err then
    return nil, err
  end
  return build_endpoints(E, out, path)
end

--- YAML when the name says so or the text does not begin as JSON does.
function M.is_yaml(text, source)
  return source:match("%.ya?ml$") ~= nil or not text:match("^%s*[{%[]")
end

--- Decodes a config or endpoints text, JSON or YAML.  Returns the value and
--- its index of lines and kinds, or nil and "source:line: invalid ...".
--- whole: a config's YAML may be a Kubernetes manifest or llm-d-router's
--- chart values (lupin.config.manifest); the third value is then what
--- else the file held ({ pools }).
function M.decode(text, source, whole)
  local root, index, found
  if M.is_yaml(text, source) then
    if whole then
      root, index, found = manifest.select(text, source)
    else
      root, index = yaml.decode(text, source)
    end
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
  return root, index, found or { pools = {} }
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

-- One line's ${...} expanded (the part before a YAML comment only), or nil
-- and the message.
local function expand_line(line, n, source, getenv, yaml_text)
  local code, comment = line, ""
  if yaml_text then
    local c = line:find("^%s*#") or line:find("%s#")
    if c then
      code, comment = line:sub(1, c - 1), line:sub(c)
    end
  end
  local err
  code = code:gsub("(%$+){([^}]*)}", function(dollars, body)
    if err then
      return nil
    end
    if #dollars % 2 == 0 then -- $${...}: escaped, one $ less
      return dollars:sub(2) .. "{" .. body .. "}"
    end
    local name, default = body:match("^([%a_][%w_]*):%-(.*)$")
    name = name or body:match("^([%a_][%w_]*)$")
    if not name then
      err = ("%s:%d: ${%s}: not a variable: write ${NAME} or ${NAME:-default}"):format(source, n,
        body)
      return nil
    end
    local v = getenv(name)
    if v == nil or (default and v == "") then
      v = default
    end
    if v == nil then
      err = ("%s:%d: ${%s}: the environment variable %s is not set: set it, or give a default"
        .. " (${%s:-value})"):format(source, n, body, name, name)
      return nil
    end
    return dollars:sub(2) .. v
  end)
  if err then
    return nil, err
  end
  return code .. comment
end

--- Expands ${NAME} and ${NAME:-default} from the environment, as the
--- upstream deploy scripts' envsubst does before the EPP reads its config
--- (not in YAML comments); $${ is a literal ${.  An unset variable without
--- a default is an error at its line.  Returns the text, or nil and the
--- message.
---@param getenv fun(name: string): string?
function M.expand(text, source, getenv)
  if not text:find("${", 1, true) then
    return text
  end
  local yaml_text, out, n = M.is_yaml(text, source), {}, 0
  for line, nl in text:gmatch("([^\n]*)(\n?)") do
    n = n + 1
    if line == "" and nl == "" then
      break
    end
    local x, err = expand_line(line, n, source, getenv, yaml_text)
    if not x then
      return nil, err
    end
    out[#out + 1] = x .. nl
  end
  return table.concat(out)
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
  local expanded, xerr = M.expand(text, source, os.getenv)
  if not expanded then
    return nil, xerr
  end
  text = expanded
  local root, index, found = M.decode(text, source, true)
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
    text = table.concat(canonical(root, "", index.kinds, {})), pools = found.pools }
  if #found.pools > 0 then -- a pool edited is a config changed: in the digest
    cfg.text = cfg.text .. manifest.pools_text(found.pools)
  end
  -- each section walked, then what it refers to checked and its part of
  -- the cfg built, section after section
  local after = {
    pluginDirs = function(dirs)
      for i, d in ipairs(dirs or {}) do
        cfg.plugin_dirs[i] = sections.plugin_dir(cfg.dir, d)
      end
    end,
    plugins = function(list) return build_plugins(list or {}, cfg) end,
    schedulingProfiles = function(list) return build_profiles(list or {}, cfg) end,
    budgets = function(b)
      b = b or {}
      cfg.budgets = { call_ms = b.callMs or M.BUDGETS.callMs.default,
        lifecycle_ms = b.lifecycleMs or M.BUDGETS.lifecycleMs.default,
        disable_after = b.disableAfterCuts or M.BUDGETS.disableAfterCuts.default }
    end,
    data = function()
      if root.data ~= nil and root.dataLayer ~= nil then
        return E:at("dataLayer", 'both "data" and "dataLayer": they are the same section'
          .. " (GIE's and llm-d-router's name); keep one")
      end
    end,
    dataLayer = function(_, _, c) return build_data(c, cfg) end,
    saturationDetector = function(s) return build_saturation(s, cfg) end,
    flowControl = function(f) return flow_config.check(E, f, root, cfg) end,
    featureGates = function(list) return build_feature_gates(list, cfg) end,
    parser = function(p) cfg.legacy_parser = p end,
    requestHandler = function(rh) return build_parsers(rh, cfg) end,
    objectives = function(list) return flow_config.build(E, list, cfg) end,
    endpoints = function(list)
      local err
      if list ~= nil then
        cfg.endpoints, err = build_endpoints(E, list, "endpoints")
      end
      return err
    end,
  }
  cfg.sections = {}
  for name, decl in pairs(M.sections) do
    after[name] = function(values)
      if values == nil then
        values = {}
        for k, f in pairs(decl.fields) do
          values[k] = f.default
        end
      end
      cfg.sections[name] = values
    end
  end
  local _, err = walk.walk(E, sections.config(after), root, "", nil, cfg)
  if err then
    return nil, err
  end
  return cfg
end

return M
