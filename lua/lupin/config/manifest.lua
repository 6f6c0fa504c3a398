--- lupin.config.manifest: the EndpointPickerConfig out of a YAML file as
--- Kubernetes keeps it (several documents: the InferencePool, the Service,
--- the Deployment, a ConfigMap whose data holds the config) or as
--- llm-d-router's chart values hold it (`router:`, lupin.config.router).
--- Other kinds are ignored.  The config keeps the lines of the file: a
--- ConfigMap's data text is decoded with the line its block starts at
--- added, so errors name the manifest's own lines.
local cjson = require "cjson.safe"
local jsonpos = require "lupin.config.jsonpos"
local walk = require "lupin.config.walk"
local yaml = require "lupin.config.yaml"

local M = {}

local EPC = "EndpointPickerConfig"

--- InferencePool API groups: the form of each one's spec.
M.POOL_GROUPS = {
  ["inference.networking.k8s.io/v1"] = "v1",
  ["inference.networking.x-k8s.io/v1alpha2"] = "v1alpha2",
}

local function kind_of(doc)
  return type(doc.value) == "table" and type(doc.value.kind) == "string" and doc.value.kind or nil
end

local function name_of(v)
  local meta = type(v) == "table" and v.metadata
  return type(meta) == "table" and type(meta.name) == "string" and meta.name or nil
end

