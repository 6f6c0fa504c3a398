-- The C side as seen from Lua: the structures the core shares through FFI and
-- the function table it hands over at start.  Mirrors core/internal.h, and
-- check_abi proves it at every start against the layout the C compiler chose
-- (core/abi.c): a field added, moved or retyped on one side only stops the
-- runtime with the difference named, instead of reading the wrong bytes.
local ffi = require "ffi"

ffi.cdef [[
typedef struct lupin_alloc {
  size_t used, peak, limit;
  int enforce;
  uint64_t refused;
} lupin_alloc;

/* read as plain aligned 64-bit loads; written only by C, atomically */
typedef struct lupin_counters {
  int64_t in_flight;
  int64_t in_flight_tokens;
  int64_t prefill_tokens;
} lupin_counters;

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
  /* named c_* here so that ep.name and ep.address reach the Lua strings of
   * lupin.pool's side table; addresses, not pointers, to the FFI: plugins
   * read endpoints, and a pointer they could index would read anywhere.
   * c_counters: ep.in_flight and ep.in_flight_tokens (lupin.pool) */
  uintptr_t c_name;
  uintptr_t c_address;
  uintptr_t c_counters;
} lupin_endpoint;

typedef struct lupin_hash_input {
  const char *prompt;
  size_t prompt_len;
  const char *model;
  size_t model_len;
  const char *salt;
  size_t salt_len;
  size_t block_size;
  size_t max_blocks;
} lupin_hash_input;

typedef struct lupin_prefix_index lupin_prefix_index;

typedef struct lupin_prefix_view lupin_prefix_view;
typedef struct lupin_dict lupin_dict;

typedef struct lupin_dict_value {
  int32_t type;
  double num;
  size_t len;
} lupin_dict_value;

/* a prompt prefix to tokenize (lupin.tokens.want) */
typedef struct lupin_tokenize_job {
  uint64_t key;
  const char *endpoint;
  const char *model;
  const char *text;
  size_t text_len;
  int chat;
} lupin_tokenize_job;

/* latency models (lupin.predictor); lupin_latency_stats is core/lupin.h's */
typedef struct lupin_latency_model lupin_latency_model;
typedef struct lupin_latency_spec {
  const char *plugin, *target, *group;
  int32_t features;
  int32_t exported;
  double half_life;
  double quantile;
} lupin_latency_spec;
typedef struct lupin_latency_stats {
  uint64_t trained;
  double weight;
  uint64_t apriori_n;
  double apriori_mape;
  uint64_t served_n;
  double served_ape_sum;
  double served_mape;
  double factor;
  int32_t features;
  double w[16];
} lupin_latency_stats;

typedef struct lupin_capi_shared {
  lupin_prefix_view *(*prefix_open)(void *rt, const char *key, uint32_t capacity);
  void (*prefix_close)(lupin_prefix_view *v);
  int (*prefix_set_capacity)(lupin_prefix_view *v, uint32_t id, uint32_t capacity);
  int (*prefix_record)(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n,
                       uint32_t capacity);
  long (*prefix_match)(lupin_prefix_view *v, const uint64_t *hashes, size_t n, uint32_t *ids,
                       uint32_t *counts, size_t cap);
  void (*prefix_purge)(lupin_prefix_view *v, uint32_t id);
  size_t (*prefix_count)(lupin_prefix_view *v, uint32_t id);
  int (*prefix_holds)(lupin_prefix_view *v, uint32_t id, uint64_t hash);
  size_t (*prefix_memory)(lupin_prefix_view *v);
  lupin_dict *(*dict_open)(void *rt, const char *name, size_t max_entries);
  int (*dict_get)(lupin_dict *d, const char *key, size_t klen, lupin_dict_value *out, char *buf,
                  size_t cap);
  int (*dict_set)(lupin_dict *d, const char *key, size_t klen, int type, double num,
                  const char *str, size_t slen);
  int (*dict_incr)(lupin_dict *d, const char *key, size_t klen, double delta, double init,
                   int has_init, double *out);
  size_t (*dict_count)(lupin_dict *d);
  size_t (*dict_max)(lupin_dict *d);
  double (*flow_add)(void *rt, int64_t delta);
  void (*flow_keep)(void *rt, int on);
  uint64_t (*token_seed)(const char *hash_seed, size_t hash_seed_len, const char *lora,
                         size_t lora_len, const char *salt, size_t salt_len);
  long (*token_block_hashes)(uint64_t prev, const uint32_t *ids, size_t n, size_t block_size,
                             uint64_t *out, size_t cap);
  int (*tokens_put)(void *rt, uint64_t key, const uint32_t *ids, size_t n);
  long (*tokens_hashes)(void *rt, uint64_t key, uint64_t prev, size_t block_size, uint64_t *out,
                        size_t cap);
  long (*tokens_count)(void *rt, uint64_t key);
  int (*tokens_want)(void *rt, const lupin_tokenize_job *job);
  int (*prefix_unsure)(lupin_prefix_view *v, uint32_t id);
  int (*prefix_remove)(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n);
  long (*prefix_match_runs)(lupin_prefix_view *v, const uint64_t *hashes, size_t n, uint32_t *ids,
                            uint32_t *counts, size_t cap);
  lupin_latency_model *(*latency_open)(void *rt, const lupin_latency_spec *spec);
  int (*latency_train)(lupin_latency_model *m, const double *x, double y, double now);
  void (*latency_predict)(lupin_latency_model *const *models, size_t n, const double *x,
                          size_t stride, double *out, uint64_t *trained);
  void (*latency_observe)(lupin_latency_model *m, double predicted, double actual);
  void (*latency_stats)(lupin_latency_model *m, lupin_latency_stats *out);
} lupin_capi_shared;

typedef struct lupin_budget {
  volatile int32_t cut;
  int32_t stop;
  volatile double deadline;
} lupin_budget;

typedef struct lupin_response_timing {
  double begun_at;
  double head_at;
  double first_byte_at;
  double last_byte_at;
  uint64_t bytes, chunks;
  uint64_t events;
  int32_t newline;
} lupin_response_timing;

typedef struct lupin_capi {
  void *rt;
  lupin_alloc *alloc;
  double (*now)(void);
  void (*log)(void *rt, int level, const char *msg);
  void (*endpoint_free)(lupin_endpoint *ep);
  int (*result_add_pick)(uintptr_t req, const lupin_endpoint *ep);
  int (*request_count)(uintptr_t req, const lupin_endpoint *ep, int64_t requests, int64_t tokens);
  int (*result_add_header)(uintptr_t req, const char *name, const char *value);
  int (*client_add_header)(uintptr_t req, const char *name, const char *value);
  const char *(*header_find)(const char *block, size_t len, const char *name, size_t name_len,
                             size_t *value_len);
  long (*block_hashes)(const lupin_hash_input *in, uint64_t *out, size_t cap);
  lupin_prefix_index *(*prefix_new)(void *rt, uint32_t default_capacity);
  void (*prefix_free)(lupin_prefix_index *x);
  int (*prefix_set_capacity)(lupin_prefix_index *x, uint32_t id, uint32_t capacity);
  int (*prefix_record)(lupin_prefix_index *x, uint32_t id, const uint64_t *hashes, size_t n);
  long (*prefix_match)(lupin_prefix_index *x, const uint64_t *hashes, size_t n, uint32_t *ids,
                       uint32_t *counts, size_t cap);
  void (*prefix_purge)(lupin_prefix_index *x, uint32_t id);
  size_t (*prefix_count)(const lupin_prefix_index *x, uint32_t id);
  int (*prefix_holds)(const lupin_prefix_index *x, uint32_t id, uint64_t hash);
  size_t (*prefix_endpoints)(const lupin_prefix_index *x);
  size_t (*prefix_memory)(const lupin_prefix_index *x);
  lupin_budget *budget;
  int (*budget_poll)(const volatile int32_t *cut);
  const lupin_capi_shared *shared;
  void (*request_timing)(uintptr_t req, lupin_response_timing *out);
  int (*request_prefill)(uintptr_t req, const lupin_endpoint *ep, int64_t tokens);
} lupin_capi;

struct lupin_timespec { long tv_sec; long tv_nsec; };
int clock_gettime(int clock, struct lupin_timespec *ts);
]]

