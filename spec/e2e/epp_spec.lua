-- lupin epp end to end: the real binary as an Envoy ext_proc endpoint picker
-- in front of real model servers (lupin-sim), driven by a real gRPC client
-- playing Envoy's ext_proc filter (spec/fixtures/epp/envoy.py, Debian's
-- python3-grpcio).  The client forwards the request Envoy would forward to
-- the picked endpoint and streams the answer back through the picker, so
-- what is checked is what a client of Envoy would get.  The protocol is the
-- Gateway API Inference Extension's endpoint picker protocol
-- (docs/proposals/004-endpoint-picker-protocol).
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local SIM = "--model m --itl-ms 1 --seed 7 --max-model-len 200000"
local MAX_CHUNK = 62000 -- the picker replays the body in chunks of at most this

local COMPLETION = { model = "m", prompt = "hello there", max_tokens = 5 }
local CHAT = { model = "m", messages = { { role = "user", content = "hello" } }, max_tokens = 5 }

local function with(t, extra)
  local c = {}
  for k, v in pairs(t) do
    c[k] = v
  end
  for k, v in pairs(extra or {}) do
    c[k] = v
  end
  return c
end

local function eps(sim)
  local list = {}
  for i, port in ipairs(sim.ports) do
    list[i] = { name = "e" .. i, address = "127.0.0.1", port = port }
  end
  return list
end

-- queue-scorer and a picker of two (a pick and a fallback); the recorder
-- sets x-recorder in pre_request and x-recorded on the response; the
-- shedder answers 429 to requests with x-shed.
local function config(endpoints, extra)
  local cfg = {
    kind = "EndpointPickerConfig",
    pluginDirs = { support.FIXTURES },
    plugins = { { type = "queue-scorer" },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 2 } },
      { type = "e2e-recorder" }, { type = "e2e-shedder" } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
    endpoints = endpoints,
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local seq = 0
local function body_file(body)
  seq = seq + 1
  local path = ("%s/epp-body-%d.json"):format(P.dir, seq)
  support.write(path, type(body) == "string" and body or json.encode(body))
  return path
end

-- One request through the picker; opts are envoy.py's request options.
local function request(epp, body, opts)
  local args = opts or ""
  if body ~= nil then
    args = args .. " --body-file " .. body_file(body)
  end
  return P.envoy(epp.grpc, "request", args)
end

local function set_of(list)
  local s = {}
  for _, v in ipairs(list) do
    s[v] = true
  end
  return s
end

local function in_list(v, list)
  return set_of(list)[v] == true
end

local function health(epp, service)
  return P.envoy(epp.health, "health", P.quote(service))
end

-- Waits until the picker holds no request in flight.
local function until_idle(epp)
  P.poll(function()
    local code, _, body = P.get(epp.admin .. "/admin/requests")
    return code == 200 and #json.decode(body).requests == 0
  end, "no request in flight")
end

-- The access-log records of request id, once there is one; a moment later
-- again, so that a second line would be seen.
local function ended(epp, id)
  P.poll(function()
    return #P.access_records(epp, id) >= 1
  end, id .. "'s access log line")
  until_idle(epp)
  os.execute("sleep 0.3")
  return P.access_records(epp, id)
end

-- dropped: llm-d's x-llm-d-request-dropped-reason expected (nil: none).
local function expect_refusal(r, status, dropped)
  assert.is_nil(r.error, r.error)
  assert.truthy(r.immediate, "no immediate response: " .. json.encode(r))
  assert.equal(status, r.immediate.status)
  assert.equal("OK", r.grpc_status)
  assert.equal("application/json", r.immediate.headers["content-type"])
  assert.equal(dropped, r.immediate.headers["x-llm-d-request-dropped-reason"])
  local e = r.immediate.body.error
  assert.truthy(e, "not an OpenAI error body: " .. json.encode(r.immediate.body))
  assert.equal("string", type(e.message))
  assert.equal("string", type(e.type))
  return e
end

