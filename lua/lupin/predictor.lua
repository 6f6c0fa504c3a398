--- lupin.predictor: online latency models plugins train on every finished
--- request and ask before picking (core/latency_model.c;
--- docs/latency-prediction.md).  A model is ridge regression over
--- exponentially weighted samples, one per (plugin, target, group) for the
--- whole process: every worker trains and reads the same one.
---
---   local predictor = require "lupin.predictor"
---   local m = predictor.model { plugin = "p", target = "ttft", group = "all",
---     features = 3, halfLife = 60 }
---   m:train({ 1, kv_usage, waiting }, ttft_ms, env.now())  -- a bias is a feature of 1
---   local b = predictor.batch(3, 64)                         -- reused: made once
---   b:reset()
---   for _, ep in ipairs(endpoints) do b:add(m, { 1, ep.kv_cache_usage, ep.waiting_queue_size }) end
---   b:predict()                                              -- one C call
---   local ms, trained = b:get(1)
---
--- Models live as long as the process's runtimes, across reloads; at most
--- MAX_MODELS of them.  Handles hold no pointer a plugin can reach.
local ffi = require "ffi"
local capi = require "lupin.runtime.capi"

---@class lupin.predictor
local M = {}

--- Features a model takes at most; models a process holds at most; bytes of
--- each of a model's names at most; rows of a batch at most.
M.MAX_FEATURES = 16
M.MAX_MODELS = 4096
M.MAX_NAME = 255
M.MAX_ROWS = 65536

local spec = ffi.new("lupin_latency_spec") -- reused: a runtime is single-threaded
local stats = ffi.new("lupin_latency_stats")
local xbuf = ffi.new("double[?]", M.MAX_FEATURES)

---@class lupin.LatencyModel
local Model = {}

-- A handle is an empty table; its C model and what the Lua side checks
-- against live here, out of a plugin's reach (a pointer it could replace
-- would send C anywhere).  Every plugin of a runtime naming a model gets
-- the same handle, kept for the runtime's life (at most MAX_MODELS).
local cmodel = {}   -- handle -> lupin_latency_model *
local dims = {}     -- handle -> features
local labels = {}   -- handle -> "plugin/target/group"
local settings = {} -- handle -> { features, halfLife, quantile, exported } last applied
local models = {}   -- "plugin\0target\0group" -> handle

local MODEL = {
  __index = Model,
  __newindex = function(_, k)
    error(("a latency model handle is read-only (setting %s)"):format(tostring(k)), 2)
  end,
  __tostring = function(self)
    return ("latency model %s"):format(labels[self] or "?")
  end,
  __metatable = false,
}

-- The C model of a handle; an error at the caller's caller for anything else.
local function model_of(self, method)
  local p = cmodel[self]
  if not p then
    error(("model:%s: not a latency model: call it on what predictor.model returns (m:%s(...))")
      :format(method, method), 3)
  end
  return p
end

local FIELDS = { plugin = true, target = true, group = true, features = true, halfLife = true,
  quantile = true, exported = true }

local function name_error(o, k)
  local v = o[k]
  if type(v) ~= "string" or v == "" or #v > M.MAX_NAME or v:find("\0", 1, true) then
    return ("predictor.model: %s must be a non-empty string of at most %d bytes without NUL,"
      .. " got %s"):format(k, M.MAX_NAME, type(v) == "string" and ("%q"):format(v:sub(1, 40))
      or type(v))
  end
end

