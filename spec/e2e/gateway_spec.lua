-- lupin serve end to end: the real binary, a real model server (the fixture
-- spec/fixtures/gateway/upstream.py until lupin-sim is on main), curl.
local P = require "e2e.procs"
local json = P.json

local function config(endpoints, gateway, extra)
  local cfg = {
    kind = "EndpointPickerConfig",
    plugins = { { type = "queue-scorer" },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 2 } } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
    endpoints = endpoints,
    gateway = gateway,
  }
  for k, v in pairs(extra or {}) do
    cfg[k] = v
  end
  return cfg
end

local function ep(name, up_or_port)
  local port = type(up_or_port) == "table" and up_or_port.port or up_or_port
  return { name = name, address = "127.0.0.1", port = port }
end

local COMPLETION = { model = "m", prompt = "hello there" }
local CHAT = { model = "m", messages = { { role = "user", content = "hello" } } }

local function ok_request(gw)
  local status, _, body = P.post(gw.base, "/v1/completions", COMPLETION)
  assert.equal(200, status, body)
end

local function sse_events(body)
  local events = {}
  for block in body:gmatch("(.-)\n\n") do
    events[#events + 1] = block
  end
  return events
end

describe("lupin serve", function()
  local a, b, gw

  setup(function()
    a = P.upstream("--name A --model m")
    b = P.upstream("--name B --model other --waiting 3")
    gw = P.gateway(config({ ep("a", a), ep("b", b) }, { maxBodyBytes = 4096,
      maxHeaderBytes = 2048 }))
  end)

  teardown(function()
    P.stop(gw)
    P.stop(a)
    P.stop(b)
  end)

  describe("proxies", function()
    it("a completion: the body unchanged, the destination header upstream", function()
      local text = json.encode(COMPLETION)
      local status, h, body = P.post(gw.base, "/v1/completions", text)
      assert.equal(200, status, body)
      local r = json.decode(body)
      assert.equal("text_completion", r.object)
      assert.equal("hi from A", r.choices[1].text)
      assert.equal(5, r.usage.total_tokens)
      assert.equal(a.hostport, r.received["x-gateway-destination-endpoint"])
      assert.equal(#text, r.received.body_bytes)
      assert.equal(h["x-request-id"], r.received["x-request-id"])
      assert.truthy(h["x-request-id"]:match("%S"))
      assert.equal("application/json", h["content-type"])
    end)

    it("keeps the client's x-request-id and drops the headers the gateway consumes", function()
      local _, h, body = P.post(gw.base, "/v1/completions", COMPLETION,
        "-H 'x-request-id: my-id-1' -H 'x-gateway-inference-objective: 3' -H 'x-custom: yes'")
      local r = json.decode(body)
      assert.equal("my-id-1", h["x-request-id"])
      assert.equal("my-id-1", r.received["x-request-id"])
      assert.is_nil(r.received["x-gateway-inference-objective"])
      assert.equal("yes", r.received["x-custom"])
    end)

    it("a chat completion", function()
      local status, _, body = P.post(gw.base, "/v1/chat/completions", CHAT)
      assert.equal(200, status)
      local r = json.decode(body)
      assert.equal("chat.completion", r.object)
      assert.equal("hi from A", r.choices[1].message.content)
    end)

    for _, case in ipairs({ { "/v1/completions", COMPLETION, "text_completion" },
      { "/v1/chat/completions", CHAT, "chat.completion.chunk" } }) do
      it("a streamed " .. case[1] .. " with its SSE framing intact", function()
        local req = {}
        for k, v in pairs(case[2]) do
          req[k] = v
        end
        req.stream = true
        local status, h, body = P.post(gw.base, case[1], req)
        assert.equal(200, status)
        assert.equal("text/event-stream", h["content-type"])
        local events = sse_events(body)
        assert.equal(5, #events)
        for i = 1, 4 do
          assert.equal(case[3], json.decode(events[i]:match("^data: (.*)$")).object)
        end
        assert.equal(a.hostport, json.decode(events[1]:sub(7)).received[
          "x-gateway-destination-endpoint"])
        assert.equal(5, json.decode(events[4]:sub(7)).usage.total_tokens)
        assert.equal("data: [DONE]", events[5])
        assert.equal("", body:gsub(".*\n\n", ""), "nothing after the last event")
      end)
    end

    it("GET /v1/models merged from every endpoint", function()
      local status, _, body = P.get(gw.base .. "/v1/models")
      assert.equal(200, status)
      local r = json.decode(body)
      local ids = {}
      for _, m in ipairs(r.data) do
        ids[#ids + 1] = m.id
      end
      table.sort(ids)
      assert.same({ "m", "other" }, ids)
      assert.equal("list", r.object)
    end)

    it("honors x-gateway-destination-endpoint-subset", function()
      local _, h, body = P.post(gw.base, "/v1/completions", COMPLETION,
        "-H 'x-gateway-destination-endpoint-subset: " .. b.hostport .. "'")
      assert.equal("B", json.decode(body).served_by)
      assert.equal(b.hostport, h["x-gateway-destination-endpoint"])
    end)
  end)

  describe("answers errors in the OpenAI shape and keeps serving", function()
    local function expect_error(status, pattern, got_status, headers, body)
      assert.equal(status, got_status, body)
      assert.equal("application/json", headers["content-type"])
      local e = json.decode(body).error
      assert.truthy(e.message:match(pattern), e.message)
      assert.is_string(e.type)
      assert.equal(json.null, e.code)
      ok_request(gw)
      return e
    end

    it("404 unknown route", function()
      expect_error(404, "unknown route GET /v2/nothing", P.get(gw.base .. "/v2/nothing"))
    end)

    it("405 wrong method", function()
      expect_error(405, "use POST", P.get(gw.base .. "/v1/completions"))
      expect_error(405, "use GET", P.post(gw.base, "/v1/models", COMPLETION))
    end)

    it("400 invalid JSON", function()
      expect_error(400, "not valid JSON", P.post(gw.base, "/v1/completions", "{nope"))
    end)

    it("400 missing model, naming the parameter", function()
      local e = expect_error(400, 'missing "model"',
        P.post(gw.base, "/v1/completions", { prompt = "x" }))
      assert.equal("model", e.param)
    end)

    it("400 wrong types", function()
      expect_error(400, '"model" must be a non%-empty string',
        P.post(gw.base, "/v1/completions", { model = 3, prompt = "x" }))
      expect_error(400, '"stream" must be true or false',
        P.post(gw.base, "/v1/completions", { model = "m", prompt = "x", stream = "yes" }))
      expect_error(400, '"messages" must be a list',
        P.post(gw.base, "/v1/chat/completions", { model = "m", messages = "hi" }))
      expect_error(400, '"max_tokens" must be a number',
        P.post(gw.base, "/v1/completions", { model = "m", prompt = "x", max_tokens = "9" }))
    end)

    it("413 body over maxBodyBytes", function()
      expect_error(413, "maxBodyBytes", P.post(gw.base, "/v1/completions",
        { model = "m", prompt = ("x"):rep(5000) }))
    end)

    it("431 headers over maxHeaderBytes", function()
      expect_error(431, "maxHeaderBytes", P.post(gw.base, "/v1/completions", COMPLETION,
        "-H 'x-big: " .. ("y"):rep(3000) .. "'"))
    end)

    it("503 no endpoint, saying why", function()
      expect_error(503, "subset", P.post(gw.base, "/v1/completions", COMPLETION,
        "-H 'x-gateway-destination-endpoint-subset: 10.1.2.3:9'"))
    end)
  end)

  describe("admin", function()
    it("answers /healthz, /readyz, /admin/endpoints, /admin/requests and /metrics", function()
      assert.equal(200, (P.get(gw.admin .. "/healthz")))
      P.poll(function()
        return P.get(gw.admin .. "/readyz") == 200
      end, "readiness")
      local s, _, body = P.get(gw.admin .. "/admin/endpoints")
      assert.equal(200, s)
      local eps = {}
      for _, e in ipairs(json.decode(body).endpoints) do
        eps[e.name] = e
      end
      P.poll(function()
        local _, _, t = P.get(gw.admin .. "/admin/endpoints")
        for _, e in ipairs(json.decode(t).endpoints) do
          eps[e.name] = e
        end
        return eps.b.metrics.waiting_queue_size == 3
      end, "b's scraped queue")
      assert.equal(0.25, eps.a.metrics.kv_cache_usage) -- the legacy name
      -- escaped quotes and braces in a label, a timestamp after the value
      assert.equal(1, eps.a.metrics.running_requests)
      -- of two lora_requests_info series, the latest value wins, not the last line
      assert.equal("a1", eps.a.metrics.running_lora_adapters)
      assert.equal("", eps.a.metrics.waiting_lora_adapters)
      assert.equal(2, eps.a.metrics.max_lora)
      assert.equal(16, eps.a.metrics.cache_block_size)
      assert.equal(1000, eps.a.metrics.num_blocks)
      s, _, body = P.get(gw.admin .. "/admin/requests")
      assert.equal(200, s)
      assert.same({}, json.decode(body).requests)
      ok_request(gw)
      assert.truthy(P.metric(gw, 'lupin_requests_total{status="200"}') >= 1)
      assert.truthy(P.metric(gw, 'lupin_request_outcomes_total{outcome="ok"}') >= 1)
      assert.truthy(P.metric(gw, "lupin_scheduling_seconds_count") >= 1)
      assert.truthy(P.metric(gw,
        'lupin_plugin_calls_total{plugin="queue-scorer",type="queue-scorer",point="score"}') >= 1)
      assert.equal(3, P.metric(gw, 'lupin_endpoint_waiting_queue_size{endpoint="b"}'))
      assert.equal(0, P.metric(gw, "lupin_live_requests"))
      assert.truthy(P.metric(gw, "lupin_lua_memory_bytes") > 0)
      assert.is_number(P.metric(gw, "lupin_live_request_tables"))
      -- the upstream connection went back to the pool
      _, _, body = P.get(gw.admin .. "/admin/endpoints")
      local idle = 0
      for _, e in ipairs(json.decode(body).endpoints) do
        idle = idle + e.idle_connections
      end
      assert.truthy(idle >= 1)
    end)

    it("404 on unknown admin routes", function()
      assert.equal(404, (P.get(gw.admin .. "/nothing")))
    end)
  end)
end)

describe("lupin serve, failures upstream", function()
  local live, gw, procs

  before_each(function()
    procs = {}
  end)

  after_each(function()
    for _, p in ipairs(procs) do
      P.stop(p)
    end
  end)

  local function start_gateway(cfg, args)
    gw = P.gateway(cfg, args)
    procs[#procs + 1] = gw
    return gw
  end

  local function start_upstream(args)
    local p = P.upstream(args)
    procs[#procs + 1] = p
    return p
  end

  it("falls back to the next pick when the primary refuses connections", function()
    live = start_upstream("--name L --waiting 3")
    -- port 1: nothing listens; with no metrics its queue reads 0, so it ranks first
    start_gateway(config({ ep("dead", 1), ep("live", live) }))
    P.poll(function()
      local _, _, t = P.get(gw.admin .. "/admin/endpoints")
      return t:match('"waiting_queue_size":3')
    end, "the live endpoint's metrics")
    local status, h, body = P.post(gw.base, "/v1/completions", COMPLETION)
    assert.equal(200, status, body)
    assert.equal("L", json.decode(body).served_by)
    assert.equal(live.hostport, h["x-gateway-destination-endpoint"])
  end)

  it("408 when the request is not read within headerTimeoutMs", function()
    live = start_upstream("--name W")
    start_gateway(config({ ep("w", live) }, { headerTimeoutMs = 200 }))
    local port = gw.base:match(":(%d+)$")
    -- half a request over a raw socket; the gateway answers and closes
    local out = P.run(("bash -c 'exec 3<>/dev/tcp/127.0.0.1/%s; printf \"POST /v1/completions "
      .. "HTTP/1.1\\r\\nHost: x\\r\\n\" >&3; cat <&3'"):format(port))
    assert.truthy(out:match("^HTTP/1.1 408"), out)
    assert.truthy(out:match("headerTimeoutMs"), out)
    ok_request(gw)
  end)

  it("502 when no pick can be reached, naming them", function()
    start_gateway(config({ ep("dead", 1) }))
    local status, _, body = P.post(gw.base, "/v1/completions", COMPLETION)
    assert.equal(502, status)
    assert.truthy(json.decode(body).error.message:match("127.0.0.1:1"))
    assert.equal(502, (P.post(gw.base, "/v1/completions", COMPLETION)))
  end)

  it("504 when the endpoint does not answer within firstByteTimeoutMs", function()
    live = start_upstream("--name S")
    start_gateway(config({ ep("s", live) }, { firstByteTimeoutMs = 100 }))
    local status, _, body = P.post(gw.base, "/v1/completions",
      { model = "m", prompt = "sleep:2000" })
    assert.equal(504, status)
    assert.truthy(json.decode(body).error.message:match("firstByteTimeoutMs"))
    assert.equal(1, P.metric(gw, 'lupin_request_outcomes_total{outcome="timeout"}'))
    ok_request(gw)
  end)

  it("429 when admission sheds the request", function()
    live = start_upstream("--name Q --waiting 10")
    local cfg = config({ ep("q", live) })
    table.insert(cfg.plugins, { type = "saturation-detector",
      parameters = { metricsStalenessThreshold = 60000 } })
    start_gateway(cfg)
    P.poll(function()
      local _, _, t = P.get(gw.admin .. "/admin/endpoints")
      return t:match('"waiting_queue_size":10')
    end, "metrics")
    local status, h, body = P.post(gw.base, "/v1/completions", COMPLETION,
      "-H 'x-gateway-inference-objective: -1'")
    assert.equal(429, status)
    assert.equal("application/json", h["content-type"])
    assert.truthy(json.decode(body).error.message:match("saturated"))
    ok_request(gw) -- priority 0 is not sheddable
  end)

  it("relays an upstream 500 and counts it as an upstream error", function()
    live = start_upstream("--name F")
    start_gateway(config({ ep("f", live) }))
    assert.equal(500, (P.post(gw.base, "/v1/completions", { model = "m", prompt = "fail500" })))
    assert.equal(1, P.metric(gw, 'lupin_request_outcomes_total{outcome="upstream_error"}'))
    ok_request(gw)
  end)

  it("cuts the client's stream when the endpoint drops mid-stream", function()
    live = start_upstream("--name D")
    start_gateway(config({ ep("d", live) }))
    local status, _, body, rc = P.post(gw.base, "/v1/completions",
      { model = "m", prompt = "drop", stream = true })
    assert.equal(200, status)
    assert.truthy(body:match("^data: "))
    assert.is_nil(body:match("%[DONE%]"))
    assert.not_equal(0, rc)
    assert.equal(1, P.metric(gw, 'lupin_request_outcomes_total{outcome="upstream_error"}'))
    ok_request(gw)
  end)

  it("a client that disconnects cancels the request", function()
    live = start_upstream("--name C")
    start_gateway(config({ ep("c", live) }))
    P.post(gw.base, "/v1/completions", { model = "m", prompt = "sleep:3000" }, "--max-time 0.3")
    P.poll(function()
      return P.metric(gw, 'lupin_request_outcomes_total{outcome="cancelled"}') == 1
    end, "the cancel")
    assert.equal(0, P.metric(gw, "lupin_live_requests"))
    ok_request(gw)
  end)

  it("readiness follows a stopped endpoint going stale", function()
    live = start_upstream("--name R")
    start_gateway(config({ ep("r", live) }, { metricsStalenessMs = 200 }))
    P.poll(function()
      return P.get(gw.admin .. "/readyz") == 200
    end, "ready")
    P.stop(live)
    P.poll(function()
      return P.get(gw.admin .. "/readyz") == 503
    end, "not ready")
  end)

  it("SIGTERM lets a request in flight complete, then exits 0", function()
    live = start_upstream("--name T")
    start_gateway(config({ ep("t", live) }))
    local client = P.start(("curl -sS -o %s/sigterm.body -w '%%{http_code}' -d %s %s"):format(
      P.dir, P.quote(json.encode({ model = "m", prompt = "sleep:500" })),
      P.quote(gw.base .. "/v1/completions")))
    procs[#procs + 1] = client
    P.poll(function()
      local _, _, t = P.get(gw.admin .. "/admin/requests")
      return #json.decode(t).requests == 1
    end, "the request in flight")
    P.signal(gw, "TERM")
    assert.equal(0, P.wait(gw))
    assert.equal(0, P.wait(client))
    assert.equal("200", P.read(client.out))
    assert.equal("T", json.decode(P.read(P.dir .. "/sigterm.body")).served_by)
  end)

  it("protects the admin listener with a bearer token", function()
    live = start_upstream("--name K")
    start_gateway(config({ ep("k", live) }), "--admin-token s3cret")
    assert.equal(401, (P.get(gw.admin .. "/metrics")))
    assert.equal(401, (P.get(gw.admin .. "/metrics", "-H 'authorization: Bearer nope'")))
    assert.equal(200, (P.get(gw.admin .. "/metrics", "-H 'authorization: Bearer s3cret'")))
  end)

  it("re-reads a watched endpoints file", function()
    local one, two = start_upstream("--name One"), start_upstream("--name Two")
    local file = P.dir .. "/endpoints.json"
    local support = require "support"
    support.write(file, json.encode({ ep("one", one) }))
    start_gateway(config(nil), "--endpoints " .. file)
    assert.equal("One", json.decode((select(3, P.post(gw.base, "/v1/completions",
      COMPLETION)))).served_by)
    support.write(file, json.encode({ ep("two", two) }))
    P.poll(function()
      local _, _, t = P.get(gw.admin .. "/admin/endpoints")
      local list = json.decode(t).endpoints
      return #list == 1 and list[1].name == "two"
    end, "the new endpoint list")
    assert.equal("Two", json.decode((select(3, P.post(gw.base, "/v1/completions",
      COMPLETION)))).served_by)
  end)
end)

describe("lupin check", function()
  local support = require "support"

  local function check(cfg)
    local path = P.dir .. "/check.json"
    support.write(path, cfg)
    local out, rc = P.run(P.LUPIN .. " check --config " .. path .. " 2>&1")
    return rc, out, path
  end

  it("accepts a good config", function()
    local rc, out = check(json.encode(config({ ep("a", 8000) })))
    assert.equal(0, rc, out)
    assert.truthy(out:match("ok %(1 endpoints%)"))
  end)

  it("rejects a broken one with the file, line and path", function()
    local rc, out, path = check('{\n "plugins": [],\n "endpoints": [\n  {"address": "10.0.0.1",\n'
      .. '   "port": "x"}\n ]\n}\n')
    assert.not_equal(0, rc)
    assert.truthy(out:find(path .. ":5: endpoints[0].port: port must be an integer", 1, true), out)
  end)

  it("rejects an unknown plugin type", function()
    local cfg = config({})
    cfg.plugins[1].type = "no-such-scorer"
    local rc, out = check(json.encode(cfg))
    assert.not_equal(0, rc)
    assert.truthy(out:match("no%-such%-scorer"), out)
  end)
end)

describe("lupin serve, the request lifecycle on the real response path", function()
  local up, gw

  setup(function()
    up = P.upstream("--name H")
    local cfg = config({ ep("h", up) }, { firstByteTimeoutMs = 300 },
      { pluginDirs = { require("support").FIXTURES } })
    table.insert(cfg.plugins, { type = "e2e-recorder" })
    gw = P.gateway(cfg)
  end)

  teardown(function()
    P.stop(gw)
    P.stop(up)
  end)

  -- the journal the recorder logged from finish for request id
  local function journal(id)
    return P.poll(function()
      return (P.read(gw.err) or ""):match("request " .. id:gsub("%-", "%%-")
        .. " %[e2e%-recorder%] journal ([^\n]*)")
    end, "the journal of " .. id)
  end

  local function send(id, body, extra)
    return P.post(gw.base, "/v1/completions", body,
      "-H 'x-request-id: " .. id .. "' " .. (extra or ""))
  end

  local ALL = "admit:m prepare pre_request:h response_header:200 response_complete chunks:some"

  it("a full response: every point in order, plugin headers both ways", function()
    local status, h, body = send("life-ok", COMPLETION)
    assert.equal(200, status)
    assert.equal("yes", h["x-recorded"])
    assert.equal("life-ok", json.decode(body).received["x-recorder"])
    assert.equal(ALL .. " finish:ok", journal("life-ok"))
  end)

  it("a streamed response: every chunk seen", function()
    send("life-stream", { model = "m", prompt = "x", stream = true })
    assert.equal(ALL .. " finish:ok", journal("life-stream"))
  end)

  it("an upstream 500", function()
    send("life-500", { model = "m", prompt = "fail500" })
    assert.equal("admit:m prepare pre_request:h response_header:500 response_complete "
      .. "chunks:some finish:upstream_error", journal("life-500"))
  end)

  it("an upstream dropped mid-stream", function()
    send("life-drop", { model = "m", prompt = "drop", stream = true })
    assert.equal("admit:m prepare pre_request:h response_header:200 chunks:some "
      .. "finish:upstream_error", journal("life-drop"))
  end)

  it("a client that disconnects mid-stream", function()
    send("life-cancel", { model = "m", prompt = "slowstream:3000", stream = true },
      "--max-time 0.5")
    assert.equal("admit:m prepare pre_request:h response_header:200 chunks:some finish:cancelled",
      journal("life-cancel"))
  end)

  it("a timeout", function()
    send("life-timeout", { model = "m", prompt = "sleep:2000" })
    assert.equal("admit:m prepare pre_request:h finish:timeout", journal("life-timeout"))
  end)

  it("no endpoint", function()
    send("life-none", COMPLETION, "-H 'x-gateway-destination-endpoint-subset: 10.0.0.1:1'")
    assert.equal("admit:m prepare finish:no_endpoint", journal("life-none"))
    assert.equal(0, P.metric(gw, "lupin_live_requests"))
  end)
end)
