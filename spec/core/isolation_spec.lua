-- Plugins share one VM: what they share is read-only to them (docs/design.md,
-- "Trust boundary").  Each attack below runs in a hostile filter on every
-- request; a victim scorer beside it checks, request after request, that
-- nothing it relies on changed, and a reload without the hostile plugin
-- serves as before.  A crash of the spec process fails the whole run.
local S = require "support"

local ATTACKS = {
  -- handles whose C pointers a plugin could reach
  dict_pointer = [[local d = shared.dict("spec") d.d = nil return d:get("k")]],
  dict_raw_pointer = [[local d = shared.dict("spec") rawset(d, "d", false) return d:get("k")]],
  dict_method = [[rawset(shared.dict("spec"), "get", function() return "poisoned" end)]],
  dict_forged = [[return shared.dict("spec").get({ d = false }, "k")]],
  dict_metatable = [[getmetatable(shared.dict("spec")).__index.get = nil]],
  prefix_methods = [[getmetatable(prefix.index(10)).__index.match = function() return {} end]],
  prefix_buffer = [[local i = prefix.index(10) i.cap = 1e6 return i:match(
    prefix.hashes(("a"):rep(64), "m", "", 4, 16))]],
  hashes_count = [[local h = prefix.hashes(("a"):rep(64), "m", "", 4, 16) h.n = 1e6
    return prefix.index(10):record(endpoints[1].id, h)]],
  hashes_raw = [[local h = prefix.hashes(("a"):rep(64), "m", "", 4, 16) return h.h[1e8] ]],
  hashes_forged = [[return prefix.index(10):match({ n = 1e6, h = false })]],
  hashes_block = [[local h = prefix.hashes(("a"):rep(64), "m", "", 4, 16)
    return prefix.index(10):holds(endpoints[1].id, h, 1e8)]],
  hashes_released = [[local h = prefix.hashes(("a"):rep(64), "m", "", 4, 16)
    prefix.release(h) prefix.release(h)]],
  -- endpoints: the pool's memory and list
  endpoint_write = [[endpoints[1].waiting_queue_size = 1e9]],
  endpoint_id = [[endpoints[1].id = 12345]],
  endpoint_arithmetic = [[return (endpoints[1] + 1).waiting_queue_size]],
  endpoint_index = [[return endpoints[1][100000000] ]],
  endpoint_pointer = [[return endpoints[1].c_name[100000000] ]],
  pool_list = [[table.remove(endpoints, 1)]],
  pool_list_append = [[endpoints[#endpoints + 1] = endpoints[1] ]],
  pool_list_assign = [[endpoints[2] = nil]],
  labels_write = [[endpoints[1].labels.role = "poisoned"]],
  labels_insert = [[table.insert(endpoints[1].labels, "poisoned")]],
  labels_clear = [[require("table.clear")(endpoints[1].labels)]],
  adapters_add = [[endpoints[1].active_adapters.poisoned = true]],
  adapters_insert = [[table.insert(endpoints[1].waiting_adapters, "poisoned")]],
  -- shared metatables and module tables
  request_metatable = [[getmetatable(ctx.request).__index = function() error("poisoned") end]],
  request_rawset = [[rawset(ctx.request, "path", "/poisoned")]],
  ctx_metatable = [[getmetatable(ctx).__index = nil]],
  picker_schema = [[local s = require("lupin.picker").schema for k in pairs(s) do s[k] = nil end]],
  module_constant = [[require("lupin.prefix").CHARS_PER_TOKEN = 1]],
  other_instance = [[self.env.plugin("victim").index = nil]],
  -- process-wide library settings
  cjson_precision = [[require("cjson").encode_number_precision(1)]],
  cjson_depth = [[require("cjson.safe").decode_max_depth(1)]],
  randomseed = [[math.randomseed(42)]],
  -- headers the gateway owns
  forged_id = [[ctx.upstream_headers["x-request-id"] = "forged"]],
  forged_destination = [[ctx.upstream_headers["X-Gateway-Destination-Endpoint"] = "6.6.6.6:1"]],
  forged_framing = [[ctx.upstream_headers["content-length"] = "0"]],
}

-- Attacks that succeed on the plugin's own copy (its module copies, its
-- cjson instance, its view of the hashes) and change nothing any other
-- plugin sees, or (pool_list_assign: an assignment no metamethod sees) that
-- change the candidate list for their own request only, the pool's list
-- being restored before the next; every other attack is refused.
local OWN_COPY = { endpoint_index = true, cjson_depth = true, cjson_precision = true,
  module_constant = true, picker_schema = true, hashes_count = true, pool_list_assign = true }

local HOSTILE = [[
local shared, prefix = require "lupin.shared", require "lupin.prefix"
return {
  type = "spec-hostile",
  schema = { attack = { type = "string" } },
  new = function(params, env) return { attack = params.attack, errors = {}, env = env, n = {} } end,
  filter = function(self, ctx, endpoints)
    self.n[#self.n + 1] = #endpoints
    local ok, err = pcall(function()
      ATTACK
    end)
    self.errors[#self.errors + 1] = ok and "none" or tostring(err)
    return endpoints
  end,
}]]

-- What every request of the victim sees; "expected" below is what it must.
local VICTIM = [=[
local cjson, safe = require "cjson", require "cjson.safe"
local shared, prefix = require "lupin.shared", require "lupin.prefix"
local picker = require "lupin.picker"
return {
  type = "spec-victim",
  new = function()
    shared.dict("spec"):set("k", "v")
    return { seen = {}, index = prefix.index(100) }
  end,
  score = function(self, ctx, endpoints)
    local h = prefix.hashes(("b"):rep(64), "m", "", 4, 16)
    self.index:record(endpoints[1].id, h)
    local matched = self.index:match(h)[endpoints[1].id]
    prefix.release(h)
    local n = 0
    for _ in pairs(picker.schema) do n = n + 1 end
    self.seen[#self.seen + 1] = {
      endpoints = #endpoints, json = cjson.encode({ 0.123456 }),
      deep = safe.decode("[[[1]]]") ~= nil, dict = shared.dict("spec"):get("k"),
      chars = prefix.CHARS_PER_TOKEN, path = ctx.request.path, matched = matched,
      waiting = endpoints[1].waiting_queue_size, picker_fields = n > 0,
      role = endpoints[1].labels.role, label_list = #endpoints[1].labels,
      adapters = #endpoints[1].active_adapters + #endpoints[1].waiting_adapters,
      poisoned = endpoints[1].active_adapters.poisoned or false,
      label_keys = (function() local k = 0 for _ in pairs(endpoints[1].labels) do k = k + 1 end
        return k end)(),
      header = pcall(ctx.set_header, ctx, "x-victim", "1"),
    }
    local out = {}
    for i = 1, #endpoints do out[i] = 0.5 end
    return out
  end,
}]=]

local EXPECTED = { endpoints = 2, json = "[0.123456]", deep = true, dict = "v", chars = 4,
  path = "/v1/completions", matched = 16, waiting = 3, picker_fields = true, header = true,
  role = "decode", label_list = 0, label_keys = 1, adapters = 1, poisoned = false }

local function config(attack)
  local plugins = { { type = "spec-victim", name = "victim" },
    { type = "max-score-picker", name = "picker", parameters = { maxNumOfEndpoints = 1 } } }
  local steps = { { pluginRef = "victim" }, { pluginRef = "picker" } }
  if attack then
    table.insert(plugins, 1, { type = "spec-hostile-" .. attack, name = "hostile" })
    table.insert(steps, 1, { pluginRef = "hostile" })
  end
  return S.json.encode({ plugins = plugins,
    schedulingProfiles = { { name = "default", plugins = steps } } })
end

local function field(rt, name, key)
  return S.eval(rt, ([[return require("lupin.runtime").current.by_name[%q].obj[%q] ]]):format(
    name, key))
end

describe("plugins sharing one VM", function()
  local dir
  setup(function()
    dir = S.tmpdir()
    S.write(dir .. "/spec-victim.lua", VICTIM)
    for name, code in pairs(ATTACKS) do
      S.write(("%s/spec-hostile-%s.lua"):format(dir, name),
        (HOSTILE:gsub("spec%-hostile", "spec-hostile-" .. name):gsub("ATTACK",
          function() return code end)))
    end
  end)

  for name in pairs(ATTACKS) do
    it("cannot reach each other or the runtime: " .. name, function()
      local rt = S.runtime({ plugin_dirs = { S.FIXTURES, dir } })
      assert(rt:load_string(config(name), "hostile.json"))
      local m = { waiting_queue_size = 3, labels = { role = "decode" },
        running_lora_adapters = "sql" }
      S.endpoints(rt, 2, { m, m })
      for _ = 1, 3 do
        local req = assert(rt:begin({ path = "/v1/completions", body = '{"prompt":"x"}' }))
        local res = req:schedule()
        assert.equal(200, res.status)
        assert.is_nil(res.headers and (res.headers["x-request-id"]
          or res.headers["x-gateway-destination-endpoint"] or res.headers["content-length"]))
        req:finish("ok")
      end
      -- the attack was refused with an error or changed only the plugin's
      -- own copy, and the victim saw nothing change
      local errors = field(rt, "hostile", "errors")
      assert.equal(3, #errors)
      for _, e in ipairs(errors) do
        if OWN_COPY[name] then
          assert.equal("none", e)
        else
          assert.not_equal("none", e, name .. " was not refused")
        end
      end
      -- (a filter removing an endpoint from its request's list is filtering:
      -- the next requests still get both)
      assert.same({ 2, 2, 2 }, field(rt, "hostile", "n")) -- each request gets the whole pool
      local want = setmetatable({ endpoints = name == "pool_list_assign" and 1 or 2 },
        { __index = EXPECTED })
      for _, seen in ipairs(field(rt, "victim", "seen")) do
        for k, v in pairs(seen) do
          assert.same(want[k], v, k)
        end
      end
      -- a generation without the hostile plugin loads and serves as before
      assert(rt:load_string(config(nil), "clean.json"))
      S.lifecycle(rt, '{"prompt":"y"}')
      local seen = field(rt, "victim", "seen")
      assert.same(EXPECTED, seen[#seen])
      rt:free()
    end)
  end
end)
