-- An allocation that fails costs one request at most (issue 51, item 5):
-- the gateway answers or closes that connection and serves the next.
--
-- build/lupin-faults is lupin serve with its own allocations (the
-- gateway's and liblupin's) routed through spec/fixtures/gateway/
-- malloc_count.c, which on SIGUSR1 arms "the Nth allocation from now
-- fails" and reports whether the arming before fired.  For each path a
-- request takes -- accept and parse (a 404), the request path (a body of
-- 200 KB and 60 headers, scheduled and proxied), the proxy path (a streamed
-- answer over a fresh upstream connection), GET /v1/models (a fan-out to
-- the endpoints) -- N runs from 1 until the
-- request makes fewer than N allocations; after each: the request got an
-- error answer, a closed connection or its whole answer, the next one is
-- answered 200, /healthz is ok, nothing is left in flight and the leak
-- check finds nothing.  At the end the gateway drains and exits 0 (under
-- ASan, LeakSanitizer would make it 23).
local P = require "e2e.procs"
local support = require "support"
local json = P.json

local FAULTS = support.ROOT .. "/" .. (os.getenv("LUPIN_PROGRAMS") or support.BUILD)
  .. "/lupin-faults"
local MAX_N = 600 -- far past what one request allocates (the sweep stops there)

describe("lupin serve, one allocation failing at a time", function()
  local up, gw
  local fail_file = P.dir .. "/malloc-fail"

  setup(function()
    up = P.upstream("--name A --close")
    local saved = P.LUPIN
    P.LUPIN = FAULTS
    gw = P.gateway({
      kind = "EndpointPickerConfig",
      plugins = { { type = "queue-scorer" }, { type = "max-score-picker" } },
      schedulingProfiles = { { name = "default", plugins = {
        { pluginRef = "queue-scorer", weight = 1 }, { pluginRef = "max-score-picker" } } } },
      endpoints = { { name = "a", address = "127.0.0.1", port = up.port } },
      -- one scrape at the start, none while a failure is armed
      -- (no ejection: an injected failure is not the endpoint's)
      gateway = { refreshIntervalMs = 3600000, metricsStalenessMs = 7200000, staleEjectionMs = 0,
        consecutiveErrors = 0 },
    }, "--log-level error", "MALLOC_FAIL_FILE=" .. fail_file)
    P.LUPIN = saved
  end)

  teardown(function()
    P.stop(gw)
    P.stop(up)
  end)

  -- Arms the Nth allocation to fail (0: none); returns whether the arming
  -- before failed one and the allocations counted since it.
  local function arm(n)
    os.remove(fail_file .. ".out")
    support.write(fail_file, tostring(n))
    P.signal(gw, "USR1")
    local out = P.poll(function()
      local f, c = (P.read(fail_file .. ".out") or ""):match("^(%d) (%d+)\n$")
      return f and { f == "1", tonumber(c) }
    end, "the failure armed")
    return out[1], out[2]
  end

  local BIG = ("x"):rep(200 * 1024)
  local many = {}
  for i = 1, 60 do
    many[#many + 1] = ("-H 'x-filler-%d: %s'"):format(i, ("v"):rep(40))
  end
  many = table.concat(many, " ")

  -- each returns status, headers, body, curl's exit status; and whether a
  -- whole 200 was what it should be
  local paths = {
    accept = function()
      local status, h, body, rc = P.get(gw.base .. "/nope", "--max-time 10")
      return status, h, body, rc, status == 404
    end,
    request = function()
      local status, h, body, rc = P.post(gw.base, "/v1/completions",
        { model = "m", prompt = BIG }, "--max-time 10 " .. many)
      local ok, r = pcall(json.decode, body)
      return status, h, body, rc, ok and r.received and r.received.body_bytes > #BIG
        and r.received["x-filler-60"] == ("v"):rep(40)
    end,
    proxy = function()
      local status, h, body, rc = P.post(gw.base, "/v1/completions",
        { model = "m", prompt = "hi", stream = true }, "--max-time 10")
      return status, h, body, rc, body:find("data: [DONE]", 1, true) ~= nil
    end,
    models = function()
      local status, h, body, rc = P.get(gw.base .. "/v1/models", "--max-time 10")
      local ok, r = pcall(json.decode, body)
      return status, h, body, rc, ok and r.data and r.data[1] and r.data[1].id == "m"
    end,
  }

  local function error_answer(status, body)
    local ok, r = pcall(json.decode, body)
    return status >= 400 and ok and type(r.error) == "table" and type(r.error.message) == "string"
  end

  local function serving(what)
    local status, _, body = P.post(gw.base, "/v1/completions", { model = "m", prompt = "next" },
      "--max-time 10")
    assert.equal(200, status, what .. ": the next request: " .. body)
    assert.equal("hi from A", json.decode(body).choices[1].text, what)
    assert.equal(200, (P.get(gw.admin .. "/healthz", "--max-time 10")), what .. ": /healthz")
    local _, _, list = P.get(gw.admin .. "/admin/requests")
    assert.same({}, json.decode(list).requests, what .. ": requests left in flight")
    assert.equal(0, P.metric(gw, "lupin_requests_in_flight"), what .. ": in flight")
    local _, _, leaks = P.post(gw.admin, "/admin/leaks", "")
    local r = json.decode(leaks)
    assert.equal(0, r.leaked, what .. ": " .. tostring(r.report))
    assert.equal(0, r.live_requests, what .. ": live requests")
  end

  for _, name in ipairs({ "accept", "request", "proxy", "models" }) do
    it("fails each allocation of the " .. name .. " path in turn, and serves on", function()
      serving("before")
      local made, outcomes = nil, {}
      for n = 1, MAX_N do
        arm(n)
        local status, _, body, rc, whole = paths[name]()
        local failed, count = arm(0)
        local what = ("%s path, allocation %d"):format(name, n)
        if not failed then -- the request made fewer than n: all of them were failed once
          made = count
          assert.truthy(whole, what .. " (none failed): " .. status .. " " .. body)
          break
        end
        -- an error answer, a connection closed (curl: no status, or a cut
        -- transfer), or the whole answer (the allocation was not needed for it)
        local how = whole and rc == 0 and "whole" or error_answer(status, body) and status
          or (status == 0 or rc ~= 0) and "closed"
        assert.truthy(how, ("%s: status %d, curl %d, body %s"):format(what, status, rc, body))
        assert.are_not.equal(28, rc, what .. ": curl timed out (a hang)")
        outcomes[tostring(how)] = (outcomes[tostring(how)] or 0) + 1
        serving(what)
      end
      assert.truthy(made, "more than " .. MAX_N .. " allocations")
      assert.truthy(made >= 3, name .. " path: too few allocations to tell: " .. tostring(made))
      print(("# %s path: %d allocations a request, failed in turn: %s"):format(name, made,
        json.encode(outcomes)))
    end)
  end

  it("drains and exits 0 after it all (no leak at exit under ASan)", function()
    P.signal(gw, "TERM")
    local rc = P.wait(gw)
    local err = P.read(gw.err) or ""
    assert.equal(0, rc, err)
    assert.falsy(err:find("LeakSanitizer", 1, true), err)
    assert.falsy(err:find("runtime error", 1, true), err)
  end)
end)
