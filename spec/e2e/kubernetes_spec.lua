-- Endpoints from Kubernetes (`lupin serve --k8s-pool`, gateway/endpoints/k8s_*.c)
-- end to end: a real lupin serve reads an InferencePool and watches its
-- pods from an API server stand-in (spec/fixtures/gateway/kube_apiserver.py:
-- HTTPS with a CA this spec makes, the list/watch wire format, 410 Gone,
-- bookmarks, a bearer token) and sends requests to lupin-sim.  Each change
-- must reach /admin/endpoints within a second of the event.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local KUBE = support.ROOT .. "/spec/fixtures/gateway/kube_apiserver.py"
local TOKEN = "s3cret-token"
local SIM = "--model m --itl-ms 1 --seed 7"

-- the runtime's monotonic clock (its FFI declaration is the suite's one)
local now = require("lupin.runtime.capi").now

local dir = support.tmpdir()

local function sh(cmd)
  local out, rc = P.run(cmd .. " 2>&1")
  assert(rc == 0, cmd .. ": " .. tostring(out))
  return out
end

-- A CA and a server certificate it signs for IP 127.0.0.1, once per run;
-- a second CA that signed nothing the server shows (the wrong CA).
local function make_pki()
  local ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
  for _, ca in ipairs({ "ca", "other-ca" }) do
    sh(("openssl req -x509 %s -keyout %s/%s.key -out %s/%s.crt -days 2 -subj /CN=%s"):format(ec,
      dir, ca, dir, ca, ca))
  end
  support.write(dir .. "/san.cnf", "subjectAltName=IP:127.0.0.1\n")
  sh(("openssl req %s -keyout %s/server.key -out %s/server.csr -subj /CN=kube-apiserver"):format(
    ec, dir, dir))
  sh(("openssl x509 -req -in %s/server.csr -CA %s/ca.crt -CAkey %s/ca.key -CAcreateserial"
    .. " -out %s/server.crt -days 2 -extfile %s/san.cnf"):format(dir, dir, dir, dir, dir))
  -- a client certificate the same CA signs (kubeconfig client-certificate-data)
  sh(("openssl req %s -keyout %s/client.key -out %s/client.csr -subj /CN=lupin"):format(ec, dir,
    dir))
  sh(("openssl x509 -req -in %s/client.csr -CA %s/ca.crt -CAkey %s/ca.key -CAcreateserial"
    .. " -out %s/client.crt -days 2"):format(dir, dir, dir, dir))
end

