--- lupin.config.router: llm-d-router's chart values (`router:` at the top,
--- config/charts/routerlib/values.yaml upstream) read as a config.  The
--- EndpointPickerConfig is router.epp.pluginsCustomConfig's entry named by
--- router.epp.pluginsConfigFile; router.modelServers' matchLabels and
--- targetPorts make the InferencePool; router.inferenceObjectives become the
--- config's objectives.  Every other field is either about how the chart
--- deploys the picker (accepted, logged as not read) or something lupin
--- does not do (refused at its line, saying why).
local capi = require "lupin.runtime.capi"
local cjson = require "cjson.safe"
local log = require "lupin.log"
local walk = require "lupin.config.walk"

local M = {}

local MAP = "map"         -- read: the config, the pool, the objectives
local DEPLOY = "deploy"   -- the chart's Kubernetes objects: not the picker's behaviour
local BUILTIN = "builtin" -- shapes only the chart's built-in default-plugins.yaml

-- A field refused, saying why, when test(v); else taken `as` (DEPLOY when
-- the value only describes the deployment, MAP when it is what lupin does).
local function refuse_if(test, why, as)
  return { refuse = test, why = why, as = as or DEPLOY }
end

--- Each field of the values and what lupin does with it: MAP, DEPLOY,
--- BUILTIN, a table of the fields below, or refuse_if's rule.
M.FIELDS = {
  provider = DEPLOY, -- the gateway chart's
  httpRoute = DEPLOY,
  router = {
    epp = {
      pluginsConfigFile = MAP,
      pluginsCustomConfig = MAP,
      parsers = BUILTIN,
      metricsDataSource = BUILTIN,
      replicas = refuse_if(function(v) return type(v) == "number" and v > 1 end,
        "lupin epp runs one replica (docs/kubernetes.md, \"Not supported yet\"): set 1"),
      flags = DEPLOY, image = DEPLOY, extProcPort = DEPLOY, grpcHealthPort = DEPLOY,
      env = DEPLOY, resources = DEPLOY, affinity = DEPLOY, tolerations = DEPLOY,
      podAnnotations = DEPLOY, extraContainerPorts = DEPLOY, volumes = DEPLOY,
      volumeMounts = DEPLOY,
    },
    modelServers = {
      matchLabels = MAP,
      targetPorts = MAP,
      type = BUILTIN,
      protocol = refuse_if(function(v) return v ~= "http" end,
        "lupin reaches model servers over HTTP only; set protocol: http", MAP),
    },
    inferencePool = {
      create = MAP,
      failureMode = DEPLOY, -- the gateway's, on the pool's endpointPickerRef
    },
    inferenceObjectives = MAP,
    tracing = refuse_if(function(v) return type(v) == "table" and v.enabled == true end,
      "lupin exports no OpenTelemetry traces; set tracing.enabled: false"),
    latencyPredictor = refuse_if(function(v) return type(v) == "table" and v.enabled == true end,
      "lupin neither runs nor calls the chart's latency-predictor servers: its"
        .. " predicted-latency-producer predicts in process; set latencyPredictor.enabled: false"),
    tokenizer = DEPLOY, -- a sidecar; the config's plugins name its URL
    proxy = DEPLOY,
    monitoring = DEPLOY,
    extraServicePorts = DEPLOY,
    clusterDomain = DEPLOY,
  },
}

-- Logged through the runtime's sink when there is one (lupin.config also
-- runs bare: tools, specs).
local function note(level, msg)
  if capi.api then
    log[level]("%s", msg)
  end
end

local function join(path, key)
  return path == "" and key or path .. "." .. key
end

