-- Explain records end to end (docs/explain.md): the x-lupin-explain header
-- with and without the admin token, GET /admin/explain/<id> with the
-- attempts, POST /admin/explain deciding without forwarding, the access
-- log's attempts after a failing endpoint, and `lupin explain` offline.
-- The real binaries: lupin serve, the fixture model server (it echoes the
-- headers it received), curl.
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local TOKEN = "s3cret-token"

-- health checks off: a scrape of the dead endpoint must not eject it first
local QUIET = { consecutiveErrors = 0, staleEjectionMs = 0 }

local function ep(name, port)
  return { name = name, address = "127.0.0.1", port = port }
end

-- "dead" (nothing listens on port 1) scores best, "live" next, "spare" last:
-- the pick fails and the first ranked fallback serves.
local function config(up_port, gateway)
  local g = {}
  for k, v in pairs(QUIET) do
    g[k] = v
  end
  for k, v in pairs(gateway or {}) do
    g[k] = v
  end
  return {
    plugins = {
      { type = "test-scorer", name = "ranks", parameters = { byIndex = { 1, 0.25, 0 }, record = false } },
      { type = "queue-scorer", name = "queue" },
      { type = "max-score-picker", name = "best" },
    },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "ranks", weight = 2 },
      { pluginRef = "queue", weight = 1 }, { pluginRef = "best" } } } },
    endpoints = { ep("dead", 1), ep("live", up_port), ep("spare", up_port) },
    gateway = g,
    pluginDirs = { support.FIXTURES },
  }
end

local function post(gw, id, headers)
  local extra = "-H " .. P.quote("x-request-id: " .. id)
  for _, h in ipairs(headers or {}) do
    extra = extra .. " -H " .. P.quote(h)
  end
  return P.post(gw.base, "/v1/completions", { model = "m", prompt = "hello", max_tokens = 3 },
    extra)
end

local BEARER = "-H " .. P.quote("authorization: Bearer " .. TOKEN)

--- The access-log line of request id (stdout, one JSON object a line).
local function access(gw, id)
  return P.poll(function()
    for line in (P.read(gw.out) or ""):gmatch("[^\n]+") do
      if line:sub(1, 1) == "{" then
        local rec = json.decode(line)
        if rec.id == id then
          return rec
        end
      end
    end
  end, "the access-log line of " .. id)
end

