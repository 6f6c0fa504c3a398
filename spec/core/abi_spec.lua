-- The C/Lua ABI check (core/abi.c against lua/lupin/runtime/capi.lua): every runtime
-- start passes it, and a declaration that drifted is refused by name.
local support = require "support"

describe("the C/Lua ABI check", function()
  local rt

  before_each(function()
    rt = support.runtime()
  end)

  after_each(function()
    rt:free()
  end)

  it("passes at start, over every shared structure", function()
    local n = support.eval(rt, [[return require("lupin.runtime.capi").check_abi(require("lupin.runtime.capi").abi)]])
    assert.truthy(n > 40, n)
  end)

  it("names a field whose offset differs", function()
    local msg = support.eval(rt, [[
      local ffi = require "ffi"
      ffi.cdef "typedef struct { uint32_t id; int32_t port; double running_requests; \
        double waiting_queue_size; double kv_cache_usage; double max_lora; \
        double cache_block_size; double num_blocks; double scraped_at; \
        const char *c_name; const char *c_address; const void *c_counters; } abi_spec_swapped;"
      local capi = require "lupin.runtime.capi"
      local ok, err = pcall(capi.check_abi, capi.abi, { lupin_endpoint = "abi_spec_swapped" })
      return not ok and err]])
    assert.equal("C/Lua ABI mismatch: lupin_endpoint.waiting_queue_size is at offset 8 in C, "
      .. "at 16 in lua/lupin/runtime/capi.lua", msg)
  end)

  it("names a missing field and a size that differs", function()
    local both = support.eval(rt, [[
      local ffi = require "ffi"
      ffi.cdef "typedef struct { size_t used, peak, limit; int enforce; } abi_spec_short;"
      ffi.cdef "typedef struct { const char *prompt; size_t prompt_len; } abi_spec_small;"
      local capi = require "lupin.runtime.capi"
      local _, e1 = pcall(capi.check_abi, capi.abi, { lupin_alloc = "abi_spec_short" })
      local _, e2 = pcall(capi.check_abi, capi.abi, { lupin_hash_input = "abi_spec_small" })
      return require("cjson").encode({ e1, e2 })]])
    local missing, size = both[1], both[2]
    assert.truthy(missing:find("lupin_alloc", 1, true), missing)
    assert.truthy(size:find("sizeof(lupin_hash_input) is 64 in C, 16", 1, true), size)
  end)

  it("covers the shared table: the keyed prefix index and dict calls, the dict value", function()
    local errs = support.eval(rt, [[
      local ffi = require "ffi"
      ffi.cdef "typedef struct { double num; int32_t type; size_t len; } abi_spec_value;"
      ffi.cdef "typedef struct { void *prefix_open, *prefix_close; } abi_spec_shared;"
      local capi = require "lupin.runtime.capi"
      local _, e1 = pcall(capi.check_abi, capi.abi, { lupin_dict_value = "abi_spec_value" })
      local _, e2 = pcall(capi.check_abi, capi.abi, { lupin_capi_shared = "abi_spec_shared" })
      return { e1, e2 }]])
    assert.equal("C/Lua ABI mismatch: lupin_dict_value.type is at offset 0 in C, at 8 in "
      .. "lua/lupin/runtime/capi.lua", errs[1])
    assert.truthy(errs[2]:find("sizeof(lupin_capi_shared) is 248 in C", 1, true), errs[2])
  end)
end)

-- The enums crossing the line (core/abi.c's lupin__abi_push_enums against
-- lua/lupin/runtime/enums.lua) and the hooks (core/internal.h's LUPIN_HOOKS
-- against lupin.runtime's table).
describe("the C/Lua enum check", function()
  local rt

  before_each(function()
    rt = support.runtime()
  end)

  after_each(function()
    rt:free()
  end)

  local function check_error(edit)
    return support.eval(rt, ([[
      local enums = require "lupin.runtime.enums"
      local c = {}
      for group, t in pairs(enums.core) do
        c[group] = {}
        for k, v in pairs(t) do c[group][k] = v end
      end
      local hooks = {}
      for name in pairs(c.hook) do hooks[name] = true end
      %s
      local ok, err = pcall(enums.check, c, hooks)
      return ok and "passed" or err]]):format(edit))
  end

  it("passes at start: every outcome, flag and hook the core has", function()
    assert.equal("passed", check_error(""))
    local names = support.eval(rt, [[
      local c = require("lupin.runtime.enums").core
      local n = 0
      for _ in pairs(c.outcome) do n = n + 1 end
      return { n, c.outcome.shed, c.outcome.evicted, c.hook.begin ~= nil,
        c.request_flag.dry_run }]])
    assert.same({ 12, 10, 11, true, 2 }, names)
  end)

  it("names a value that differs, one only C has and one only Lua has", function()
    assert.equal("C/Lua enum mismatch: outcome.shed is 11 in C, 10 in lua/lupin/runtime/enums.lua",
      check_error("c.outcome.shed = 11"))
    assert.equal("C/Lua enum mismatch: gen_flag.observes_everything is 16 in C, nil in "
      .. "lua/lupin/runtime/enums.lua", check_error("c.gen_flag.observes_everything = 16"))
    assert.equal("C/Lua enum mismatch: request_flag.explain is 1 in lua/lupin/runtime/enums.lua, "
      .. "not in C", check_error("c.request_flag.explain = nil"))
  end)

  it("refuses a hook the core never calls", function()
    assert.equal('lupin.runtime hands the core a hook "on_the_side" it never calls '
      .. "(core/internal.h, LUPIN_HOOKS)", check_error("hooks.on_the_side = true"))
  end)
end)
