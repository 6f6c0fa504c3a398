-- ngx_http_lupin_module (issue 42, docs/nginx.md) in Debian's nginx, in
-- front of lupin-sim: real nginx, real sockets, curl.  Pending when the
-- module is not built (make nginx-module needs nginx-dev).  Under make
-- test-asan (LUPIN_ASAN=1) the same specs run the module built with ASan and
-- UBSan in Debian's nginx, the sanitizers' runtime preloaded.
local P = require "e2e.procs"
local S = require "support"
local json = P.json

local N = require "e2e.nginx"

local COMPLETION = { model = "m", prompt = "hello from nginx", max_tokens = 4 }
local CHAT = { model = "m", messages = { { role = "user", content = "hi" } }, max_tokens = 4 }

describe("nginx with ngx_http_lupin_module", function()
  if not N.available() then
    pending("no " .. N.MODULE .. " (make nginx-module, with nginx-dev installed)")
    return
  end

  local sim, ngx

  setup(function()
    sim = P.sim("--model m --itl-ms 20", 2)
    ngx = N.start(N.config(P.sim_endpoints(sim)))
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  local function send(path, body, id, extra)
    return P.post(ngx.base, path, body, ("-H 'x-request-id: %s' %s"):format(id, extra or ""))
  end

  it("a completion and a chat completion reach the endpoint lupin picked", function()
    for _, case in ipairs({ { "/v1/completions", COMPLETION, "text_completion" },
      { "/v1/chat/completions", CHAT, "chat.completion" } }) do
      local id = "ok-" .. case[3]
      local code, h, body = send(case[1], case[2], id)
      assert.equal(200, code, body)
      assert.equal(case[3], json.decode(body).object)
      -- lupin-sim echoes the x-gateway-destination-endpoint it received:
      -- every pick, the one that answered (the primary) first
      assert.truthy(h["x-sim-endpoint"])
      local other = h["x-sim-endpoint"] == sim.hostports[1] and sim.hostports[2]
        or sim.hostports[1]
      assert.equal(h["x-sim-endpoint"] .. "," .. other, h["x-sim-destination"])
      assert.equal("yes", h["x-recorded"]) -- a plugin's response header
      assert.same({ "prepare admit:m pre_request:" .. (h["x-sim-endpoint"] == sim.hostports[1]
        and "sim-1" or "sim-2") .. " response_header:200 response_complete chunks:some finish:ok" },
        N.journal(ngx, id))
    end
  end)

  it("the x-gateway-destination-endpoint-subset hint is honored", function()
    for i, hp in ipairs(sim.hostports) do
      local code, h = send("/v1/completions", COMPLETION, "subset-" .. i,
        "-H 'x-gateway-destination-endpoint-subset: " .. hp .. "'")
      assert.equal(200, code)
      assert.equal(hp, h["x-sim-endpoint"])
      assert.equal(hp, h["x-sim-destination"]) -- the one candidate, the one pick
    end
  end)

  it("replaces a destination header the client sent with lupin's", function()
    -- a few headers (nginx's list in one part) and many (several parts)
    local many = {}
    for i = 1, 40 do
      many[i] = ("-H 'x-filler-%d: %d'"):format(i, i)
    end
    for _, extra in ipairs({ "", table.concat(many, " ") }) do
      local code, h = send("/v1/completions", COMPLETION, "spoofed",
        "-H 'x-gateway-destination-endpoint: 10.9.9.9:1' " .. extra)
      assert.equal(200, code)
      assert.equal(h["x-sim-endpoint"], (h["x-sim-destination"] or ""):match("^[^,]+"))
      assert.falsy(h["x-sim-destination"]:find("10.9.9.9", 1, true))
    end
    -- the worker lives on: the next request is answered
    assert.equal(200, (send("/v1/completions", COMPLETION, "after-spoofed")))
  end)

  it("schedules a body nginx spooled to a temporary file", function()
    -- 64 KB: past client_body_buffer_size (16 KB), read back from the file
    local big = { model = "m", prompt = ("lorem ipsum "):rep(5500), max_tokens = 2 }
    local code, h, body = send("/v1/completions", big, "big-body")
    assert.equal(200, code, body)
    assert.equal(h["x-sim-endpoint"], h["x-sim-destination"]:match("^[^,]+"))
    assert.matches("finish:ok$", N.journal(ngx, "big-body")[1])
    assert.truthy((P.read(ngx.dir .. "/error.log") or ""):find("buffered to a temporary file", 1,
      true))
  end)

  it("passes a stream through as server-sent events", function()
    local body = { model = "m", prompt = "stream me", max_tokens = 5, stream = true }
    local code, h, text = send("/v1/completions", body, "stream-1")
    assert.equal(200, code)
    assert.matches("^text/event%-stream", h["content-type"])
    local events = 0
    for line in text:gmatch("[^\n]+") do
      if line:find("^data: {") then
        events = events + 1
      end
    end
    assert.equal(5, events)
    assert.truthy(text:find("data: [DONE]", 1, true))
    assert.matches("chunks:some finish:ok$", N.journal(ngx, "stream-1")[1])
  end)

  it("answers a bad body with lupin's 400 in the OpenAI error shape", function()
    local code, h, body = send("/v1/completions", '{"model": "m", "prompt": ', "bad-json")
    assert.equal(400, code)
    assert.matches("^application/json", h["content-type"])
    local err = json.decode(body).error
    assert.equal("invalid_request_error", err.type)
    assert.matches("not valid JSON", err.message)

    code, h, body = send("/v1/completions", { prompt = "no model" }, "no-model")
    assert.equal(400, code)
    assert.matches("^application/json", h["content-type"])
    err = json.decode(body).error
    assert.equal("invalid_request_error", err.type)
    assert.equal("model", err.param)
    -- no plugin saw either
    assert.same({}, N.journals(ngx, "bad-json"))
    assert.same({}, N.journals(ngx, "no-model"))
  end)

  it("runs finish exactly once per request, a client gone mid-stream included", function()
    local long = { model = "m", prompt = "a long answer", max_tokens = 400, stream = true }
    local ids = {}
    for i = 1, 3 do
      ids[i] = "abort-" .. i
      -- 400 tokens at 20 ms: 8 s; curl leaves after 0.5 s
      local code = P.post(ngx.base, "/v1/completions", long,
        ("-H 'x-request-id: %s' --max-time 0.5"):format(ids[i]))
      assert.equal(200, code) -- the header came; curl's exit tells the timeout
    end
    for i = 1, 3 do
      ids[#ids + 1] = "after-" .. i
      assert.equal(200, (send("/v1/completions", COMPLETION, ids[#ids])))
    end
    for _, id in ipairs(ids) do
      local js = N.journal(ngx, id)
      assert.equal(1, #js, id)
      assert.matches(id:find("^abort") and "finish:cancelled$" or "finish:ok$", js[1])
    end
    -- nothing left behind: no live request, and no request table once collected
    P.poll(function()
      return N.status(ngx, "lupin_live_requests") == 0
    end, "no live request")
    assert.equal(0, N.status(ngx, "lupin_live_request_tables", "?collect"))
    assert.is_true(N.status(ngx, 'lupin_request_outcomes_total{outcome="cancelled"}') >= 3)
    assert.is_true(N.status(ngx, 'lupin_request_outcomes_total{outcome="invalid_request"}') >= 2)
    assert.equal(1, N.status(ngx, "lupin_generation"))
    assert.equal(2, N.status(ngx, "lupin_endpoints"))
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx with ngx_http_lupin_module, an endpoint down", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  local sim, ngx

  setup(function()
    sim = P.sim("--model m --instant", 1)
    local eps = P.sim_endpoints(sim)
    -- a port nothing listens on (lupin-sim's next one: it listens on one)
    eps[2] = { name = "dead", address = "127.0.0.1", port = sim.ports[1] + 1 }
    -- outlier detection off, so that the dead one stays a candidate
    -- (spec/e2e/nginx_endpoints_spec.lua ejects it)
    ngx = N.start(N.config(eps, { gateway = { consecutiveErrors = 0, staleEjectionMs = 0 } }))
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("a refused connect goes to the next pick (proxy_next_upstream)", function()
    local live, dead = sim.hostports[1], "127.0.0.1:" .. (sim.ports[1] + 1)
    local retried = 0
    -- the two tie (no metrics): the picker orders them at random; 20
    -- requests put the dead one first at least once but for 2^-20
    for i = 1, 20 do
      local code, h = P.post(ngx.base, "/v1/completions", COMPLETION,
        "-H 'x-request-id: failover-" .. i .. "'")
      assert.equal(200, code)
      assert.equal(live, h["x-sim-endpoint"])
      -- the header names every pick in order, so it holds for the retry
      -- too: the endpoint that answered a retry finds itself second
      local dest = h["x-sim-destination"]
      assert.is_true(dest == live .. "," .. dead or dest == dead .. "," .. live, dest)
      if dest == dead .. "," .. live then
        retried = retried + 1
      end
    end
    assert.is_true(retried > 0)
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx with ngx_http_lupin_module, the model-name rewrite and GET", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  local up, ngx

  setup(function()
    up = P.upstream("--name A --model m") -- echoes what it received
    ngx = N.start(N.config({ { name = "a", address = "127.0.0.1", port = up.port } }))
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(up)
  end)

  it("forwards the body with the rewritten model, every other byte the client's", function()
    local text = '{"model":"m","prompt":"hi","temperature":0.7,"top_p":1e-3,"max_tokens":2}'
    for _, name in ipairs({ "x-gateway-model-name-rewrite", "x-llm-d-model-name-rewrite" }) do
      local code, _, body = P.post(ngx.base, "/v1/completions", text, "-H '" .. name
        .. ": lora-two'")
      assert.equal(200, code, body)
      local r = json.decode(body)
      assert.equal("lora-two", r.model)
      assert.equal(#text + #"lora-two" - #"m", r.received.body_bytes) -- nothing reformatted
      assert.equal(tostring(r.received.body_bytes), r.received["content-length"])
      assert.is_nil(r.received[name]) -- consumed
    end
    -- llm-d's name wins over GIE's older one, whatever their order
    local _, _, body = P.post(ngx.base, "/v1/completions", text,
      "-H 'x-gateway-model-name-rewrite: old' -H 'x-llm-d-model-name-rewrite: new'")
    assert.equal("new", json.decode(body).model)
    -- without the header the body goes as sent
    _, _, body = P.post(ngx.base, "/v1/completions", text)
    assert.equal(#text, json.decode(body).received.body_bytes)
  end)

  it("sends GET /v1/models to a healthy endpoint", function()
    local code, _, body = P.get(ngx.base .. "/v1/models")
    assert.equal(200, code, body)
    assert.equal("m", json.decode(body).data[1].id)
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx with ngx_http_lupin_module, an answer past proxy_buffers", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  local sim, ngx

  setup(function()
    sim = P.sim("--model m --instant", 1)
    -- buffers of 1 KB and nginx sending slowly: it spools to its file
    ngx = N.start(N.config(P.sim_endpoints(sim)), { location = [[
      limit_rate 32k;
      proxy_buffers 2 1k;
      proxy_buffer_size 1k;
      proxy_busy_buffers_size 1k;
      proxy_temp_file_write_size 1k;]] })
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("passes an answer nginx spooled to a temporary file to the plugins' chunks", function()
    -- a 30 KB answer at 32 KB/s: about a second
    local body = { model = "m", prompt = "a long one", max_tokens = 6000 }
    local code, _, text = P.post(ngx.base, "/v1/completions", body,
      "-H 'x-request-id: spooled'")
    assert.equal(200, code)
    assert.is_true(#text > 20000, #text)
    assert.matches("finish:ok$", N.journal(ngx, "spooled")[1])
    local log = P.read(ngx.dir .. "/error.log")
    assert.truthy(log:find("an upstream response is buffered to a temporary file", 1, true))
    assert.equal(#text, tonumber(log:match("request spooled %[e2e%-recorder%] chunk bytes (%d+)")))
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx -t with ngx_http_lupin_module", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  it("refuses a broken lupin config naming its file, line and field", function()
    local dir = P.dir .. "/nginx-t"
    os.execute("mkdir -p " .. dir)
    S.write(dir .. "/lupin.json", table.concat({
      "{",
      '  "kind": "EndpointPickerConfig",',
      '  "plugins": [{"type": "queue-scorer", "parameters": {"nope": 1}}],',
      '  "endpoints": []',
      "}" }, "\n"))
    S.write(dir .. "/nginx.conf", N.conf(dir, 1))
    local out, rc = P.run(N.cmd(dir, "-t 2>&1"))
    assert.is_not.equal(0, rc)
    assert.matches("lupin_config \"" .. dir:gsub("%p", "%%%0") .. "/lupin.json\": "
      .. dir:gsub("%p", "%%%0") .. "/lupin.json:3: ", out)
    assert.matches("nope", out)
    assert.matches("test failed", out)
    -- nginx -t loads the config in its one process: no sanitizer report there
    assert.equal("", P.run(("cat %s/sanitizer.* 2>/dev/null"):format(dir)))
  end)
end)
