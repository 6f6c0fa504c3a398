-- The host library (host/, liblupin-host.a): what every host of liblupin
-- needs besides lupin.h, with no event loop.  A program linked against it
-- and liblupin.a alone, without libuv or http_parser, uses each piece: the
-- admin API's JSON answers and the explain records of a small runtime
-- included (spec/host/host_link.c).
local support = require "support"

local function run(cmd)
  local p = io.popen(cmd .. " 2>&1")
  local out = p:read("*a")
  local ok = p:close()
  return out, ok
end

describe("the host library", function()
  local build = support.ROOT .. "/" .. support.BUILD

  it("links without libuv: a program on liblupin-host.a and liblupin.a alone", function()
    local out = support.program("host-link")
    assert.matches("rc=0", out, 1, true)
    assert.matches("metrics 0 3 2 0.25", out, 1, true)
    assert.matches("# TYPE lupin_endpoints gauge\nlupin_endpoints 4\n", out, 1, true)
    -- ejected for the base time, back once it is over and scrapes succeed
    assert.matches("health 1 1 0 1 healthy", out, 1, true)
    assert.matches('access {"ts":1.000,"id":"r\\"1","path":"/v1/completions"', out, 1, true)
    assert.matches("secret 1 0", out, 1, true)
    -- the OpenAI error body, as lupin serve answers a refusal
    local e429 = support.json.decode((assert(out:match("error429 (%b{})"), out))).error
    assert.same({ message = 'queue "full"', type = "rate_limit_error" },
      { message = e429.message, type = e429.type })
    assert.equal(support.json.null, e429.param)
    local e400 = support.json.decode((assert(out:match("error400 (%b{})"), out))).error
    assert.same({ "bad", "invalid_request_error", "messages" }, { e400.message, e400.type, e400.param })
    local libs = run("ldd " .. build .. "/host-link")
    assert.falsy(libs:match("libuv"), libs)
    assert.falsy(libs:match("http_parser"), libs)
  end)

  -- "name <JSON>" lines of host-link, decoded by name
  local function answers()
    local out = support.program("host-link")
    assert.matches("rc=0", out, 1, true)
    local got = {}
    for name, json in out:gmatch("\n([%w ]+) (%b{})") do
      got[name] = support.json.decode(json)
    end
    return got, out
  end

  it("writes the admin API's answers from a runtime and the host's data", function()
    local got, out = answers()
    local eps = assert(got.endpoints, out).endpoints
    assert.equal(2, #eps)
    local ep1, ep2 = eps[1], eps[2]
    assert.equal("ep1", ep1.name)
    assert.same({ "10.0.0.1:8000" }, ep1.addresses)
    assert.is_true(ep1.fresh)
    assert.is_true(math.abs(ep1.scrape_age_seconds - 1) < 0.5)
    assert.equal(7, ep1.scrapes)
    assert.equal(2, ep1.idle_connections)
    assert.equal(3, ep1.metrics.waiting_queue_size)
    assert.equal(0.5, ep1.metrics.kv_cache_usage)
    assert.equal("a,b", ep1.metrics.running_lora_adapters)
    assert.equal("healthy", ep1.health.state)
    assert.equal("ep2", ep2.name)
    assert.same({}, ep2.addresses)
    assert.is_false(ep2.fresh)
    assert.equal(-1, ep2.scrape_age_seconds)
    assert.equal(3, ep2.scrape_errors)
    assert.equal("ejected", ep2.health.state)
    assert.equal(1, ep2.health.ejections)
    assert.is_true(ep2.health.ejected_for_seconds > 29 and ep2.health.ejected_for_seconds <= 30)
    assert.equal("connect: refused", ep2.health.last_error)

    local reqs = assert(got.requests, out).requests
    assert.equal(1, #reqs)
    assert.same({ id = "req-1", model = "m", path = "/v1/completions", endpoint = "ep2",
      stream = false, age_seconds = 0.25, generation = 1, worker = 0 }, reqs[1])

    local gens = assert(got.generations, out)
    assert.equal(1, gens.current)
    assert.equal(1, #gens.generations)
    assert.equal("host-link", gens.generations[1].source)
    assert.is_true(gens.generations[1].current)
    assert.equal(1, #gens.workers)
    assert.equal(0, gens.workers[1].worker)
    assert.same(gens.generations[1].digest, gens.workers[1].generations[1].digest)

    assert.same({ reloaded = true, generation = 2, duration_seconds = 0.125 }, got.reload)
    local leaks = assert(got.leaks, out)
    assert.equal(0, leaks.leaked)
    assert.equal(0, leaks.live_requests)
    assert.equal("", leaks.report)
    assert.is_true(leaks.lua_memory_bytes > 0)
  end)

  it("sums flow control's queue over runtimes, off when none has it", function()
    local got, out = answers()
    assert.same({ enabled = false, bands = {} }, assert(got["flows off"], out))
    local on = assert(got["flows on"], out)
    assert.is_true(on.enabled)
    assert.same({}, on.bands) -- nothing queued
    assert.equal("boolean", type(on.saturated))
  end)

  it("keeps explain records in a ring: the newest first, the oldest aged out", function()
    local got, out = answers()
    assert.same({ kept = 2, ids = { "req-3", "req-2" } }, got.explain)
    local rec = assert(got.record, out)
    assert.equal("req-3", rec.request_id)
    assert.same({ "ep2" }, rec.picks)
    assert.same({ status = 200, outcome = "ok", total_ms = 12.5,
      attempts = { { endpoint = "10.0.0.1:8000", status = 200 } } }, rec.gateway)
    assert.matches("aged out yes", out, 1, true)
  end)

  it("defines and uses no libuv or http_parser symbol", function()
    local syms = run("nm " .. build .. "/liblupin-host.a")
    assert.falsy(syms:match("%f[%w_]uv_[%w_]+"), "liblupin-host.a names libuv")
    assert.falsy(syms:match("%f[%w_]http_parser[%w_]*"), "liblupin-host.a names http_parser")
  end)

  it("includes lupin.h from the core and no loop header", function()
    local strange = {}
    local p = io.popen("cd " .. support.ROOT .. " && grep -H '#include' host/*.c host/*.h")
    for line in p:lines() do
      local file, inc = line:match('^([^:]+):#include%s+[<"]([^>"]+)[>"]')
      if inc and (inc:match("uv") or inc:match("http_parser") or inc == "internal.h"
          or inc == "gateway.h" or inc:match("^lua")) then
        strange[#strange + 1] = file .. ": " .. inc
      end
    end
    p:close()
    assert.same({}, strange)
  end)
end)
