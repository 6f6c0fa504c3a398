-- deploy/'s manifests against each other, against docs/kubernetes.md and
-- against the lupin they run: what drifts when one side changes alone.
-- No cluster here: this reads the files; `lupin check` and `lupin epp
-- --help` are the only programs run.
local S = require "support"
local yaml = require "lupin.config.yaml"

local DEPLOY = S.ROOT .. "/deploy"
local LUPIN = S.ROOT .. "/" .. S.BUILD .. "/lupin"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

--- A command's output (stdout and stderr) and its exit status.
local function run(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a")
  p:close()
  local body, rc = out:match("^(.*)rc=(%d+)%s*$")
  return body, tonumber(rc)
end

local function yaml_files()
  local list = {}
  local p = io.popen("cd " .. DEPLOY .. " && ls *.yaml")
  for name in p:lines() do
    list[#list + 1] = name
  end
  p:close()
  return list
end

--- The documents of a file, split at its `---` lines, each decoded.
local function documents(name)
  local docs, chunk = {}, {}
  local function flush()
    local text = table.concat(chunk, "\n")
    if text:find("\n?%s*[%w_]+:") then -- a chunk of comments only is no document
      docs[#docs + 1] = assert(yaml.decode(text, "deploy/" .. name))
    end
    chunk = {}
  end
  for line in (read(DEPLOY .. "/" .. name) .. "\n"):gmatch("([^\n]*)\n") do
    if line:match("^%-%-%-%s*$") then
      flush()
    else
      chunk[#chunk + 1] = line
    end
  end
  flush()
  return docs
end

--- Every object of deploy/, by kind (the kustomization apart).
local function objects()
  local by_kind = {}
  for _, name in ipairs(yaml_files()) do
    if name ~= "kustomization.yaml" then
      for _, doc in ipairs(documents(name)) do
        by_kind[doc.kind] = by_kind[doc.kind] or {}
        table.insert(by_kind[doc.kind], doc)
      end
    end
  end
  return by_kind
end

local function one(by_kind, kind)
  assert.equal(1, by_kind[kind] and #by_kind[kind], "one " .. kind .. " in deploy/")
  return by_kind[kind][1]
end

--- docs/kubernetes.md's flags table: {epp = {...}, lupin = {flag = note}}.
local function flags_table()
  local text = read(S.ROOT .. "/docs/kubernetes.md")
  local section = assert(text:match("\n## Flags\n(.-)\n## "), "docs/kubernetes.md has a Flags section")
  local lupin = {}
  for line in section:gmatch("[^\n]+") do
    local _, mine, note = line:match("^|%s*(.-)%s*|%s*(.-)%s*|%s*(.-)%s*|$")
    if mine then
      for flag in mine:gmatch("`(%-%-[%w-]+)`") do
        lupin[flag] = note
      end
    end
  end
  return lupin
end

--- The flags in a container's args ("--flag value" and "--flag=value").
local function arg_flags(args)
  local flags, values = {}, {}
  for i, a in ipairs(args) do
    local flag, value = a:match("^(%-%-[%w-]+)=(.*)$")
    if flag then
      flags[#flags + 1], values[flag] = flag, value
    elseif a:match("^%-%-") then
      flags[#flags + 1] = a
      local nxt = args[i + 1]
      values[a] = nxt and not nxt:match("^%-%-") and nxt or true
    end
  end
  return flags, values
end

local function by_name(list, field)
  local out = {}
  for _, item in ipairs(list or {}) do
    out[item[field or "name"]] = item
  end
  return out
end

describe("deploy/", function()
  local all = objects()
  local deployment = one(all, "Deployment")
  local pod = deployment.spec.template.spec
  local container = pod.containers[1]
  local flags, values = arg_flags(container.args)

  it("holds YAML that parses, every object with a kind and a name", function()
    for _, name in ipairs(yaml_files()) do
      local docs = documents(name)
      assert.truthy(#docs > 0, name .. " holds no document")
      for _, doc in ipairs(docs) do
        assert.is_string(doc.apiVersion, name)
        assert.is_string(doc.kind, name)
        if doc.kind ~= "Kustomization" then
          assert.is_string(doc.metadata and doc.metadata.name, name .. ": metadata.name")
        end
      end
    end
  end)

  it("lists every manifest in kustomization.yaml, and only those", function()
    local listed = {}
    for _, r in ipairs(documents("kustomization.yaml")[1].resources) do
      listed[#listed + 1] = r
    end
    local present = {}
    for _, name in ipairs(yaml_files()) do
      if name ~= "kustomization.yaml" then
        present[#present + 1] = name
      end
    end
    table.sort(listed)
    assert.same(present, listed)
  end)

  it("gives the ports the documented defaults, the same in the args, probes and Service", function()
    local ports = by_name(container.ports)
    local want = { grpc = 9002, ["grpc-health"] = 9003, ["http-metrics"] = 9090 }
    for name, number in pairs(want) do
      assert.equal(number, ports[name] and ports[name].containerPort, "container port " .. name)
    end
    -- the args say the same ports as the container, and the docs' defaults
    local documented = flags_table()
    for flag, port in pairs({ ["--grpc-port"] = 9002, ["--grpc-health-port"] = 9003,
      ["--metrics-port"] = 9090 }) do
      assert.equal(tostring(port), values[flag], flag .. " in the args")
      assert.equal(tostring(port), (documented[flag] or ""):match("^(%d+)"),
        flag .. "'s default in docs/kubernetes.md")
    end
    -- the kubelet's gRPC probes ask the health port for the EPP's service names
    assert.same({ port = 9003, service = "liveness" }, container.livenessProbe.grpc)
    assert.same({ port = 9003, service = "readiness" }, container.readinessProbe.grpc)
    -- each Service port forwards to the container port of the same number
    local service = one(all, "Service")
    local exposed = {}
    for _, p in ipairs(service.spec.ports) do
      local target = ports[p.targetPort] or by_name(container.ports, "containerPort")[p.targetPort]
      assert.truthy(target, "Service port " .. p.name .. ": no container port " .. tostring(p.targetPort))
      assert.equal(target.containerPort, p.port, "Service port " .. p.name)
      exposed[p.port] = p
    end
    assert.truthy(exposed[9002] and exposed[9003] and exposed[9090], "the Service exposes 9002, 9003, 9090")
    assert.equal("kubernetes.io/h2c", exposed[9002].appProtocol)
    for k, v in pairs(service.spec.selector) do
      assert.equal(v, deployment.spec.template.metadata.labels[k], "Service selector " .. k)
    end
  end)

  it("points the InferencePool at the Service's ext_proc port", function()
    local pool = one(all, "InferencePool")
    local service = one(all, "Service")
    local ref = pool.spec.endpointPickerRef
    assert.equal(service.metadata.name, ref.name)
    assert.equal(9002, ref.port.number)
    assert.equal(pool.metadata.name, values["--pool-name"])
    assert.equal("inference.networking.k8s.io", pool.apiVersion:match("^(.*)/"))
    assert.equal(values["--pool-group"], pool.apiVersion:match("^(.*)/"))
    local route = one(all, "HTTPRoute")
    assert.equal(pool.metadata.name, route.spec.rules[1].backendRefs[1].name)
  end)

  it("names in its args only flags docs/kubernetes.md lists for lupin epp", function()
    assert.equal("epp", container.args[1])
    assert.truthy(read(DEPLOY .. "/Dockerfile"):find('ENTRYPOINT %["/usr/local/bin/lupin"%]'),
      "the image's entrypoint is lupin: the args begin with its command")
    local documented = flags_table()
    for _, flag in ipairs(flags) do
      assert.truthy(documented[flag], flag .. " is not in docs/kubernetes.md's flags table")
    end
  end)

  it("names only flags `lupin epp --help` knows", function()
    local help, rc = run(LUPIN .. " epp --help")
    if rc ~= 0 then
      pending("lupin epp is not built yet (" .. S.BUILD .. "/lupin epp --help: exit " .. rc .. ")")
      return
    end
    local function knows(flag) -- the whole flag: --config is not --config-file
      return help:find(flag:gsub("%-", "%%-") .. "%f[^%w-]") ~= nil
    end
    local unknown = {}
    for _, flag in ipairs(flags) do
      if not knows(flag) then
        unknown[#unknown + 1] = "deploy/deployment.yaml: " .. flag
      end
    end
    for flag in pairs(flags_table()) do
      if not knows(flag) then
        unknown[#unknown + 1] = "docs/kubernetes.md: " .. flag
      end
    end
    table.sort(unknown)
    assert.same({}, unknown)
  end)

  it("grants get, list and watch on pods and inferencepools, and nothing to write", function()
    local role = one(all, "Role")
    local granted = {}
    for _, rule in ipairs(role.rules) do
      for _, verb in ipairs(rule.verbs) do
        assert.truthy(verb == "get" or verb == "list" or verb == "watch", "verb " .. verb)
      end
      for _, group in ipairs(rule.apiGroups) do
        for _, resource in ipairs(rule.resources) do
          local verbs = {}
          for _, v in ipairs(rule.verbs) do
            verbs[v] = true
          end
          granted[group .. "/" .. resource] = verbs
        end
      end
    end
    for _, key in ipairs({ "/pods", "inference.networking.k8s.io/inferencepools",
      "inference.networking.x-k8s.io/inferencepools" }) do
      assert.same({ get = true, list = true, watch = true }, granted[key], key)
    end
    -- bound to the pod's service account
    local account = one(all, "ServiceAccount")
    local binding = one(all, "RoleBinding")
    assert.equal(account.metadata.name, pod.serviceAccountName)
    assert.same({ kind = "ServiceAccount", name = account.metadata.name, namespace = "default" },
      binding.subjects[1])
    assert.equal(role.metadata.name, binding.roleRef.name)
  end)

  it("mounts the ConfigMap's EndpointPickerConfig where --config-file reads it, and it passes lupin check", function()
    local map = one(all, "ConfigMap")
    local volume
    for _, v in ipairs(pod.volumes) do
      if v.configMap and v.configMap.name == map.metadata.name then
        volume = v
      end
    end
    assert.truthy(volume, "a volume of ConfigMap " .. map.metadata.name)
    local mount = by_name(container.volumeMounts)[volume.name]
    local dir, key = values["--config-file"]:match("^(.*)/([^/]+)$")
    assert.equal(mount.mountPath, dir)
    local text = map.data[key]
    assert.is_string(text, "the ConfigMap's key " .. key)
    assert.equal("EndpointPickerConfig", yaml.decode(text, key).kind)
    local tmp = os.tmpname()
    S.write(tmp, text)
    local out, rc = run(LUPIN .. " check --config " .. tmp)
    os.remove(tmp)
    assert.equal(0, rc, out)
  end)

  it("keeps the Dockerfile's run-time packages those lupin links", function()
    local dockerfile = read(DEPLOY .. "/Dockerfile")
    local last = dockerfile:match(".*\nFROM [^\n]*\n(.*)$") -- the run-time stage
    local packages = {}
    for name in (last:match("apt%-get install(.-)&&%s*rm") or ""):gmatch("[%w][%w.+-]+") do
      packages[name] = true
    end
    -- the libraries lupin names itself (NEEDED; theirs come with their
    -- packages); dpkg knows a library by the path it installed, /lib or
    -- /usr/lib (usrmerge)
    local libs, rc = run("readelf -d " .. LUPIN .. " | sed -n 's/.*NEEDED.*\\[\\(.*\\)\\]/\\1/p'"
      .. " | while read -r n; do ldd " .. LUPIN .. " | awk -v n=\"$n\" '$1 == n {print $3}'; done"
      .. " | while read -r l; do"
      .. " dpkg -S \"$l\" 2>/dev/null || dpkg -S \"$(readlink -f \"$l\")\" 2>/dev/null; done"
      .. " | cut -d: -f1 | sort -u")
    if rc ~= 0 or not libs:find("%S") then
      pending("no dpkg here to name the packages of lupin's libraries")
      return
    end
    local missing = {}
    for pkg in libs:gmatch("[^\n]+") do
      -- the C and C++ runtimes come with the base image
      if not packages[pkg] and not pkg:match("^libc6") and not pkg:match("^libgcc") and pkg ~= "libstdc++6" then
        missing[#missing + 1] = pkg
      end
    end
    assert.same({}, missing)
  end)
end)

describe("docs/kubernetes.md", function()
  local text = read(S.ROOT .. "/docs/kubernetes.md")

  it("names only files of deploy/ that exist, and every one of them", function()
    local named, missing = {}, {}
    -- "deploy/..." standing alone, not the tail of spec/deploy/...
    for before, path in text:gmatch("(.)(deploy/[%w._/-]*[%w_])") do
      if not before:match("[%w/._-]") then
        named[path] = true
        if os.execute("test -e " .. S.ROOT .. "/" .. path) ~= 0 then
          missing[#missing + 1] = path
        end
      end
    end
    table.sort(missing)
    assert.same({}, missing)
    local p = io.popen("cd " .. S.ROOT .. " && ls deploy/*")
    local unnamed = {}
    for path in p:lines() do
      if not named[path] then
        unnamed[#unnamed + 1] = path
      end
    end
    p:close()
    assert.same({}, unnamed)
  end)
end)
