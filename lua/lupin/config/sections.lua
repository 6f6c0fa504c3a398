--- lupin.config.sections: what a config may hold, declared section by
--- section (the EPP's EndpointPickerConfig, lupin's own sections and the
--- hosts'), for lupin.config.walk to check.  Flow control and objectives are
--- declared in lupin.config.flow.  What refers across sections (a pluginRef
--- naming a plugin, duplicate names) is checked by lupin.config after the
--- walk; what needs the plugins themselves, by lupin.generation.
local flow = require "lupin.config.flow"

local M = {}

local function plugin_ref(what)
  return { type = "string", required = true, nonempty = true, or_missing = true,
    missing = ('missing "pluginRef": name the %s, a plugin defined under "plugins"'):format(what),
    description = "the name of a plugin under \"plugins\"" }
end

local function name_field(description)
  return { type = "string", nonempty = true, message = "name must be a non-empty string",
    description = description }
end

M.PLUGIN = { type = "object", what = "each plugin", known = "a plugin",
  order = { "type", "name", "parameters", "maxCallMs", "maxLifecycleMs" },
  fields = {
    type = { type = "string", required = true, nonempty = true,
      missing = 'missing "type": name the plugin type, e.g. "type": "queue-scorer"',
      message = "type must be a non-empty string", description = "the plugin type" },
    name = name_field("the instance's name (default: its type)"),
    parameters = { type = "object", what = "parameters", nullable = true,
      description = "checked against the plugin's schema by lupin.generation" },
    maxCallMs = { type = "number", min = 0.01, max = 3600000,
      message = "{key} must be a number of milliseconds from 0.01 to 3600000, got {got}",
      description = "this plugin's budget per call (budgets.callMs)" },
    maxLifecycleMs = { type = "number", min = 0.01, max = 3600000,
      message = "{key} must be a number of milliseconds from 0.01 to 3600000, got {got}",
      description = "this plugin's budget per lifecycle call (budgets.lifecycleMs)" },
  } }

M.PLUGINS = { type = "array", what = "plugins", items = M.PLUGIN }

M.PROFILE_PLUGIN = { type = "object", what = "each profile plugin", known = "a profile plugin",
  order = { "pluginRef", "weight" },
  fields = {
    pluginRef = { type = "string", required = true, or_missing = true,
      missing = 'missing "pluginRef": name a plugin defined under "plugins"' },
    weight = { type = "number", min = 0, message = "weight must be a number ≥ 0, got {got}",
      description = "a scorer's weight" },
  } }

M.PROFILE = { type = "object", what = "each profile", known = "a profile",
  order = { "name", "plugins" },
  fields = {
    name = { type = "string", required = true, nonempty = true, or_missing = true,
      missing = 'missing "name": give the profile a name, e.g. "default"' },
    plugins = { type = "array", what = "a profile's plugins", items = M.PROFILE_PLUGIN },
  } }

M.PROFILES = { type = "array", what = "schedulingProfiles", items = M.PROFILE }

--- A plugin directory as given, made absolute from the config's folder.
function M.plugin_dir(config_dir, d)
  return d:sub(1, 1) == "/" and d or config_dir .. "/" .. d
end

M.PLUGIN_DIRS = { type = "array", what = "pluginDirs",
  items = { type = "string", message = "each plugin directory must be a string",
    check = function(d, _, ctx)
      local dir = M.plugin_dir(ctx.dir, d)
      local f, ferr = io.open(dir, "rb")
      local is_dir = f and select(3, f:read(0)) == 21 -- EISDIR
      if f then
        f:close()
      end
      if not is_dir then
        return ("plugin directory %q %s%s"):format(d, dir ~= d and ("(%s) "):format(dir) or "",
          f and "is not a directory" or tostring(ferr):find("No such file", 1, true)
            and "does not exist" or "cannot be read: " .. tostring(ferr))
      end
    end } }

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

do
  local fields = {}
  for k, b in pairs(M.BUDGETS) do
    fields[k] = { type = b.integer and "integer" or "number", default = b.default, min = b.min,
      max = b.max, message = ("{key} must be a%s from %s to %s, got {got}"):format(
        b.integer and "n integer" or " number", b.min, b.max) }
  end
  M.BUDGETS_SECTION = { type = "object", what = "budgets", known = "the budgets section",
    fields = fields }
end

local NOT_SUPPORTED_DATA = {
  discovery = "lupin reads endpoints from the config's \"endpoints\" or an --endpoints file;"
    .. " use those",
  crossReplica = "lupin runs one picker per gateway process and shares no state between"
    .. " replicas; remove it",
}

local function not_supported(why)
  return { type = "any", check = function() return "not supported: " .. why end }
end

--- data (GIE) or dataLayer (llm-d-router), under the name key: { sources =
--- [{pluginRef, extractors = [{pluginRef}]}], injectDefaults }.
function M.data(key)
  return { type = "object", what = key, known = "the " .. key .. " section",
    order = { "crossReplica", "discovery", "injectDefaults", "sources" },
    fields = {
      discovery = not_supported(NOT_SUPPORTED_DATA.discovery),
      crossReplica = not_supported(NOT_SUPPORTED_DATA.crossReplica),
      injectDefaults = { type = "boolean", default = true,
        message = "injectDefaults must be true or false",
        description = "add the default sources and extractors" },
      sources = { type = "array", what = "sources",
        items = { type = "object", what = "each source", known = "a source",
          order = { "pluginRef", "extractors" },
          fields = {
            pluginRef = plugin_ref("data source"),
            extractors = { type = "array", what = "extractors",
              items = { type = "object", what = "each extractor", known = "an extractor",
                fields = { pluginRef = plugin_ref("extractor") } } },
          } } },
    } }
end

-- saturationDetector: GIE v1's thresholds (made a saturation-detector
-- plugin by the generation, which checks them) or llm-d-router's { pluginRef }.
M.SATURATION = { type = "object", what = "saturationDetector",
  known = "the saturationDetector section",
  fields = {
    queueDepthThreshold = { type = "any" },
    kvCacheUtilThreshold = { type = "any" },
    metricsStalenessThreshold = { type = "any" },
    pluginRef = { type = "string", nonempty = true, or_missing = true,
      missing = plugin_ref("saturation detector").missing },
  },
  check = function(s)
    if s.pluginRef ~= nil and (next(s, nil) ~= "pluginRef" or next(s, "pluginRef") ~= nil) then
      return "give either pluginRef or the thresholds (queueDepthThreshold,"
        .. " kvCacheUtilThreshold, metricsStalenessThreshold), not both"
    end
  end }