-- The settings of o checked, or nil and the message.
local function settings_of(o)
  if type(o) ~= "table" then
    return nil, ("predictor.model: a table {plugin=, target=, group=, features=, ...} expected,"
      .. " got %s"):format(type(o))
  end
  for k in pairs(o) do
    if not FIELDS[k] then
      return nil, ("predictor.model: unknown field %s (plugin, target, group, features,"
        .. " halfLife, quantile, exported)"):format(tostring(k))
    end
  end
  local err = name_error(o, "plugin") or name_error(o, "target") or name_error(o, "group")
  if err then
    return nil, err
  end
  local d, hl, q, ex = o.features, o.halfLife, o.quantile, o.exported
  if hl == nil then
    hl = 0
  end
  if q == nil then
    q = 0
  end
  if ex == nil then
    ex = false
  end
  if type(d) ~= "number" or d % 1 ~= 0 or d < 1 or d > M.MAX_FEATURES then
    return nil, ("predictor.model: features must be an integer from 1 to %d, got %s"):format(
      M.MAX_FEATURES, tostring(d))
  end
  if type(hl) ~= "number" or hl < 0 or hl - hl ~= 0 then
    return nil, ("predictor.model: halfLife must be a number of seconds, 0 (no forgetting) or"
      .. " more, got %s"):format(tostring(hl))
  end
  if type(q) ~= "number" or not (q == 0 or (q > 0 and q < 1)) then
    return nil, ("predictor.model: quantile must be 0 (the mean) or between 0 and 1 (0.9: the"
      .. " 90th percentile), got %s"):format(tostring(q))
  end
  if type(ex) ~= "boolean" then
    return nil, ("predictor.model: exported must be a boolean, got %s"):format(type(ex))
  end
  return { d, hl, q, ex }
end

local function same(a, b)
  return a[1] == b[1] and a[2] == b[2] and a[3] == b[3] and a[4] == b[4]
end

---@class lupin.LatencyModelSpec
---@field plugin string the plugin instance's name (each name non-empty, ≤ 255 bytes)
---@field target string what is predicted: "ttft", "tpot"
---@field group string whose latency: "all", "gpu=a100", "endpoint=pod-1"
---@field features integer the length of every x, 1..16 (a bias is a feature of 1)
---@field halfLife number? seconds after which a sample weighs half; 0 (default): no forgetting
---@field quantile number? 0 (default): predict the mean; in (0,1): that quantile
---@field exported boolean? list it on /metrics (default false)

--- The model of (plugin, target, group), made on first use.  Later calls
--- with the same names, from any plugin or worker, get the same model; the
--- settings they pass replace its own, and another feature count starts it
--- afresh.  nil and a message on bad arguments, or when the process holds
--- MAX_MODELS models already.
---@param o lupin.LatencyModelSpec
---@return lupin.LatencyModel? model
---@return string? err
function M.model(o)
  local set, err = settings_of(o)
  if not set then
    return nil, err
  end
  local key = o.plugin .. "\0" .. o.target .. "\0" .. o.group
  local h = models[key]
  if h and same(settings[h], set) then
    return h
  end
  spec.plugin, spec.target, spec.group = o.plugin, o.target, o.group
  spec.features, spec.half_life, spec.quantile, spec.exported = set[1], set[2], set[3],
    set[4] and 1 or 0
  local p = capi.shared.latency_open(capi.rt, spec)
  spec.plugin, spec.target, spec.group = nil, nil, nil -- no pointers into strings to be freed
  local label = o.plugin .. "/" .. o.target .. "/" .. o.group
  if p == nil then
    return nil, ("predictor.model %s: cannot be made: the process holds %d latency models,"
      .. " the most it keeps (or memory ran out); use fewer groups"):format(label, M.MAX_MODELS)
  end
  if not h then
    h = setmetatable({}, MODEL)
    models[key], labels[h] = h, label
  end
  cmodel[h], dims[h], settings[h] = p, set[1], set
  return h
end

