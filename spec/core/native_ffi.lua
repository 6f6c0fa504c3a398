-- The lupin_shared calls lupin_native does not wrap, through FFI against the
-- native module's own copy of liblupin (dlopen hands back the module busted
-- loaded): specs call them on a native.shared() the runtimes use.
local ffi = require "ffi"
local S = require "support"

if not pcall(ffi.typeof, "spec_native_ffi") then -- once per process: cdefs are global
  ffi.cdef [[
typedef struct { int unused; } spec_native_ffi;
typedef struct lupin_shared lupin_shared;
typedef struct spec_tokenize_job {
  uint64_t key;
  const char *endpoint, *model, *text;
  size_t text_len;
  int chat;
} spec_tokenize_job;
typedef struct spec_token_stats {
  uint64_t entries, bytes, limit, pending, hits, misses, evictions, asked, failed, expired;
} spec_token_stats;
typedef void (*spec_tokenize_fn)(void *ud, const spec_tokenize_job *job);
unsigned long long strtoull(const char *s, char **end, int base);
uint64_t lupin_token_seed(const char *, size_t, const char *, size_t, const char *, size_t);
long lupin_token_block_hashes(uint64_t prev, const uint32_t *ids, size_t n, size_t block_size,
                              uint64_t *out, size_t cap);
int lupin_shared_prefix_remove(lupin_shared *s, const char *key, const char *endpoint,
                               const uint64_t *hashes, size_t n);
int lupin_shared_prefix_purge(lupin_shared *s, const char *key, const char *endpoint);
int lupin_shared_tokens_put(lupin_shared *s, uint64_t key, const uint32_t *ids, size_t n);
long lupin_shared_tokens_hashes(lupin_shared *s, uint64_t key, uint64_t prev, size_t block_size,
                                uint64_t *out, size_t cap);
long lupin_shared_tokens_count(lupin_shared *s, uint64_t key);
void lupin_shared_tokens_limit(lupin_shared *s, size_t bytes);
void lupin_shared_tokens_pending_seconds(lupin_shared *s, double seconds);
void lupin_shared_tokens_stats(lupin_shared *s, spec_token_stats *out);
void lupin_shared_on_tokenize(lupin_shared *s, spec_tokenize_fn fn, void *ud);
int lupin_shared_tokens_want(lupin_shared *s, const spec_tokenize_job *job);
void lupin_shared_tokens_failed(lupin_shared *s, uint64_t key);
]]
end

local M = {}

M.C = ffi.load(S.BUILD .. "/lupin_native.so")

--- The lupin_shared of a native.shared() (its userdata starts with it).
function M.shared(ud)
  return ffi.cast("lupin_shared **", ud)[0]
end

--- A uint64_t from hex.
function M.u64(hex)
  return ffi.cast("uint64_t", ffi.C.strtoull(hex, nil, 16))
end

--- uint64_t[n] of hex strings.
function M.hashes(hex)
  local a = ffi.new("uint64_t[?]", math.max(#hex, 1))
  for i, h in ipairs(hex) do
    a[i - 1] = M.u64(h)
  end
  return a, #hex
end

--- uint32_t[n] of a Lua array.
function M.ids(list)
  local a = ffi.new("uint32_t[?]", math.max(#list, 1))
  for i, v in ipairs(list) do
    a[i - 1] = v
  end
  return a, #list
end

function M.stats(s)
  local st = ffi.new("spec_token_stats")
  M.C.lupin_shared_tokens_stats(s, st)
  local out = {}
  for _, f in ipairs({ "entries", "bytes", "limit", "pending", "hits", "misses", "evictions",
    "asked", "failed", "expired" }) do
    out[f] = tonumber(st[f])
  end
  return out
end

return M
