-- The admin /metrics of the real `lupin serve` in front of lupin-sim, after
-- real traffic: valid text exposition (promtool, from Debian's prometheus
-- package, which `make deps` installs), label values escaped, process_* and
-- lupin_build_info sane, and the endpoint picker's (EPP) families moving with
-- the requests they count, under llm-d-router's llm_d_epp_* names and again
-- under the older inference_* names it still writes (docs/metrics.md).
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

-- The EPP's families: llm-d-router's name, the deprecated name it writes
-- beside it (pkg/epp/metrics), and the labels the older one names otherwise.
local EPP = {
  { "llm_d_epp_request_total", "inference_objective_request_total" },
  { "llm_d_epp_request_error_total", "inference_objective_request_error_total" },
  { "llm_d_epp_request_duration_seconds", "inference_objective_request_duration_seconds" },
  { "llm_d_epp_request_size_bytes", "inference_objective_request_sizes" },
  { "llm_d_epp_response_size_bytes", "inference_objective_response_sizes" },
  { "llm_d_epp_request_running", "inference_objective_running_requests" },
  { "llm_d_epp_average_kv_cache_utilization", "inference_pool_average_kv_cache_utilization" },
  { "llm_d_epp_average_queue_size", "inference_pool_average_queue_size" },
  { "llm_d_epp_per_endpoint_queue_size", "inference_pool_per_pod_queue_size",
    { model_server_endpoint = "model_server_pod" } },
  { "llm_d_epp_ready_endpoints", "inference_pool_ready_pods" },
  { "llm_d_epp_scheduler_e2e_duration_seconds",
    "inference_extension_scheduler_e2e_duration_seconds" },
  { "llm_d_epp_plugin_duration_seconds", "inference_extension_plugin_duration_seconds" },
}
-- written only with flow control on
local EPP_FLOW = {
  { "llm_d_epp_flow_control_queue_size", "inference_extension_flow_control_queue_size" },
  { "llm_d_epp_flow_control_queue_bytes", "inference_extension_flow_control_queue_bytes" },
  { "llm_d_epp_flow_control_request_queue_duration_seconds",
    "inference_extension_flow_control_request_queue_duration_seconds" },
  { "llm_d_epp_flow_control_pool_saturation", "inference_extension_flow_control_pool_saturation" },
}

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

