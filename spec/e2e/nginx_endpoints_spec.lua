-- ngx_http_lupin_module's endpoints (nginx/lupin_endpoints.c): metrics
-- scraped on nginx's timers, outlier detection through the host library,
-- the config's "gateway" section read as lupin serve reads it.  Real nginx
-- in front of lupin-sim, curl.
local P = require "e2e.procs"
local S = require "support"
local N = require "e2e.nginx"
local json = P.json

local COMPLETION = { model = "m", prompt = "hello", max_tokens = 2 }

local function series(family, endpoint)
  return ('%s{endpoint="%s"}'):format(family, endpoint)
end

describe("nginx module: endpoint metrics", function()
  if not N.available() then
    pending("no " .. N.MODULE .. " (make nginx-module, with nginx-dev installed)")
    return
  end

  local sim, ngx

  setup(function()
    -- one running request per endpoint: the rest wait, and the queue shows
    sim = P.sim("--model m --itl-ms 20 --max-num-seqs 1", 2)
    ngx = N.start(N.config(P.sim_endpoints(sim), { gateway = { refreshIntervalMs = 20 } }))
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("scrapes every endpoint on nginx's timers", function()
    for _, name in ipairs({ "sim-1", "sim-2" }) do
      P.poll(function()
        local age = N.status(ngx, series("lupin_endpoint_scrape_age_seconds", name))
        return age and age >= 0 and age < 1
      end, name .. " scraped")
      assert.equal(1, N.status(ngx, series("lupin_endpoint_healthy", name)))
      assert.equal(0, N.status(ngx, series("lupin_endpoint_scrape_errors_total", name)))
    end
    assert.equal(2, N.status(ngx, "lupin_endpoints_healthy"))
  end)

  it("routes around the endpoint whose queue the scrapes show", function()
    -- five long answers held at sim-1: one runs, four wait there
    local held = {}
    local body = S.write(P.dir .. "/held.json", json.encode({ model = "m", prompt = "long",
      max_tokens = 100 }))
    for i = 1, 5 do
      held[i] = P.start(("curl -s -o /dev/null --max-time 10 -H 'content-type: application/json' "
        .. "-H 'x-gateway-destination-endpoint-subset: %s' --data-binary @%s %s/v1/completions")
        :format(sim.hostports[1], body, ngx.base))
    end
    finally(function()
      for _, p in ipairs(held) do
        P.stop(p)
      end
    end)
    P.poll(function()
      return (N.status(ngx, series("lupin_endpoint_waiting_queue_size", "sim-1")) or 0) >= 3
    end, "sim-1's queue in the scrapes")
    assert.is_true(N.status(ngx, series("lupin_endpoint_running_requests", "sim-1")) >= 1)
    -- the queue-scorer sees it: every new request goes to sim-2
    for i = 1, 6 do
      local code, h = P.post(ngx.base, "/v1/completions", COMPLETION,
        "-H 'x-request-id: around-" .. i .. "'")
      assert.equal(200, code)
      assert.equal(sim.hostports[2], h["x-sim-endpoint"])
    end
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx module: endpoint health", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  local sim, bad, ngx, dead_port

  setup(function()
    sim = P.sim("--model m --instant", 1)
    bad = P.sim("--model m --instant --error-rate 1", 1) -- every generation answered 500
    dead_port = sim.ports[1] + 1                          -- nothing listens there
    local eps = P.sim_endpoints(sim)
    eps[2] = { name = "bad", address = "127.0.0.1", port = bad.ports[1] }
    eps[3] = { name = "dead", address = "127.0.0.1", port = dead_port }
    ngx = N.start(N.config(eps, { gateway = { consecutiveErrors = 3, baseEjectionTimeMs = 2000,
      maxEjectionPercent = 100 } }))
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
    P.stop(bad)
  end)

  it("takes an endpoint whose scrapes fail out of the candidates", function()
    P.poll(function()
      return N.status(ngx, series("lupin_endpoint_healthy", "dead")) == 0
    end, "dead out")
    assert.is_true(N.status(ngx, series("lupin_endpoint_scrape_errors_total", "dead")) >= 3)
    local log = P.read(ngx.dir .. "/error.log")
    assert.truthy(log:find("endpoint dead (127.0.0.1:" .. dead_port .. ")", 1, true), log)
    -- a failed scrape is told by the health lines, not one connect() line each
    local _, connects = log:gsub("connect%(%) to 127%.0%.0%.1:" .. dead_port .. " failed", "")
    assert.is_true(connects <= 1, connects .. " connect() lines")
    -- requests go to the live endpoints only: sim-1 or bad, never dead
    for i = 1, 5 do
      local _, h = P.post(ngx.base, "/v1/completions", COMPLETION, "-H 'x-request-id: d-" .. i
        .. "'")
      assert.falsy(h["x-sim-destination"]:find(":" .. dead_port, 1, true))
    end
  end)

  it("ejects an endpoint after consecutiveErrors 5xx answers, and restores it", function()
    local only_bad = "-H 'x-gateway-destination-endpoint-subset: " .. bad.hostports[1] .. "'"
    local before = N.status(ngx, series("lupin_endpoint_ejections_total", "bad"))
    -- the last answers may already have ejected it (the unhinted requests above)
    for i = 1, 3 do
      local code = P.post(ngx.base, "/v1/completions", COMPLETION, only_bad .. " -H 'x-request-id: "
        .. "bad-" .. i .. "'")
      if code ~= 500 then
        break
      end
    end
    P.poll(function()
      return N.status(ngx, series("lupin_endpoint_ejections_total", "bad")) > before
        or N.status(ngx, series("lupin_endpoint_healthy", "bad")) == 0
    end, "bad ejected")
    -- while ejected, a request that may only go there is refused by lupin
    local code, h, body = P.post(ngx.base, "/v1/completions", COMPLETION, only_bad)
    assert.equal(503, code, body)
    assert.matches("^application/json", h["content-type"])
    assert.equal("server_error", json.decode(body).error.type)
    -- its scrapes succeed: back once the ejection is over (2 s)
    P.poll(function()
      return N.status(ngx, series("lupin_endpoint_restorations_total", "bad")) >= 1
    end, "bad restored")
    local log = P.read(ngx.dir .. "/error.log")
    assert.truthy(log:find("endpoint bad (" .. bad.hostports[1] .. ") ejected for", 1, true))
    assert.truthy(log:find("3 requests in a row failed (last: request: answered 500)", 1, true))
    assert.truthy(log:find("endpoint bad (" .. bad.hostports[1] .. ") restored", 1, true))
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx -t: the gateway section", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  it("refuses a setting out of range with file, line and field", function()
    local dir = P.dir .. "/nginx-t-gateway"
    os.execute("mkdir -p " .. dir)
    S.write(dir .. "/lupin.json", table.concat({
      "{",
      '  "kind": "EndpointPickerConfig",',
      '  "plugins": [{"type": "queue-scorer"}, {"type": "max-score-picker"}],',
      '  "gateway": {',
      '    "refreshIntervalMs": 0',
      "  },",
      '  "endpoints": []',
      "}" }, "\n"))
    S.write(dir .. "/nginx.conf", N.conf(dir, 1))
    local out, rc = P.run(N.cmd(dir, "-t 2>&1"))
    assert.is_not.equal(0, rc)
    assert.matches("lupin%.json:5: ", out)
    assert.matches("refreshIntervalMs", out)
  end)
end)