describe("lupin epp", function()
  local sim, epp

  setup(function()
    sim = P.sim(SIM, 3)
    epp = P.epp(config(eps(sim)))
    P.poll(function()
      return health(epp, "readiness").status == "SERVING"
    end, "readiness")
  end)

  teardown(function()
    P.stop(epp)
    P.stop(sim)
  end)

  -- the pick, the header and the metadata agree; the request reached the
  -- endpoint picked first, with the picker's headers, and came back whole
  local function picked(r, id)
    assert.is_nil(r.error, r.error)
    assert.equal(200, r.status, json.encode(r))
    assert.equal("OK", r.grpc_status)
    assert.equal(2, #r.pick)
    for _, hp in ipairs(r.pick) do
      assert.truthy(in_list(hp, sim.hostports), hp)
    end
    assert.are_not.equal(r.pick[1], r.pick[2])
    assert.equal(r.pick_header, r.dynamic_metadata)
    assert.equal(table.concat(r.pick, ","), r.pick_header)
    assert.is_true(r.clear_route_cache)
    assert.equal(r.pick[1], r.served)
    -- lupin-sim says which endpoint answered and echoes the destination header
    assert.equal(r.served, r.headers["x-sim-endpoint"])
    assert.equal(r.pick_header, r.headers["x-sim-destination"])
    assert.equal(tostring(r.sent.length), r.set_headers["content-length"])
    assert.equal(r.sent.sha256, r.replayed.sha256)
    if id then
      assert.equal(id, r.set_headers["x-request-id"])
      assert.equal(id, r.set_headers["x-recorder"]) -- set by a plugin's pre_request
    end
    assert.equal("yes", r.headers["x-recorded"]) -- set by a plugin's response_header
  end

  describe("picks and relays", function()
    it("a completion: the model server's answer", function()
      local r = request(epp, COMPLETION, "--request-id cmpl-1")
      picked(r, "cmpl-1")
      local a = json.decode(r.body)
      assert.equal("text_completion", a.object)
      assert.equal(5, a.usage.completion_tokens)
      assert.truthy(r.sched_ms >= 0)
      local recs = ended(epp, "cmpl-1")
      assert.equal(1, #recs)
      assert.equal(200, recs[1].status)
      assert.equal("/v1/completions", recs[1].path)
    end)

    it("a streamed completion: every SSE event, then [DONE]", function()
      local r = request(epp, with(COMPLETION, { stream = true, max_tokens = 8 }),
        "--request-id cmpl-s")
      picked(r, "cmpl-s")
      assert.truthy(r.body:find("data: [DONE]", 1, true), r.body)
      local events = 0
      for _ in r.body:gmatch("data: {") do
        events = events + 1
      end
      assert.truthy(events >= 8, r.body)
      assert.truthy(r.response_chunks >= 2)
      assert.equal(1, #ended(epp, "cmpl-s"))
    end)

    it("a chat completion", function()
      local r = request(epp, CHAT, "--path /v1/chat/completions --request-id chat-1")
      picked(r, "chat-1")
      assert.equal("chat.completion", json.decode(r.body).object)
    end)

    it("a streamed chat completion", function()
      local r = request(epp, with(CHAT, { stream = true }),
        "--path /v1/chat/completions --request-id chat-s")
      picked(r, "chat-s")
      assert.truthy(r.body:find("chat.completion.chunk", 1, true), r.body)
      assert.truthy(r.body:find("data: [DONE]", 1, true), r.body)
    end)
  end)

  describe("replays the body", function()
    for _, size in ipairs({ 1024, 200 * 1024, 345 * 1024 }) do
      for _, chunk in ipairs({ 1000, 16384, 65536, 100000 }) do
        if chunk < size or chunk == 1000 then
          it(("of %d bytes sent in chunks of %d: the same bytes, each chunk <= %d"):format(size,
            chunk, MAX_CHUNK), function()
            local body = json.encode(with(COMPLETION, { prompt = "" }))
            body = json.encode(with(COMPLETION, { prompt = ("p"):rep(size - #body) }))
            assert.equal(size, #body)
            local r = request(epp, body, "--no-forward --chunk-size " .. chunk)
            assert.is_nil(r.error, r.error)
            assert.equal(size, r.replayed.length)
            assert.equal(r.sent.sha256, r.replayed.sha256)
            assert.equal(tostring(size), r.set_headers["content-length"])
            local total = 0
            for _, n in ipairs(r.replayed.chunks) do
              assert.truthy(n <= MAX_CHUNK, n)
              total = total + n
            end
            assert.equal(size, total)
            assert.truthy(#r.replayed.chunks >= math.ceil(size / MAX_CHUNK))
            assert.equal("OK", r.grpc_status)
          end)
        end
      end
    end

    it("of 345 KB to the endpoint, which answers it", function()
      local body = json.encode(with(COMPLETION, { prompt = ("word "):rep(345 * 1024 / 5) }))
      local r = request(epp, body, "--chunk-size 32768 --request-id big-1")
      picked(r, "big-1")
      assert.equal("text_completion", json.decode(r.body).object)
    end)
  end)

  describe("honours a subset hint", function()
    it("in metadata, as a list", function()
      for i = 1, 3 do
        local r = request(epp, COMPLETION, "--subset-list " .. sim.hostports[2])
        assert.is_nil(r.error, r.error)
        assert.equal(200, r.status)
        assert.same({ sim.hostports[2] }, r.pick)
        assert.equal(sim.hostports[2], r.headers["x-sim-endpoint"], "request " .. i)
      end
    end)

    it("in metadata, as one comma-separated string", function()
      local subset = { sim.hostports[1], sim.hostports[3] }
      for _ = 1, 3 do
        local r = request(epp, COMPLETION, "--subset-string " .. table.concat(subset, ","))
        assert.equal(200, r.status, json.encode(r))
        assert.equal(2, #r.pick)
        assert.same(set_of(subset), set_of(r.pick))
      end
    end)

    it("in the x-gateway-destination-endpoint-subset header", function()
      local r = request(epp, COMPLETION,
        "-H " .. P.quote("x-gateway-destination-endpoint-subset: " .. sim.hostports[3]))
      assert.equal(200, r.status, json.encode(r))
      assert.same({ sim.hostports[3] }, r.pick)
    end)

    it("and answers 503 when it names no endpoint", function()
      local r = request(epp, COMPLETION, "--request-id sub-none --subset-list 10.1.2.3:9")
      local e = expect_refusal(r, 503, "rejected-no-endpoints")
      assert.truthy(e.message:match("subset"), e.message)
      assert.is_nil(r.pick)
      assert.equal(1, #ended(epp, "sub-none"))
    end)
  end)

  it("drops a client's P/D routing headers, which only the scheduler sets", function()
    local r = request(epp, COMPLETION, "-H 'x-prefiller-host-port: 10.0.0.9:8000'")
    assert.equal(200, r.status, json.encode(r))
    assert.same({ "x-prefiller-host-port" }, r.remove_headers)
    assert.same({}, request(epp, COMPLETION).remove_headers)
  end)

  describe("refuses", function()
    it("invalid JSON with 400", function()
      expect_refusal(request(epp, "{not json", "--request-id bad-json"), 400)
      assert.equal(1, #ended(epp, "bad-json"))
    end)

    it("a body without a model with 400", function()
      expect_refusal(request(epp, { prompt = "x" }), 400)
    end)

    it("a request a plugin sheds with 429", function()
      local r = request(epp, COMPLETION, "--request-id shed-1 -H 'x-shed: 1'")
      local e = expect_refusal(r, 429, "rejected-saturated")
      assert.truthy(e.message:match("shed by e2e%-shedder"), e.message)
      assert.equal("rate_limit_error", e.type)
      local recs = ended(epp, "shed-1")
      assert.equal(1, #recs)
      assert.equal(429, recs[1].status)
    end)
  end)

  describe("ends a request exactly once when the stream ends early", function()
    for _, mode in ipairs({ "cancel", "close" }) do
      for _, phase in ipairs({ "headers", "body", "pick", "response" }) do
        it(("%s at %s"):format(mode, phase), function()
          local id = ("reset-%s-%s"):format(mode, phase)
          local body = phase == "body" and { model = "m", prompt = ("x"):rep(4000) }
            or with(COMPLETION, { stream = true, max_tokens = 50 })
          local r = request(epp, body, ("--request-id %s --reset-at %s --reset-mode %s"
            .. " --chunk-size 1000"):format(id, phase, mode))
          assert.equal(phase, r.reset_at, json.encode(r))
          local recs = ended(epp, id)
          assert.equal(1, #recs, json.encode(recs))
          assert.equal("cancelled", recs[1].outcome)
        end)
      end
    end
  end)

  -- envoy.py proxy: Envoy with the ext_proc filter as an HTTP/1.1 front
  -- (bench/routing's FRONT=epp); curl is its client
  describe("behind envoy.py proxy", function()
    local proxy, base

    setup(function()
      proxy = P.start(("%s --target %s proxy --listen 127.0.0.1:0"):format(P.ENVOY, epp.grpc))
      base = "http://" .. P.poll(function()
        local line = P.read(proxy.out) or ""
        return line:match('"listening": "([^"]+)"')
      end, "envoy.py proxy to listen")
    end)

    teardown(function()
      P.stop(proxy)
    end)

    it("streams a completion from the endpoint picked first", function()
      local status, h, text = P.post(base, "/v1/completions",
        with(COMPLETION, { stream = true, max_tokens = 8 }), "-H 'x-request-id: proxy-s'")
      assert.equal(200, status, text)
      assert.equal("chunked", h["transfer-encoding"])
      assert.equal("yes", h["x-recorded"]) -- the picker's response mutation
      assert.truthy(in_list(h["x-sim-endpoint"], sim.hostports))
      assert.equal(h["x-sim-endpoint"], h["x-sim-destination"]:match("^[^,]+"))
      assert.truthy(text:find("data: [DONE]", 1, true), text)
      local recs = ended(epp, "proxy-s")
      assert.equal(1, #recs)
      assert.equal(200, recs[1].status)
    end)

    it("answers a refusal with the picker's status and body", function()
      local status, h, text = P.post(base, "/v1/completions", COMPLETION, "-H 'x-shed: 1'")
      assert.equal(429, status, text)
      assert.equal("application/json", h["content-type"])
      assert.equal("rate_limit_error", json.decode(text).error.type)
    end)

    it("passes a GET with no body, two requests on one connection", function()
      local out = P.run(("curl -sS -o /dev/null -o /dev/null -w '%%{http_code} %%{num_connects}\\n'"
        .. " %s/v1/models %s/v1/models"):format(base, base))
      assert.equal("200 1\n200 0\n", out)
    end)
  end)

  it("answers 64 concurrent streams, each ended once", function()
    local out = P.envoy(epp.grpc, "concurrent", "64 --request-id many --body-file "
      .. body_file(COMPLETION))
    assert.same({}, out.errors)
    assert.same({ ["200"] = 64 }, out.statuses)
    for _, r in ipairs(out.results) do
      assert.equal(r.pick[1], r.served)
      assert.equal(r.pick_header, r.dynamic_metadata)
    end
    until_idle(epp)
    for i = 0, 63 do
      local id = "many-" .. i
      P.poll(function()
        return #P.access_records(epp, id) >= 1
      end, id)
      assert.equal(1, #P.access_records(epp, id), id)
    end
  end)

  it("answers grpc.health.v1 for every service the protocol names", function()
    for _, s in ipairs({ "", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor" }) do
      local h = health(epp, s)
      assert.equal("OK", h.grpc_status, s)
      assert.equal("SERVING", h.status, s)
    end
    assert.equal("NOT_FOUND", health(epp, "no.such.Service").grpc_status)
  end)

  it("counts the requests in /metrics", function()
    local before = P.metric(epp, 'lupin_requests_total{status="200"}') or 0
    for _ = 1, 3 do
      assert.equal(200, request(epp, COMPLETION).status)
    end
    P.poll(function()
      return P.metric(epp, 'lupin_requests_total{status="200"}') == before + 3
    end, "three more requests counted")
    local _, _, text = P.get(epp.admin .. "/metrics")
    assert.truthy(text:find("inference_objective_request_total", 1, true))
    assert.truthy(text:find("lupin_scheduling_seconds_count", 1, true))
  end)
end)

describe("lupin epp without endpoints", function()
  local epp

  setup(function()
    epp = P.epp(config(nil, { gateway = { allowEmptyEndpoints = true } }))
  end)

  teardown(function()
    P.stop(epp)
  end)

  it("is live but not ready", function()
    assert.equal("SERVING", health(epp, "liveness").status)
    assert.equal("NOT_SERVING", health(epp, "readiness").status)
    assert.equal("NOT_SERVING", health(epp, "envoy.service.ext_proc.v3.ExternalProcessor").status)
  end)

  it("answers 503 with an OpenAI error", function()
    local r = request(epp, COMPLETION, "--request-id none-1")
    expect_refusal(r, 503, "rejected-no-endpoints")
    assert.equal(1, #ended(epp, "none-1"))
  end)
end)

-- Parity: the same config, endpoints and requests through lupin serve and
-- lupin epp give the same picks.  Deterministic by construction: the only
-- scorer is prefix-cache-scorer (fixed 16-character blocks, no auto-tuning),
-- the picker takes one endpoint.  Each of four distinct prompt prefixes is
-- first sent with a subset hint naming one endpoint (the only candidate, so
-- that is the pick, and pre_request records the prefix's blocks there);
-- every later request with that prefix then scores 1 x its matched share at
-- that endpoint and 0 at every other, a unique maximum: no tie for the
-- random tie-break to decide.
describe("lupin epp and lupin serve", function()
  local sim

  setup(function()
    sim = P.sim(SIM, 4)
  end)

  teardown(function()
    P.stop(sim)
  end)

  local function parity_config()
    return {
      kind = "EndpointPickerConfig",
      plugins = { { type = "prefix-cache-scorer", parameters = { blockSize = 16, autoTune = false } },
        { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "prefix-cache-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
      endpoints = eps(sim),
    }
  end

  local PREFIXES = {}
  for i = 1, 4 do
    PREFIXES[i] = ("prefix %d: "):format(i) .. (string.char(96 + i)):rep(200)
  end
  -- the sequence after seeding: prefix index and a distinct suffix
  local SEQUENCE = { 3, 1, 4, 1, 2, 2, 4, 3, 1, 3 }

  local function body(i, n)
    return { model = "m", prompt = PREFIXES[i] .. " question " .. n, max_tokens = 2 }
  end

  it("give the same picks for the same requests", function()
    local gw = P.gateway(parity_config())
    local epp = P.epp(parity_config())
    local serve, picker = {}, {}
    for i = 1, 4 do
      local hp = sim.hostports[i]
      local status, h = P.post(gw.base, "/v1/completions", body(i, 0),
        "-H " .. P.quote("x-gateway-destination-endpoint-subset: " .. hp))
      assert.equal(200, status)
      assert.equal(hp, h["x-sim-endpoint"])
      local r = request(epp, body(i, 0), "--subset-list " .. hp)
      assert.equal(200, r.status, json.encode(r))
      assert.equal(hp, r.pick[1])
    end
    for n, i in ipairs(SEQUENCE) do
      local status, h = P.post(gw.base, "/v1/completions", body(i, n))
      assert.equal(200, status)
      serve[n] = h["x-sim-endpoint"]
      local r = request(epp, body(i, n))
      assert.equal(200, r.status, json.encode(r))
      picker[n] = r.pick[1]
      assert.equal(sim.hostports[i], picker[n], "request " .. n)
    end
    assert.same(serve, picker)
    P.stop(gw)
    P.stop(epp)
  end)
end)

-- Flow control as lupin serve's spec drives it: one endpoint taking one
-- request at a time (concurrency-detector), so "saturated" is exact; the
-- stream of a held request waits for its pick.
describe("lupin epp under flow control", function()
  local SLOW = "--model m --itl-ms 100 --default-max-tokens 8 --seed 1"
  local sim

  setup(function()
    sim = P.sim(SLOW, 1)
  end)
  teardown(function()
    P.stop(sim)
  end)

  local function fc_config(fc)
    return {
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" },
        { type = "concurrency-detector", parameters = { maxConcurrency = 1 } } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
      saturationDetector = { pluginRef = "concurrency-detector" },
      flowControl = fc,
      endpoints = { { name = "e1", address = "127.0.0.1", port = sim.ports[1] } },
    }
  end

  -- a request through envoy.py in the background; its result once done
  local function send(epp, id, body, extra)
    local p = P.start(("%s --target %s request --body-file %s --request-id %s %s"):format(P.ENVOY,
      epp.grpc, body_file(body), id, extra or ""))
    return function()
      P.wait(p)
      return json.decode(P.read(p.out))
    end
  end

  local function queued(epp)
    local _, _, body = P.get(epp.admin .. "/admin/flows")
    local n = 0
    for _, b in ipairs(json.decode(body).bands or {}) do
      n = n + b.queued
    end
    return n
  end

  it("holds a request while the pool is saturated, and picks it once it frees", function()
    local epp = P.epp(fc_config({}))
    local a = send(epp, "fa", with(COMPLETION, { max_tokens = 30 }))
    P.until_running(epp, "fa")
    local b = send(epp, "fb", COMPLETION)
    P.poll(function()
      return queued(epp) == 1
    end, "fb queued")
    assert.equal(200, a().status)
    local rb = b()
    assert.equal(200, rb.status, json.encode(rb))
    assert.same({ sim.hostports[1] }, rb.pick)
    assert.equal(1, P.metric(epp, 'lupin_flow_control_requests_total{priority="0",outcome="dispatched"}'))
    P.stop(epp)
  end)

  it("with enableEviction, answers a sent sheddable request 429 evicted for a higher one", function()
    local epp = P.epp(fc_config({ enableEviction = true }))
    local low = send(epp, "el", with(COMPLETION, { max_tokens = 30 }),
      "-H 'x-llm-d-inference-objective: -1'")
    P.until_running(epp, "el")
    local high = send(epp, "eh", COMPLETION)
    local rl = low()
    local e = expect_refusal(rl, 429, "evicted")
    assert.is_true(rl.after_pick, json.encode(rl)) -- picked, then taken back
    assert.matches("evicted by flow control after it was sent", e.message, 1, true)
    local rh = high()
    assert.equal(200, rh.status, json.encode(rh))
    assert.equal("evicted", ended(epp, "el")[1].outcome)
    P.stop(epp)
  end)

  it("refuses a request held past its TTL with 429, and ends it once", function()
    local epp = P.epp(fc_config({ defaultRequestTTL = "100ms" }))
    local a = send(epp, "ta", with(COMPLETION, { max_tokens = 30 }))
    P.until_running(epp, "ta")
    local rb = send(epp, "tb", COMPLETION)()
    local e = expect_refusal(rb, 429, "rejected-ttl-expired")
    assert.matches("past its TTL", e.message, 1, true)
    assert.equal(200, a().status)
    assert.equal(1, #ended(epp, "tb"))
    assert.equal(1, P.metric(epp, 'lupin_flow_control_requests_total{priority="0",outcome="queue_ttl"}'))
    P.stop(epp)
  end)
end)

describe("lupin epp and the endpoints' health", function()
  it("counts the served endpoint's 5xx answers and ejects it, as serve does", function()
    local sim = P.sim("--model m --itl-ms 1 --error-rate 1", 1)
    local epp = P.epp(config(eps(sim), { gateway = { consecutiveErrors = 2, refreshIntervalMs = 50 } }))
    P.poll(function()
      return health(epp, "readiness").status == "SERVING"
    end, "readiness")
    for i = 1, 2 do
      local r = request(epp, COMPLETION, "--request-id sick-" .. i)
      assert.equal(500, r.status, json.encode(r))
      assert.equal(sim.hostports[1], r.served)
    end
    local _, _, body = P.get(epp.admin .. "/admin/endpoints")
    local ep = json.decode(body).endpoints[1]
    assert.equal("ejected", ep.health.state, body)
    P.stop(epp)
    P.stop(sim)
  end)
end)

describe("lupin epp's command line", function()
  local function run(args)
    return P.run(("%s epp %s 2>&1"):format(P.LUPIN, args))
  end

  it("refuses a bad flag, value or combination with exit 2 and what to do", function()
    local cases = {
      { "--config-file x --bogus 1", "bad argument --bogus" },
      { "--config-file x --grpc-port=70000", "--grpc-port 70000: give a port number" },
      { "--config-file x --log-level loud", "--log-level loud: give error, warn, info or debug" },
      { "--config-file x --log-format xml", "--log-format xml: give text or json" },
      { "--config-file x --secure-serving=true", "pass --secure-serving=false" },
      { "--grpc-port 1", "give one of --config-file FILE and --config-text TEXT" },
      { "--config-file x --config-text y", "give one of --config-file FILE and --config-text TEXT" },
      { "--config-file x --pool-group g", "go with --pool-name" },
    }
    for _, c in ipairs(cases) do
      local out, rc = run(c[1])
      assert.equal(2, rc, c[1] .. ": " .. out)
      assert.truthy(out:find(c[2], 1, true), c[1] .. ": " .. out)
    end
  end)

  it("takes the EPP's --flag=value form and an inline config (--config-text)", function()
    local sim = P.sim(SIM, 1)
    local cfg = json.encode(config(eps(sim)))
    local p = P.start(("%s epp --config-text=%s --bind-address=127.0.0.1 --grpc-port=0"
      .. " --grpc-health-port=0 --metrics-port=0 --secure-serving=false"):format(P.LUPIN,
      P.quote(cfg)))
    local grpc = P.poll(function()
      return (P.read(p.out) or ""):match("listening on grpc://(%S+)") or P.read(p.rc)
    end, "lupin epp to listen")
    assert.truthy(grpc:match(":%d+$"), P.read(p.err))
    local r = P.envoy(grpc, "request", "--body-file " .. body_file(COMPLETION))
    assert.equal(200, r.status, json.encode(r))
    P.signal(p, "TERM")
    assert.equal(0, P.wait(p))
    P.stop(sim)
  end)
end)
