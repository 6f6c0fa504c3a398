-- Latency models (lupin.predictor over core/latency_model.c): ridge
-- regression that converges on a linear truth, forgets by its half-life,
-- tracks a quantile, ignores non-finite samples, checks every argument, is
-- one model per names for every runtime of a lupin_shared, holds at most
-- 4096 models, and counts the errors of the predictions a scheduler used.
-- Nothing here is timed: `make bench-predictor` measures the cost.
local S = require "support"
local native = require "lupin_native"

local PRELUDE = [[
local predictor = require "lupin.predictor"
local function pair(ok, err) return tostring(ok) .. " " .. tostring(err) end
local function err_of(f, ...) local ok, e = pcall(f, ...) return not ok and e or "no error" end
local function spec(t)
  local o = { plugin = "p", target = "ttft", group = "all", features = 3 }
  for k, v in pairs(t or {}) do o[k] = v end
  return o
end
local function rel(a, b) return math.abs(a - b) / math.abs(b) end
-- the truth the convergence cases learn: y = 50 + 2·x1 + 30·x2
local function truth(x1, x2) return 50 + 2 * x1 + 30 * x2 end
]]

local function run(rt, code)
  return S.eval(rt, PRELUDE .. code)
end

describe("lupin.predictor", function()
  local rt

  before_each(function()
    rt = S.runtime()
  end)

  after_each(function()
    rt:free()
  end)

  it("converges on a linear truth with noise: within 5% after 500 samples", function()
    local got = run(rt, [[
      math.randomseed(7)
      local m = assert(predictor.model(spec()))
      for i = 1, 500 do
        local x1, x2 = math.random() * 200, math.random() * 4
        local noise = 1 + 0.04 * (math.random() - 0.5)
        assert(m:train({ 1, x1, x2 }, truth(x1, x2) * noise, i))
      end
      local worst, b = 0, predictor.batch(3, 50)
      for _ = 1, 50 do
        local x1, x2 = math.random() * 200, math.random() * 4
        local i = b:add(m, { 1, x1, x2 })
        b:predict()
        worst = math.max(worst, rel((b:get(i)), truth(x1, x2)))
      end
      local s = m:stats()
      return { worst = worst, w = s.weights, trained = s.trained, apriori = s.apriori }]])
    assert.truthy(got.worst < 0.05, "worst relative error " .. got.worst)
    assert.near(50, got.w[1], 5)
    assert.near(2, got.w[2], 0.05)
    assert.near(30, got.w[3], 2)
    assert.equal(500, got.trained)
    -- the a-priori errors: every sample once there are as many as features
    assert.equal(497, got.apriori.n)
    assert.truthy(got.apriori.mape < 0.05, got.apriori.mape)
  end)

  it("learns a bias and a feature counted in tokens alike (the ridge is per feature's scale)",
    function()
      -- with ρ on the raw trace a 0..20000 feature would pull the bias to 0
      local got = run(rt, [[
        math.randomseed(3)
        local m = assert(predictor.model(spec({ features = 2 })))
        for i = 1, 300 do
          local tokens = math.random() * 20000
          m:train({ 1, tokens }, 40 + 0.01 * tokens, i)
        end
        return m:stats().weights]])
      assert.near(40, got[1], 0.1)
      assert.near(0.01, got[2], 1e-5)
    end)

  it("forgets by its half-life: follows new coefficients within 100 samples, not without", function()
    local got = run(rt, [[
      local function follow(half_life)
        local m = assert(predictor.model(spec({ group = "hl" .. half_life, halfLife = half_life,
          features = 2 })))
        math.randomseed(11)
        local now = 0
        for _ = 1, 300 do -- 10 samples a second
          now = now + 0.1
          local x = math.random() * 100
          m:train({ 1, x }, 50 + 2 * x, now)
        end
        for _ = 1, 100 do -- the endpoint got slower
          now = now + 0.1
          local x = math.random() * 100
          m:train({ 1, x }, 100 + 4 * x, now)
        end
        local b = predictor.batch(2, 1)
        b:add(m, { 1, 50 })
        b:predict()
        return rel((b:get(1)), 100 + 4 * 50)
      end
      return { follow(2), follow(0) }]])
    assert.truthy(got[1] < 0.05, "half-life 2 s: off by " .. got[1])
    assert.truthy(got[2] > 0.15, "no forgetting: off by only " .. got[2])
  end)

  it("decays the sample weight by 2^(-elapsed/halfLife), not before the first sample", function()
    local got = run(rt, [[
      local m = assert(predictor.model(spec({ features = 1, halfLife = 10 })))
      local w = {}
      m:train({ 1 }, 5, 100)
      w[1] = m:stats().weight
      m:train({ 1 }, 5, 110)       -- one half-life later
      w[2] = m:stats().weight
      m:train({ 1 }, 5, 105)       -- a clock behind the last sample: no decay
      w[3] = m:stats().weight
      local n = assert(predictor.model(spec({ group = "none", features = 1 })))
      for t = 1, 3 do n:train({ 1 }, 5, t * 1000) end
      w[4] = n:stats().weight
      return w]])
    assert.same({ 1, 1.5, 2.5, 3 }, got)
  end)

  it("predicts a quantile: about 90% of fresh samples at or below q = 0.9's prediction", function()
    local got = run(rt, [[
      math.randomseed(5)
      local q = assert(predictor.model(spec({ group = "q", quantile = 0.9, features = 2 })))
      local mean = assert(predictor.model(spec({ group = "mean", features = 2 })))
      local function sample()
        local x = math.random() * 100
        return x, (100 + 2 * x) * (1 + 0.6 * (math.random() - 0.5))
      end
      for i = 1, 3000 do
        local x, y = sample()
        q:train({ 1, x }, y, i)
        mean:train({ 1, x }, y, i)
      end
      local b, below_q, below_mean = predictor.batch(2, 2), 0, 0
      for _ = 1, 2000 do
        local x, y = sample()
        b:reset()
        b:add(q, { 1, x })
        b:add(mean, { 1, x })
        b:predict()
        below_q = below_q + (y <= b:get(1) and 1 or 0)
        below_mean = below_mean + (y <= b:get(2) and 1 or 0)
      end
      return { below_q / 2000, below_mean / 2000, q:stats().factor, mean:stats().factor }]])
    assert.truthy(got[1] > 0.83 and got[1] < 0.96, "below the 0.9 quantile: " .. got[1])
    assert.truthy(got[2] > 0.42 and got[2] < 0.58, "below the mean: " .. got[2])
    assert.truthy(got[3] > 1.1 and got[3] < 1.4, "factor " .. got[3])
    assert.equal(1, got[4])
  end)

  it("ignores non-finite samples: false, the model untouched", function()
    local got = run(rt, [[
      local m = assert(predictor.model(spec({ features = 2, halfLife = 5 })))
      assert(m:train({ 1, 2 }, 10, 1) and m:train({ 1, 3 }, 12, 2))
      local before = require("cjson").encode(m:stats())
      local out = {
        m:train({ 1, 0 / 0 }, 10, 3), m:train({ 1, math.huge }, 10, 3),
        m:train({ -math.huge, 1 }, 10, 3), m:train({ 1, 2 }, 0 / 0, 3),
        m:train({ 1, 2 }, math.huge, 3), m:train({ 1, 2 }, 10, 0 / 0),
        m:train({ 1, 2 }, 10, math.huge), m:train({ 1, 1e200 }, 10, 3),
        m:train({ 1, 2 }, -1e101, 3),
      }
      out[#out + 1] = require("cjson").encode(m:stats()) == before
      out[#out + 1] = m:train({ 1, 4 }, 14, 3)
      out[#out + 1] = m:stats().trained
      return out]])
    assert.same({ false, false, false, false, false, false, false, false, false, true, true, 3 },
      got)
  end)

  it("answers nil and a message naming the field for a bad model spec", function()
    local got = run(rt, [[
      local out = {}
      for _, bad in ipairs({
        "nope", { plugin = "p", target = "t" },
        spec({ plugin = "" }), spec({ target = 7 }), spec({ group = ("g"):rep(256) }),
        spec({ group = "a\0b" }), spec({ features = 0 }), spec({ features = 17 }),
        spec({ features = 2.5 }), spec({ features = "3" }), spec({ halfLife = -1 }),
        spec({ halfLife = 0 / 0 }), spec({ halfLife = math.huge }), spec({ halfLife = "60" }),
        spec({ quantile = 1 }), spec({ quantile = -0.1 }), spec({ quantile = 0 / 0 }),
        spec({ exported = 1 }), spec({ halflife = 60 }),
      }) do
        local m, err = predictor.model(bad)
        out[#out + 1] = m == nil and err or "accepted"
      end
      return out]])
    local want = {
      "predictor.model: a table {plugin=, target=, group=, features=, ...} expected, got string",
      "predictor.model: group must be a non-empty string of at most 255 bytes without NUL, got nil",
      'predictor.model: plugin must be a non-empty string of at most 255 bytes without NUL, got ""',
      "predictor.model: target must be a non-empty string of at most 255 bytes without NUL, got number",
      "predictor.model: group must be a non-empty string of at most 255 bytes without NUL, got \""
        .. ("g"):rep(40) .. '"',
      'predictor.model: group must be a non-empty string of at most 255 bytes without NUL, got "a\\0b"',
      "predictor.model: features must be an integer from 1 to 16, got 0",
      "predictor.model: features must be an integer from 1 to 16, got 17",
      "predictor.model: features must be an integer from 1 to 16, got 2.5",
      "predictor.model: features must be an integer from 1 to 16, got 3",
      "predictor.model: halfLife must be a number of seconds, 0 (no forgetting) or more, got -1",
      "predictor.model: halfLife must be a number of seconds, 0 (no forgetting) or more, got nan",
      "predictor.model: halfLife must be a number of seconds, 0 (no forgetting) or more, got inf",
      "predictor.model: halfLife must be a number of seconds, 0 (no forgetting) or more, got 60",
      "predictor.model: quantile must be 0 (the mean) or between 0 and 1 (0.9: the 90th"
        .. " percentile), got 1",
      "predictor.model: quantile must be 0 (the mean) or between 0 and 1 (0.9: the 90th"
        .. " percentile), got -0.1",
      "predictor.model: quantile must be 0 (the mean) or between 0 and 1 (0.9: the 90th"
        .. " percentile), got nan",
      "predictor.model: exported must be a boolean, got number",
      "predictor.model: unknown field halflife (plugin, target, group, features, halfLife,"
        .. " quantile, exported)",
    }
    assert.same(want, got)
  end)

  it("raises naming the argument for bad train, observe and stats calls", function()
    local got = run(rt, [[
      local m = assert(predictor.model(spec()))
      return {
        err_of(m.train, m, "x", 1, 1), err_of(m.train, m, { 1, 2 }, 1, 1),
        err_of(m.train, m, { 1, 2, 3, 4 }, 1, 1), err_of(m.train, m, { 1, "2", 3 }, 1, 1),
        err_of(m.train, m, { 1, true, 3 }, 1, 1), err_of(m.train, m, { 1, 2, 3 }, "1", 1),
        err_of(m.train, m, { 1, 2, 3 }, 1), err_of(m.observe, m, "1", 1),
        err_of(m.observe, m, 1), err_of(m.train, {}, { 1, 2, 3 }, 1, 1),
        err_of(m.stats, "m"), err_of(m.observe, nil, 1, 1),
        err_of(function() m.train = print end),
      }]])
    assert.same({
      "model:train: x must be an array of 3 numbers, got string",
      "model:train: x has 2 values, the model 3 features",
      "model:train: x has 4 values, the model 3 features",
      "model:train: x[2] must be a number, got string",
      "model:train: x[2] must be a number, got boolean",
      "model:train: y must be a number (the latency, ms), got string",
      "model:train: now must be a number (seconds, env.now()), got nil",
      "model:observe: predicted must be a number (ms), got string",
      "model:observe: actual must be a number (ms), got nil",
      "model:train: not a latency model: call it on what predictor.model returns"
        .. " (m:train(...))",
      "model:stats: not a latency model: call it on what predictor.model returns"
        .. " (m:stats(...))",
      "model:observe: not a latency model: call it on what predictor.model returns"
        .. " (m:observe(...))",
      "a latency model handle is read-only (setting train)",
    }, (function()
      -- errors raised at pcall have no position, those in a function of the chunk have one
      for i, e in ipairs(got) do
        got[i] = e:gsub("^eval:%d+: ", "")
      end
      return got
    end)())
  end)

  it("batches predictions of many models in one call, each row its model's", function()
    local got = run(rt, [[
      local a = assert(predictor.model(spec({ group = "a", features = 2 })))
      local b3 = assert(predictor.model(spec({ group = "b", features = 3 })))
      local fresh = assert(predictor.model(spec({ group = "fresh", features = 1 })))
      for t = 1, 50 do
        a:train({ 1, t }, 10 + 3 * t, t)
        b3:train({ 1, t, t % 7 }, 5 + t + 2 * (t % 7), t)
      end
      local bt = predictor.batch(3, 8)
      local rows = { bt:add(a, { 1, 100 }), bt:add(b3, { 1, 10, 4 }), bt:add(fresh, { 7 }),
        bt:add(a, { 1, 0 }) }
      assert(bt:predict() == 4)
      local out = { rows = rows, got = {} }
      for i = 1, 4 do
        local ms, n = bt:get(i)
        out.got[i] = { math.floor(ms * 1000 + 0.5) / 1000, n }
      end
      bt:reset()                   -- reused: rows from 1 again
      out.again = bt:add(b3, { 1, 1, 1 })
      bt:predict()
      out.again_ms = math.floor(bt:get(1) * 1000 + 0.5) / 1000
      out.text = tostring(bt)
      return out]])
    assert.same({ 1, 2, 3, 4 }, got.rows)
    -- exact data: the ridge's shrinkage (1e-4 of each feature's scale) alone
    -- stands between the truth and the prediction
    for i, want in ipairs({ { 310, 50 }, { 23, 50 }, { 0, 0 }, { 10, 50 } }) do
      assert.near(want[1], got.got[i][1], math.max(want[1] * 1e-3, 0.05), "row " .. i)
      assert.equal(want[2], got.got[i][2], "row " .. i)
    end
    assert.equal(0, got.got[3][1]) -- a model that knows nothing predicts 0
    assert.equal(1, got.again)
    assert.near(8, got.again_ms, 0.05)
    assert.equal("predictor batch of 1 rows", got.text)
  end)

  it("raises naming the argument for bad batch calls", function()
    local got = run(rt, [[
      local m = assert(predictor.model(spec()))
      local wide = assert(predictor.model(spec({ group = "wide", features = 4 })))
      local b = predictor.batch(3, 2)
      local out = {
        err_of(predictor.batch, 0, 1), err_of(predictor.batch, 17, 1),
        err_of(predictor.batch, 3, 0), err_of(predictor.batch, 3, 1.5),
        err_of(predictor.batch, 3, 65537), err_of(predictor.batch, "3", 4),
        err_of(b.add, b, {}, { 1, 2, 3 }), err_of(b.add, b, wide, { 1, 2, 3, 4 }),
        err_of(b.add, b, m, 5), err_of(b.add, b, m, { 1, 2 }),
        err_of(b.add, b, m, { 1, 0 / 0, 3 }), err_of(b.add, b, m, { 1, 2, -math.huge }),
        err_of(b.add, b, m, { 1, 2, "3" }),
      }
      b:add(m, { 1, 2, 3 })
      out[#out + 1] = err_of(b.get, b, 1) -- not predicted yet
      b:predict()
      out[#out + 1] = err_of(b.get, b, 2)
      out[#out + 1] = err_of(b.get, b, 0.5)
      b:add(m, { 1, 2, 3 })
      out[#out + 1] = err_of(b.add, b, m, { 1, 2, 3 })
      out[#out + 1] = err_of(b.predict, {})
      out[#out + 1] = err_of(function() b.n = 1e9 end)
      return out]])
    for i, e in ipairs(got) do
      got[i] = e:gsub("^eval:%d+: ", "")
    end
    assert.same({
      "predictor.batch: features_max must be an integer from 1 to 16, got 0",
      "predictor.batch: features_max must be an integer from 1 to 16, got 17",
      "predictor.batch: rows_max must be an integer from 1 to 65536, got 0",
      "predictor.batch: rows_max must be an integer from 1 to 65536, got 1.5",
      "predictor.batch: rows_max must be an integer from 1 to 65536, got 65537",
      "predictor.batch: features_max must be an integer from 1 to 16, got 3",
      "batch:add: m must be a model from predictor.model, got table",
      "batch:add: p/ttft/wide has 4 features, the batch room for 3 (features_max)",
      "batch:add: x must be an array of 3 numbers, got number",
      "batch:add: x has 2 values, p/ttft/all 3 features",
      "batch:add: x[2] must be a finite number, got nan",
      "batch:add: x[3] must be a finite number, got -inf",
      "batch:add: x[3] must be a finite number, got 3",
      "batch:get: rows were added since the last b:predict(): call b:predict() first",
      "batch:get: i must be a row from 1 to 1, got 2",
      "batch:get: i must be a row from 1 to 1, got 0.5",
      "batch:add: the batch is full (rows_max 2): b:reset() first",
      "batch:predict: not a batch: call it on what predictor.batch returns (b:predict(...))",
      "a predictor batch is read-only (setting n)",
    }, got)
  end)

  it("counts served errors: |predicted - actual| / actual, its sum and weighted mean", function()
    local got = run(rt, [[
      local m = assert(predictor.model(spec()))
      local counted = { m:observe(150, 100), m:observe(100, 100), m:observe(100, 0),
        m:observe(-1, 100), m:observe(0 / 0, 100), m:observe(100, math.huge), m:observe(0, 50) }
      return { counted = counted, served = m:stats().served }]])
    assert.same({ true, true, false, false, false, false, true }, got.counted)
    assert.equal(3, got.served.n)
    assert.near(1.5, got.served.ape_sum, 1e-12)
    -- the first sets the mean, then 1/64 of each
    local mape = 0.5 + (0 - 0.5) / 64
    mape = mape + (1 - mape) / 64
    assert.near(mape, got.served.mape, 1e-12)
  end)

  it("reports every stats field", function()
    local got = run(rt, [[
      local m = assert(predictor.model(spec({ features = 2, quantile = 0.5 })))
      local empty = m:stats()
      m:train({ 1, 1 }, 5, 1)
      m:train({ 1, 2 }, 7, 2)
      m:train({ 1, 3 }, 9, 3)
      m:observe(10, 8)
      return { empty = empty, now = m:stats(), text = tostring(m) }]])
    assert.same({ trained = 0, weight = 0, apriori = { n = 0, mape = 0 },
      served = { n = 0, ape_sum = 0, mape = 0 }, factor = 1, features = 2, weights = { 0, 0 } },
      got.empty)
    local s = got.now
    assert.equal(3, s.trained)
    assert.equal(3, s.weight)
    -- counted from the third sample: two determine a two-feature fit, which
    -- then predicts the third (on the line) all but exactly
    assert.equal(1, s.apriori.n)
    assert.truthy(s.apriori.mape < 0.01, s.apriori.mape)
    assert.same({ n = 1, ape_sum = 0.25, mape = 0.25 }, s.served)
    assert.truthy(s.factor ~= 1, "a quantile model's factor moves") -- q = 0.5
    assert.equal(2, s.features)
    assert.near(3, s.weights[1], 1e-2)
    assert.near(2, s.weights[2], 1e-2)
    assert.equal("latency model p/ttft/all", got.text)
  end)

  it("reopens in place: settings replaced, the same model; a new feature count starts afresh",
    function()
      local got = run(rt, [[
        local m = assert(predictor.model(spec()))
        for t = 1, 5 do m:train({ 1, t, 1 }, 10 * t, t) end
        local again = assert(predictor.model(spec({ halfLife = 30, exported = true })))
        local kept = again:stats().trained
        local wider = assert(predictor.model(spec({ features = 4 })))
        return { same = m == again and again == wider, kept = kept,
          after = wider:stats().trained, features = wider:stats().features,
          other = predictor.model(spec({ group = "other" })) ~= m }]])
      assert.same({ same = true, kept = 5, after = 0, features = 4, other = true }, got)
    end)

  it("holds at most 4096 models per process: the next fails cleanly, known ones still open",
    function()
      local got = run(rt, [[
        for i = 1, 4096 do
          assert(predictor.model(spec({ group = "g" .. i, features = 1 })))
        end
        local m, err = predictor.model(spec({ group = "one too many", features = 1 }))
        local known = predictor.model(spec({ group = "g17", features = 1, halfLife = 5 }))
        return { m == nil, err, known ~= nil, known:train({ 1 }, 3, 1) }]])
      assert.same({ true, "predictor.model p/ttft/one too many: cannot be made: the process holds"
        .. " 4096 latency models, the most it keeps (or memory ran out); use fewer groups", true,
        true }, got)
    end)

  it("lets a plugin use it with no pointer in reach", function()
    local dir = S.tmpdir()
    S.write(dir .. "/spec-predicting.lua", [[
local predictor = require "lupin.predictor"
return {
  type = "spec-predicting",
  new = function()
    local m = assert(predictor.model { plugin = "x", target = "ttft", group = "all", features = 1 })
    assert(next(m) == nil and not getmetatable(m), "a handle shows nothing")
    assert(not pcall(rawset, m, "p", 1), "rawset refused")
    local b = predictor.batch(1, 1)
    assert(next(b) == nil and not getmetatable(b))
    assert(m:train({ 1 }, 5, 1))
    return {}
  end,
  score = function() return { 1 } end,
}]])
    local prt = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
    finally(function() prt:free() end)
    assert(prt:load_string(S.json.encode({ plugins = { { type = "spec-predicting" } } })))
  end)
end)

describe("lupin.predictor across runtimes", function()
  local shared, a, b

  before_each(function()
    shared = native.shared(2)
    a = S.runtime({ shared = shared })
    b = S.runtime({ shared = shared })
  end)

  after_each(function()
    a:free()
    b:free()
  end)

  it("is one model per names for every runtime of a lupin_shared", function()
    run(a, [[
      local m = assert(predictor.model(spec({ features = 2 })))
      for t = 1, 10 do m:train({ 1, t }, 3 + 2 * t, t) end
      m:observe(11, 10)]])
    local got = run(b, [[
      local m = assert(predictor.model(spec({ features = 2 })))
      local other = assert(predictor.model(spec({ target = "tpot", features = 2 })))
      m:train({ 1, 11 }, 25, 11)
      return { m:stats(), other:stats().trained }]])
    assert.equal(11, got[1].trained)
    assert.equal(1, got[1].served.n)
    assert.equal(0, got[2])
    assert.equal(11, run(a, [[return predictor.model(spec({ features = 2 })):stats().trained]]))
    -- a runtime with a lupin_shared of its own has its own models
    local c = S.runtime()
    finally(function() c:free() end)
    assert.equal(0, run(c, [[return predictor.model(spec({ features = 2 })):stats().trained]]))
  end)

  it("predicts NaN, never reads past a row, when another runtime widened the model", function()
    local got = run(a, [[
      local m = assert(predictor.model(spec({ features = 2 })))
      m:train({ 1, 1 }, 5, 1)
      _G.spec_batch, _G.spec_model = predictor.batch(2, 1), m
      return 0]])
    assert.equal(0, got)
    run(b, [[predictor.model(spec({ features = 16 }))]])
    assert.equal("nan 0", run(a, [[
      local bt = _G.spec_batch
      bt:add(_G.spec_model, { 1, 1 })
      bt:predict()
      local ms, n = bt:get(1)
      return tostring(ms) .. " " .. n]]))
  end)
end)
