-- lupin serve against hostile clients and unlucky operators (issue 51):
-- what a client sends cannot grow the gateway's state without bound, and an
-- endpoints source that suddenly lists nothing does not empty the pool
-- unless the operator said so.  The real binary, lupin-sim, curl.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local SPAM = support.ROOT .. "/spec/fixtures/gateway/spam_flows.py"
local FIXTURES = support.ROOT .. "/spec/fixtures/gateway/"

local function ep(name, port)
  return { name = name, address = "127.0.0.1", port = port }
end

local function admin_json(gw, path)
  local _, _, body = P.get(gw.admin .. path)
  return json.decode(body)
end

describe("hostile clients and flow control", function()
  local sim
  setup(function()
    sim = P.sim("--model m --itl-ms 100 --default-max-tokens 8 --seed 1", 1)
  end)
  teardown(function()
    P.stop(sim)
  end)

  it("keeps bands to the configured priorities and drops idle flows", function()
    local gw = P.gateway({
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" },
        { type = "concurrency-detector", parameters = { maxConcurrency = 1 } } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
      saturationDetector = { pluginRef = "concurrency-detector" },
      flowControl = { flowGCTimeout = "300ms" },
      objectives = { { name = "critical", priority = 10 }, { name = "batch", priority = -1 } },
      endpoints = { ep("e1", sim.ports[1]) },
    })
    -- the endpoint busy for ~10 s: everything after it waits in the queue
    local hold = P.send(gw, "hold", { max_tokens = 100 })
    P.until_running(gw, "hold")
    local host, port = gw.base:match("^http://(.-):(%d+)$")
    local out, rc = P.run(("python3 %s %s %s %s 3 400"):format(SPAM, host, port, gw.admin))
    assert.equal(0, rc, out)
    assert.equal("1200", out:match("%d+"))
    -- 1200 distinct priorities and fairness ids: the three configured bands
    local flows = admin_json(gw, "/admin/flows")
    local prios, clamped = {}, 0
    for _, b in ipairs(flows.bands) do
      prios[#prios + 1] = b.priority
      clamped = clamped + b.clamped
      assert.equal(0, b.queued)
    end
    assert.same({ 10, 0, -1 }, prios)
    assert.equal(1200, clamped)
    assert.equal(1200, P.metric(gw, 'lupin_flow_control_priority_clamped_total{priority="10"}')
      + P.metric(gw, 'lupin_flow_control_priority_clamped_total{priority="0"}')
      + P.metric(gw, 'lupin_flow_control_priority_clamped_total{priority="-1"}'))
    -- every tenant's flow dropped once idle for flowGCTimeout
    P.poll(function()
      local kept = 0
      for _, b in ipairs(admin_json(gw, "/admin/flows").bands) do
        kept = kept + b.flows_kept
      end
      return kept == 0
    end, "the idle flows to be dropped")
    -- the configured bands still served highest first
    local low = P.send(gw, "low", { headers = { ["x-gateway-inference-objective"] = "batch" } })
    local mid = P.send(gw, "mid", { headers = { ["x-gateway-inference-objective"] = "3" } })
    local high = P.send(gw, "high",
      { headers = { ["x-gateway-inference-objective"] = "critical" } })
    P.poll(function()
      local n = 0
      for _, b in ipairs(admin_json(gw, "/admin/flows").bands) do
        n = n + b.queued
      end
      return n == 3
    end, "three queued")
    for _, p in ipairs({ hold, low, mid, high }) do
      assert.equal(200, (P.result(p)))
    end
    local mine = {}
    for id in P.access_log_ids(gw, 1204):gmatch("%S+") do
      if id == "hold" or id == "high" or id == "mid" or id == "low" then
        mine[#mine + 1] = id
      end
    end
    assert.equal("hold high mid low", table.concat(mine, " "))
    P.stop(gw)
  end)
end)

describe("an endpoints source that lists none", function()
  local sim
  setup(function()
    sim = P.sim("--model m --itl-ms 1 --default-max-tokens 2", 1)
  end)
  teardown(function()
    P.stop(sim)
  end)

  local COMPLETION = { model = "m", prompt = "hi", max_tokens = 2 }

  local function config(gateway)
    return {
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
      gateway = gateway,
    }
  end

  local function pool(gw)
    return #admin_json(gw, "/admin/endpoints").endpoints
  end

  it("keeps the last endpoints, with a warning and a metric", function()
    local file = P.dir .. "/hostile-endpoints.json"
    support.write(file, json.encode({ ep("one", sim.ports[1]) }))
    local gw = P.gateway(config(), "--endpoints " .. file)
    assert.equal(200, (P.post(gw.base, "/v1/completions", COMPLETION)))
    support.write(file, "[]")
    P.poll(function()
      return (P.read(gw.err) or ""):match("lists no endpoints: the 1 current endpoints stay")
    end, "the warning")
    assert.equal(1, P.metric(gw, "lupin_endpoints_empty_kept_total"))
    assert.equal(1, pool(gw))
    assert.equal(200, (P.post(gw.base, "/v1/completions", COMPLETION)))
    -- a list again is applied as before
    support.write(file, json.encode({ ep("again", sim.ports[1]) }))
    P.poll(function()
      local list = admin_json(gw, "/admin/endpoints").endpoints
      return #list == 1 and list[1].name == "again"
    end, "the new list")
    P.stop(gw)
  end)

  it("empties the pool when gateway.allowEmptyEndpoints says so", function()
    local file = P.dir .. "/allowed-endpoints.json"
    support.write(file, json.encode({ ep("one", sim.ports[1]) }))
    local gw = P.gateway(config({ allowEmptyEndpoints = true }), "--endpoints " .. file)
    assert.equal(200, (P.post(gw.base, "/v1/completions", COMPLETION)))
    support.write(file, "[]")
    P.poll(function()
      return pool(gw) == 0
    end, "the pool to empty")
    assert.equal(503, (P.post(gw.base, "/v1/completions", COMPLETION)))
    assert.equal(0, P.metric(gw, "lupin_endpoints_empty_kept_total"))
    P.stop(gw)
  end)

  it("keeps the config's endpoints when a reload lists none", function()
    local cfg = config()
    cfg.endpoints = { ep("one", sim.ports[1]) }
    local gw = P.gateway(cfg, "--no-watch")
    cfg.endpoints = json.empty_array
    support.write(gw.config, json.encode(cfg))
    assert.equal(200, (P.post(gw.admin, "/admin/reload", "")))
    assert.equal(1, pool(gw))
    assert.equal(1, P.metric(gw, "lupin_endpoints_empty_kept_total"))
    assert.equal(200, (P.post(gw.base, "/v1/completions", COMPLETION)))
    -- the same reload with the setting empties it
    cfg.gateway = { allowEmptyEndpoints = 1 }
    support.write(gw.config, json.encode(cfg))
    assert.equal(200, (P.post(gw.admin, "/admin/reload", "")))
    assert.equal(0, pool(gw))
    assert.equal(503, (P.post(gw.base, "/v1/completions", COMPLETION)))
    P.stop(gw)
  end)

  it("is a warning of lupin check", function()
    local file = P.dir .. "/check-empty.json"
    support.write(file, "[]")
    local path = P.dir .. "/check-empty-config.json"
    support.write(path, json.encode(config()))
    local out, rc = P.run(("%s check --config %s --endpoints %s 2>&1"):format(P.LUPIN, path, file))
    assert.equal(0, rc, out)
    assert.matches("warning: " .. file .. " lists no endpoints: every request would get 503",
      out, 1, true)
    out, rc = P.run(("%s check --config %s --endpoints %s --format json 2>/dev/null"):format(
      P.LUPIN, path, file))
    assert.equal(0, rc, out)
    assert.same({ "no endpoints: every request would get 503" }, json.decode(out).warnings)
  end)
end)

describe("big bodies against maxBufferedBodyBytes", function()
  -- the gateway's RSS from /proc (VmRSS), in bytes
  local function rss(gw)
    return tonumber((P.read("/proc/" .. gw.pid .. "/status") or ""):match("VmRSS:%s*(%d+)")) * 1024
  end

  local function config(port, gateway)
    return {
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
      endpoints = { ep("e1", port) },
      gateway = gateway,
    }
  end

  -- n bodies of about size bytes posted at once, in the background; prompt
  -- starts with lead
  local function post_all(gw, n, size, lead)
    local file = P.dir .. "/big-" .. size .. ".json"
    local body = json.encode({ model = "m", prompt = lead .. ("x"):rep(size - 40 - #lead) })
    support.write(file, body)
    local procs = {}
    for i = 1, n do
      local out = ("%s/big-%d-%d.out"):format(P.dir, size, i)
      procs[i] = P.start(("curl -sS -o %s -w '%%{http_code}' -H 'content-type: application/json'"
        .. " --data-binary @%s %s"):format(out, file, P.quote(gw.base .. "/v1/completions")))
      procs[i].body_file = out
    end
    return procs, #body
  end

  local function answers(procs)
    local by = {}
    for _, p in ipairs(procs) do
      local code, body = P.result(p)
      by[code] = by[code] or {}
      table.insert(by[code], body)
    end
    return by
  end

  it("serves the bodies within the budget and answers the others 503 at once", function()
    local up = P.upstream()
    local size = 1000000
    local gw = P.gateway(config(up.port, { maxBufferedBodyBytes = 2 * size + 1000 }))
    finally(function()
      P.stop(gw)
      P.stop(up)
    end)
    local procs, len = post_all(gw, 5, size, "sleep:3000 ")
    local by = answers(procs)
    assert.equal(2, #(by[200] or {}))
    assert.equal(3, #(by[503] or {}))
    for _, body in ipairs(by[503]) do
      local e = json.decode(body).error
      assert.equal("server_error", e.type)
      assert.matches("would pass its cap (gateway.maxBufferedBodyBytes = 2001000)", e.message, 1, true)
    end
    assert.equal(3, P.metric(gw, 'lupin_capacity_refusals_total{cap="maxBufferedBodyBytes"}'))
    assert.equal(0, P.metric(gw, "lupin_buffered_body_bytes"))
    assert.is_true(len <= size)
    P.stop(gw)
    P.stop(up)
  end)

  -- Each body held is held once (the upstream request is written from the
  -- client's buffer, the rest queued by reference, not copied twice more),
  -- and what the ended requests held goes back to the system once idle.
  it("holds each body once and gives the memory back after", function()
    local tarpit, gw = P.start("python3 -u " .. FIXTURES .. "tarpit.py"), nil
    finally(function()
      P.stop(gw)
      P.stop(tarpit)
    end)
    local port = P.poll(function()
      return tonumber((P.read(tarpit.out) or ""):match("port (%d+)"))
    end, "the tarpit's port")
    local size = 8000000
    -- one worker: each worker's allocator keeps pages of its own
    gw = P.gateway(config(port, { maxBufferedBodyBytes = 4 * size, firstByteTimeoutMs = 3000 }),
      "--workers 1")
    local base = rss(gw)
    local procs, len = post_all(gw, 6, size, "")
    P.poll(function()
      return P.metric(gw, "lupin_buffered_body_bytes") == 4 * len
    end, "four bodies held")
    -- the bodies are counted at what they are, and RSS grew by less than
    -- twice that (the body, and its prompt decoded in the Lua heap, which
    -- maxLuaMemoryBytes bounds); before, a copy in the upstream request and
    -- another queued behind what the socket took made it 2.8 times
    local held = rss(gw) - base
    -- a sanitizer's shadow memory and quarantine are its own: RSS says
    -- nothing of the gateway's bodies then
    local plain = not (os.getenv("LUPIN_ASAN") or os.getenv("LUPIN_TSAN"))
    if plain then
      assert.is_true(held < 2 * 4 * len, ("RSS grew by %d for %d bytes held"):format(held, 4 * len))
    end
    local by = answers(procs)
    assert.equal(4, #(by[504] or {}))
    assert.equal(2, #(by[503] or {}))
    assert.equal(0, P.metric(gw, "lupin_buffered_body_bytes"))
    if plain then
      -- (the allocator keeps one or two bodies' size for reuse; before, all
      -- four and more)
      P.poll(function()
        return rss(gw) < base + 3 * len
      end, "the memory of the ended requests to go back (RSS " .. rss(gw) .. ", at start " .. base
        .. ")")
    end
    P.stop(gw)
    P.stop(tarpit)
  end)
end)