local seq = 0
-- A kubeconfig for the stand-in at port; opts: ca (a file), ca_data (inline),
-- token, user (the user's lines instead of the token), namespace.
local function kubeconfig(port, opts)
  seq = seq + 1
  local path = ("%s/kubeconfig-%d.yaml"):format(dir, seq)
  local ca = opts.ca_data and ("    certificate-authority-data: %s\n"):format(opts.ca_data)
    or ("    certificate-authority: %s\n"):format(opts.ca or (dir .. "/ca.crt"))
  support.write(path, table.concat({
    "apiVersion: v1\nkind: Config\ncurrent-context: test\n",
    "clusters:\n- name: standin\n  cluster:\n",
    ("    server: https://127.0.0.1:%d\n"):format(port), ca,
    "users:\n- name: lupin\n  user:\n", opts.user or ("    token: %s\n"):format(opts.token or TOKEN),
    "contexts:\n- name: test\n  context:\n    cluster: standin\n    user: lupin\n",
    opts.namespace and ("    namespace: %s\n"):format(opts.namespace) or "",
  }))
  return path
end

local CONFIG = {
  kind = "EndpointPickerConfig",
  plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
  gateway = { refreshIntervalMs = 50 },
}

describe("lupin serve --k8s-pool", function()
  local procs, api, sim

  setup(function()
    make_pki()
  end)

  before_each(function()
    procs = {}
    api = P.start(("python3 -u %s --cert %s/server.crt --key %s/server.key --token %s"
      .. " --client-ca %s/ca.crt"):format(KUBE, dir, dir, TOKEN, dir))
    procs[#procs + 1] = api
    P.poll(function()
      api.port, api.control = (P.read(api.out) or ""):match("port (%d+) control (%d+)")
      return api.port or P.read(api.rc)
    end, "the API server stand-in's port")
    assert(api.port, "the stand-in did not start: " .. (P.read(api.err) or ""))
    api.ctl = "http://127.0.0.1:" .. api.control
    sim = P.sim(SIM, 1)
    procs[#procs + 1] = sim
  end)

  after_each(function()
    for _, p in ipairs(procs) do
      P.stop(p)
    end
  end)

  local function control(path, body)
    local code = P.post(api.ctl, path, body or {})
    assert.equal(200, code, path)
  end

  local function pod(name, extra)
    local body = { name = name, ip = "127.0.0.1", ready = true, labels = { app = "vllm" } }
    for k, v in pairs(extra or {}) do
      body[k] = v
    end
    control("/pod", body)
  end

  local function pool(extra)
    local body = { name = "pool1", selector = { app = "vllm" }, ports = { sim.ports[1] } }
    for k, v in pairs(extra or {}) do
      body[k] = v
    end
    control("/pool", body)
  end

  local function gateway(args, kube_opts)
    local gw = P.gateway(CONFIG, ("--k8s-pool pool1 --kubeconfig %s %s"):format(
      kubeconfig(api.port, kube_opts or {}), args or ""))
    procs[#procs + 1] = gw
    return gw
  end

  local function endpoints(gw)
    local _, _, body = P.get(gw.admin .. "/admin/endpoints")
    local ok, t = pcall(json.decode, body)
    return ok and t.endpoints or {}
  end

  local function names(gw)
    local list = {}
    for _, e in ipairs(endpoints(gw)) do
      list[#list + 1] = e.name
    end
    table.sort(list)
    return table.concat(list, " ")
  end

  -- Waits for the endpoint names; asserts they came within a second of t0.
  local function within_a_second(gw, want, t0, what)
    P.poll(function()
      return names(gw) == want
    end, what .. ": endpoints " .. want)
    local took = now() - t0
    assert.is_true(took < 1, ("%s took %.3f s"):format(what, took))
    return took
  end

  local function readyz(gw)
    local code, _, body = P.get(gw.admin .. "/readyz")
    return code, body
  end

  local function requests_seen()
    local _, _, body = P.get(api.ctl .. "/stats")
    return json.decode(body).requests
  end

  it("serves the pool's ready pods, in step with their changes, and requests reach them",
    function()
      pool()
      pod("vllm-a")
      pod("vllm-b", { ready = false })
      local t0 = now()
      local gw = gateway()
      within_a_second(gw, "vllm-a", t0, "the first list")
      P.poll(function()
        return readyz(gw) == 200
      end, "ready")
      local code = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi", max_tokens = 2 })
      assert.equal(200, code)
      -- becoming ready, appearing, no longer ready, being deleted, deletion begun
      t0 = now()
      pod("vllm-b")
      within_a_second(gw, "vllm-a vllm-b", t0, "a pod becoming ready")
      t0 = now()
      pod("vllm-c")
      within_a_second(gw, "vllm-a vllm-b vllm-c", t0, "a new ready pod")
      t0 = now()
      pod("vllm-a", { ready = false })
      within_a_second(gw, "vllm-b vllm-c", t0, "a pod no longer ready")
      t0 = now()
      control("/pod/delete", { name = "vllm-b" })
      within_a_second(gw, "vllm-c", t0, "a pod deleted")
      t0 = now()
      pod("vllm-c", { deleting = true })
      within_a_second(gw, "", t0, "a pod being deleted")
      -- an empty pool is applied, not kept: and /readyz says no endpoint
      local _, body = readyz(gw)
      assert.matches("no healthy endpoint", body)
      pod("other", { labels = { app = "something-else" } })
      t0 = now()
      pod("vllm-d")
      within_a_second(gw, "vllm-d", t0, "a pod after an empty pool")
      assert.equal(1, P.metric(gw, 'lupin_kubernetes_pool_endpoints{pool="default/pool1"}'))
      assert.equal(1, P.metric(gw, 'lupin_kubernetes_pool_synced{pool="default/pool1"}'))
      -- SIGTERM with the watches open: a clean exit (under make test-asan, no leak)
      P.signal(gw, "TERM")
      assert.equal(0, P.wait(gw))
    end)

  it("gives endpoints the pods' labels, so P/D roles reach the plugins", function()
    pool()
    pod("prefill-0", { labels = { app = "vllm", ["llm-d.ai/role"] = "prefill" } })
    pod("decode-0", { labels = { app = "vllm", ["llm-d.ai/role"] = "decode" } })
    local gw = gateway()
    P.poll(function()
      return names(gw) == "decode-0 prefill-0"
    end, "both pods")
    local roles = {}
    for _, e in ipairs(endpoints(gw)) do
      roles[e.name] = e.labels["llm-d.ai/role"]
      assert.equal("vllm", e.labels.app)
      assert.equal("127.0.0.1", e.address)
      assert.equal(sim.ports[1], e.port)
    end
    assert.same({ ["prefill-0"] = "prefill", ["decode-0"] = "decode" }, roles)
  end)

  it("names an endpoint POD-PORT when the pool has several target ports", function()
    pool({ ports = { sim.ports[1], sim.ports[1] + 1000 } })
    pod("vllm-a")
    local gw = gateway()
    P.poll(function()
      return names(gw) == ("vllm-a-%d vllm-a-%d"):format(sim.ports[1], sim.ports[1] + 1000)
    end, "one endpoint per port")
  end)

  it("re-selects the pods when the pool's selector changes", function()
    pool()
    pod("vllm-a")
    pod("tgi-a", { labels = { app = "tgi" } })
    local gw = gateway()
    P.poll(function()
      return names(gw) == "vllm-a"
    end, "the first selection")
    local t0 = now()
    pool({ selector = { app = "tgi" } })
    within_a_second(gw, "tgi-a", t0, "a new selector")
  end)

  it("resumes a watch the server ends from its resourceVersion, and takes bookmarks", function()
    pool()
    pod("vllm-a")
    local gw = gateway()
    P.poll(function()
      return names(gw) == "vllm-a"
    end, "the first list")
    P.poll(function()
      for _, r in ipairs(requests_seen()) do
        if r.kind == "pods" and r.watch then
          return true
        end
      end
    end, "a watch of the pods")
    control("/bookmark")
    local before = #requests_seen()
    control("/expire", { mode = "close" })
    local t0 = now()
    pod("vllm-b")
    within_a_second(gw, "vllm-a vllm-b", t0, "an event after a watch ended")
    -- the pods were watched again, from a resourceVersion, not listed again
    local lists, rewatches = 0, 0
    for i = before + 1, #requests_seen() do
      local r = requests_seen()[i]
      if r.kind == "pods" then
        if r.watch then
          assert.truthy(tonumber(r.rv))
          rewatches = rewatches + 1
        else
          lists = lists + 1
        end
      end
    end
    assert.equal(0, lists)
    assert.is_true(rewatches >= 1)
    -- the bookmark moved the resume point past its version
    local last
    for _, r in ipairs(requests_seen()) do
      if r.kind == "pods" and r.watch then
        last = tonumber(r.rv)
      end
    end
    assert.is_true(last >= 103, "resumed from " .. tostring(last))
    assert.is_true(P.metric(gw, 'lupin_kubernetes_watch_restarts_total{resource="pods"}') >= 1)
  end)

  for _, mode in ipairs({ "gone", "gone_http" }) do
    it("lists again when a watch expires (410 Gone, " .. (mode == "gone" and "an ERROR event"
      or "the HTTP status") .. ")", function()
      pool()
      pod("vllm-a")
      local gw = gateway()
      P.poll(function()
        return names(gw) == "vllm-a"
      end, "the first list")
      local before = #requests_seen()
      control("/expire", { mode = mode })
      if mode == "gone_http" then -- the watch ended: the resume gets 410
        control("/pod/delete", { name = "vllm-a" })
      end
      local t0 = now()
      pod("vllm-b")
      local want = mode == "gone_http" and "vllm-b" or "vllm-a vllm-b"
      within_a_second(gw, want, t0, "an event after 410")
      local relisted = false
      local seen = requests_seen()
      for i = before + 1, #seen do
        relisted = relisted or (seen[i].kind == "pods" and not seen[i].watch)
      end
      assert.is_true(relisted, "the pods were listed again")
      assert.equal(200, (readyz(gw)))
    end)
  end

  it("reads a v1alpha2 pool (--pool-group inference.networking.x-k8s.io)", function()
    pool({ group = "inference.networking.x-k8s.io" })
    pod("vllm-a")
    local gw = gateway("--pool-group inference.networking.x-k8s.io")
    P.poll(function()
      return names(gw) == "vllm-a"
    end, "the v1alpha2 pool's pod")
    local e = endpoints(gw)[1]
    assert.equal(sim.ports[1], e.port)
    -- and the v1 pool of the same name is not read
    control("/pool/delete", { name = "pool1", group = "inference.networking.x-k8s.io" })
    P.poll(function()
      return names(gw) == ""
    end, "the pool deleted: no endpoints")
    local code, body = readyz(gw)
    assert.equal(503, code)
    assert.matches("no InferencePool pool1 in namespace default", body, 1, true)
  end)

  -- In a pod the credentials are files under /var/run/secrets: a mount
  -- namespace of the gateway's own puts this spec's there (root only).
  it("reads in-cluster credentials: the service account's files and KUBERNETES_SERVICE_*",
    function()
      local _, can = P.run("unshare -m --propagation private true 2>/dev/null")
      if can ~= 0 then
        pending("no mount namespace here (unshare -m needs root)")
        return
      end
      local run = dir .. "/in-cluster-run"
      local sa = run .. "/secrets/kubernetes.io/serviceaccount"
      sh("mkdir -p " .. sa .. " && cp " .. dir .. "/ca.crt " .. sa .. "/ca.crt")
      support.write(sa .. "/token", TOKEN .. "\n")
      support.write(sa .. "/namespace", "default\n")
      pool()
      pod("vllm-a")
      local t0 = now()
      local env = ("KUBERNETES_SERVICE_HOST=127.0.0.1 KUBERNETES_SERVICE_PORT=%s HOME=%s"
        .. " unshare -m --propagation private sh -c 'mount --bind %s /run && exec \"$0\" \"$@\"'")
        :format(api.port, dir, run)
      local gw = P.gateway(CONFIG, "--k8s-pool pool1", env)
      procs[#procs + 1] = gw
      within_a_second(gw, "vllm-a", t0, "the first list, in-cluster")
      P.poll(function()
        return readyz(gw) == 200
      end, "ready")
    end)

  it("takes the CA inline (certificate-authority-data) and the namespace from the context",
    function()
      pool({ namespace = "prod" })
      pod("vllm-a")
      local b64 = sh("base64 -w0 " .. dir .. "/ca.crt")
      local gw = gateway(nil, { ca_data = b64, namespace = "prod" })
      P.poll(function()
        return names(gw) == "vllm-a"
      end, "the pod")
      local seen = requests_seen()
      assert.truthy(P.read(gw.err):find("InferencePool prod/pool1", 1, true))
      assert.truthy(#seen > 0)
    end)

  it("authenticates with a client certificate (client-certificate-data, client-key-data)",
    function()
      pool()
      pod("vllm-a")
      local function b64(f)
        return sh("base64 -w0 " .. dir .. "/" .. f)
      end
      local gw = gateway(nil, { user = ("    client-certificate-data: %s\n    client-key-data: %s\n")
        :format(b64("client.crt"), b64("client.key")) })
      P.poll(function()
        return names(gw) == "vllm-a"
      end, "the pod, with no token")
    end)

  it("re-reads a tokenFile at each request (rotated tokens)", function()
    pool()
    pod("vllm-a")
    local file = dir .. "/token"
    support.write(file, TOKEN .. "\n")
    local gw = gateway(nil, { user = ("    tokenFile: %s\n"):format(file) })
    P.poll(function()
      return names(gw) == "vllm-a"
    end, "the pod")
    support.write(file, "rotated\n")
    control("/token", { token = "rotated" })
    control("/expire", { mode = "close" }) -- the watches resume with the new token
    local t0 = now()
    pod("vllm-b")
    within_a_second(gw, "vllm-a vllm-b", t0, "an event after the token rotated")
    assert.equal(0, P.metric(gw, 'lupin_kubernetes_errors_total{reason="unauthorized"}'))
  end)

  -- An error an operator must see: a log line (once), /readyz, a metric;
  -- the process keeps serving.
  local function sees_error(gw, reason, text)
    P.poll(function()
      local code, body = readyz(gw)
      return code == 503 and body:find(text, 1, true)
    end, "/readyz naming " .. text)
    P.poll(function()
      return (P.metric(gw, ('lupin_kubernetes_errors_total{reason="%s"}'):format(reason)) or 0) > 0
    end, "lupin_kubernetes_errors_total{reason=" .. reason .. "}")
    assert.equal(0, P.metric(gw, 'lupin_kubernetes_pool_synced{pool="default/pool1"}'))
    P.poll(function()
      return (P.read(gw.err) or ""):find(text, 1, true)
    end, "the log naming " .. text)
    os.execute("sleep 1") -- retries go on: the log line is not repeated
    local _, count = (P.read(gw.err) or ""):gsub("kubernetes: InferencePool [^\n]*" .. text:gsub(
      "%p", "%%%0"), "")
    assert.equal(1, count, P.read(gw.err))
    assert.equal(200, (P.get(gw.admin .. "/healthz")))
    assert.equal(nil, P.read(gw.rc))
  end

  it("reports a missing pool, and picks it up once created", function()
    pod("vllm-a")
    local gw = gateway()
    sees_error(gw, "not_found", "no InferencePool pool1 in namespace default")
    local t0 = now()
    pool()
    within_a_second(gw, "vllm-a", t0, "the pool created")
    local ok, err = pcall(P.poll, function()
      return readyz(gw) == 200
    end, "ready")
    assert(ok, tostring(err) .. ": " .. select(2, readyz(gw)) .. (P.read(gw.err) or ""))
  end)

  it("reports a wrong token (401)", function()
    pool()
    local gw = gateway(nil, { token = "wrong" })
    sees_error(gw, "unauthorized", "HTTP 401 from the API server: Unauthorized")
    P.signal(gw, "TERM") -- with a retry pending: a clean exit
    assert.equal(0, P.wait(gw))
  end)

  it("reports a server certificate its CA did not sign", function()
    pool()
    local gw = gateway(nil, { ca = dir .. "/other-ca.crt" })
    sees_error(gw, "tls", "the API server's certificate did not verify")
  end)

  it("reports an API server that does not answer", function()
    pool()
    local port = api.port
    P.stop(api)
    local gw = P.gateway(CONFIG, ("--k8s-pool pool1 --kubeconfig %s"):format(kubeconfig(port, {})))
    procs[#procs + 1] = gw
    sees_error(gw, "unreachable", "connection refused")
  end)

  it("reports pods it may not list (403), and recovers once it may", function()
    pool()
    pod("vllm-a")
    control("/forbid", { kind = "pods" })
    local gw = gateway()
    sees_error(gw, "forbidden", "pods: HTTP 403 from the API server: pods is forbidden")
    control("/forbid", {})
    P.poll(function()
      return names(gw) == "vllm-a" and readyz(gw) == 200
    end, "the pods listed once allowed")
  end)

  it("reports a pool with no selector, and follows it once fixed", function()
    pool({ selector = "none" })
    pod("vllm-a")
    local gw = gateway()
    sees_error(gw, "bad_pool", "spec.selector.matchLabels selects nothing")
    local t0 = now()
    pool()
    within_a_second(gw, "vllm-a", t0, "the pool fixed")
  end)

  it("applies the pool on every worker", function()
    pool()
    pod("vllm-a")
    local gw = gateway("--workers 2")
    P.poll(function()
      return names(gw) == "vllm-a"
    end, "the pod")
    local codes = {}
    for i = 1, 16 do
      local code = P.post(gw.base, "/v1/completions", { model = "m", prompt = "w" .. i,
        max_tokens = 1 })
      codes[code] = (codes[code] or 0) + 1
    end
    assert.same({ [200] = 16 }, codes)
    local counts = P.worker_requests(gw)
    assert.is_true((counts[0] or 0) > 0 and (counts[1] or 0) > 0, json.encode(counts))
  end)

  it("is lupin epp's pool too (--pool-name): readiness follows it, picks are its pods", function()
    pool()
    local epp = P.epp(CONFIG, ("--pool-name pool1 --kubeconfig %s"):format(
      kubeconfig(api.port, {})))
    procs[#procs + 1] = epp
    local function readiness()
      return P.envoy(epp.health, "health", "readiness").status
    end
    local body = ([[--body '{"model":"m","prompt":"hi","max_tokens":2}']])
    assert.equal("NOT_SERVING", readiness())
    assert.equal(503, P.envoy(epp.grpc, "request", body).immediate.status)
    pod("vllm-a")
    P.poll(function()
      return readiness() == "SERVING"
    end, "readiness once the pod is ready and scraped")
    local r = P.envoy(epp.grpc, "request", body)
    assert.same({ sim.hostports[1] }, r.pick)
    assert.equal(200, r.status)
    control("/pod/delete", { name = "vllm-a" })
    P.poll(function()
      return readiness() == "NOT_SERVING"
    end, "not ready once the pool is empty")
    assert.equal(503, P.envoy(epp.grpc, "request", body).immediate.status)
    local out, rc = P.run(("%s epp --config-file x --endpoints e --pool-name p 2>&1"):format(P.LUPIN))
    assert.equal(2, rc)
    assert.matches("give one of --pool-name and --endpoints", out, 1, true)
  end)

  it("refuses --endpoints with --k8s-pool, and an unknown --pool-group", function()
    local out, rc = P.run(("%s serve --config x --endpoints e --k8s-pool p 2>&1"):format(P.LUPIN))
    assert.equal(2, rc)
    assert.matches("give one source of endpoints", out)
    local gw_out, gw_rc = P.run(("%s serve --config %s --k8s-pool p --pool-group example.com "
      .. "--kubeconfig %s --listen 127.0.0.1:0 --admin 127.0.0.1:0 2>&1"):format(P.LUPIN,
      support.ROOT .. "/examples/configs/default.yaml", kubeconfig(api.port, {})))
    assert.equal(1, gw_rc)
    assert.matches("--pool-group example.com", gw_out, 1, true)
  end)

  -- A Kubernetes manifest as the config (docs/kubernetes.md, "A manifest as
  -- the config"): its InferencePool, when it is the one --k8s-pool names,
  -- is used in place of the API server's, which is then never asked.
  local function manifest(name, labels, port)
    local sel = {}
    for k, v in pairs(labels) do
      sel[#sel + 1] = ("      %s: %s\n"):format(k, v)
    end
    return table.concat({
      "apiVersion: inference.networking.k8s.io/v1\nkind: InferencePool\n",
      "metadata:\n  name: ", name, "\nspec:\n  targetPorts:\n  - number: ", tostring(port),
      "\n  selector:\n    matchLabels:\n", table.concat(sel),
      "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: ", name, "-epp\n",
      "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ", name, "-epp\ndata:\n",
      "  default-plugins.yaml: |\n    kind: EndpointPickerConfig\n    plugins:\n",
      "    - type: queue-scorer\n    - type: max-score-picker\n",
      "    gateway:\n      refreshIntervalMs: 50\n",
    })
  end

  local function pool_requests()
    local n = 0
    for _, r in ipairs(json.decode((select(3, P.get(api.ctl .. "/stats")))).requests) do
      n = n + (r.kind:match("^pools") and 1 or 0)
    end
    return n
  end

  it("takes the pool from a manifest config, follows its edits, and never asks for it",
    function()
      pod("vllm-a")
      pod("tgi-a", { labels = { app = "tgi" } })
      local gw = P.gateway(manifest("pool1", { app = "vllm" }, sim.ports[1]),
        ("--k8s-pool pool1 --kubeconfig %s"):format(kubeconfig(api.port, {})))
      procs[#procs + 1] = gw
      P.poll(function()
        return names(gw) == "vllm-a"
      end, "the manifest pool's pod")
      P.poll(function()
        return readyz(gw) == 200
      end, "ready")
      assert.equal(200, (P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi",
        max_tokens = 2 })))
      assert.matches("InferencePool default/pool1 (from the config, " .. gw.config .. ":1)",
        P.read(gw.err), 1, true)
      -- the file edited: its new selector is the pool's at the reload
      support.write(gw.config, manifest("pool1", { app = "tgi" }, sim.ports[1]))
      local t0 = now()
      assert.equal(200, (P.post(gw.admin, "/admin/reload", "")))
      within_a_second(gw, "tgi-a", t0, "the manifest's new selector")
      assert.equal(0, pool_requests())
    end)

  it("goes back to the API server's pool when a reload drops the file's", function()
    pool({ selector = { app = "tgi" } })
    pod("vllm-a")
    pod("tgi-a", { labels = { app = "tgi" } })
    local gw = P.gateway(manifest("pool1", { app = "vllm" }, sim.ports[1]),
      ("--k8s-pool pool1 --kubeconfig %s"):format(kubeconfig(api.port, {})))
    procs[#procs + 1] = gw
    P.poll(function()
      return names(gw) == "vllm-a"
    end, "the manifest pool's pod")
    assert.equal(0, pool_requests())
    support.write(gw.config, json.encode(CONFIG))
    local t0 = now()
    assert.equal(200, (P.post(gw.admin, "/admin/reload", "")))
    within_a_second(gw, "tgi-a", t0, "the API server's pool")
    assert.matches("the config no longer holds InferencePool default/pool1", P.read(gw.err), 1,
      true)
  end)

  it("reads the pool from the API server when the manifest's pool is another", function()
    pool()
    pod("vllm-a")
    local gw = P.gateway(manifest("other", { app = "nothing" }, 1),
      ("--k8s-pool pool1 --kubeconfig %s"):format(kubeconfig(api.port, {})))
    procs[#procs + 1] = gw
    P.poll(function()
      return names(gw) == "vllm-a"
    end, "the API server's pool's pod")
    assert.matches("the config's InferencePools (default/other at " .. gw.config
      .. ":1) are not default/pool1: reading default/pool1 from the API server",
      P.read(gw.err), 1, true)
    assert.is_true(pool_requests() > 0)
  end)
end)
