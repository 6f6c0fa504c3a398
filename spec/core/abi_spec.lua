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
    assert.truthy(errs[2]:find("sizeof(lupin_capi_shared) is 136 in C", 1, true), errs[2])
  end)
end)