M.FEATURE_GATES = { type = "array", what = "featureGates",
  items = { type = "string", nonempty = true,
    message = "each feature gate is a name such as \"flowControl\"" } }

-- A parser entry: {pluginRef: a plugin of a parser type, or a parser
-- type's name (an instance with its defaults, as upstream's loader makes)}.
local function parser_entry(what, known)
  return { type = "object", what = what, known = known,
    fields = {
      pluginRef = { type = "string", required = true, nonempty = true, or_missing = true,
        missing = 'missing "pluginRef": name a parser plugin defined under "plugins", or a'
          .. " parser type (openai-parser, anthropic-parser, vllmhttp-parser,"
          .. " passthrough-parser)" },
    } }
end

-- The EPP's "parser" section (deprecated upstream for requestHandler):
-- {pluginRef}, the only parser then.
M.PARSER = parser_entry("parser", "the parser section")

-- llm-d-router's requestHandler: {parsers: [{pluginRef}, ...]}, in the
-- order upstream registers them (lupin.runtime.parsers).
M.REQUEST_HANDLER = { type = "object", what = "requestHandler",
  known = "the requestHandler section",
  fields = {
    parsers = { type = "array", what = "parsers",
      items = parser_entry("each parser", "a parser entry") },
  } }

-- An endpoint's metrics as an endpoints file may give them: what `lupin
-- explain` schedules over (lupin serve scrapes them and ignores these):
-- numbers ≥ 0, adapters a list of names or a comma-separated string.
local function count(description)
  return { type = "number", min = 0, message = "{key} must be a number ≥ 0, got {got}",
    description = description }
end

local function adapters(description)
  return { type = "any", description = description,
    check = function(v, path)
      if type(v) == "table" then
        for i, a in ipairs(v) do
          if type(a) ~= "string" then
            return "adapter names are strings", ("%s[%d]"):format(path, i - 1)
          end
        end
      elseif type(v) ~= "string" then
        return (path:match("[^.]+$")) .. " must be a list of adapter names or a"
          .. " comma-separated string"
      end
    end }
end

M.METRICS = { type = "object", what = "metrics", known = "metrics",
  fields = {
    waiting_queue_size = count("requests waiting"),
    running_requests = count("requests running"),
    kv_cache_usage = count("the KV cache's use, 0 to 1"),
    max_lora = count("the LoRA adapters it can hold"),
    cache_block_size = count("tokens per KV-cache block"),
    num_blocks = count("KV-cache blocks"),
    running_lora_adapters = adapters("the adapters loaded and running"),
    waiting_lora_adapters = adapters("the adapters requests wait for"),
  } }

M.ENDPOINT = { type = "object", what = "each endpoint", known = "an endpoint",
  order = { "address", "port", "name", "labels", "metrics" },
  fields = {
    address = { type = "string", required = true, nonempty = true, or_missing = true,
      missing = 'missing "address": the endpoint\'s IP address, e.g. "127.0.0.1"' },
    port = { type = "integer", required = true, min = 1, max = 65535,
      message = "port must be an integer from 1 to 65535, got {got}" },
    name = name_field("the endpoint's name (default: address:port)"),
    labels = { type = "object", what = "labels",
      values = { type = "string", message = "label values must be strings" } },
    metrics = M.METRICS,
  } }

M.ENDPOINTS = { type = "array", what = "endpoints", items = M.ENDPOINT }
M.ENDPOINTS_FILE = { type = "array", what = "an endpoints file", items = M.ENDPOINT }

--- The sections of the runtime's own config, in the order they are checked.
M.ORDER = { "apiVersion", "kind", "pluginDirs", "plugins", "schedulingProfiles", "budgets",
  "data", "dataLayer", "saturationDetector", "flowControl", "featureGates", "parser",
  "requestHandler", "objectives", "endpoints" }

M.TOP = {
  apiVersion = { type = "any" },
  kind = { type = "any", enum = { "EndpointPickerConfig" },
    message = 'kind must be "EndpointPickerConfig", got {got}' },
  pluginDirs = M.PLUGIN_DIRS,
  plugins = M.PLUGINS,
  schedulingProfiles = M.PROFILES,
  budgets = M.BUDGETS_SECTION,
  data = M.data("data"),
  dataLayer = M.data("dataLayer"),
  saturationDetector = M.SATURATION,
  flowControl = flow.FLOW_CONTROL,
  featureGates = M.FEATURE_GATES,
  parser = M.PARSER,
  requestHandler = M.REQUEST_HANDLER,
  objectives = flow.OBJECTIVES,
  endpoints = M.ENDPOINTS,
}

--- The top-level sections hosts declared (lupin_runtime_declare_section;
--- lupin serve's "gateway"): name -> { order = { field names },
--- fields = { name -> { default, min, max } } }: integers, or strings
--- ({ default, text = true, pattern, what }) where the host said so.
M.host = {}

-- A host's section as a declaration for the walker.
local function host_declaration(name, decl)
  local fields = {}
  for k, f in pairs(decl.fields) do
    if f.text then
      fields[k] = { type = "string", default = f.default, pattern = f.pattern,
        messages = { type = "{key} must be a string, got {got}",
          pattern = "{key} must be " .. (f.what or ("like " .. f.pattern)) .. ", got {got}" } }
    else
      local at_least = ("{key} must be an integer ≥ %d, got {got}"):format(f.min)
      fields[k] = { type = "integer", default = f.default, min = f.min, max = f.max,
        messages = { type = at_least, min = at_least,
          max = f.max and ("{key} must be an integer ≤ %d, got {got}"):format(f.max) },
        convert = f.min == 0 and f.max == 1 and function(v) -- a switch: true or 1
          if type(v) == "boolean" then
            return v and 1 or 0
          end
          return v
        end or nil }
    end
  end
  return { type = "object", what = name, known = "the " .. name .. " section", fields = fields,
    order = decl.order }
end

--- Declares a host's section; nil and a message when the declaration is wrong.
function M.declare_section(name, list)
  if type(name) ~= "string" or not name:match("^%a%w*$") then
    return nil, ("a section name must be a word, got %q"):format(tostring(name))
  end
  if M.TOP[name] then
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
  M.host[name] = { fields = fields, order = order }
  return true
end

--- The whole config's declaration: the runtime's sections and the hosts'
--- (declared at the time of the call), each checked in turn.  after: name
--- -> the function run once that section is walked (lupin.config's
--- cross-references and the cfg it builds).
function M.config(after)
  local fields, order = {}, {}
  for _, k in ipairs(M.ORDER) do
    fields[k], order[#order + 1] = M.TOP[k], k
  end
  for name in pairs(M.host) do
    fields[name] = host_declaration(name, M.host[name])
  end
  for name, fn in pairs(after) do
    local d = {}
    for k, v in pairs(fields[name]) do
      d[k] = v
    end
    d.after = fn
    fields[name] = d
  end
  local hosts = {}
  for name in pairs(M.host) do
    hosts[#hosts + 1] = name
  end
  table.sort(hosts)
  for _, name in ipairs(hosts) do
    table.insert(order, 5, name) -- after the plugins and profiles, as before
  end
  return { type = "object", what = "the config", known = "the config", fields = fields,
    order = order }
end

return M