--- The samples of family fam (a histogram's _bucket, _sum and _count
--- lines included), keyed by suffix and labels, label names renamed by
--- rename (old name -> the name to compare under).
local function family_samples(m, fam, rename)
  local out, n = {}, 0
  for _, s in ipairs(m.samples) do
    local suffix = s.name == fam and "" or s.name:sub(#fam + 1)
    if s.name:sub(1, #fam) == fam and (suffix == "" or suffix == "_bucket" or suffix == "_sum"
        or suffix == "_count") then
      local keys = {}
      for k, v in pairs(s.labels) do
        keys[#keys + 1] = ((rename or {})[k] or k) .. "=" .. v
      end
      table.sort(keys)
      out[suffix .. "{" .. table.concat(keys, ",") .. "}"] = s.value
      n = n + 1
    end
  end
  return out, n
end

--- Asserts that old repeats new: the same type, a HELP that sends the
--- reader to new, and the same samples (labels renamed where upstream's
--- differ).  Returns how many samples new has.
local function assert_twin(m, new, old, relabel)
  assert.equal(m.types[new], m.types[old], old)
  assert.truthy(m.help[old] and m.help[old]:find("Deprecated: use " .. new .. ". ", 1, true),
    old .. ": " .. tostring(m.help[old]))
  local back = {}
  for k, v in pairs(relabel or {}) do
    back[v] = k
  end
  local want, n = family_samples(m, new)
  local got, n_old = family_samples(m, old, back)
  assert.same(want, got, old)
  assert.equal(n, n_old)
  return n
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

--- promtool check metrics passes text (P.promtool: llm_d_epp_'s one lint let through).
local function promtool(text)
  local err = P.promtool(text)
  assert(err == nil, err)
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
      promtool(text)
      local seen = {}
      for _, s in ipairs(m.samples) do
        local fam = s.name:gsub("_bucket$", ""):gsub("_sum$", ""):gsub("_count$", "")
        fam = m.types[fam] and fam or s.name
        assert.truthy(m.types[fam], "no TYPE for " .. s.name)
        assert.truthy(m.help[fam] and #m.help[fam] > 0, "no HELP for " .. s.name)
        seen[fam] = true
      end
      for _, fam in ipairs({ "lupin_requests_total", "lupin_build_info",
        "process_resident_memory_bytes", "llm_d_epp_request_total",
        "inference_objective_request_total", "llm_d_epp_plugin_duration_seconds",
        "inference_extension_plugin_duration_seconds", "llm_d_epp_ready_endpoints",
        "inference_pool_ready_pods" }) do
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
      assert.truthy(value(m, "llm_d_epp_request_error_total",
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
    assert.equal(3, delta("llm_d_epp_request_total", ML))
    assert.equal(3, delta("llm_d_epp_request_duration_seconds_count", ML))
    assert.truthy(delta("llm_d_epp_request_duration_seconds_sum", ML) > 0)
    assert.equal(3, delta("llm_d_epp_request_size_bytes_count", ML))
    assert.equal(sent, delta("llm_d_epp_request_size_bytes_sum", ML))
    assert.equal(3, delta("llm_d_epp_response_size_bytes_count", ML))
    assert.equal(received, delta("llm_d_epp_response_size_bytes_sum", ML))
    assert.equal(3, value(after, "llm_d_epp_request_duration_seconds_bucket",
      { model_name = "m", le = "+Inf" }) - value(before,
      "llm_d_epp_request_duration_seconds_bucket", { model_name = "m", le = "+Inf" }))
    assert.equal(0, value(after, "llm_d_epp_request_running", { model_name = "m" }))
    -- the EPP's scheduler histogram counts the cycles lupin's own does
    assert.equal(3, delta("llm_d_epp_scheduler_e2e_duration_seconds_count"))
    assert.equal(value(after, "lupin_scheduling_seconds_count"),
      value(after, "llm_d_epp_scheduler_e2e_duration_seconds_count"))
    -- one observation per plugin call, the same count as lupin's counter
    local PL = { extension_point = "Scorer", plugin_type = "queue-scorer",
      plugin_name = "queue-scorer" }
    assert.equal(3, delta("llm_d_epp_plugin_duration_seconds_count", PL))
    assert.equal(value(after, "lupin_plugin_calls_total",
        { plugin = "queue-scorer", type = "queue-scorer", point = "score" }),
      value(after, "llm_d_epp_plugin_duration_seconds_count", PL))
    assert.equal(value(after, "llm_d_epp_plugin_duration_seconds_count", PL),
      value(after, "llm_d_epp_plugin_duration_seconds_bucket",
        { plugin_name = "queue-scorer", extension_point = "Scorer", le = "+Inf" }))
    -- the pool: both endpoints fresh, the means those of the endpoints' own series
    local POOL = { name = "lupin" }
    assert.equal(2, value(after, "llm_d_epp_ready_endpoints", POOL))
    assert.equal(2, #all(after, "llm_d_epp_per_endpoint_queue_size", POOL))
    local kv = (value(after, "lupin_endpoint_kv_cache_usage", { endpoint = ODD_EP }) +
      value(after, "lupin_endpoint_kv_cache_usage", { endpoint = "e2" })) / 2
    assert.near(kv, value(after, "llm_d_epp_average_kv_cache_utilization", POOL), 1e-12)
  end)

  it("writes each llm_d_epp_* family again under its deprecated inference_* name", function()
    assert.equal(200, (completion(gw)))
    assert.equal(404, (completion(gw, ODD_MODEL))) -- an error, its label escaped in both
    local m, text = scrape(gw)
    for _, f in ipairs(EPP) do
      assert.truthy(assert_twin(m, f[1], f[2], f[3]) > 0, f[1] .. " has no sample")
    end
    -- upstream's new label for the endpoint, the older one on the twin
    assert.truthy(value(m, "llm_d_epp_per_endpoint_queue_size", { model_server_endpoint = "e2" }))
    assert.truthy(value(m, "inference_pool_per_pod_queue_size", { model_server_pod = "e2" }))
    assert.is_nil(value(m, "inference_pool_per_pod_queue_size", { model_server_endpoint = "e2" }))
    -- each twin right after its family, so the text stays one block per family
    local new = text:find("# TYPE llm_d_epp_request_total ", 1, true)
    local old = text:find("# TYPE inference_objective_request_total ", 1, true)
    local next_fam = text:find("# TYPE llm_d_epp_request_error_total ", 1, true)
    assert.truthy(new < old and old < next_fam)
    -- flow control is off here: neither name of its families
    for _, f in ipairs(EPP_FLOW) do
      assert.is_nil(m.types[f[1]], f[1])
      assert.is_nil(m.types[f[2]], f[2])
    end
  end)

  it("counts failures by the EPP's error codes", function()
    local before = scrape(gw)
    assert.equal(400, (P.post(gw.base, "/v1/completions", { prompt = "no model" })))
    assert.equal(404, (completion(gw, "unknown-model")))
    local after = scrape(gw)
    local function delta(name, labels)
      return (value(after, name, labels) or 0) - (value(before, name, labels) or 0)
    end
    assert.equal(1, delta("llm_d_epp_request_error_total",
      { model_name = "", error_code = "BadRequest" }))
    assert.equal(1, delta("llm_d_epp_request_error_total",
      { model_name = "unknown-model", error_code = "ModelServerError" }))
    -- scheduled, so counted as a request too (as the EPP does)
    assert.equal(1, delta("llm_d_epp_request_total", { model_name = "unknown-model" }))
    assert.equal(0, delta("llm_d_epp_request_duration_seconds_count",
      { model_name = "unknown-model" }))
  end)

  it("keeps at most 100 model names, the rest under <other>", function()
    for i = 1, 105 do
      completion(gw, "flood-" .. i)
    end
    local m = scrape(gw)
    local names = {}
    for _, s in ipairs(all(m, "llm_d_epp_request_total")) do
      names[#names + 1] = s.labels.model_name
    end
    assert.truthy(#names <= 101, #names)
    assert.truthy(value(m, "llm_d_epp_request_total", { model_name = "<other>" }) >= 5)
    assert.is_nil(value(m, "llm_d_epp_request_total", { model_name = "flood-105" }))
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
    assert.equal(1, value(m, "llm_d_epp_request_error_total",
      { model_name = "m", error_code = "InferencePoolResourceExhausted" }))
    assert.is_nil(value(m, "llm_d_epp_request_total", { model_name = "m" }))
    assert.equal(0, value(m, "llm_d_epp_ready_endpoints", { name = "lupin" }))
    -- no mean over no endpoint: the series is absent, as the EPP leaves it
    assert.equal(0, #all(m, "llm_d_epp_average_queue_size"))
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
      local q = value(s, "llm_d_epp_per_endpoint_queue_size", { model_server_endpoint = "e1" })
      return q and q >= 1 and s
    end, "e1's queue in the EPP's series")
    assert.equal(2, value(m, "llm_d_epp_request_running", { model_name = "m" }))
    assert.equal(2, value(m, "inference_objective_running_requests", { model_name = "m" }))
    local q1 = value(m, "llm_d_epp_per_endpoint_queue_size", { model_server_endpoint = "e1" })
    local q2 = value(m, "llm_d_epp_per_endpoint_queue_size", { model_server_endpoint = "e2" })
    assert.equal((q1 + q2) / 2, value(m, "llm_d_epp_average_queue_size", { name = "lupin" }))
    -- the clients give up: cancelled, neither running nor an error
    for i = #procs, 3, -1 do
      P.stop(procs[i])
      procs[i] = nil
    end
    m = P.poll(function()
      local s = scrape(gw)
      return value(s, "llm_d_epp_request_running", { model_name = "m" }) == 0 and s
    end, "the running requests to end")
    assert.equal(0, #all(m, "llm_d_epp_request_error_total", { model_name = "m" }))
    assert.equal(2, value(m, "llm_d_epp_request_total", { model_name = "m" }))
  end)
end)

describe("lupin serve's deprecated EPP names", function()
  local sim
  local procs = {}

  setup(function()
    -- ~3 s a request of 30 tokens: one holds the endpoint while another queues
    sim = P.sim("--model m --itl-ms 100 --default-max-tokens 8 --seed 1", 1)
  end)

  teardown(function()
    P.stop(sim)
  end)

  after_each(function()
    for i = #procs, 1, -1 do
      P.stop(procs[i])
      procs[i] = nil
    end
  end)

  -- flow control on (its families are written only then), one request at a
  -- time at the endpoint (concurrency-detector), so a second one queues
  local function flow_gateway(gateway)
    local cfg = config(eps(sim, "e1"), gateway)
    cfg.plugins[#cfg.plugins + 1] = { type = "concurrency-detector",
      parameters = { maxConcurrency = 1 } }
    cfg.saturationDetector = { pluginRef = "concurrency-detector" }
    cfg.flowControl = {}
    local gw = P.gateway(cfg)
    procs[#procs + 1] = gw
    return gw
  end

  -- a request held at the endpoint, one queued behind it: the scrape while
  -- it waits, and the one after both ended
  local function queue_one(gw)
    local a = P.send(gw, "a", { max_tokens = 30 })
    P.until_running(gw, "a")
    local b = P.send(gw, "b")
    local waiting = P.poll(function()
      local m = scrape(gw)
      return value(m, "llm_d_epp_flow_control_queue_size", { priority = "0" }) == 1 and m
    end, "b to queue")
    assert.equal(200, (P.result(a)))
    assert.equal(200, (P.result(b)))
    local m, text = scrape(gw)
    return waiting, m, text
  end

  it("writes flow control's families under both names by default", function()
    local waiting, m, text = queue_one(flow_gateway())
    for _, f in ipairs(EPP_FLOW) do
      assert_twin(waiting, f[1], f[2], f[3])
      assert_twin(m, f[1], f[2], f[3])
    end
    assert.equal(1, value(waiting, "inference_extension_flow_control_queue_size",
      { priority = "0" }))
    assert.equal(1, value(waiting, "inference_extension_flow_control_pool_saturation"))
    assert.equal(1, value(m, "inference_extension_flow_control_request_queue_duration_seconds_count",
      { priority = "0", outcome = "dispatched" }))
    promtool(text)
  end)

  it("leaves every deprecated name out with gateway.deprecatedMetricNames 0", function()
    local waiting, m, text = queue_one(flow_gateway({ consecutiveErrors = 0,
      staleEjectionMs = 0, deprecatedMetricNames = 0 }))
    for _, scraped in ipairs({ waiting, m }) do
      for fam in pairs(scraped.types) do
        assert.falsy(fam:find("^inference_"), fam)
      end
      for _, s in ipairs(scraped.samples) do
        assert.falsy(s.name:find("^inference_"), s.name)
      end
    end
    for _, list in ipairs({ EPP, EPP_FLOW }) do
      for _, f in ipairs(list) do
        assert.truthy(m.types[f[1]], f[1])
      end
    end
    assert.equal(2, value(m, "llm_d_epp_request_total", { model_name = "m" }))
    assert.equal(1, value(m, "llm_d_epp_flow_control_request_queue_duration_seconds_count",
      { priority = "0", outcome = "dispatched" }))
    promtool(text)
  end)

  it("refuses a deprecatedMetricNames other than 0 or 1 at its line", function()
    local path = P.dir .. "/bad-deprecated-names.yaml"
    require("support").write(path, table.concat({ "plugins:", "  - type: queue-scorer",
      "  - type: max-score-picker", "gateway:", "  deprecatedMetricNames: 2", "" }, "\n"))
    local out, rc = P.run(P.LUPIN .. " check --config " .. P.quote(path) .. " 2>&1")
    assert.equal(1, rc)
    assert.truthy(out:find(path .. ":5: gateway.deprecatedMetricNames: deprecatedMetricNames must "
      .. "be an integer ≤ 1, got 2", 1, true), out)
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
      promtool(text)
    end)
end)
