-- The admin /metrics of the real `lupin serve` in front of lupin-sim, after
-- real traffic: valid text exposition (promtool, from Debian's prometheus
-- package, which `make deps` installs), label values escaped, process_* and
-- lupin_build_info sane, and the endpoint picker's (EPP) families moving with
-- the requests they count (docs/metrics.md).
local P = require "e2e.procs"
local json = P.json

local SIM = "--model m --itl-ms 1 --seed 7"
-- endpoint and model names that would break an unescaped exposition
local ODD_EP = 'e"1\\x'
local ODD_MODEL = 'mo"del\\x\nnext_line{a="b"} 1'

local function config(endpoints, gateway)
  return {
    plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
    endpoints = endpoints,
    gateway = gateway or { consecutiveErrors = 0, staleEjectionMs = 0 },
  }
end

local function eps(sim, first)
  local list = {}
  for i, hp in ipairs(sim.hostports) do
    list[i] = { name = i == 1 and first or ("e" .. i), address = "127.0.0.1",
      port = tonumber(hp:match(":(%d+)$")) }
  end
  return list
end

-- A label value as the exposition format escapes it, read back.
local UNESCAPE = { n = "\n", ["\\"] = "\\", ['"'] = '"' }

--- Parses a text exposition: samples {name, labels, value} and the HELP and
--- TYPE of each family.  Label values may hold any byte, escaped.
local function parse(text)
  local samples, help, types = {}, {}, {}
  for line in text:gmatch("[^\n]+") do
    local kind, fam, rest = line:match("^# (%u+) (%S+) (.*)$")
    if kind == "HELP" then
      help[fam] = rest
    elseif kind == "TYPE" then
      types[fam] = rest
    else
      local name, pos = line:match("^([%a_:][%w_:]*)()")
      assert(name, "not a sample line: " .. line)
      local labels = {}
      if line:sub(pos, pos) == "{" then
        pos = pos + 1
        while line:sub(pos, pos) ~= "}" do
          local k, start = line:match('^([%a_][%w_]*)="()', pos)
          assert(k, "bad label at " .. pos .. " of " .. line)
          local i, buf = start, {}
          while line:sub(i, i) ~= '"' do
            local c = line:sub(i, i)
            assert(c ~= "", "unterminated label value: " .. line)
            if c == "\\" then
              buf[#buf + 1] = assert(UNESCAPE[line:sub(i + 1, i + 1)], "bad escape: " .. line)
              i = i + 2
            else
              buf[#buf + 1] = c
              i = i + 1
            end
          end
          labels[k] = table.concat(buf)
          pos = i + 1
          if line:sub(pos, pos) == "," then
            pos = pos + 1
          end
        end
        pos = pos + 1
      end
      local v = line:match("^ (%S+)$", pos)
      assert(v, "bad value: " .. line)
      samples[#samples + 1] = { name = name, labels = labels, value = tonumber(v) }
    end
  end
  return { samples = samples, help = help, types = types }
end

local function scrape(gw)
  local status, _, text = P.get(gw.admin .. "/metrics")
  assert.equal(200, status)
  return parse(text), text
end

local function matches(s, labels)
  for k, v in pairs(labels or {}) do
    if s.labels[k] ~= v then
      return false
    end
  end
  return true
end

--- The value of the one sample of name whose labels include labels.
local function value(m, name, labels)
  local found
  for _, s in ipairs(m.samples) do
    if s.name == name and matches(s, labels) then
      assert(not found, "more than one " .. name .. " matches")
      found = s.value
    end
  end
  return found
end

--- Every sample of name whose labels include labels.
local function all(m, name, labels)
  local out = {}
  for _, s in ipairs(m.samples) do
    if s.name == name and matches(s, labels) then
      out[#out + 1] = s
    end
  end
  return out
end

local function completion(gw, model, extra)
  local body = { model = model or "m", prompt = "Hello, lupin", max_tokens = 4 }
  for k, v in pairs(extra or {}) do
    body[k] = v
  end
  local text = json.encode(body)
  local status, _, out = P.post(gw.base, "/v1/completions", text)
  return status, #text, #out
end

local function promtool(text)
  local file = P.dir .. "/metrics-" .. tostring({}):match("0x(%x+)") .. ".txt"
  local f = assert(io.open(file, "wb"))
  f:write(text)
  f:close()
  local _, found = P.run("promtool --version > /dev/null 2>&1")
  -- not skipped: CI installs it (`make deps`, Debian package prometheus)
  assert(found == 0, "promtool is missing: apt-get install prometheus (or make deps)")
  return P.run("promtool check metrics < " .. P.quote(file) .. " 2>&1")
end

describe("lupin serve's /metrics", function()
  local sim, gw

  setup(function()
    sim = P.sim(SIM, 2)
    gw = P.gateway(config(eps(sim, ODD_EP)))
    P.poll(function()
      return P.get(gw.admin .. "/readyz") == 200
    end, "the gateway to be ready")
  end)

  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("passes promtool check metrics after real traffic, with HELP and TYPE on every family",
    function()
      assert.equal(200, (completion(gw)))
      assert.equal(200, (completion(gw, "m", { stream = true })))
      assert.equal(404, (completion(gw, ODD_MODEL))) -- lupin-sim has no such model
      assert.equal(400, (P.post(gw.base, "/v1/completions", { prompt = "no model" })))
      local m, text = scrape(gw)
      local out, rc = promtool(text)
      assert.equal(0, rc, out)
      local seen = {}
      for _, s in ipairs(m.samples) do
        local fam = s.name:gsub("_bucket$", ""):gsub("_sum$", ""):gsub("_count$", "")
        fam = m.types[fam] and fam or s.name
        assert.truthy(m.types[fam], "no TYPE for " .. s.name)
        assert.truthy(m.help[fam] and #m.help[fam] > 0, "no HELP for " .. s.name)
        seen[fam] = true
      end
      for _, fam in ipairs({ "lupin_requests_total", "lupin_build_info",
        "process_resident_memory_bytes", "inference_objective_request_total",
        "inference_extension_plugin_duration_seconds", "inference_pool_ready_pods" }) do
        assert.truthy(seen[fam], fam)
      end
      -- each family's header once
      for fam in pairs(m.types) do
        local _, n = text:gsub("\n# TYPE " .. fam:gsub("%p", "%%%0") .. " ", "")
        assert.equal(1, n, fam)
      end
    end)

  it("escapes backslash, quote and newline in label values (endpoint and model names)",
    function()
      assert.equal(404, (completion(gw, ODD_MODEL)))
      local m, text = scrape(gw)
      assert.equal(1, value(m, "lupin_endpoint_healthy", { endpoint = ODD_EP }))
      assert.truthy(text:find('lupin_endpoint_healthy{endpoint="e\\"1\\\\x"} 1\n', 1, true))
      assert.truthy(value(m, "inference_objective_request_error_total",
        { model_name = ODD_MODEL, target_model_name = ODD_MODEL, error_code = "ModelServerError" })
        >= 1)
      -- the newline in the model name did not start a line of its own
      assert.falsy(text:find("\nnext_line", 1, true))
      assert.truthy(text:find('model_name="mo\\"del\\\\x\\nnext_line{a=\\"b\\"} 1"', 1, true))
      -- and the older families kept their values readable by P.metric
      assert.equal(1, P.metric(gw, 'lupin_endpoint_healthy{endpoint="e2"}'))
    end)

  it("exports process_* from /proc and lupin_build_info", function()
    local m = scrape(gw)
    local stat = P.read("/proc/" .. gw.pid .. "/stat")
    local limits = P.read("/proc/" .. gw.pid .. "/limits")
    local version = P.run(P.LUPIN .. " --version"):match("lupin (%S+)")
    assert.equal(1, value(m, "lupin_build_info", { version = version }))
    assert.truthy(all(m, "lupin_build_info")[1].labels.luajit:find("^LuaJIT 2%."))
    local rss, vsize = value(m, "process_resident_memory_bytes"),
      value(m, "process_virtual_memory_bytes")
    assert.truthy(rss > 1e6 and rss < vsize, rss .. " " .. vsize)
    -- vsize is field 23 of /proc/PID/stat (after the command in parentheses)
    local fields = {}
    for f in stat:match("%) (.*)$"):gmatch("%S+") do
      fields[#fields + 1] = f
    end
    assert.truthy(math.abs(tonumber(fields[21]) - vsize) < 64 * 2 ^ 20, fields[21])
    assert.truthy(value(m, "process_cpu_seconds_total") >= 0)
    local soft = tonumber(limits:match("Max open files%s+(%d+)"))
    assert.equal(soft, value(m, "process_max_fds"))
    local fds = value(m, "process_open_fds")
    assert.truthy(fds >= 3 and fds < soft, fds)
    -- started this spec file's setup: within the elapsed time ps reports
    local etimes = tonumber((P.run("ps -o etimes= -p " .. gw.pid)))
    local start = value(m, "process_start_time_seconds")
    assert.truthy(math.abs(os.time() - etimes - start) <= 2, start .. " vs " .. etimes)
  end)

  it("moves the EPP's request families with the requests they count", function()
    local before = scrape(gw)
    local ML = { model_name = "m", target_model_name = "m" }
    local sent, received = 0, 0
    for _ = 1, 3 do
      local status, nin, nout = completion(gw)
      assert.equal(200, status)
      sent, received = sent + nin, received + nout
    end
    local after = scrape(gw)
    local function delta(name, labels)
      return (value(after, name, labels) or 0) - (value(before, name, labels) or 0)
    end
    assert.equal(3, delta("inference_objective_request_total", ML))
    assert.equal(3, delta("inference_objective_request_duration_seconds_count", ML))
    assert.truthy(delta("inference_objective_request_duration_seconds_sum", ML) > 0)
    assert.equal(3, delta("inference_objective_request_sizes_count", ML))
    assert.equal(sent, delta("inference_objective_request_sizes_sum", ML))
    assert.equal(3, delta("inference_objective_response_sizes_count", ML))
    assert.equal(received, delta("inference_objective_response_sizes_sum", ML))
    assert.equal(3, value(after, "inference_objective_request_duration_seconds_bucket",
      { model_name = "m", le = "+Inf" }) - value(before,
      "inference_objective_request_duration_seconds_bucket", { model_name = "m", le = "+Inf" }))
    assert.equal(0, value(after, "inference_objective_running_requests", { model_name = "m" }))
    -- the EPP's scheduler histogram counts the cycles lupin's own does
    assert.equal(3, delta("inference_extension_scheduler_e2e_duration_seconds_count"))
    assert.equal(value(after, "lupin_scheduling_seconds_count"),
      value(after, "inference_extension_scheduler_e2e_duration_seconds_count"))
    -- one observation per plugin call, the same count as lupin's counter
    local PL = { extension_point = "Scorer", plugin_type = "queue-scorer",
      plugin_name = "queue-scorer" }
    assert.equal(3, delta("inference_extension_plugin_duration_seconds_count", PL))
    assert.equal(value(after, "lupin_plugin_calls_total",
        { plugin = "queue-scorer", type = "queue-scorer", point = "score" }),
      value(after, "inference_extension_plugin_duration_seconds_count", PL))
    assert.equal(value(after, "inference_extension_plugin_duration_seconds_count", PL),
      value(after, "inference_extension_plugin_duration_seconds_bucket",
        { plugin_name = "queue-scorer", extension_point = "Scorer", le = "+Inf" }))
    -- the pool: both endpoints fresh, the means those of the endpoints' own series
    local POOL = { name = "lupin" }
    assert.equal(2, value(after, "inference_pool_ready_pods", POOL))
    assert.equal(2, #all(after, "inference_pool_per_pod_queue_size", POOL))
    local kv = (value(after, "lupin_endpoint_kv_cache_usage", { endpoint = ODD_EP }) +
      value(after, "lupin_endpoint_kv_cache_usage", { endpoint = "e2" })) / 2
    assert.near(kv, value(after, "inference_pool_average_kv_cache_utilization", POOL), 1e-12)
  end)

  it("counts failures by the EPP's error codes", function()
    local before = scrape(gw)
    assert.equal(400, (P.post(gw.base, "/v1/completions", { prompt = "no model" })))
    assert.equal(404, (completion(gw, "unknown-model")))
    local after = scrape(gw)
    local function delta(name, labels)
      return (value(after, name, labels) or 0) - (value(before, name, labels) or 0)
    end
    assert.equal(1, delta("inference_objective_request_error_total",
      { model_name = "", error_code = "BadRequest" }))
    assert.equal(1, delta("inference_objective_request_error_total",
      { model_name = "unknown-model", error_code = "ModelServerError" }))
    -- scheduled, so counted as a request too (as the EPP does)
    assert.equal(1, delta("inference_objective_request_total", { model_name = "unknown-model" }))
    assert.equal(0, delta("inference_objective_request_duration_seconds_count",
      { model_name = "unknown-model" }))
  end)

  it("keeps at most 100 model names, the rest under <other>", function()
    for i = 1, 105 do
      completion(gw, "flood-" .. i)
    end
    local m = scrape(gw)
    local names = {}
    for _, s in ipairs(all(m, "inference_objective_request_total")) do
      names[#names + 1] = s.labels.model_name
    end
    assert.truthy(#names <= 101, #names)
    assert.truthy(value(m, "inference_objective_request_total", { model_name = "<other>" }) >= 5)
    assert.is_nil(value(m, "inference_objective_request_total", { model_name = "flood-105" }))
  end)
end)

describe("lupin serve's EPP pool and running series", function()
  local procs = {}

  after_each(function()
    for i = #procs, 1, -1 do
      P.stop(procs[i])
      procs[i] = nil
    end
  end)

  it("a pool with no endpoint counts InferencePoolResourceExhausted", function()
    local gw = P.gateway(config(nil))
    procs[1] = gw
    assert.equal(503, (completion(gw)))
    local m = scrape(gw)
    assert.equal(1, value(m, "inference_objective_request_error_total",
      { model_name = "m", error_code = "InferencePoolResourceExhausted" }))
    assert.is_nil(value(m, "inference_objective_request_total", { model_name = "m" }))
    assert.equal(0, value(m, "inference_pool_ready_pods", { name = "lupin" }))
    -- no mean over no endpoint: the series is absent, as the EPP leaves it
    assert.equal(0, #all(m, "inference_pool_average_queue_size"))
  end)

  it("running requests and the pool's queues follow requests held at an endpoint", function()
    local sim = P.sim(SIM .. " --slow-endpoints 0 --slow-factor 1000 --max-num-seqs 1", 2)
    procs[#procs + 1] = sim
    local gw = P.gateway(config(eps(sim, "e1")))
    procs[#procs + 1] = gw
    P.poll(function()
      return P.get(gw.admin .. "/readyz") == 200
    end, "the gateway to be ready")
    local body = json.encode({ model = "m", prompt = "Hello, lupin", max_tokens = 4 })
    for _ = 1, 2 do -- one runs for seconds at e1, one waits behind it
      procs[#procs + 1] = P.start(("curl -s -o /dev/null -H %s -d %s %s"):format(
        P.quote("x-gateway-destination-endpoint-subset: " .. sim.hostports[1]), P.quote(body),
        P.quote(gw.base .. "/v1/completions")))
    end
    local m = P.poll(function()
      local s = scrape(gw)
      local q = value(s, "inference_pool_per_pod_queue_size", { model_server_pod = "e1" })
      return q and q >= 1 and s
    end, "e1's queue in the EPP's series")
    assert.equal(2, value(m, "inference_objective_running_requests", { model_name = "m" }))
    local q1 = value(m, "inference_pool_per_pod_queue_size", { model_server_pod = "e1" })
    local q2 = value(m, "inference_pool_per_pod_queue_size", { model_server_pod = "e2" })
    assert.equal((q1 + q2) / 2, value(m, "inference_pool_average_queue_size", { name = "lupin" }))
    -- the clients give up: cancelled, neither running nor an error
    for i = #procs, 3, -1 do
      P.stop(procs[i])
      procs[i] = nil
    end
    m = P.poll(function()
      local s = scrape(gw)
      return value(s, "inference_objective_running_requests", { model_name = "m" }) == 0 and s
    end, "the running requests to end")
    assert.equal(0, #all(m, "inference_objective_request_error_total", { model_name = "m" }))
    assert.equal(2, value(m, "inference_objective_request_total", { model_name = "m" }))
  end)
end)

-- A plugin training latency models through lupin.predictor on every
-- finished request: one model exported (its group's quotes escaped on the
-- way out), one not.
local TRAINER = [[
local predictor = require "lupin.predictor"
return {
  type = "spec-latency-trainer",
  new = function(_, env)
    local m = assert(predictor.model { plugin = "trainer", target = "ttft", group = 'gpu="a100"',
      features = 2, halfLife = 60, exported = true })
    local hidden = assert(predictor.model { plugin = "trainer", target = "tpot", group = "all",
      features = 1 })
    return { m = m, hidden = hidden, now = env.now, n = 0 }
  end,
  finish = function(self, _, outcome)
    if outcome ~= "ok" then
      return -- the dry cycle of each load ends "dry_run": nothing measured
    end
    self.n = self.n + 1
    self.m:train({ 1, self.n }, 10 + 2 * self.n, self.now())
    self.m:observe(110, 100) -- 10% off each time
    self.hidden:train({ 1 }, 5, self.now())
  end,
}]]

describe("lupin serve's latency model series", function()
  local sim, gw

  setup(function()
    local support = require "support"
    local dir = support.tmpdir()
    support.write(dir .. "/spec-latency-trainer.lua", TRAINER)
    sim = P.sim(SIM, 1)
    gw = P.gateway({ pluginDirs = { dir },
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" },
        { type = "spec-latency-trainer" } },
      endpoints = eps(sim, "e1"), gateway = { consecutiveErrors = 0, staleEjectionMs = 0 } })
    P.poll(function()
      return P.get(gw.admin .. "/readyz") == 200
    end, "the gateway to be ready")
  end)

  teardown(function()
    P.stop(gw)
    P.stop(sim)
  end)

  it("lists each exported model once, by plugin, target and group, from the process's models",
    function()
      local labels = { plugin = "trainer", target = "ttft", group = 'gpu="a100"' }
      assert.equal(0, value(scrape(gw), "lupin_latency_model_samples_total", labels))
      for _ = 1, 3 do
        assert.equal(200, (completion(gw)))
      end
      local m, text = unpack(P.poll(function()
        local s, t = scrape(gw)
        return value(s, "lupin_latency_model_samples_total", labels) == 3 and { s, t }
      end, "the model to train on 3 requests"))
      assert.equal(3, value(m, "lupin_latency_predictions_observed_total", labels))
      assert.near(0.3, value(m, "lupin_latency_prediction_ape_total", labels), 1e-9)
      assert.near(0.1, value(m, "lupin_latency_prediction_error_ratio", labels), 1e-9)
      assert.equal("gauge", m.types.lupin_latency_prediction_error_ratio)
      assert.equal("counter", m.types.lupin_latency_model_samples_total)
      assert.truthy(text:find('group="gpu=\\"a100\\""', 1, true))
      -- the model not exported is not listed; each exported one once, whatever the workers
      assert.equal(1, #all(m, "lupin_latency_model_samples_total"))
      assert.equal(0, #all(m, "lupin_latency_model_samples_total", { target = "tpot" }))
      local out, rc = promtool(text)
      assert.equal(0, rc, out)
    end)
end)