local M = {}

---@type ffi.cdata* the runtime's function table, set by bind()
M.api = nil

local ts = ffi.new("struct lupin_timespec")
local CLOCK_MONOTONIC = 1

--- Monotonic clock in seconds (the clock metrics timestamps use).
---@return number
function M.now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

--- The same clock as an FFI function pointer, once bound: ~60 ns a call
--- when interpreted where M.now above costs ~300 (tonumber of a boxed int64
--- field allocates), ~30 ns in a trace.
M.clock = M.now

ffi.cdef [[
typedef struct lupin_abi_entry {
  const char *type, *field, *lua_field;
  size_t size, offset;
} lupin_abi_entry;
]]

--- Compares the C layout (core/abi.c's list) with this file's declarations;
--- raises an error naming the first difference.  rename maps a C type name
--- to the FFI type to check it against (specs use it to prove a mismatch is
--- caught).
---@param abi lightuserdata the list from lupin__abi()
---@param rename? table<string, string>
function M.check_abi(abi, rename)
  local e = ffi.cast("const lupin_abi_entry *", abi)
  local i = 0
  while e[i].type ~= nil do
    local ctype = ffi.string(e[i].type)
    local ltype = rename and rename[ctype] or ctype
    local size, offset = tonumber(e[i].size), tonumber(e[i].offset)
    if e[i].field == nil then
      if ffi.sizeof(ltype) ~= size then
        error(("C/Lua ABI mismatch: sizeof(%s) is %d in C, %d in lua/lupin/runtime/capi.lua"):format(
          ctype, size, ffi.sizeof(ltype)), 0)
      end
    else
      local field = ffi.string(e[i].lua_field ~= nil and e[i].lua_field or e[i].field)
      local loff = ffi.offsetof(ltype, field)
      if loff ~= offset then
        error(("C/Lua ABI mismatch: %s.%s is at offset %d in C, %s in lua/lupin/runtime/capi.lua"):format(
          ctype, field, offset, loff and "at " .. loff or "missing"), 0)
      end
    end
    i = i + 1
  end
  return i
end

function M.bind(ud, abi)
  if abi then
    M.check_abi(abi)
    M.abi = abi
  end
  M.api = ffi.cast("lupin_capi *", ud)
  M.rt = M.api.rt
  M.alloc = M.api.alloc
  M.budget = M.api.budget
  M.budget_poll = M.api.budget_poll
  M.shared = M.api.shared -- keyed prefix indexes, shared dicts, token keys and cache, latency models
  local clock = M.api.now
  M.clock = clock
  M.now = function()
    return clock()
  end
end

return M