-- Walks the values against M.FIELDS: the first refusal (an error), and the
-- paths read by no one (deploy) or that shape only the built-in config.
local function classify(E, v, fields, path, seen)
  local keys = {}
  for k in pairs(v) do
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local f, p = fields[k], join(path, k)
    if f == nil then
      return E:at(p, "unknown field %q in llm-d-router's chart values; known: %s", k,
        walk.sorted_keys(fields))
    elseif type(f) == "table" and f.refuse then
      if f.refuse(v[k]) then
        return E:at(p, "not supported: %s", f.why)
      elseif f.as == DEPLOY then
        seen.deploy[#seen.deploy + 1] = p
      end
    elseif type(f) == "table" then
      if type(v[k]) ~= "table" or (next(v[k]) ~= nil and v[k][1] ~= nil) then
        if v[k] ~= cjson.null then
          return E:at(p, "%s must be a mapping, got %s", k, walk.show(v[k]))
        end
      else
        local err = classify(E, v[k], f, p, seen)
        if err then
          return err
        end
      end
    elseif f == DEPLOY or f == BUILTIN then
      local list = f == DEPLOY and seen.deploy or seen.builtin
      list[#list + 1] = p
    end
  end
end

-- The pool the chart would make: router.modelServers' labels and ports.
local function pool(E, r, line, source)
  local ms, ip = type(r.modelServers) == "table" and r.modelServers or {},
    type(r.inferencePool) == "table" and r.inferencePool or {}
  if ip.create == false or ms.matchLabels == nil then
    return nil
  end
  local selector, ports = {}, {}
  if type(ms.matchLabels) ~= "table" then
    return nil, E:at("router.modelServers.matchLabels", "matchLabels must be a mapping of"
      .. " label: value")
  end
  for k, l in pairs(ms.matchLabels) do
    if type(l) ~= "string" then
      return nil, E:at("router.modelServers.matchLabels." .. k, "a label's value must be a"
        .. " string, got %s", walk.show(l))
    end
    selector[k] = l
  end
  if next(selector) == nil then
    return nil, E:at("router.modelServers.matchLabels", "the pool selects no pods: give"
      .. " matchLabels { label: value }")
  end
  local tp = ms.targetPorts == nil and { { number = 8000 } } or ms.targetPorts
  for i, p in ipairs(type(tp) == "table" and tp or {}) do
    local n = type(p) == "table" and p.number
    if type(n) ~= "number" or n % 1 ~= 0 or n < 1 or n > 65535 then
      return nil, E:at(("router.modelServers.targetPorts[%d].number"):format(i - 1),
        "a target port must be an integer from 1 to 65535, got %s", walk.show(n))
    end
    ports[i] = n
  end
  if #ports == 0 or #ports > 8 then
    return nil, E:at("router.modelServers.targetPorts", "give 1 to 8 target ports ({number})")
  end
  return require("lupin.config.manifest").pool_view({ group = "inference.networking.k8s.io",
    version = "v1", selector = selector, ports = ports, line = line, source = source })
end

-- router.inferenceObjectives as the config's objectives, with their lines.
local function objectives(E, r, cfg, index, rindex)
  local list = r.inferenceObjectives
  if list == nil or (type(list) == "table" and #list == 0) then
    return
  elseif cfg.objectives ~= nil then
    return E:at("router.inferenceObjectives", "both router.inferenceObjectives and the config's"
      .. " \"objectives\" (line %d): keep one", index.lines.objectives)
  end
  cfg.objectives = list
  local from = "router.inferenceObjectives"
  for _, t in ipairs({ "lines", "kinds" }) do
    for p, x in pairs(rindex[t]) do
      if p:sub(1, #from) == from then
        index[t]["objectives" .. p:sub(#from + 1)] = x
      end
    end
  end
end

--- The config held by chart values (a decoded document { value, index,
--- line }): the config's value and index, and { pools }; nil and the error.
function M.select(doc, source)
  local E, v = walk.errors(source, doc.index), doc.value
  if type(v.router) ~= "table" then
    return nil, E:at("router", "router must be a mapping (llm-d-router's chart values)")
  end
  local seen = { deploy = {}, builtin = {} }
  local err = classify(E, v, M.FIELDS, "", seen)
  if err then
    return nil, err
  end
  local r, manifest = v.router, require "lupin.config.manifest"
  local epp = type(r.epp) == "table" and r.epp or {}
  local file = epp.pluginsConfigFile == nil and "default-plugins.yaml" or epp.pluginsConfigFile
  local custom = type(epp.pluginsCustomConfig) == "table" and epp.pluginsCustomConfig or {}
  local at = "router.epp.pluginsCustomConfig." .. tostring(file)
  if type(file) ~= "string" or type(custom[file]) ~= "string" then
    return nil, E:at(epp.pluginsConfigFile ~= nil and "router.epp.pluginsConfigFile" or "router",
      "no config %s under router.epp.pluginsCustomConfig: lupin does not render the chart's"
      .. " built-in configs; paste the EndpointPickerConfig there", walk.show(file))
  end
  local cfg, index = manifest.inner(custom[file], source, doc.index, at)
  if cfg == nil then
    return nil, index
  end
  local p
  p, err = pool(E, r, doc.line, source)
  err = err or objectives(E, r, cfg, index, doc.index)
  if err then
    return nil, err
  end
  if #seen.builtin > 0 then
    note("warn", E:at(seen.builtin[1], "no effect: %s shape only the chart's built-in"
      .. " default-plugins.yaml, and the config is %s", table.concat(seen.builtin, ", "), at))
  end
  if #seen.deploy > 0 then
    note("info", E:at(seen.deploy[1], "not read: %s describe how the chart deploys the"
      .. " picker (lupin's manifests are in deploy/)", table.concat(seen.deploy, ", ")))
  end
  return cfg, index, { pools = { p } }
end

return M