describe("lupin serve: explain records", function()
  local up, gw

  setup(function()
    up = P.upstream("--name A")
    gw = P.gateway(config(up.port), "--admin-token " .. TOKEN)
  end)

  teardown(function()
    P.stop(gw)
    P.stop(up)
  end)

  it("answers x-lupin-explain with the admin token: a summary and the record's place", function()
    local status, h, body = post(gw, "ex-1", { "x-lupin-explain: 1",
      "x-lupin-admin-token: " .. TOKEN })
    assert.equal(200, status, body)
    local summary = h["x-lupin-explain"]
    assert.truthy(summary:find("profile=default; picks=dead; totals=dead:", 1, true), summary)
    assert.truthy(summary:find("fallbacks=live,spare", 1, true), summary)
    assert.equal("/admin/explain/ex-1", h["x-lupin-explain-record"])
    -- neither header went upstream, nor the token
    local got = json.decode(body).received
    assert.is_nil(got["x-lupin-explain"])
    assert.is_nil(got["x-lupin-admin-token"])

    local s2, _, text = P.get(gw.admin .. "/admin/explain/ex-1", BEARER)
    assert.equal(200, s2, text)
    local x = json.decode(text)
    assert.same({ "ex-1", 200, false }, { x.request_id, x.status, x.dry_run })
    assert.same({ "dead" }, x.picks)
    assert.same({ "live", "spare" }, x.fallbacks)
    local ranks = x.profiles[1].scorers[1]
    assert.same({ "ranks", 2 }, { ranks.plugin, ranks.weight })
    assert.same({ 1, 2 }, { ranks.scores[1].raw, ranks.scores[1].weighted })
    -- the gateway's part: the pick failed, the first fallback answered
    local a = x.gateway.attempts
    assert.equal(200, x.gateway.status)
    assert.equal(2, #a)
    assert.same({ "dead", "pick", "connect_failed" }, { a[1].name, a[1].via, a[1].reason })
    assert.same({ "live", "fallback", 200 }, { a[2].name, a[2].via, a[2].status })
  end)

  it("explains an error answer too: nothing left to schedule on", function()
    local status, h, body = post(gw, "ex-503", { "x-lupin-explain: 1",
      "x-lupin-admin-token: " .. TOKEN, "x-gateway-destination-endpoint-subset: 10.9.9.9:1" })
    assert.equal(503, status, body)
    local summary = h["x-lupin-explain"]
    assert.truthy(summary:find("^status=503; outcome=no_endpoint; message=no endpoint matches"),
      summary)
    local _, _, text = P.get(gw.admin .. "/admin/explain/ex-503", BEARER)
    local x = json.decode(text)
    assert.same({ 503, "no_endpoint", 503 }, { x.status, x.outcome, x.gateway.status })
    assert.same({}, x.candidates)
    assert.same({}, x.gateway.attempts)
  end)

  it("lists the records it keeps, newest first", function()
    post(gw, "ex-list", { "x-lupin-explain: 1", "x-lupin-admin-token: " .. TOKEN })
    local body = P.poll(function()
      local _, _, t = P.get(gw.admin .. "/admin/explain", BEARER)
      return t:find("ex-list", 1, true) and t
    end, "the record of ex-list")
    local list = json.decode(body)
    assert.equal("ex-list", list.ids[1])
    assert.equal(64, list.kept)
  end)

  it("refuses x-lupin-explain without the token, or with a wrong one, and keeps nothing",
    function()
      for i, headers in ipairs({ { "x-lupin-explain: 1" },
        { "x-lupin-explain: 1", "x-lupin-admin-token: wrong" } }) do
        local id = "no-ex-" .. i
        local status, h, body = post(gw, id, headers)
        assert.equal(200, status, body) -- the request itself is served
        assert.truthy(h["x-lupin-explain"]:find("^refused: send the admin token"),
          h["x-lupin-explain"])
        assert.is_nil(h["x-lupin-explain-record"])
        assert.is_nil(json.decode(body).received["x-lupin-admin-token"])
        access(gw, id) -- ended
        local s2, _, text = P.get(gw.admin .. "/admin/explain/" .. id, BEARER)
        assert.equal(404, s2)
        assert.truthy(json.decode(text).error.message:find("no explain record for request " .. id,
          1, true))
      end
    end)

  it("adds nothing to a request that does not ask", function()
    local status, h = post(gw, "plain-1")
    assert.equal(200, status)
    assert.is_nil(h["x-lupin-explain"])
    assert.is_nil(h["x-lupin-explain-record"])
  end)

  it("writes each attempt in the access log: name, pick or fallback, status or reason",
    function()
      local status = post(gw, "log-1")
      assert.equal(200, status)
      local rec = access(gw, "log-1")
      assert.equal(2, #rec.attempts)
      local a, b = rec.attempts[1], rec.attempts[2]
      assert.same({ "127.0.0.1:1", "dead", "pick", "connect_failed" },
        { a.endpoint, a.name, a.via, a.reason })
      assert.truthy(a.detail and #a.detail > 0, a.detail)
      assert.is_nil(a.status)
      assert.same({ up.hostport, "live", "fallback", 200 }, { b.endpoint, b.name, b.via, b.status })
      assert.is_nil(b.reason)
    end)

  it("POST /admin/explain decides a body against the live endpoints, without sending it",
    function()
      local _, _, before = P.get("http://" .. up.hostport .. "/stats")
      local status, _, text = P.post(gw.admin, "/admin/explain",
        { model = "m", messages = { { role = "user", content = "hi" } } }, BEARER)
      assert.equal(200, status, text)
      local x = json.decode(text)
      assert.same({ "/v1/chat/completions", true, 200 }, { x.path, x.dry_run, x.status })
      assert.same({ "dead" }, x.picks)
      assert.same({ "ranks", "queue" }, { x.profiles[1].scorers[1].plugin,
        x.profiles[1].scorers[2].plugin })
      assert.is_nil(x.gateway)
      local _, _, after = P.get("http://" .. up.hostport .. "/stats")
      assert.equal(json.decode(before).posts, json.decode(after).posts)
    end)

  it("POST /admin/explain answers a bad body with an OpenAI error", function()
    local status, _, text = P.post(gw.admin, "/admin/explain", '{"model": "m"}', BEARER)
    assert.equal(400, status)
    local e = json.decode(text).error
    assert.equal("prompt", e.param)
    assert.truthy(e.message:find('missing "prompt"', 1, true), e.message)
  end)

  it("keeps /admin/explain behind the admin token", function()
    local status = P.post(gw.admin, "/admin/explain", { model = "m", prompt = "x" })
    assert.equal(401, status)
    assert.equal(401, (P.get(gw.admin .. "/admin/explain/ex-1")))
    local s3, _, text = P.curl("-X DELETE " .. BEARER .. " " .. P.quote(gw.admin
      .. "/admin/explain/ex-1"))
    assert.equal(405, s3)
    assert.truthy(json.decode(text).error.message:find("POST /admin/explain", 1, true))
  end)
end)

describe("lupin serve: gateway.explainWithoutToken", function()
  it("honours x-lupin-explain from any client when set to 1", function()
    local up = P.upstream("--name B")
    local gw = P.gateway(config(up.port, { explainWithoutToken = 1 }))
    local status, h = post(gw, "open-1", { "x-lupin-explain: 1" })
    P.stop(gw)
    P.stop(up)
    assert.equal(200, status)
    assert.truthy(h["x-lupin-explain"]:find("picks=dead", 1, true), h["x-lupin-explain"])
    assert.equal("/admin/explain/open-1", h["x-lupin-explain-record"])
  end)

  it("is refused at load when not 0 or 1", function()
    local path = P.dir .. "/explain-bad-switch.json"
    local cfg = config(9, { explainWithoutToken = 2 })
    support.write(path, json.encode(cfg))
    local out, rc = P.run(("%s check --config %s 2>&1"):format(P.LUPIN, path))
    assert.equal(1, rc, out)
    assert.truthy(out:find("gateway.explainWithoutToken", 1, true), out)
  end)
end)

describe("lupin explain", function()
  local dir = P.dir
  local cfg_path, eps_path, req_path

  setup(function()
    cfg_path = dir .. "/explain-config.json"
    local cfg = config(9)
    cfg.endpoints = nil
    support.write(cfg_path, json.encode(cfg))
    eps_path = support.write(dir .. "/explain-endpoints.yaml", [[
- {name: a, address: 127.0.0.1, port: 8001, metrics: {waiting_queue_size: 8}}
- {name: b, address: 127.0.0.1, port: 8002, metrics: {waiting_queue_size: 0}}
- {name: c, address: 127.0.0.1, port: 8003, labels: {zone: x}}
]])
    req_path = support.write(dir .. "/explain-request.json", '{"model":"m","prompt":"hello"}')
  end)

  local function run(args)
    return P.run(("%s explain %s 2>&1"):format(P.LUPIN, args))
  end

  it("prints the record as text: the score table, the picks and fallbacks", function()
    local out, rc = run(("--config %s --endpoints %s %s"):format(cfg_path, eps_path, req_path))
    assert.equal(0, rc, out)
    assert.truthy(out:find("status 200 (ok)", 1, true), out)
    assert.truthy(out:find("a 127.0.0.1:8001 queue 8", 1, true), out)
    assert.truthy(out:find("labels zone=x", 1, true), out)
    -- ranks (w=2) a:1, b:0.25, c:0; queue (w=1) a:0 (8 waiting), b:1, c:1: no tie
    assert.truthy(out:find("endpoint%s+ranks %(w=2%)%s+queue %(w=1%)%s+total"), out)
    assert.truthy(out:find("a%s+1 %-> 2%s+0 %-> 0%s+2%s+picked\n"), out)
    assert.truthy(out:find("b%s+0.25 %-> 0.5%s+1 %-> 1%s+1.5%s+fallback 1\n"), out)
    assert.truthy(out:find("primary profile default: picks a; fallbacks b, c", 1, true), out)
  end)

  it("prints the runtime's JSON with --format json, reading stdin for -", function()
    local out, rc = run(("--config %s --endpoints %s --format json - < %s"):format(cfg_path,
      eps_path, req_path))
    assert.equal(0, rc, out)
    local x = json.decode(out)
    assert.same({ true, 200 }, { x.dry_run, x.status })
    assert.same({ "a" }, x.picks)
    assert.same({ "b", "c" }, x.fallbacks)
    assert.equal(8, x.candidates[1].waiting_queue_size)
  end)

  it("shows a failing scorer's error with its traceback", function()
    -- fails on prompts that say so: the load's dry cycle passes
    os.execute("mkdir -p " .. dir .. "/explain-plugins")
    support.write(dir .. "/explain-plugins/explain-touchy-scorer.lua", [[
local function check(prompt)
  if prompt:find("explode", 1, true) then
    error("touchy scorer exploded")
  end
end
return {
  type = "explain-touchy-scorer",
  score = function(_, ctx, endpoints)
    check(ctx.request.prompt)
    local s = {}
    for i = 1, #endpoints do s[i] = 1 end
    return s
  end,
}
]])
    local broken = dir .. "/explain-broken.json"
    local cfg = config(9)
    cfg.endpoints = nil
    cfg.pluginDirs = { support.FIXTURES, dir .. "/explain-plugins" }
    table.insert(cfg.plugins, 1, { type = "explain-touchy-scorer", name = "touchy" })
    table.insert(cfg.schedulingProfiles[1].plugins, 1, { pluginRef = "touchy", weight = 3 })
    support.write(broken, json.encode(cfg))
    local req = support.write(dir .. "/explain-explode.json", '{"model":"m","prompt":"explode"}')
    local out, rc = run(("--config %s --endpoints %s %s"):format(broken, eps_path, req))
    assert.equal(0, rc, out)
    assert.truthy(out:find("scorer touchy %(explain%-touchy%-scorer%) weight 3, [%d.]+ us:"
      .. " failed, added nothing"), out)
    assert.truthy(out:find("errors (1):", 1, true), out)
    assert.truthy(out:find("touchy (explain-touchy-scorer) in score: ", 1, true), out)
    assert.truthy(out:find("touchy scorer exploded", 1, true), out)
    assert.truthy(out:find("at [^\n]*explain%-touchy%-scorer%.lua:3 in upvalue 'check' <%- "
      .. "[^\n]*explain%-touchy%-scorer%.lua:9"), out)
    -- the same config, a quiet prompt: no error
    out, rc = run(("--config %s --endpoints %s %s"):format(broken, eps_path, req_path))
    assert.equal(0, rc, out)
    assert.falsy(out:find("errors (", 1, true), out)
  end)

  it("refuses bad arguments with exit 2 and the usage", function()
    for _, args in ipairs({
      ("--endpoints %s %s"):format(eps_path, req_path), -- no --config
      ("--config %s"):format(cfg_path),                 -- no request
      ("--config %s --bogus %s"):format(cfg_path, req_path),
      ("--config %s --format yaml %s"):format(cfg_path, req_path),
      ("--config %s %s %s"):format(cfg_path, req_path, req_path),
      "--config",
    }) do
      local out, rc = run(args)
      assert.equal(2, rc, args .. ": " .. out)
      assert.truthy(out:find("^lupin explain: "), out)
      assert.truthy(out:find("usage: lupin explain --config FILE", 1, true), out)
    end
  end)

  it("refuses a bad request file with exit 2 and a clear message", function()
    local cases = {
      { "{not json", "is not valid JSON" },
      { '{"prompt":"x"}', 'missing "model"' },
      { '{"model":"m","messages":"hi"}', '"messages" must be a list' },
    }
    for i, case in ipairs(cases) do
      local path = support.write(("%s/explain-bad-%d.json"):format(dir, i), case[1])
      local out, rc = run(("--config %s --endpoints %s %s"):format(cfg_path, eps_path, path))
      assert.equal(2, rc, out)
      assert.truthy(out:find("lupin explain: " .. path .. ": ", 1, true), out)
      assert.truthy(out:find(case[2], 1, true), out)
    end
    local out, rc = run(("--config %s %s/no-such-request.json"):format(cfg_path, dir))
    assert.equal(2, rc, out)
    assert.truthy(out:find("cannot read the request " .. dir .. "/no-such-request.json: No such"
      .. " file", 1, true), out)
  end)

  it("refuses bad endpoint metrics with exit 1 and file:line: path", function()
    local bad = support.write(dir .. "/explain-bad-eps.yaml", [[
- {name: a, address: 127.0.0.1, port: 8001}
- {name: b, address: 127.0.0.1, port: 8002, metrics: {waiting_queue_size: lots}}
]])
    local out, rc = run(("--config %s --endpoints %s %s"):format(cfg_path, bad, req_path))
    assert.equal(1, rc, out)
    assert.truthy(out:find(bad .. ":2: [1].metrics.waiting_queue_size: waiting_queue_size must be"
      .. " a number", 1, true), out)
    local unknown = support.write(dir .. "/explain-unknown-eps.json",
      '[{"name":"a","address":"127.0.0.1","port":1,"metrics":{"queue":1}}]')
    out, rc = run(("--config %s --endpoints %s %s"):format(cfg_path, unknown, req_path))
    assert.equal(1, rc, out)
    assert.truthy(out:find('unknown field "queue" in metrics', 1, true), out)
  end)

  it("gives docs/explain.md's sample over the shipped examples", function()
    local ex = support.ROOT .. "/examples"
    local out, rc = run(("--config %s/configs/epp-default.yaml --endpoints"
      .. " %s/configs/explain-endpoints.yaml %s/requests/chat.json"):format(ex, ex, ex))
    assert.equal(0, rc, out)
    assert.truthy(out:find("sim%-1%s+0 %-> 0%s+1 %-> 2%s+0.82 %-> 1.64%s+3.64%s+picked\n"), out)
    assert.truthy(out:find("primary profile default: picks sim-1; fallbacks sim-3, sim-2, sim-0",
      1, true), out)
  end)

  it("is in lupin --help and has its own", function()
    local out, rc = P.run(P.LUPIN .. " --help")
    assert.equal(0, rc)
    assert.truthy(out:find("explain  schedule one request offline", 1, true), out)
    out, rc = P.run(P.LUPIN .. " help explain")
    assert.equal(0, rc)
    assert.truthy(out:find("usage: lupin explain", 1, true), out)
  end)
end)
