-- Endpoint identities and in-flight counters shared between runtimes
-- (core/shared.c, docs/workers.md): two runtimes made with one lupin_shared
-- on this one thread, as two workers of a gateway would be on two.
local S = require "support"
local native = require "lupin_native"

local dir
setup(function()
  dir = S.tmpdir()
  -- fails where the header x-fail-at says; sets x-tokens tokens on its pick
  -- (x-tokens-at: in which point); keeps what set_in_flight_tokens answered,
-- or the error it raised
  S.write(dir .. "/spec-shared-probe.lua", [[
local answers = {}
local function maybe(ctx, point)
  local h = ctx.request.headers
  if h["x-tokens"] and (h["x-tokens-at"] or "pre_request") == point then
    local ep = ctx.result.endpoints[1]
    local n = tonumber(h["x-tokens"]) or h["x-tokens"]
    local ok, v = pcall(function()
      local counted = ctx:set_in_flight_tokens(ep, n) -- not a tail call: the line stays
      return counted
    end)
    if not ok then
      v = v:gsub("^.*/", "")
    end
    answers[#answers + 1] = v
  end
  if h["x-fail-at"] == point then
    error("asked to fail in " .. point)
  end
end
return {
  type = "spec-shared-probe",
  answers = answers,
  pre_request = function(_, ctx) maybe(ctx, "pre_request") end,
  response_chunk = function(_, ctx) maybe(ctx, "response_chunk") end,
  finish = function(_, ctx) maybe(ctx, "finish") end,
}
]])
end)

local CONFIG = {
  plugins = { { type = "header-based-testing-filter" }, { type = "kit-failing-picker" },
    { type = "spec-shared-probe" } },
  schedulingProfiles = { { name = "default", plugins = {
    { pluginRef = "header-based-testing-filter" }, { pluginRef = "kit-failing-picker" } } } },
}

local function runtime(shared, n)
  local rt = S.loaded(CONFIG, { plugin_dirs = { S.FIXTURES, dir }, shared = shared })
  S.endpoints(rt, n or 2)
  return rt
end

local function ids(rt)
  return S.eval(rt, [[
    local out = {}
    for _, ep in ipairs(require("lupin.runtime.pool").list) do
      out[ep.name] = ep.id
    end
    return out]])
end

local function begin(rt, target, headers, flags)
  headers = headers or {}
  headers["test-epp-endpoint-selection"] = target or "ep1"
  local d = { path = "/v1/completions", body = '{"model":"m","prompt":"p"}', headers = headers }
  for k, v in pairs(flags or {}) do
    d[k] = v
  end
  return assert(rt:begin(d))
end

local function answers(rt)
  return S.eval(rt, "return require('lupin.runtime').current.by_name['spec-shared-probe'].obj.answers")
end

describe("endpoints shared between runtimes", function()
  local shared, a, b

  before_each(function()
    shared = native.shared()
    a, b = runtime(shared), runtime(shared)
  end)

  after_each(function()
    if a then a:free() end
    if b then b:free() end
  end)

  it("gives an endpoint the same id in every runtime, another one a different id", function()
    local ia, ib = ids(a), ids(b)
    assert.same(ia, ib)
    assert.are_not.equal(ia.ep1, ia.ep2)
    assert.equal(2, shared:endpoints())
    -- a runtime of its own (no shared state) numbers its endpoints by itself
    local own = runtime(nil, 1)
    assert.equal(1, ids(own).ep1)
    own:free()
  end)

  it("shows a request scheduled on one runtime in flight on the other until it ends", function()
    for _, outcome in ipairs({ "ok", "cancelled", "upstream_error", "timeout" }) do
      local req = begin(a, "ep2")
      assert.equal(200, req:schedule().status)
      assert.same({ ep2 = 1 }, S.in_flight(b), outcome)
      assert.equal(200, req:schedule().status) -- asked again: counted once
      assert.same({ ep2 = 1 }, S.in_flight(b), outcome)
      req:finish(outcome)
      assert.same({}, S.in_flight(b), outcome)
      assert.same({}, S.in_flight(a), outcome)
    end
  end)

  it("releases the count when a plugin fails in pre_request, the response or finish", function()
    for _, point in ipairs({ "pre_request", "response_chunk", "finish" }) do
      local req = begin(a, "ep1", { ["x-fail-at"] = point })
      assert.equal(200, req:schedule().status) -- a request-control error: the request goes on
      req:response_header(200, {})
      req:response_chunk("{}")
      assert.same({ ep1 = 1 }, S.in_flight(b), point)
      req:finish("ok")
      assert.same({}, S.in_flight(b), point)
    end
    local failed = false
    for _, l in ipairs(a:logs()) do
      failed = failed or l[2]:find("asked to fail in finish", 1, true) ~= nil
    end
    assert.is_true(failed)
  end)

  it("counts nothing for a request that fails scheduling or is a dry run", function()
    local req = begin(a, "ep1", { ["x-kit-fail"] = "1" })
    assert.equal(500, req:schedule().status)
    assert.same({}, S.in_flight(b))
    req:finish("plugin_error")
    req = begin(a, "ep1", nil, { dry_run = true, explain = true })
    assert.equal(200, req:schedule().status)
    assert.same({}, S.in_flight(b))
    req:finish("ok")
    assert.same({}, S.in_flight(b))
  end)

  it("counts a request once on an endpoint two profiles chose", function()
    local two = S.loaded({
      plugins = { { type = "kit-two-profile-handler" }, { type = "header-based-testing-filter" },
        { type = "kit-failing-picker" } },
      schedulingProfiles = {
        { name = "a", plugins = { { pluginRef = "header-based-testing-filter" },
          { pluginRef = "kit-failing-picker" } } },
        { name = "b", plugins = { { pluginRef = "header-based-testing-filter" },
          { pluginRef = "kit-failing-picker" } } },
      },
    }, { plugin_dirs = { S.FIXTURES, dir }, shared = shared })
    S.endpoints(two, 2)
    local req = begin(two, "ep2")
    assert.equal(200, req:schedule().status)
    assert.same({ ep2 = 1 }, S.in_flight(a))
    req:finish("ok")
    assert.same({}, S.in_flight(a))
    two:free()
  end)

  it("holds the tokens a plugin set until the request ends, set and not added", function()
    local r1 = begin(a, "ep1", { ["x-tokens"] = "40" })
    local r2 = begin(b, "ep1", { ["x-tokens"] = "2" })
    assert.equal(200, r1:schedule().status)
    assert.equal(200, r2:schedule().status)
    assert.same({ ep1 = 42 }, S.in_flight(a, "in_flight_tokens"))
    assert.same({ ep1 = 2 }, S.in_flight(b))
    -- set again from a later point: it replaces this request's 40
    local r3 = begin(a, "ep2", { ["x-tokens"] = "7", ["x-tokens-at"] = "response_chunk" })
    assert.equal(200, r3:schedule().status)
    r3:response_chunk("{}")
    r3:response_chunk("{}")
    assert.same({ ep1 = 42, ep2 = 7 }, S.in_flight(b, "in_flight_tokens"))
    r1:finish("cancelled")
    r3:finish("ok")
    assert.same({ ep1 = 2 }, S.in_flight(a, "in_flight_tokens"))
    r2:finish("upstream_error")
    assert.same({}, S.in_flight(a, "in_flight_tokens"))
    assert.same({ true, true, true }, answers(a)) -- r1, then r3 twice
  end)

  it("counts no tokens set in finish: the request is ending", function()
    local req = begin(a, "ep1", { ["x-tokens"] = "5", ["x-tokens-at"] = "finish" })
    assert.equal(200, req:schedule().status)
    req:finish("ok")
    assert.same({ false }, answers(a))
    assert.same({}, S.in_flight(b, "in_flight_tokens"))
  end)

  it("refuses tokens that are not a whole number from 0, at the plugin's line", function()
    for _, bad in ipairs({ "-1", "1.5", "x" }) do
      local req = begin(a, "ep1", { ["x-tokens"] = bad })
      assert.equal(200, req:schedule().status)
      req:finish("ok")
    end
    local msg = "spec-shared-probe.lua:8: set_in_flight_tokens: n must be a whole number from 0, got "
    assert.same({ msg .. "-1", msg .. "1.5", msg .. "x" }, answers(a))
    assert.same({}, S.in_flight(b, "in_flight_tokens"))
  end)

  it("gives a moved endpoint a new id; requests on the old one release its counters", function()
    local before = ids(a).ep1
    local req = begin(a, "ep1")
    assert.equal(200, req:schedule().status)
    assert(a:upsert({ name = "ep1", address = "10.0.0.99", port = 8000 }))
    local moved = ids(a).ep1
    assert.are_not.equal(before, moved)
    assert.same({}, S.in_flight(a)) -- the new ep1 has nothing in flight
    assert.same({ ep1 = 1 }, S.in_flight(b)) -- b still has ep1 where it was
    assert(b:upsert({ name = "ep1", address = "10.0.0.99", port = 8000 }))
    assert.equal(moved, ids(b).ep1)
    req:finish("ok")
    a:collect()
    b:collect()
    assert.equal(2, shared:endpoints()) -- the old slot went with its last object
    -- moved back: a new id again, the old one is not reused
    assert(a:upsert({ name = "ep1", address = "10.0.0.1", port = 8000 }))
    local back = ids(a).ep1
    assert.are_not.equal(before, back)
    assert.are_not.equal(moved, back)
  end)

  it("lets a slot go once no runtime holds its endpoint, and keeps it while one does", function()
    local id = ids(a).ep2
    assert(a:remove("ep2"))
    a:collect()
    assert.equal(2, shared:endpoints()) -- b still has it
    assert(a:upsert({ name = "ep2", address = "10.0.0.2", port = 8000 }))
    assert.equal(id, ids(a).ep2) -- the same identity
    -- a request holds its endpoint, and the slot, past the removal
    local req = begin(a, "ep2")
    assert.equal(200, req:schedule().status)
    assert(a:remove("ep2"))
    assert(b:remove("ep2"))
    a:collect()
    b:collect()
    assert.equal(2, shared:endpoints())
    req:finish("ok")
    a:collect()
    assert.equal(1, shared:endpoints())
    assert(b:upsert({ name = "ep2", address = "10.0.0.2", port = 8000 }))
    assert.are_not.equal(id, ids(b).ep2)
  end)

  it("releases the counts of requests alive when their runtime is freed", function()
    local r1, r2 = begin(a, "ep1", { ["x-tokens"] = "9" }), begin(a, "ep2")
    assert.equal(200, r1:schedule().status)
    assert.equal(200, r2:schedule().status)
    assert.same({ ep1 = 1, ep2 = 1 }, S.in_flight(b))
    a:free()
    a = nil
    assert.same({}, S.in_flight(b))
    assert.same({}, S.in_flight(b, "in_flight_tokens"))
    assert.equal(2, shared:endpoints()) -- b's objects hold them
    b:free()
    b = nil
    assert.equal(0, shared:endpoints())
  end)
end)
