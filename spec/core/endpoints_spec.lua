-- The endpoint pool: C-owned, read by plugins as plain fields, no copies.
local S = require "support"

describe("endpoint pool", function()
  local rt
  before_each(function()
    rt = S.runtime()
    assert(rt:load("examples/configs/minimal.json"))
  end)
  after_each(function()
    rt:free()
  end)

  local function view()
    return S.eval(rt, [[
      local out = {}
      for i, ep in ipairs(require("lupin.runtime.pool").list) do
        out[i] = { name = ep.name, address = ep.address, port = ep.port, hostport = ep.hostport,
          q = ep.waiting_queue_size, running = ep.running_requests, kv = ep.kv_cache_usage,
          max_lora = ep.max_lora, block = ep.cache_block_size, blocks = ep.num_blocks,
          fresh = ep.scraped_at > 0, labels = require("lupin.runtime.readonly").unwrap(ep.labels),
          active = table.concat(ep.active_adapters, ","), has_sql = ep.active_adapters.sql or false,
          waiting = table.concat(ep.waiting_adapters, ","), waits_x = ep.waiting_adapters.x or false }
      end
      return out]])
  end

  it("adds endpoints with labels and reads their metrics as plain fields", function()
    assert(rt:upsert({ name = "a", address = "10.1.0.1", port = 8000,
      labels = { ["llm-d.ai/role"] = "decode" } }))
    assert(rt:set_metrics("a", { waiting_queue_size = 3, running_requests = 2,
      kv_cache_usage = 0.25, running_lora_adapters = "sql,chat", waiting_lora_adapters = "x",
      max_lora = 4, cache_block_size = 16, num_blocks = 1000 }))
    local eps = view()
    assert.equal(1, #eps)
    assert.same({ name = "a", address = "10.1.0.1", port = 8000, hostport = "10.1.0.1:8000",
      q = 3, running = 2, kv = 0.25, max_lora = 4, block = 16, blocks = 1000, fresh = true,
      labels = { ["llm-d.ai/role"] = "decode" },
      active = "sql,chat", has_sql = true, waiting = "x", waits_x = true }, eps[1])
  end)

  it("finds each of many endpoints by name through removals and moves", function()
    for i = 1, 300 do
      assert(rt:upsert({ name = "n" .. i, address = "10.2.0." .. (i % 250), port = 1000 + i }))
    end
    for i = 1, 300, 3 do
      assert.is_true(rt:remove("n" .. i))
    end
    for i = 2, 300, 3 do -- moved: detached and attached again under the same name
      assert(rt:upsert({ name = "n" .. i, address = "10.3.0.1", port = 2000 + i }))
    end
    for i = 1, 300 do
      local gone = i % 3 == 1
      assert.equal(not gone, rt:set_metrics("n" .. i, { waiting_queue_size = i }), "n" .. i)
    end
    assert.is_false(rt:set_metrics("n301", { waiting_queue_size = 1 }))
    local eps = view()
    assert.equal(200, #eps)
    for _, ep in ipairs(eps) do
      assert.equal(tonumber(ep.name:sub(2)), ep.q, ep.name) -- each got its own metrics
    end
  end)

  it("names an endpoint address:port when no name is given", function()
    assert(rt:upsert({ address = "10.1.0.9", port = 9000 }))
    assert.equal("10.1.0.9:9000", view()[1].name)
  end)

  it("refuses an endpoint without address or with a bad port", function()
    local ok, err = rt:upsert({ name = "x", port = 8000 })
    assert.is_nil(ok)
    assert.matches("endpoint x: needs an address and a port in 1..65535", err, 1, true)
    assert.is_nil((rt:upsert({ name = "x", address = "10.0.0.1", port = 70000 })))
    assert.equal(0, rt:stats().endpoints)
  end)

  it("updates labels in place and keeps metrics on upsert", function()
    rt:upsert({ name = "a", address = "10.1.0.1", port = 8000 })
    rt:set_metrics("a", { waiting_queue_size = 7 })
    rt:upsert({ name = "a", address = "10.1.0.1", port = 8000, labels = { zone = "b" } })
    local ep = view()[1]
    assert.same({ zone = "b" }, ep.labels)
    assert.equal(7, ep.q)
  end)

  it("moves an endpoint to a new address as a new object, keeping metrics", function()
    rt:upsert({ name = "a", address = "10.1.0.1", port = 8000 })
    rt:set_metrics("a", { waiting_queue_size = 5 })
    local req = rt:begin({})
    assert.equal("10.1.0.1", req:schedule().picks[1].address)
    rt:upsert({ name = "a", address = "10.1.0.2", port = 8001 })
    local ep = view()[1]
    assert.same({ "10.1.0.2", 8001, 5 }, { ep.address, ep.port, ep.q })
    assert.equal(1, rt:stats().endpoints)
    req:finish("ok")
  end)

  it("removes endpoints; requests holding one keep a valid view", function()
    S.endpoints(rt, 3)
    local req = rt:begin({ subset = { "ep2" } })
    local res = req:schedule()
    assert.equal("ep2", res.picks[1].name)
    assert.is_true(rt:remove("ep2"))
    assert.is_false(rt:remove("ep2"))
    assert.equal(2, #view())
    -- the request's view of ep2 is intact until it ends
    req:response_header(200, {})
    assert.same({ "ep2", "10.0.0.2" }, S.eval(rt, [[
      local out
      require("lupin.runtime.leaks").each_live(function(r)
        local ep = r.result.endpoints[1]
        out = { ep.name, ep.address }
      end)
      return out]]))
    req:finish("ok")
    collectgarbage()
    rt:check_leaks()
    assert.equal(2, rt:stats().endpoints)
    assert.is_false(rt:set_metrics("ep2", { waiting_queue_size = 1 }))
  end)

  it("hands every request the same endpoint objects, not copies", function()
    S.endpoints(rt, 4)
    local same = S.eval(rt, [[
      local pool = require("lupin.runtime.pool")
      local before = pool.list
      return before[1] == pool.list[1] and before == pool.list]])
    assert.is_true(same)
    -- metrics written through the C API are seen without rebuilding the list
    local list_before = S.eval(rt, [[return tostring(require("lupin.runtime.pool").list)]])
    rt:set_metrics("ep1", { waiting_queue_size = 42 })
    assert.equal(list_before, S.eval(rt, [[return tostring(require("lupin.runtime.pool").list)]]))
    assert.equal(42, view()[1].q)
  end)

  it("stamps metrics with the scrape time, now when none is given", function()
    S.endpoints(rt, 1)
    rt:set_metrics("ep1", { scraped_at = 12.5 })
    assert.equal(12.5, S.eval(rt, [[return require("lupin.runtime.pool").list[1].scraped_at]]))
  end)
end)
