-- The C side as seen from Lua: the structures the core shares through FFI and
-- the function table it hands over at start.  Mirrors core/internal.h.
local ffi = require "ffi"

ffi.cdef [[
typedef struct lupin_alloc {
  size_t used, peak, limit;
  int enforce;
  uint64_t refused;
} lupin_alloc;

typedef struct lupin_endpoint {
  uint32_t id;
  int32_t port;
  double waiting_queue_size;
  double running_requests;
  double kv_cache_usage;
  double max_lora;
  double cache_block_size;
  double num_blocks;
  double scraped_at;
  /* name and address in C; spelled c_ here so that ep.name and ep.address
   * reach the Lua strings of lupin.pool's side table, not these pointers */
  const char *c_name;
  const char *c_address;
} lupin_endpoint;

typedef struct lupin_capi {
  void *rt;
  lupin_alloc *alloc;
  void (*log)(void *rt, int level, const char *msg);
  void (*endpoint_free)(lupin_endpoint *ep);
  int (*result_add_pick)(void *req, const lupin_endpoint *ep);
  int (*result_add_header)(void *req, const char *name, const char *value);
  int (*client_add_header)(void *req, const char *name, const char *value);
} lupin_capi;

struct lupin_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clock, struct lupin_timespec *ts);
]]

local M = {}

---@type ffi.cdata* the runtime's function table, set by bind()
M.api = nil

function M.bind(ud)
  M.api = ffi.cast("lupin_capi *", ud)
  M.rt = M.api.rt
  M.alloc = M.api.alloc
end

local ts = ffi.new("struct lupin_timespec")
local CLOCK_MONOTONIC = 1

--- Monotonic clock in seconds (the clock metrics timestamps use).
---@return number
function M.now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

return M