--- Decodes the text of a value at path of an index (a ConfigMap's data
--- entry, chart values' pluginsCustomConfig) with the file's lines: a block
--- scalar's (| or >) text starts on the line after its indicator.
function M.inner(text, source, index, path)
  local at = index.starts[path] or index.lines[path] or 1
  return yaml.decode(text, source, index.blocks[path] and at or at - 1)
end

-- The candidates a ConfigMap's data holds: { value, index, line, where, key }.
-- An entry that is not YAML, or is YAML of another kind, is not a config
-- (a ConfigMap may hold anything), unless it names EndpointPickerConfig.
local function from_configmap(doc, source, out)
  local data, name = doc.value.data, name_of(doc.value) or "(unnamed)"
  if type(data) ~= "table" then
    return
  end
  local keys = {}
  for k in pairs(data) do
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for _, key in ipairs(keys) do
    local text, path = data[key], "data." .. key
    if type(text) == "string" and text:find(EPC, 1, true) then
      local v, index = M.inner(text, source, doc.index, path)
      if v == nil then
        return index
      end
      if type(v) == "table" and v.kind == EPC then
        out[#out + 1] = { value = v, index = index, line = doc.index.lines[path], key = key,
          where = ("ConfigMap %s, data key %q"):format(name, key) }
      end
    end
  end
end

-- The base names --config-file names in the Deployments' containers.
local function config_files(deployments)
  local names = {}
  for _, d in ipairs(deployments) do
    local spec = type(d.spec) == "table" and d.spec.template
    spec = type(spec) == "table" and type(spec.spec) == "table" and spec.spec or {}
    for _, c in ipairs(type(spec.containers) == "table" and spec.containers or {}) do
      local args = type(c) == "table" and type(c.args) == "table" and c.args or {}
      for i, a in ipairs(args) do
        local file = a == "--config-file" and args[i + 1] or
          type(a) == "string" and a:match("^%-%-config%-file=(.+)$")
        if type(file) == "string" then
          names[file:match("[^/]*$")] = true
        end
      end
    end
  end
  return names
end

--- A pool as the host reads it (lupin_runtime_config_pool): its selector
--- as "k=v,k2=v2" (keys sorted, a label selector's form) and where it is.
function M.pool_view(p)
  local keys = {}
  for k in pairs(p.selector) do
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for i, k in ipairs(keys) do
    keys[i] = k .. "=" .. p.selector[k]
  end
  p.selector_text = table.concat(keys, ",")
  p.where = ("%s:%d"):format(p.source, p.line)
  return p
end

--- The pools as the digest sees them: an edited pool is a changed config.
function M.pools_text(pools)
  local out = {}
  for i, p in ipairs(pools) do
    out[i] = ("pool %s/%s %s/%s %s %s"):format(p.namespace or "", p.name or "", p.group,
      p.version, p.selector_text, table.concat(p.ports, ","))
  end
  return table.concat(out, ";")
end

-- An InferencePool's selector and target ports, or the error at its path.
local function pool(doc, source)
  local v, E = doc.value, walk.errors(source, doc.index)
  local form = M.POOL_GROUPS[v.apiVersion]
  if not form then
    return nil, E:at("apiVersion", "an InferencePool's apiVersion must be %s, got %s",
      walk.sorted_keys(M.POOL_GROUPS), type(v.apiVersion) == "string"
      and ('"%s"'):format(v.apiVersion) or walk.show(v.apiVersion))
  end
  local spec = type(v.spec) == "table" and v.spec or {}
  local version = form
  if form == "v1" and type(spec.selector) == "table" and spec.selector.matchLabels == nil
    and spec.targetPorts == nil and spec.targetPortNumber ~= nil then
    -- GIE's own leader-election test manifests (v1.3-v1.5) write the v1alpha2
    -- fields under v1: read them as such, and say so
    require("lupin.log").warn("%s", E:at("spec", "an InferencePool of %s with v1alpha2's fields"
      .. " (selector as a map, targetPortNumber): read as v1alpha2's; v1 writes"
      .. " selector.matchLabels and targetPorts[].number", v.apiVersion))
    form = "v1alpha2"
  end
  local labels_path = form == "v1" and "spec.selector.matchLabels" or "spec.selector"
  local labels = spec.selector
  if form == "v1" then
    labels = type(labels) == "table" and labels.matchLabels
  end
  local selector = {}
  for k, l in pairs(type(labels) == "table" and labels or {}) do
    if type(l) ~= "string" then
      return nil, E:at(labels_path .. "." .. k, "a label's value must be a string, got %s",
        walk.show(l))
    end
    selector[k] = l
  end
  if next(selector) == nil then
    return nil, E:at(labels_path, "the pool selects no pods: give %s { label: value }",
      labels_path)
  end
  local ports, ppath = {}, form == "v1" and "spec.targetPorts" or "spec.targetPortNumber"
  if form == "v1" then
    for i, p in ipairs(type(spec.targetPorts) == "table" and spec.targetPorts or {}) do
      ports[i] = type(p) == "table" and p.number
    end
  else
    ports[1] = spec.targetPortNumber
  end
  for i, p in ipairs(ports) do
    if type(p) ~= "number" or p % 1 ~= 0 or p < 1 or p > 65535 then
      local at = form == "v1" and ("spec.targetPorts[%d].number"):format(i - 1) or ppath
      return nil, E:at(at, "a target port must be an integer from 1 to 65535, got %s",
        walk.show(p))
    end
  end
  if #ports == 0 or #ports > 8 then
    return nil, E:at(ppath, #ports == 0 and ("the pool has no target port: give " .. ppath)
      or ("a pool has at most 8 target ports, got %d"):format(#ports))
  end
  local meta = type(v.metadata) == "table" and v.metadata or {}
  return M.pool_view({ name = name_of(v), namespace = type(meta.namespace) == "string"
    and meta.namespace or nil, group = v.apiVersion:match("^[^/]+"), version = version,
    selector = selector, ports = ports, line = doc.line, source = source })
end

-- What the file's documents hold: candidates, pools, deployments, others.
local function sort_documents(docs, source)
  local found = { configs = {}, pools = {}, deployments = {}, others = {} }
  for _, doc in ipairs(docs) do
    local kind = kind_of(doc)
    if kind == EPC or (kind == nil and type(doc.value) == "table" and next(doc.value) ~= nil
      and doc.index.kinds[""] == "object") then
      doc.where = "the document at line " .. doc.line
      found.configs[#found.configs + 1] = doc
    elseif kind == "ConfigMap" then
      local err = from_configmap(doc, source, found.configs)
      if err then
        return nil, err
      end
    elseif kind == "InferencePool" then
      local p, err = pool(doc, source)
      if not p then
        return nil, err
      end
      found.pools[#found.pools + 1] = p
    elseif kind == "Deployment" then
      found.deployments[#found.deployments + 1] = doc.value
    elseif kind then
      found.others[#found.others + 1] = ("%s %s (line %d)"):format(kind,
        name_of(doc.value) or "(unnamed)", doc.line)
    end
  end
  return found
end

-- The one config of the file, or the error saying why there is none.
local function the_config(found, source)
  local list = found.configs
  if #list > 1 then -- the Deployment's --config-file says which
    local files, named = config_files(found.deployments), {}
    for _, c in ipairs(list) do
      if c.key and files[c.key] then
        named[#named + 1] = c
      end
    end
    list = #named > 0 and named or list
  end
  if #list == 0 then
    return nil, ("%s:1: no %s in this file: give one as a document (kind: %s) or as a"
      .. " ConfigMap's data entry; found %s"):format(source, EPC, EPC,
      #found.others > 0 and table.concat(found.others, ", ") or "nothing else")
  elseif #list > 1 then
    return nil, ("%s:%d: a second %s (%s); the first is at line %d (%s): keep one, or name it"
      .. " with --config-file in the Deployment's args"):format(source, list[2].line, EPC,
      list[2].where, list[1].line, list[1].where)
  end
  return list[1]
end

--- The config of a YAML text: its value and index (lines of the file), and
--- { pools = { {name, namespace, group, version, selector, ports, line} } }
--- from the InferencePools beside it.  nil and the error when the text
--- holds no config, or two.
-- A chart's files are not configs until Helm renders them: say so, and
-- what to give instead, rather than a YAML or field error.
local RENDER = "render the chart (helm template ...) and give lupin the output: a manifest"
  .. " whose ConfigMap holds the EndpointPickerConfig"

local function helm_template(text, source)
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line:find("{{", 1, true) and not line:match("^%s*#") then
      return ("%s:%d: a Helm template ({{ ... }}), not a config: %s"):format(source, n, RENDER)
    end
  end
end

local function gie_chart_values(doc, source)
  local v = doc.value
  if type(v) ~= "table" or v.kind ~= nil then
    return nil
  end
  for _, key in ipairs({ "inferenceExtension", "inferencePool" }) do
    if v[key] ~= nil then
      return ("%s:%d: %s: GIE's inferencepool chart values, not a config: %s"):format(source,
        jsonpos.line(doc.index, key), key, RENDER)
    end
  end
end

function M.select(text, source)
  local docs, err = yaml.decode_all(text, source)
  if not docs then
    return nil, helm_template(text, source) or err
  end
  local live = {}
  for _, d in ipairs(docs) do
    if d.value ~= cjson.null or #docs == 1 then
      live[#live + 1] = d
    end
  end
  if #live == 0 then
    return nil, ("%s:1: invalid YAML: the file holds no document"):format(source)
  end
  local first = live[1]
  local values = #live == 1 and gie_chart_values(first, source)
  if values then
    return nil, values
  end
  if #live == 1 and type(first.value) == "table" and first.value.router ~= nil
    and first.value.kind == nil then
    return require("lupin.config.router").select(first, source)
  elseif #live == 1 and kind_of(first) ~= "ConfigMap" and kind_of(first) ~= "InferencePool" then
    return first.value, first.index, { pools = {} } -- a config alone: checked as it is
  end
  local found, ferr = sort_documents(live, source)
  if not found then
    return nil, ferr
  end
  local c, cerr = the_config(found, source)
  if not c then
    return nil, cerr
  end
  return c.value, c.index, { pools = found.pools }
end

return M
