-- ngx_http_lupin_module's admin operations and reloads (docs/nginx.md,
-- "Admin, reload and explain"): `lupin_admin;`, a reload through lupin's
-- generations in every worker, lupin_config_watch, explain records.  Real
-- nginx with two workers in front of lupin-sim; the listen socket is
-- reuseport, so new connections spread over the workers and a poll with a
-- new connection each time reaches both.
local P = require "e2e.procs"
local S = require "support"
local json = P.json

local N = require "e2e.nginx"

local COMPLETION = { model = "m", prompt = "hello from the admin spec", max_tokens = 4 }
local CHAT = { model = "m", messages = { { role = "user", content = "hi" } }, max_tokens = 4 }

local ADMIN = [[
    location /lupin/ { lupin_admin; allow 127.0.0.1; deny all; }
    location /closed/ { lupin_admin; deny all; }
    location = /v1/chat/completions {
      lupin_schedule on;
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
]]

-- A config whose plugin parameters fail on line 3 (as nginx_spec's nginx -t).
local function write_broken(ngx)
  S.write(ngx.dir .. "/lupin.json", table.concat({
    "{",
    '  "kind": "EndpointPickerConfig",',
    '  "plugins": [{"type": "queue-scorer", "parameters": {"nope": 1}}],',
    '  "endpoints": []',
    "}" }, "\n"))
end

local function admin(ngx, method, op, body)
  if method == "POST" then
    return P.post(ngx.base, "/lupin/" .. op, body or "")
  end
  return P.get(ngx.base .. "/lupin/" .. op, method == "GET" and "" or "-X " .. method)
end

--- Polls /lupin/generations with a new connection each time until every
--- one of n workers has answered with ok(answer); returns the answers by
--- worker index (0-based).
local function every_worker(ngx, n, ok, what)
  local seen, count = {}, 0
  P.poll(function()
    local code, h, body = admin(ngx, "GET", "generations")
    assert.equal(200, code, body)
    local g = json.decode(body)
    local w = g.workers[1].worker
    assert.equal(tostring(w), h["x-lupin-worker"])
    if ok(g) and not seen[w] then
      seen[w], count = g, count + 1
    end
    return count == n
  end, what)
  return seen
end

local function errors_of(ngx, pat)
  local n = 0
  for _ in (P.read(ngx.dir .. "/error.log") or ""):gmatch(pat) do
    n = n + 1
  end
  return n
end

describe("nginx's lupin_admin, two workers", function()
  if not N.available() then
    pending("no " .. N.MODULE .. " (make nginx-module, with nginx-dev installed)")
    return
  end

  local sim, ngx, cfg

  setup(function()
    sim = P.sim("--model m --itl-ms 5", 2)
    cfg = N.config(P.sim_endpoints(sim))
    ngx = N.start(cfg, { workers = 2, listen = "reuseport", server = ADMIN,
      -- what proxy_pass forwards of the request's x-lupin-explain: none
      location = 'lupin_explain on; add_header x-forwarded-explain "[$http_x_lupin_explain]";' })
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("answers GET generations with this worker's live generations", function()
    local code, h, body = admin(ngx, "GET", "generations")
    assert.equal(200, code, body)
    assert.matches("^application/json", h["content-type"])
    local g = json.decode(body)
    assert.equal(1, g.current)
    assert.equal(1, #g.generations)
    assert.equal(1, g.generations[1].number)
    assert.is_true(g.generations[1].current)
    assert.equal(ngx.dir .. "/lupin.json", g.generations[1].source)
    assert.matches("^%x+$", g.generations[1].digest)
    assert.equal(1, #g.workers)
    assert.is_true(g.workers[1].worker == 0 or g.workers[1].worker == 1)
    -- both workers answer, each for itself
    every_worker(ngx, 2, function(a) return a.current == 1 end, "both workers at 1")
  end)

  it("answers an unknown operation 404 and a wrong method 405, as JSON", function()
    local code, h, body = admin(ngx, "GET", "nope")
    assert.equal(404, code)
    assert.matches("^application/json", h["content-type"])
    assert.matches('unknown admin operation "nope"', json.decode(body).error.message)
    code, h, body = admin(ngx, "GET", "reload")
    assert.equal(405, code)
    assert.equal("POST", h["allow"])
    assert.equal("invalid_request_error", json.decode(body).error.type)
    local _
    code, _, body = admin(ngx, "POST", "generations")
    assert.equal(405, code)
    assert.matches("method not allowed: GET, HEAD generations", json.decode(body).error.message)
  end)

  it("leaves the access rule to nginx: a deny all location answers 403", function()
    local code = P.get(ngx.base .. "/closed/generations")
    assert.equal(403, code)
    code = P.post(ngx.base, "/closed/reload", "")
    assert.equal(403, code)
    -- nothing was reloaded by it
    every_worker(ngx, 2, function(a) return a.current == 1 end, "both workers still at 1")
  end)

  it("POST reload reloads this worker, and every other worker follows", function()
    local code, _, body = admin(ngx, "POST", "reload")
    assert.equal(200, code, body)
    local r = json.decode(body)
    assert.is_true(r.reloaded)
    assert.equal(2, r.generation)
    assert.is_true(r.duration_seconds > 0)
    every_worker(ngx, 2, function(a) return a.current == 2 end, "both workers at 2")
    -- one worker reloaded for the call, the other followed it; each says so
    P.poll(function()
      return errors_of(ngx, "reload %(another worker asked%): generation 2 serving") == 1
    end, "the other worker's line")
    assert.equal(1, errors_of(ngx, "reload %(admin%): generation 2 serving in worker %d"))
    assert.equal(200, (P.post(ngx.base, "/v1/completions", COMPLETION)))
  end)

  it("refuses a broken config with its file and line; the old generation serves", function()
    write_broken(ngx)
    local code, h, body = admin(ngx, "POST", "reload")
    assert.equal(400, code, body)
    assert.matches("^application/json", h["content-type"])
    local err = json.decode(body).error
    assert.equal("invalid_request_error", err.type)
    assert.matches(ngx.dir:gsub("%p", "%%%0") .. "/lupin.json:3: ", err.message)
    assert.matches("nope", err.message)
    assert.equal(1, errors_of(ngx, "reload %(admin%) failed after [%d.]+ ms in worker %d, "
      .. "generation 2 keeps serving: [^\n]*lupin.json:3: "))
    -- no worker moved: the failed one kept 2, the others were not asked
    for _ = 1, 6 do
      local _, _, text = admin(ngx, "GET", "generations")
      assert.equal(2, json.decode(text).current)
      local c, _, b = P.post(ngx.base, "/v1/completions", COMPLETION)
      assert.equal(200, c, b)
    end
    assert.equal(0, errors_of(ngx, "reload %(another worker asked%) failed"))
    S.write(ngx.dir .. "/lupin.json", json.encode(cfg))
    code, h, body = admin(ngx, "POST", "reload")
    assert.equal(200, code, body)
    assert.matches("^application/json", h["content-type"])
    assert.equal(3, json.decode(body).generation)
    every_worker(ngx, 2, function(a) return a.current == 3 end, "both workers at 3")
  end)

  it("keeps a request in flight on its generation; new ones take the new one", function()
    -- 300 tokens at 5 ms: 1.5 s in flight
    local long = P.send(ngx, "pinned-1", { max_tokens = 300 })
    local pinned
    P.poll(function()
      local _, _, body = admin(ngx, "GET", "generations")
      local g = json.decode(body).generations
      pinned = #g == 1 and g[1].pinned == 1
      return pinned
    end, "the request pinned to generation 3")
    local code, _, body = admin(ngx, "POST", "reload")
    assert.equal(200, code, body)
    local seen = every_worker(ngx, 2, function(a) return a.current == 4 end, "both at 4")
    local held = false
    for _, a in pairs(seen) do
      if #a.generations == 2 then
        -- current first, then the old one its request still holds
        assert.same({ 4, true, 0 }, { a.generations[1].number, a.generations[1].current,
          a.generations[1].pinned })
        assert.same({ 3, false, 1 }, { a.generations[2].number, a.generations[2].current,
          a.generations[2].pinned })
        held = true
      end
    end
    assert.is_true(held, "a worker holding generation 3")
    local c, b = P.result(long)
    assert.equal(200, c, b)
    every_worker(ngx, 2, function(a) return #a.generations == 1 end, "generation 3 released")
  end)

  it("reloads ten times under load without a failed request", function()
    -- two clients, each a loop of curl (a new connection per request) for
    -- 4 s, writing each status on a line; streamed answers of 20 tokens at
    -- 5 ms keep requests in flight across the reloads
    local body = P.dir .. "/admin-load.json"
    S.write(body, json.encode({ model = "m", prompt = "under load", max_tokens = 20,
      stream = true }))
    local loops = {}
    for i = 1, 2 do
      loops[i] = P.start(("sh -c %s"):format(P.quote(([[
        end=$(($(date +%%s) + 4))
        while [ $(date +%%s) -lt $end ]; do
          curl -s -o /dev/null -w '%%{http_code}\n' --max-time 10 \
            -H 'content-type: application/json' --data-binary @%s %s/v1/completions
        done]]):format(body, ngx.base))))
    end
    local _, _, before = admin(ngx, "GET", "generations")
    local from = json.decode(before).current
    for _ = 1, 10 do
      local code, _, text = admin(ngx, "POST", "reload")
      assert.equal(200, code, text)
      os.execute("sleep 0.25")
    end
    local codes = {}
    for i = 1, 2 do
      P.wait(loops[i])
      for c in (P.read(loops[i].out) or ""):gmatch("%d+") do
        codes[c] = (codes[c] or 0) + 1
      end
    end
    local total = 0
    for _, n in pairs(codes) do
      total = total + n
    end
    assert.is_true(total > 20, "requests sent: " .. total)
    assert.same({ ["200"] = total }, codes)
    every_worker(ngx, 2, function(a)
      return a.current == from + 10 and #a.generations == 1
    end, "both workers on the last generation, the old ones released")
  end)

  it("explains a request without forwarding it: POST explain", function()
    local code, h, body = admin(ngx, "POST", "explain", CHAT)
    assert.equal(200, code, body)
    assert.matches("^application/json", h["content-type"])
    local rec = json.decode(body)
    assert.is_true(rec.dry_run)
    assert.equal("/v1/chat/completions", rec.path)
    assert.equal(200, rec.status)
    assert.equal(2, #rec.picks) -- the picker's two
    assert.equal("default", rec.primary)
    -- a bad body gets the API's 400
    code, h, body = admin(ngx, "POST", "explain", '{"model": "m", "prompt": ')
    assert.equal(400, code)
    assert.matches("^application/json", h["content-type"])
    assert.matches("not valid JSON", json.decode(body).error.message)
  end)

  it("explains a live request asking with x-lupin-explain: 1", function()
    local code, h, body = P.post(ngx.base, "/v1/completions", COMPLETION,
      "-H 'x-request-id: explained-1' -H 'x-lupin-explain: 1'")
    assert.equal(200, code, body)
    assert.matches("^profile=default; picks=sim%-%d,sim%-%d; ", h["x-lupin-explain"])
    assert.equal("/lupin/explain/explained-1", h["x-lupin-explain-record"])
    assert.equal("[]", h["x-forwarded-explain"]) -- consumed
    -- the worker that served it keeps the record; the other says it has none
    local rec, missing
    P.poll(function()
      local c, _, b = P.get(ngx.base .. h["x-lupin-explain-record"])
      if c == 404 then
        missing = json.decode(b).error.message
      else
        assert.equal(200, c, b)
        rec = json.decode(b)
      end
      return rec and missing
    end, "the record, and a worker without it")
    assert.matches("no explain record for request explained%-1 in worker %d", missing)
    assert.equal("explained-1", rec.request_id)
    assert.is_false(rec.dry_run)
    assert.equal(200, rec.gateway.status)
    assert.equal("ok", rec.gateway.outcome)
    assert.equal(1, #rec.gateway.attempts)
    assert.equal("pick", rec.gateway.attempts[1].via)
    assert.equal(rec.picks[1], rec.gateway.attempts[1].name)
    -- a refusal carries them too: no endpoint by that name, 503
    local c2, h2, b2 = P.post(ngx.base, "/v1/completions", COMPLETION,
      "-H 'x-request-id: explained-2' -H 'x-lupin-explain: 1'"
      .. " -H 'x-gateway-destination-endpoint-subset: nowhere'")
    assert.equal(503, c2, b2)
    assert.matches("^status=503; outcome=no_endpoint; ", h2["x-lupin-explain"])
    assert.equal("/lupin/explain/explained-2", h2["x-lupin-explain-record"])
    -- and the list of that worker names it
    P.poll(function()
      local _, _, b = admin(ngx, "GET", "explain")
      local list = json.decode(b)
      assert.equal(64, list.kept)
      -- newest first: explained-2 went to the same worker or the other
      return list.ids[1] == "explained-1" or list.ids[2] == "explained-1"
    end, "the id in a worker's list")
  end)

  it("refuses x-lupin-explain where the location does not say lupin_explain on", function()
    local code, h = P.post(ngx.base, "/v1/chat/completions", CHAT,
      "-H 'x-request-id: not-explained' -H 'x-lupin-explain: 1'")
    assert.equal(200, code)
    assert.equal("refused: lupin_explain is off in this location", h["x-lupin-explain"])
    assert.is_nil(h["x-lupin-explain-record"])
    -- and a request that does not ask gets neither header
    code, h = P.post(ngx.base, "/v1/completions", COMPLETION)
    assert.equal(200, code)
    assert.is_nil(h["x-lupin-explain"])
  end)

  it("leaks nothing after the traffic: POST leaks in every worker", function()
    local seen, count = {}, 0
    P.poll(function()
      local code, h, body = admin(ngx, "POST", "leaks")
      assert.equal(200, code, body)
      local l = json.decode(body)
      assert.equal(0, l.leaked, l.report)
      local w = h["x-lupin-worker"]
      if l.live_requests == 0 and l.live_request_tables == 0 and not seen[w] then
        seen[w], count = true, count + 1
      end
      return count == 2
    end, "no live request or table in either worker")
    -- and each counted its reloads: the 13 that worked, the one that failed
    -- in the worker that took it
    local ok, failed = 0, 0
    for _ = 1, 20 do
      ok = ok + (N.status(ngx, 'lupin_reloads_total{result="ok"}') == 13 and 1 or 0)
      failed = failed + N.status(ngx, 'lupin_reloads_total{result="error"}')
    end
    assert.equal(20, ok)
    assert.is_true(failed > 0 and failed < 20)
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)

describe("nginx's lupin_config_watch", function()
  if not N.available() then
    pending("no " .. N.MODULE)
    return
  end

  local sim, ngx, cfg

  setup(function()
    sim = P.sim("--model m --instant", 2)
    cfg = N.config(P.sim_endpoints(sim))
    ngx = N.start(cfg, { workers = 2, listen = "reuseport", http = "lupin_config_watch on;",
      server = "location /lupin/ { lupin_admin; }" })
  end)

  teardown(function()
    N.stop(ngx)
    P.stop(sim)
  end)

  it("reloads every worker when lupin_config's file changes", function()
    every_worker(ngx, 2, function(a) return a.current == 1 end, "both workers at 1")
    -- a third endpoint: the new generation's endpoints are applied
    local eps = P.sim_endpoints(sim)
    eps[3] = { name = "sim-1-again", address = "127.0.0.1", port = sim.ports[1] }
    S.write(ngx.dir .. "/lupin.json", json.encode(N.config(eps)))
    every_worker(ngx, 2, function(a) return a.current == 2 end, "both workers at 2")
    assert.equal(2, errors_of(ngx, "reload %(file change%): generation 2 serving in worker %d"))
    P.poll(function()
      return N.status(ngx, "lupin_endpoints") == 3
    end, "three endpoints")
    -- the new endpoint serves: a subset hint of its name alone reaches it
    local code, h = P.post(ngx.base, "/v1/completions", COMPLETION,
      "-H 'x-gateway-destination-endpoint-subset: sim-1-again'")
    assert.equal(200, code)
    assert.equal(sim.hostports[1], h["x-sim-endpoint"])
  end)

  it("a broken save is refused in each worker, the next good one serves", function()
    write_broken(ngx)
    P.poll(function()
      return errors_of(ngx, "reload %(file change%) failed after [%d.]+ ms in worker %d, "
        .. "generation 2 keeps serving: [^\n]*lupin.json:3: ") == 2
    end, "both workers refusing it")
    assert.equal(200, (P.post(ngx.base, "/v1/completions", COMPLETION)))
    os.execute("sleep 0.5") -- no second attempt at the same file
    assert.equal(2, errors_of(ngx, "reload %(file change%) failed"))
    S.write(ngx.dir .. "/lupin.json", json.encode(cfg))
    every_worker(ngx, 2, function(a) return a.current == 3 end, "both workers at 3")
  end)

  it("stops clean: nginx exits 0, no worker lost, no sanitizer report", function()
    assert.equal("", N.stop_clean(ngx))
  end)
end)