-- Copies x (features numbers) into xbuf; false when one is not finite.
local function features_in(self, x, method)
  local d = dims[self]
  if type(x) ~= "table" then
    error(("model:%s: x must be an array of %d numbers, got %s"):format(method, d, type(x)), 3)
  end
  if #x ~= d then
    error(("model:%s: x has %d values, the model %d features"):format(method, #x, d), 3)
  end
  local finite = true
  for i = 1, d do
    local v = x[i]
    if type(v) ~= "number" then
      error(("model:%s: x[%d] must be a number, got %s"):format(method, i, type(v)), 3)
    end
    finite = finite and v - v == 0
    xbuf[i - 1] = v
  end
  return finite
end

--- Trains on one finished request: x its features (as many as the model
--- has), y the latency measured (ms), now the time (seconds, env.now()'s
--- clock).  Returns true, or false when an input is not finite (NaN, ±inf,
--- beyond ±1e100): the sample is ignored, the model untouched.
---@param x number[]
---@param y number
---@param now number
---@return boolean trained
function Model:train(x, y, now)
  local p = model_of(self, "train")
  local finite = features_in(self, x, "train")
  if type(y) ~= "number" then
    error(("model:train: y must be a number (the latency, ms), got %s"):format(type(y)), 2)
  end
  if type(now) ~= "number" then
    error(("model:train: now must be a number (seconds, env.now()), got %s"):format(type(now)), 2)
  end
  return finite and capi.shared.latency_train(p, xbuf, y, now) == 0
end

--- Counts the error of a prediction a scheduler used, |predicted - actual| /
--- actual, into the model's served errors (lupin_latency_prediction_* on
--- /metrics).  Returns whether it counted: actual > 0, predicted >= 0, both
--- finite.
---@param predicted number ms
---@param actual number ms
---@return boolean counted
function Model:observe(predicted, actual)
  local p = model_of(self, "observe")
  if type(predicted) ~= "number" then
    error(("model:observe: predicted must be a number (ms), got %s"):format(type(predicted)), 2)
  end
  if type(actual) ~= "number" then
    error(("model:observe: actual must be a number (ms), got %s"):format(type(actual)), 2)
  end
  capi.shared.latency_observe(p, predicted, actual)
  return actual > 0 and predicted >= 0 and actual - actual == 0 and predicted - predicted == 0
end

---@class lupin.LatencyErrors
---@field n integer predictions counted
---@field mape number their absolute percentage errors' exponentially weighted mean (1/64 a sample; 0.05: 5%)
---@field ape_sum number? (served) their sum

---@class lupin.LatencyStats
---@field trained integer samples trained
---@field weight number the samples' weight now, decayed by the half-life
---@field apriori lupin.LatencyErrors each sample's prediction made before training on it
---@field served lupin.LatencyErrors the predictions observe() counted
---@field factor number the quantile factor predictions are multiplied by (1: the mean)
---@field features integer
---@field weights number[] the regression's weights, one per feature

--- What the model has learnt and how well it predicts.
---@return lupin.LatencyStats
function Model:stats()
  local p = model_of(self, "stats")
  capi.shared.latency_stats(p, stats)
  local d, w = stats.features, {}
  for i = 1, d do
    w[i] = stats.w[i - 1]
  end
  return {
    trained = tonumber(stats.trained),
    weight = stats.weight,
    apriori = { n = tonumber(stats.apriori_n), mape = stats.apriori_mape },
    served = { n = tonumber(stats.served_n), ape_sum = stats.served_ape_sum,
      mape = stats.served_mape },
    factor = stats.factor,
    features = d,
    weights = w,
  }
end

-- --- batches: many predictions in one C call -------------------------------

---@class lupin.LatencyBatch
local Batch = {}

local batches = setmetatable({}, { __mode = "k" }) -- handle -> its buffers (below)

local BATCH = {
  __index = Batch,
  __newindex = function(_, k)
    error(("a predictor batch is read-only (setting %s)"):format(tostring(k)), 2)
  end,
  __tostring = function(self)
    local st = batches[self]
    return ("predictor batch of %d rows"):format(st and st.n or 0)
  end,
  __metatable = false,
}

local function batch_of(self, method)
  local st = batches[self]
  if not st then
    error(("batch:%s: not a batch: call it on what predictor.batch returns (b:%s(...))"):format(
      method, method), 3)
  end
  return st
end

local function integer_in(v, lo, hi)
  return type(v) == "number" and v % 1 == 0 and v >= lo and v <= hi
end

--- A buffer for up to rows_max predictions of models of up to features_max
--- features, owned by the caller: make it once (in new) and reset it for
--- each request.
---@param features_max integer 1..16
---@param rows_max integer 1..65536
---@return lupin.LatencyBatch
function M.batch(features_max, rows_max)
  if not integer_in(features_max, 1, M.MAX_FEATURES) then
    error(("predictor.batch: features_max must be an integer from 1 to %d, got %s"):format(
      M.MAX_FEATURES, tostring(features_max)), 2)
  end
  if not integer_in(rows_max, 1, M.MAX_ROWS) then
    error(("predictor.batch: rows_max must be an integer from 1 to %d, got %s"):format(
      M.MAX_ROWS, tostring(rows_max)), 2)
  end
  local b = setmetatable({}, BATCH)
  batches[b] = {
    d = features_max, rows = rows_max, n = 0, ready = false,
    models = ffi.new("lupin_latency_model *[?]", rows_max),
    x = ffi.new("double[?]", rows_max * features_max),
    out = ffi.new("double[?]", rows_max),
    trained = ffi.new("uint64_t[?]", rows_max),
  }
  return b
end

--- Empties the batch.
function Batch:reset()
  local st = batch_of(self, "reset")
  st.n, st.ready = 0, false
end

--- Adds a row: the prediction of m for features x (a copy is kept).  Returns
--- its index, from 1.  Raises past rows_max, and on an x that is not m's
--- count of finite numbers.
---@param m lupin.LatencyModel
---@param x number[]
---@return integer i
function Batch:add(m, x)
  local st = batch_of(self, "add")
  local p = cmodel[m]
  if not p then
    error(("batch:add: m must be a model from predictor.model, got %s"):format(type(m)), 2)
  end
  local n, d, stride = st.n, dims[m], st.d
  if n >= st.rows then
    error(("batch:add: the batch is full (rows_max %d): b:reset() first"):format(st.rows), 2)
  end
  if d > stride then
    error(("batch:add: %s has %d features, the batch room for %d (features_max)"):format(
      labels[m], d, stride), 2)
  end
  if type(x) ~= "table" then
    error(("batch:add: x must be an array of %d numbers, got %s"):format(d, type(x)), 2)
  end
  if #x ~= d then
    error(("batch:add: x has %d values, %s %d features"):format(#x, labels[m], d), 2)
  end
  local buf, base = st.x, n * stride
  for i = 1, d do
    local v = x[i]
    if type(v) ~= "number" or v - v ~= 0 then
      error(("batch:add: x[%d] must be a finite number, got %s"):format(i, tostring(v)), 2)
    end
    buf[base + i - 1] = v
  end
  st.models[n] = p
  n = n + 1
  st.n, st.ready = n, false
  return n
end

--- Predicts every row added, in one call into C.  Returns the row count.
---@return integer n
function Batch:predict()
  local st = batch_of(self, "predict")
  if st.n > 0 then
    capi.shared.latency_predict(st.models, st.n, st.x, st.d, st.out, st.trained)
  end
  st.ready = true
  return st.n
end

--- Row i's prediction (ms, ≥ 0; the quantile's for a quantile model) and the
--- samples its model had trained on (0: it knows nothing yet, the
--- prediction is 0).  Raises before b:predict() and for a row not added.
---@param i integer
---@return number ms
---@return integer trained
function Batch:get(i)
  local st = batch_of(self, "get")
  if not integer_in(i, 1, st.n) then
    error(("batch:get: i must be a row from 1 to %d, got %s"):format(st.n, tostring(i)), 2)
  end
  if not st.ready then
    error("batch:get: rows were added since the last b:predict(): call b:predict() first", 2)
  end
  return st.out[i - 1], tonumber(st.trained[i - 1])
end

return M
