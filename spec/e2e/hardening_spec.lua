-- lupin serve against hostile input, end to end (issue 12): headers plugins
-- set from client data, bodies that are not strict JSON, scraped values that
-- are not finite, memory bounds, the admin listener.  The real binary, the
-- fixture model server spec/fixtures/gateway/upstream.py (it echoes what it
-- received and lists every request line at GET /seen), curl.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local function config(endpoints, gateway, plugins, profile)
  return {
    kind = "EndpointPickerConfig",
    pluginDirs = { support.FIXTURES },
    plugins = plugins or { { type = "queue-scorer" }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = profile or {
      { pluginRef = "queue-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
    endpoints = endpoints,
    gateway = gateway,
  }
end

local function ep(name, port)
  return { name = name, address = "127.0.0.1", port = port }
end

-- a text that is one JSON value, or nil: what a strict reader makes of it
-- (lua-cjson does not check UTF-8: Python's decoder does)
local strict = json.new()
strict.decode_invalid_numbers(false)
local function strict_json(text)
  local file = support.write(P.dir .. "/strict.json", text)
  local _, rc = P.run("python3 -c 'import sys; sys.stdin.buffer.read().decode(\"utf-8\")' < "
    .. file .. " 2>/dev/null")
  local ok, v = pcall(strict.decode, text)
  return rc == 0 and ok and v or nil
end

-- One line of the Prometheus text format: name, labels (unescaped), value;
-- nil when the line is not exactly one sample.
local function sample(line)
  local name, rest = line:match("^([%a_:][%w_:]*)(.*)$")
  if not name then
    return nil
  end
  local labels, i = {}, 1
  if rest:sub(1, 1) == "{" then
    i = 2
    while rest:sub(i, i) ~= "}" do
      local label, j = rest:match('^([%a_][%w_]*)="()', i)
      if not label then
        return nil
      end
      local value = {}
      while rest:sub(j, j) ~= '"' do
        local c = rest:sub(j, j)
        if c == "" then
          return nil
        elseif c == "\\" then
          local e = rest:sub(j + 1, j + 1)
          value[#value + 1] = e == "n" and "\n" or e
          j = j + 2
        else
          value[#value + 1] = c
          j = j + 1
        end
      end
      labels[label] = table.concat(value)
      i = j + 1
      if rest:sub(i, i) == "," then
        i = i + 1
      end
    end
    i = i + 1
  end
  local value = rest:sub(i):match("^ (%S+)$")
  if value then
    return name, labels, value
  end
end

describe("lupin serve, hardened", function()
  local procs = {}

  after_each(function()
    for _, p in ipairs(procs) do
      P.stop(p)
    end
    procs = {}
  end)

  local function upstream(args)
    local p = P.upstream(args)
    procs[#procs + 1] = p
    return p
  end

  local function gateway(cfg, args)
    local p = P.gateway(cfg, args)
    procs[#procs + 1] = p
    return p
  end

  -- the request lines the upstream received, scrapes left out
  local function seen(up)
    local _, _, body = P.get("http://" .. up.hostport .. "/seen")
    local out = {}
    for _, line in ipairs(json.decode(body)) do
      if line ~= "GET /metrics HTTP/1.1" then
        out[#out + 1] = line
      end
    end
    return out
  end

  describe("headers plugins set from client data", function()
    local INJECTOR = { { type = "queue-scorer" }, { type = "max-score-picker" },
      { type = "e2e-header-injector", name = "injector" } }

    it("a CRLF smuggles no request upstream and splits no response", function()
      local up = upstream("--name A")
      local gw = gateway(config({ ep("a", up.port) }, nil, INJECTOR))
      local payload = "a\r\nx-smuggled: 1\r\ncontent-length: 0\r\n\r\n"
        .. "GET /smuggled HTTP/1.1\r\nhost: x\r\n\r\n"
      local status, h, body = P.post(gw.base, "/v1/completions",
        { model = "m", prompt = "hi", user = payload })
      assert.equal(200, status, body) -- request-control errors: the request proceeds
      local received = json.decode(body).received
      assert.is_nil(received["x-user"])
      assert.is_nil(received["x-smuggled"])
      assert.is_nil(h["x-user"])
      assert.is_nil(h["x-smuggled"])
      assert.same({ "POST /v1/completions HTTP/1.1" }, seen(up))
      -- a second request on the pooled connection reads its own answer
      status, h, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "again" })
      assert.equal(200, status, body)
      assert.equal("hi from A", json.decode(body).choices[1].text)
      assert.is_nil(h["x-smuggled"])
      assert.same({ "POST /v1/completions HTTP/1.1", "POST /v1/completions HTTP/1.1" }, seen(up))
      assert.matches("plugin injector (e2e-header-injector) failed in pre_request:",
        P.read(gw.err), 1, true)
      assert.equal(1, P.metric(gw, 'lupin_plugin_errors_total{plugin="injector",'
        .. 'type="e2e-header-injector",point="pre_request"}'))
      assert.equal(1, P.metric(gw, 'lupin_plugin_errors_total{plugin="injector",'
        .. 'type="e2e-header-injector",point="response_header"}'))
    end)

    it("a clean value goes through both ways", function()
      local up = upstream("--name A")
      local gw = gateway(config({ ep("a", up.port) }, nil, INJECTOR))
      local status, h, body = P.post(gw.base, "/v1/completions",
        { model = "m", prompt = "hi", user = "alice\tB" })
      assert.equal(200, status, body)
      assert.equal("alice\tB", json.decode(body).received["x-user"])
      assert.equal("alice\tB", h["x-user"])
    end)
  end)

  describe("hop-by-hop headers", function()
    it("stay on the client's hop, whatever their case; names that only look alike go through",
      function()
        local up = upstream("--name A")
        local gw = gateway(config({ ep("a", up.port) }))
        local hop = { "Keep-Alive", "PROXY-CONNECTION", "te", "Upgrade", "Trailer" }
        local alike = { "X-Connection", "Hosts", "Tes", "Upgraded", "Keep-Alive-Not", "Expectation",
          "Content-Lengths", "Trailers" }
        local args = { "-H 'Connection: keep-alive, hop-0'" }
        for i, name in ipairs(hop) do
          args[#args + 1] = ("-H '%s: hop-%d'"):format(name, i)
        end
        for i, name in ipairs(alike) do
          args[#args + 1] = ("-H '%s: alike-%d'"):format(name, i)
        end
        local status, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi" },
          table.concat(args, " "))
        assert.equal(200, status, body)
        local received = json.decode(body).received
        for _, name in ipairs(hop) do
          assert.is_nil(received[name:lower()], name)
        end
        assert.is_nil((received.connection or ""):find("hop-0", 1, true)) -- its own, if any
        for i, name in ipairs(alike) do
          assert.equal("alike-" .. i, received[name:lower()], name)
        end
      end)
  end)

  describe("headers that arrive in pieces", function()
    -- The gateway keeps header texts in blocks of 1 KB it reuses from one
    -- request of a connection to the next (host/buf.c): a name or value
    -- cut across reads grows in place or moves to a new block.  Forty
    -- headers sent five bytes at a time, one value three times a block,
    -- then a second request on the same connection with other values.
    it("reach the endpoint whole, and the next request on the connection sees only its own",
      function()
        local up = upstream("--name A")
        local gw = gateway(config({ ep("a", up.port) }))
        local port = gw.base:match(":(%d+)$")
        local script = [[
import json, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = s.makefile("rb")
def answer():
    status, length = f.readline(), 0
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, v = line.decode().split(":", 1)
        if k.lower() == "content-length":
            length = int(v)
    return json.loads(f.read(length))["received"]
body = b'{"model":"m","prompt":"hi"}'
def head(extra):
    return (b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
            + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in extra)
            + b"content-length: %d\r\n\r\n" % len(body))
first = [("x-h%d" % i, "value-%d-" % i + "v" * (i * 7)) for i in range(40)]
first.append(("x-long", "".join(chr(97 + i % 26) for i in range(3000))))
data = head(first) + body
for i in range(0, len(data), 5):
    s.sendall(data[i:i + 5])
    time.sleep(0.0005)
print(json.dumps(answer()))
s.sendall(head([("x-second", "2"), ("x-h1", "changed")]) + body)
print(json.dumps(answer()))
]]
        local file = support.write(P.dir .. "/pieces.py", script)
        local out, rc = P.run(("python3 %s %s"):format(file, port))
        assert.equal(0, rc, out)
        local first, second = out:match("^([^\n]+)\n([^\n]+)\n$")
        assert.truthy(first, out)
        first, second = json.decode(first), json.decode(second)
        for i = 0, 39 do
          assert.equal(("value-%d-"):format(i) .. ("v"):rep(i * 7), first["x-h" .. i])
        end
        local long = {}
        for i = 0, 2999 do
          long[#long + 1] = string.char(97 + i % 26)
        end
        assert.equal(table.concat(long), first["x-long"])
        assert.equal("2", second["x-second"])
        assert.equal("changed", second["x-h1"])
        assert.is_nil(second["x-long"])
        assert.is_nil(second["x-h2"])
        assert.is_nil(first["x-second"])
      end)
  end)

  describe("request bodies are strict JSON", function()
    local up, gw
    setup(function()
      up = P.upstream("--name A")
      gw = P.gateway(config({ ep("a", up.port) }))
    end)
    teardown(function()
      P.stop(gw)
      P.stop(up)
    end)

    for _, case in ipairs({
      { '{"model":"m","prompt":"x","temperature":NaN}', "at character 41" },
      { '{"model":"m","prompt":"x","temperature":Infinity}', "at character 41" },
      { '{"model":"m","prompt":"x","temperature":-Infinity}', "at character 41" },
      { '{"model":"m","prompt":"x","max_tokens":0x10}', "at character 40" },
      { '{"model":"m","prompt":"x","max_tokens":1e400}', '"max_tokens" must be a finite number' },
      { '{"model":"m","prompt":"\255"}', "not valid UTF-8 at byte 24 (0xff)" },
      { '{"model":"m","prompt":"\192\175"}', "not valid UTF-8 at byte 24 (0xc0)" }, -- overlong /
      { '{"model":"m","prompt":"\237\160\128"}', "not valid UTF-8 at byte 24 (0xed)" }, -- surrogate
      { '{"model":"m","prompt":"ok \226\130"}', "not valid UTF-8 at byte 27 (0xe2)" }, -- cut short
    }) do
      it(("refuses %q with a 400 naming the position"):format(case[1]), function()
        local status, _, body = P.post(gw.base, "/v1/completions", case[1])
        assert.equal(400, status, body)
        local e = json.decode(body).error
        assert.equal("invalid_request_error", e.type)
        assert.matches(case[2], e.message, 1, true)
      end)
    end

    it("forwards UTF-8 text", function()
      local status, _, body = P.post(gw.base, "/v1/completions",
        '{"model":"m","prompt":"caf\195\169 \240\159\144\186 \\u00e9","temperature":0.5}')
      assert.equal(200, status, body)
    end)

    it("keeps /admin/requests valid JSON whatever bytes a request id holds", function()
      local sleeper = P.start(("curl -s -o /dev/null -H %s -H %s -d %s %s"):format(
        P.quote("x-request-id: bad\255id\"\\"), P.quote("content-type: application/json"),
        P.quote('{"model":"m","prompt":"sleep:3000"}'), P.quote(gw.base .. "/v1/completions")))
      local text = P.poll(function()
        local _, _, t = P.get(gw.admin .. "/admin/requests")
        return t:find('"requests":%[{') and t
      end, "the request in flight")
      local v = strict_json(text)
      assert.truthy(v, text)
      assert.equal(1, #v.requests)
      P.stop(sleeper)
    end)
  end)

  describe("scraped values", function()
    local function endpoint_view(gw)
      local _, _, text = P.get(gw.admin .. "/admin/endpoints")
      local v = strict_json(text)
      assert.truthy(v, "not JSON: " .. text)
      return v.endpoints[1]
    end

    for _, case in ipairs({
      { "--waiting NaN --kv 1.5", 2 },
      { "--waiting inf --kv -0.1", 2 },
      { "--waiting -3 --kv +Inf", 2 },
      { "--waiting 4 --kv nan", 1 },
    }) do
      it(("refuses non-finite or out-of-range series (%s)"):format(case[1]), function()
        local up = upstream(case[1])
        local gw = gateway(config({ ep("a", up.port) }))
        local e = P.poll(function()
          local v = endpoint_view(gw)
          return v.scrapes >= 2 and v
        end, "two scrapes")
        assert.is_true(e.scrape_errors >= 2 * case[2])
        local m = e.metrics
        assert.is_true(m.waiting_queue_size == 0 or m.waiting_queue_size == 4)
        assert.is_true(m.kv_cache_usage == 0)
        assert.equal(1, m.running_requests) -- the good series of the same scrape are kept
        local _, _, text = P.get(gw.admin .. "/metrics")
        for value in text:gmatch("\nlupin_endpoint_[%w_]+%b{} (%S+)") do
          local v = tonumber(value)
          assert.truthy(v and v == v and v - v == 0, value)
        end
      end)
    end
  end)

  describe("config numbers", function()
    for _, case in ipairs({
      { '"weight": Infinity', "schedulingProfiles[0].plugins[0].weight: numbers must be finite" },
      { '"weight": 1e309', "schedulingProfiles[0].plugins[0].weight: numbers must be finite" },
      { '"weight": NaN', "schedulingProfiles[0].plugins[0].weight: numbers must be finite, got NaN" },
      { '"weight": 0x10', "invalid JSON" },
    }) do
      it(("lupin serve and lupin check refuse %s with file:line: path"):format(case[1]), function()
        local path = P.dir .. "/finite.json"
        support.write(path, '{\n"plugins": [{"type": "queue-scorer"}],\n"schedulingProfiles": '
          .. '[{"name": "d", "plugins": [\n{"pluginRef": "queue-scorer", ' .. case[1] .. '}]}]\n}')
        local out, rc = P.run(P.LUPIN .. " check --config " .. path .. " 2>&1")
        assert.equal(1, rc)
        assert.matches(path .. ":4: " .. case[2], out, 1, true)
        local p = P.start(P.LUPIN .. " serve --config " .. path
          .. " --listen 127.0.0.1:0 --admin 127.0.0.1:0")
        assert.equal(1, P.wait(p))
        assert.matches(path .. ":4: " .. case[2], P.read(p.err), 1, true)
      end)
    end
  end)

  describe("memory bounds", function()
    local function in_background(gw, prompt, extra)
      procs[#procs + 1] = P.start(("curl -s -o /dev/null %s -H %s -d %s %s"):format(extra or "",
        P.quote("content-type: application/json"),
        P.quote(json.encode({ model = "m", prompt = prompt })), P.quote(gw.base .. "/v1/completions")))
    end

    it("maxRequestsInFlight: the request past the cap gets a 503 naming it", function()
      local up = upstream()
      local gw = gateway(config({ ep("a", up.port) }, { maxRequestsInFlight = 2 }))
      in_background(gw, "sleep:5000")
      in_background(gw, "sleep:5000")
      P.poll(function()
        return P.metric(gw, "lupin_requests_in_flight") == 2
      end, "two requests in flight")
      local status, h, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hog" })
      assert.equal(503, status, body)
      assert.equal("1", h["retry-after"])
      local e = json.decode(body).error
      assert.equal("server_error", e.type)
      assert.matches("gateway.maxRequestsInFlight = 2", e.message, 1, true)
      assert.equal(1, P.metric(gw, 'lupin_capacity_refusals_total{cap="maxRequestsInFlight"}'))
      assert.equal(200, (P.get(gw.admin .. "/healthz"))) -- the admin API is not capped
    end)

    it("maxBufferedBodyBytes: bodies held across connections are capped", function()
      local up = upstream()
      local gw = gateway(config({ ep("a", up.port) }, { maxBufferedBodyBytes = 50000 }))
      in_background(gw, "sleep:5000 " .. ("x"):rep(30000))
      P.poll(function()
        return (P.metric(gw, "lupin_buffered_body_bytes") or 0) > 30000
      end, "a body held")
      local status, h, body = P.post(gw.base, "/v1/completions",
        { model = "m", prompt = ("y"):rep(30000) })
      assert.equal(503, status, body)
      assert.equal("1", h["retry-after"])
      assert.matches("gateway.maxBufferedBodyBytes = 50000", json.decode(body).error.message, 1,
        true)
      -- a small one still fits
      status, h, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hog" })
      assert.equal(200, status, body)
      assert.is_nil(h["retry-after"])
      assert.equal(1, P.metric(gw, 'lupin_capacity_refusals_total{cap="maxBufferedBodyBytes"}'))
    end)

    it("pipelined requests wait behind a slow one: reading stops, nothing is lost", function()
      local up = upstream()
      local gw = gateway(config({ ep("a", up.port) },
        { maxHeaderBytes = 1024, maxBodyBytes = 2048 }))
      local host, port = gw.base:match("http://(.-):(%d+)")
      -- 100 requests of ~2 KB, 200 KB: more than one read, far more than the read-ahead
      -- allowed (maxHeaderBytes) and than the old flood check (maxBodyBytes + maxHeaderBytes)
      local out, rc = P.run(("python3 %s/spec/fixtures/gateway/pipeline.py %s %s 100 1900 "
        .. "sleep:1000"):format(support.ROOT, host, port))
      assert.equal(0, rc, out)
      local statuses = {}
      for line in out:gmatch("[^\n]+") do
        statuses[#statuses + 1] = line
      end
      assert.equal(100, #statuses, out)
      for i, s in ipairs(statuses) do
        -- a failure names why: the gateway's access-log line and its stderr
        assert.equal("200", s, ("request %d: %s\n%s"):format(i,
          (P.read(gw.out) or ""):match('[^\n]*"status":' .. s .. '[^\n]*') or "no log line",
          P.read(gw.err) or ""))
      end
    end)

    it("a big body sent slowly is read while each piece comes within headerTimeoutMs", function()
      local up = upstream()
      local gw = gateway(config({ ep("a", up.port) }, { headerTimeoutMs = 1500 }))
      local port = gw.base:match(":(%d+)$")
      -- four pieces 0.6 s apart: 2.4 s in all, more than headerTimeoutMs
      local script = [[
import socket, sys, time
body = b'{"model":"m","prompt":"' + b"x" * 4000 + b'"}'
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
          b"content-length: %d\r\n\r\n" % len(body))
for i in range(4):
    time.sleep(0.6)
    s.sendall(body[i * len(body) // 4:(i + 1) * len(body) // 4])
print(s.makefile("rb").readline().decode().strip())
]]
      local file = support.write(P.dir .. "/slow_upload.py", script)
      local out, rc = P.run(("python3 %s %s"):format(file, port))
      assert.equal(0, rc, out)
      assert.equal("HTTP/1.1 200 OK\n", out)
    end)

    local HOG = { { type = "e2e-memory-hog", name = "hog", parameters = { bytes = 40000000 },
      maxCallMs = 10000 }, -- building 40 MB takes longer than the 5 ms default budget
      { type = "max-score-picker" } }
    local HOG_PROFILE = { { pluginRef = "hog", weight = 1 }, { pluginRef = "max-score-picker" } }

    for _, case in ipairs({
      { "--max-lua-memory 32m", nil, 32 * 1024 * 1024 },
      { "", { maxLuaMemoryBytes = 32 * 1024 * 1024 }, 32 * 1024 * 1024 },
      { "--max-lua-memory 32768k", { maxLuaMemoryBytes = 0 }, 32 * 1024 * 1024 },
    }) do
      it(("the Lua memory limit fails the plugin call over it (%s %s)"):format(case[1],
        json.encode(case[2] or {})), function()
        local up = upstream()
        local gw = gateway(config({ ep("a", up.port) }, case[2], HOG, HOG_PROFILE), case[1])
        assert.equal(case[3], P.metric(gw, "lupin_lua_memory_limit_bytes"))
        local status, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hog" })
        assert.equal(200, status, body) -- a scorer error: it contributes 0
        assert.is_true(P.metric(gw, "lupin_lua_memory_limit_hits_total") >= 1)
        assert.equal(1, P.metric(gw, 'lupin_plugin_errors_total{plugin="hog",'
          .. 'type="e2e-memory-hog",point="score"}'))
        assert.matches("plugin hog (e2e-memory-hog) failed in score: not enough memory",
          P.read(gw.err), 1, true)
      end)
    end

    it("without a limit the same plugin call succeeds", function()
      local up = upstream()
      local gw = gateway(config({ ep("a", up.port) }, { maxLuaMemoryBytes = 0 }, HOG, HOG_PROFILE))
      assert.equal(200, (P.post(gw.base, "/v1/completions", { model = "m", prompt = "hog" })))
      assert.equal(0, P.metric(gw, 'lupin_plugin_errors_total{plugin="hog",'
        .. 'type="e2e-memory-hog",point="score"}') or 0)
    end)

    it("refuses a --max-lua-memory that is not a size", function()
      local path = support.write(P.dir .. "/mem.json", json.encode(config()))
      local p = P.start(P.LUPIN .. " serve --config " .. path
        .. " --listen 127.0.0.1:0 --admin 127.0.0.1:0 --max-lua-memory lots")
      assert.equal(1, P.wait(p))
      assert.matches("--max-lua-memory lots: give bytes, or a size like 512m or 2g",
        P.read(p.err), 1, true)
    end)
  end)

  describe("the admin listener", function()
    it("compares the token whole: prefixes, extensions and near misses are refused", function()
      local gw = gateway(config(), "--admin-token s3cret-token")
      local function get(token)
        return (P.get(gw.admin .. "/healthz", "-H " .. P.quote("authorization: Bearer " .. token)))
      end
      assert.equal(200, get("s3cret-token"))
      for _, t in ipairs({ "s3cret-tokeN", "s3cret-toke", "s3cret-token-", "", "s",
        "s3cret-tokens3cret-token" }) do
        assert.equal(401, get(t), t)
      end
    end)

    local function serve(args)
      local path = support.write(P.dir .. "/admin.json", json.encode(config()))
      local p = P.start(P.LUPIN .. " serve --config " .. path .. " --listen 127.0.0.1:0 " .. args)
      procs[#procs + 1] = p
      return p
    end

    local function started(p)
      return P.poll(function()
        return (P.read(p.out) or ""):match("listening on") or (P.read(p.rc) and "exited")
      end, "start or exit")
    end

    it("refuses a non-loopback admin address without a token", function()
      local p = serve("--admin 0.0.0.0:0")
      assert.equal(1, P.wait(p))
      assert.matches("refusing to serve the admin API on 0.0.0.0:0, which is not a loopback "
        .. "address, without --admin-token", P.read(p.err), 1, true)
    end)

    it("serves it with a token, or with --admin-insecure and a warning", function()
      local p = serve("--admin 0.0.0.0:0 --admin-token t")
      assert.equal("listening on", started(p))
      p = serve("--admin 0.0.0.0:0 --admin-insecure")
      assert.equal("listening on", started(p))
      assert.matches("admin listener on 0.0.0.0:0 with no token (--admin-insecure)",
        P.read(p.err), 1, true)
      p = serve("--admin [::1]:0")
      assert.equal("listening on", started(p))
    end)

    it("escapes label values: an endpoint name cannot inject series", function()
      local up = upstream()
      local names = { 'we"ird', "two\nlines} 1\nlupin_injected 1", "back\\slash" }
      local eps = {}
      for i, name in ipairs(names) do
        eps[i] = ep(name, up.port)
        eps[i].address = "127.0.0." .. i
      end
      local gw = gateway(config(eps))
      local _, _, text = P.get(gw.admin .. "/metrics")
      local found = {}
      for line in text:gmatch("[^\n]+") do
        if not line:find("^#") then
          local name, labels, value = sample(line)
          assert.truthy(name and (tonumber(value) or value == "NaN" or value == "+Inf"),
            "not a sample: " .. line)
          assert.not_equal("lupin_injected", name)
          if name == "lupin_endpoint_waiting_queue_size" then
            found[#found + 1] = labels.endpoint
          end
        end
      end
      table.sort(found)
      table.sort(names)
      assert.same(names, found)
      local err = P.promtool(text)
      assert(err == nil, err)
    end)
  end)
end)
