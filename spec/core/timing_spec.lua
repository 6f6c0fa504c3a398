-- ctx.timing: when a response came, as the core saw the host's calls; the
-- body's times only for generations with a plugin declaring times_response.
local S = require "support"
local native = require "lupin_native"

local function config(times_response)
  local plugins = { { type = "test-picker", name = "p" } }
  if times_response then
    table.insert(plugins, 1, { type = "test-timer", name = "t" })
  end
  return {
    plugins = plugins,
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "p" } } } },
  }
end

local function seen(rt, id)
  return S.eval(rt, ([[return require("lupin.runtime").current.by_name.t.obj.seen[%q] ]]):format(id))
end

describe("ctx.timing", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  it("times the head, the first and last body bytes and counts events across chunks", function()
    rt = S.loaded(config(true))
    S.endpoints(rt, 1)
    local t0 = native.now()
    local req = rt:begin({ id = "r1", body = '{"model":"m","prompt":"hi","stream":true}' })
    assert.equal(200, req:schedule().status)
    assert.is_true(req:wants_chunks()) -- the host must hand over the body
    local before = req:timing()
    assert.is_true(before.begun_at >= t0)
    assert.equal(0, before.head_at)
    assert.equal(0, before.first_byte_at)
    req:response_header(200, { ["Content-Type"] = "text/event-stream" })
    req:response_chunk("data: 1\n\ndata: 2\n")
    req:response_chunk("\ndata: 3\n\n") -- an event's blank line split over two chunks
    req:response_chunk("")               -- nothing: not a byte
    req:response_chunk("data: [DONE]\n\n")
    local t = req:timing()
    req:response_complete()
    req:finish("ok")
    assert.is_true(t.head_at >= t.begun_at)
    assert.is_true(t.first_byte_at >= t.head_at)
    assert.is_true(t.last_byte_at >= t.first_byte_at)
    assert.equal(3, t.chunks)
    assert.equal(4, t.events)
    assert.equal(#"data: 1\n\ndata: 2\n" + #"\ndata: 3\n\n" + #"data: [DONE]\n\n", t.bytes)
    local s = seen(rt, "r1") -- the plugin reads the same in finish
    assert.equal(4, s.events)
    assert.equal(t.first_byte_at, s.first_byte_at)
  end)

  it("times nothing, no clock read, when no plugin asks", function()
    rt = S.loaded(config(false))
    S.endpoints(rt, 1)
    local req = rt:begin({ id = "r2", body = '{"model":"m","prompt":"hi"}' })
    req:schedule()
    assert.is_false(req:wants_chunks())
    req:response_header(200, {})
    req:response_chunk("data: 1\n\n")
    local t = req:timing()
    req:finish("ok")
    assert.equal(0, t.begun_at)
    assert.equal(0, t.head_at)
    assert.equal(0, t.first_byte_at)
    assert.equal(0, t.chunks)
    assert.equal(0, t.events)
  end)

  it("is nil in the dry run a new generation is checked with", function()
    rt = S.loaded(config(true))
    S.endpoints(rt, 1)
    assert.is_false(seen(rt, "dry-run"))
  end)
  it("counts a request's prefill tokens on its pick until the first body byte", function()
    rt = S.loaded(config(true))
    S.endpoints(rt, 2)
    local a = rt:begin({ id = "a", body = '{"model":"m","prompt":"hi"}', subset = { "ep1" } })
    local b = rt:begin({ id = "b", body = '{"model":"m","prompt":"hi"}', subset = { "ep1" } })
    a:schedule()
    b:schedule()
    assert.same({ ep1 = 200 }, S.in_flight(rt, "in_flight_prefill_tokens"))
    a:response_header(200, {})
    assert.same({ ep1 = 200 }, S.in_flight(rt, "in_flight_prefill_tokens")) -- a head is no token
    a:response_chunk("data: 1\n\n")
    assert.same({ ep1 = 100 }, S.in_flight(rt, "in_flight_prefill_tokens"))
    b:finish("cancelled") -- never answered: taken off at the end
    assert.same({}, S.in_flight(rt, "in_flight_prefill_tokens"))
    a:finish("ok")
    assert.is_true(S.eval(rt, [[return require("lupin.runtime").current.by_name.t.obj.counted.a]]))
  end)

  it("refuses a bad set_prefill_tokens with a message, and counts nothing in a dry run", function()
    rt = S.loaded(config(true))
    S.endpoints(rt, 1)
    local out = S.eval(rt, [[
      local ctx = require "lupin.runtime.ctx"
      local r = ctx.new_request(require("lupin.runtime").current, nil, "x", "/v1/completions",
        "{}", "m", {})
      local c = ctx.of(r, { name = "p" })
      local ep = require("lupin.runtime.pool").list[1]
      local prev = ctx.enter(r)
      local ok1, e1 = pcall(c.set_prefill_tokens, c, {}, 1)
      local ok2, e2 = pcall(c.set_prefill_tokens, c, ep, -1)
      local dry = c:set_prefill_tokens(ep, 5)
      ctx.leave(prev)
      return { ok1, tostring(e1), ok2, tostring(e2), dry }]])
    assert.is_false(out[1])
    assert.matches("set_prefill_tokens: ep must be an endpoint, got table", out[2], 1, true)
    assert.is_false(out[3])
    assert.matches("set_prefill_tokens: n must be a whole number from 0, got %-1", out[4])
    assert.is_false(out[5])
  end)
end)
