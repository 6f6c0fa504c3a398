/* Internal structures shared by the core's C files.  Not installed. */
#ifndef LUPIN_INTERNAL_H
#define LUPIN_INTERNAL_H

#include "lupin.h"

#include <lua.h>
#include <pthread.h>
#include <stdarg.h>

#define LUPIN_ALLOC_SPARES 64

/* The Lua allocator's books.  Its layout is mirrored in lua/lupin/runtime/capi.lua. */
typedef struct lupin_alloc {
  size_t used;
  size_t peak;
  size_t limit;
  int enforce; /* the limit applies only while a plugin runs */
  uint64_t refused;
  /* private: the allocator underneath (the host's, else LuaJIT's own) */
  lua_Alloc base;
  void *base_ud;
  /* private: big blocks Lua freed, kept for the next big allocation (alloc.c) */
  struct {
    void *p;
    size_t size;
  } spare[LUPIN_ALLOC_SPARES];
  size_t n_spare, spare_bytes;
  uint64_t allocated; /* bytes ever asked for: the host-paced collector's clock */
} lupin_alloc;

void *lupin_alloc_fn(void *ud, void *ptr, size_t osize, size_t nsize);
/* Gives the spare blocks back to the allocator underneath (before lua_close). */
void lupin_alloc_release_spares(lupin_alloc *a);

/* Call budgets (budget.c).  `cut` and `deadline` are mirrored in
 * lua/lupin/runtime/capi.lua: the Lua side writes the running plugin call's deadline
 * (lupin_now() seconds, 0: none), the watchdog thread sets `cut` past it. */
typedef struct lupin_budget {
  volatile int32_t cut;
  int32_t stop;
  volatile double deadline;
  /* private */
  pthread_t thread;
  clockid_t cpu_clock; /* the runtime thread's CPU time */
  int running;
} lupin_budget;

int lupin_budget_poll(const volatile int32_t *cut);
int lupin__budget_start(lupin_budget *b, char *err, size_t errlen);
void lupin__budget_stop(lupin_budget *b);

/* What a scrape says of an endpoint (lupin_metrics without the adapter
 * lists), kept as one block: a moved endpoint takes it over whole. */
typedef struct lupin_load {
  double waiting_queue_size;
  double running_requests;
  double kv_cache_usage;
  double max_lora;
  double cache_block_size;
  double num_blocks;
  double scraped_at;
} lupin_load;

/* shared.c: an endpoint's requests and prompt tokens in flight through
 * every runtime of the process, and the prefill tokens of those whose
 * first byte has not come back yet.  Written only with __atomic builtins
 * (the core, and plugins through capi's count functions); Lua reads the
 * fields as plain aligned loads (ep.in_flight, ep.in_flight_tokens,
 * ep.in_flight_prefill_tokens). */
typedef struct lupin_counters {
  int64_t in_flight;
  int64_t in_flight_tokens;
  int64_t prefill_tokens;
} lupin_counters;

/* The registry's entry for one (name, address, port): its id and counters,
 * at an address that does not change while referenced. */
typedef struct lupin_endpoint_slot lupin_endpoint_slot;

/* Finds or makes the slot and takes a reference; NULL: out of memory. */
lupin_endpoint_slot *lupin__shared_endpoint_ref(lupin_shared *s, const char *name,
                                                const char *address, int port);
/* Drops a reference; the last one frees the slot (its id is not reused). */
void lupin__shared_endpoint_unref(lupin_shared *s, lupin_endpoint_slot *e);
uint32_t lupin__shared_endpoint_id(const lupin_endpoint_slot *e);
lupin_counters *lupin__shared_endpoint_counters(lupin_endpoint_slot *e);
/* Slots alive (specs). */
size_t lupin__shared_endpoints(lupin_shared *s);
void lupin__counters_add(lupin_counters *c, int64_t requests, int64_t tokens);

/* An endpoint.  The part up to `counters` is mirrored in lua/lupin/runtime/capi.lua
 * (the load's fields flat: the same layout) and read by plugins through
 * FFI; its memory is released by the Lua GC finalizer of its endpoint
 * object, so requests holding it keep it valid, and with it its slot in the
 * shared registry (so `counters`). */
typedef struct lupin_endpoint {
  uint32_t id; /* the slot's: the same in every runtime of the process */
  int32_t port;
  lupin_load load;
  const char *name;
  const char *address;
  lupin_counters *counters;
  /* private */
  char *running_lora;
  char *waiting_lora;
  lupin_shared *shared;
  lupin_endpoint_slot *slot;
} lupin_endpoint;

typedef struct lupin_generation lupin_generation;

/* blockhash.c: chained xxh64 block hashes of a prompt (see there). */
typedef struct lupin_hash_input {
  const char *prompt;
  size_t prompt_len;
  const char *model;
  size_t model_len;
  const char *salt; /* the request's cache_salt, may be empty */
  size_t salt_len;
  size_t block_size; /* characters per block, > 0 */
  size_t max_blocks;
} lupin_hash_input;

uint64_t lupin_block_seed(const char *model, size_t model_len, const char *salt, size_t salt_len);
/* Writes at most cap hashes; returns how many, or -1 on bad input. */
long lupin_block_hashes(const lupin_hash_input *in, uint64_t *out, size_t cap);

/* prefix_index.c: per-endpoint LRUs of block hashes plus the reverse map.
 * Endpoints are named by their id (lupin_endpoint.id). */
typedef struct lupin_prefix_index lupin_prefix_index;

/* rt may be NULL (benchmarks); with a runtime, removing an endpoint from its
 * pool purges the endpoint's entries. */
lupin_prefix_index *lupin_prefix_new(lupin_runtime *rt, uint32_t default_capacity);
void lupin_prefix_free(lupin_prefix_index *x);
int lupin_prefix_set_capacity(lupin_prefix_index *x, uint32_t id, uint32_t capacity);
/* Records a prompt's hashes as cached by endpoint id; -1: out of memory. */
int lupin_prefix_record(lupin_prefix_index *x, uint32_t id, const uint64_t *hashes, size_t n);
/* Walks hashes from the first until one no endpoint holds; writes per
 * endpoint the number of walked hashes it holds.  Returns the number of
 * endpoints written (at most cap), or -1 on bad input. */
long lupin_prefix_match(lupin_prefix_index *x, const uint64_t *hashes, size_t n, uint32_t *ids,
                        uint32_t *counts, size_t cap);
void lupin_prefix_purge(lupin_prefix_index *x, uint32_t id);
size_t lupin_prefix_count(const lupin_prefix_index *x, uint32_t id);
int lupin_prefix_holds(const lupin_prefix_index *x, uint32_t id, uint64_t hash);
size_t lupin_prefix_endpoints(const lupin_prefix_index *x);
size_t lupin_prefix_memory(const lupin_prefix_index *x);
/* The ids of the endpoints holding hash (at most cap written); returns how
 * many hold it. */
size_t lupin_prefix_holders(const lupin_prefix_index *x, uint64_t hash, uint32_t *ids, size_t cap);
/* Drops id's entries of hashes[0..n) (those it holds); returns how many. */
size_t lupin_prefix_remove(lupin_prefix_index *x, uint32_t id, const uint64_t *hashes, size_t n);
/* Purges id from the runtime's indexes and from its lupin_shared's. */
void lupin__prefix_purge_all(lupin_runtime *rt, uint32_t id);

/* --- prefix indexes and dicts shared between runtimes ---------------------
 * (prefix_shared.c, shared_dict.c).  A lupin_shared keeps them in a store:
 * lists under the store's own lock, taken to open, close and purge. */
typedef struct lupin_prefix_shared lupin_prefix_shared;
typedef struct lupin_prefix_view lupin_prefix_view;
typedef struct lupin_dict lupin_dict;
typedef struct lupin_token_cache lupin_token_cache;
typedef struct lupin_latency_model lupin_latency_model;

typedef struct lupin_shared_store {
  pthread_mutex_t lock;
  lupin_prefix_shared *prefix; /* keyed prefix indexes */
  unsigned prefix_shards;      /* a new index's shards: 1 in a runtime's private store */
  lupin_dict *dicts;
  size_t n_dicts;    /* under the lock */
  size_t dict_bytes; /* what every dict's entries hold: __atomic */
  /* requests waiting in flow control, every runtime's (flow.c): __atomic */
  int64_t flow_queued;
  /* the host's hook on records (prefix_sync.c): set before other threads
   * run, read without the lock */
  lupin_prefix_record_fn on_record;
  void *on_record_ud;
  lupin_token_cache *tokens; /* token_cache.c, under its own lock */
  /* latency models (latency_model.c): every one, newest first, and their
   * hash buckets (made with the first), under the lock */
  lupin_latency_model *latency;
  lupin_latency_model **latency_buckets;
  size_t n_latency;
} lupin_shared_store;

lupin_shared_store *lupin__shared_store(lupin_shared *s);
void lupin__prefix_shared_free_all(lupin_shared_store *st);
void lupin__prefix_shared_purge_all(lupin_shared_store *st, uint32_t id);
void lupin__dict_free_all(lupin_shared_store *st);
void lupin__latency_free_all(lupin_shared_store *st);

/* --- prefix records across processes (prefix_sync.c) --- */
/* Records into the index of key for endpoint id, under the store's lock,
 * calling no hook.  1: recorded; 0: no index has that key; -1: no memory. */
int lupin__prefix_shared_record(lupin_shared_store *st, const char *key, uint32_t id,
                                const uint64_t *hashes, size_t n);
/* The id of the newest endpoint named name in s's registry; 0: none. */
uint32_t lupin__shared_endpoint_named(lupin_shared *s, const char *name);
/* A keyed index recorded hashes for ep: tells the host's hook, if any. */
void lupin__prefix_sync_recorded(lupin_shared_store *st, const char *key, const lupin_endpoint *ep,
                                 const uint64_t *hashes, size_t n);

/* One runtime's handle on a keyed index (used by one thread at a time). */
lupin_prefix_view *lupin_prefix_open(lupin_runtime *rt, const char *key, uint32_t capacity);
void lupin_prefix_close(lupin_prefix_view *v);
int lupin_prefix_view_set_capacity(lupin_prefix_view *v, uint32_t id, uint32_t capacity);
/* As lupin_prefix_record; capacity > 0 first caps id's entries (autoTune)
 * in the shards the hashes fall in. */
int lupin_prefix_view_record(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n,
                             uint32_t capacity);
/* As lupin_prefix_match, but returns the number of endpoints found, which
 * may exceed cap (then only cap were written: call again with more room). */
long lupin_prefix_view_match(lupin_prefix_view *v, const uint64_t *hashes, size_t n, uint32_t *ids,
                             uint32_t *counts, size_t cap);
void lupin_prefix_view_purge(lupin_prefix_view *v, uint32_t id);
size_t lupin_prefix_view_count(lupin_prefix_view *v, uint32_t id);
int lupin_prefix_view_unsure(lupin_prefix_view *v, uint32_t id);
/* As the matches, an endpoint counting the blocks it holds from the first
 * without a gap: what an engine's cache can reuse (the precise plugins). */
long lupin_prefix_match_runs(lupin_prefix_index *x, const uint64_t *hashes, size_t n, uint32_t *ids,
                             uint32_t *counts, size_t cap);
long lupin_prefix_view_match_runs(lupin_prefix_view *v, const uint64_t *hashes, size_t n,
                                  uint32_t *ids, uint32_t *counts, size_t cap);
int lupin_prefix_view_remove(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n);
int lupin_prefix_view_holds(lupin_prefix_view *v, uint32_t id, uint64_t hash);
size_t lupin_prefix_view_memory(lupin_prefix_view *v);

/* A value in a shared dict.  Mirrored in lua/lupin/runtime/capi.lua. */
enum { LUPIN_DICT_NIL, LUPIN_DICT_NUMBER, LUPIN_DICT_STRING, LUPIN_DICT_BOOLEAN };
typedef struct lupin_dict_value {
  int32_t type; /* LUPIN_DICT_*; a boolean is num 0 or 1 */
  double num;
  size_t len; /* a string's length */
} lupin_dict_value;

/* What the dict calls answer beside 0. */
enum {
  LUPIN_DICT_FULL = 1,
  LUPIN_DICT_NOT_FOUND,
  LUPIN_DICT_NOT_NUMBER,
  LUPIN_DICT_TOO_LONG,
  LUPIN_DICT_NO_MEMORY /* the process's dicts hold LUPIN_DICT_MAX_BYTES */
};
#define LUPIN_DICT_MAX_KEY   65535
#define LUPIN_DICT_MAX_VALUE (1 << 20)
/* Bounds over the plugins' dicts of a lupin_shared, together: a plugin's bug
 * (a dict per request, values never deleted) fails its own sets, not the
 * process.  The runtime's own dicts ("lupin.*") are outside them. */
#define LUPIN_DICT_MAX_BYTES ((size_t)64 << 20)
#define LUPIN_DICT_MAX_DICTS 1024

/* The dict of that name in the runtime's lupin_shared, made on first use
 * with room for max_entries; NULL: LUPIN_DICT_MAX_DICTS dicts exist
 * already, or out of memory. */
lupin_dict *lupin_dict_open(lupin_runtime *rt, const char *name, size_t max_entries);
/* Copies the value's bytes (at most cap) into buf; out->len is its length. */
int lupin_dict_get(lupin_dict *d, const char *key, size_t klen, lupin_dict_value *out, char *buf,
                   size_t cap);
/* type LUPIN_DICT_NIL deletes.  0, LUPIN_DICT_FULL, _TOO_LONG, _NO_MEMORY or
 * -1 (malloc failed). */
int lupin_dict_set(lupin_dict *d, const char *key, size_t klen, int type, double num,
                   const char *str, size_t slen);
/* Adds delta to a number; an absent key starts at init when has_init, else
 * LUPIN_DICT_NOT_FOUND.  The new value in *out. */
int lupin_dict_incr(lupin_dict *d, const char *key, size_t klen, double delta, double init,
                    int has_init, double *out);
size_t lupin_dict_count(lupin_dict *d);
size_t lupin_dict_max(lupin_dict *d);

/* --- latency models (latency_model.c; lupin.h has their stats) ----------
 * Exponentially weighted ridge regression, one per (plugin, target, group)
 * in the runtime's lupin_shared.  Mirrored in lua/lupin/runtime/capi.lua. */
typedef struct lupin_latency_spec {
  const char *plugin, *target, *group; /* NUL-terminated, each < 256 bytes */
  int32_t features;                    /* 1..LUPIN_LATENCY_MAX_FEATURES */
  int32_t exported;                    /* listed by lupin_shared_latency_each */
  double half_life;                    /* seconds; <= 0: no forgetting */
  double quantile;                     /* 0: the mean; in (0,1): that quantile */
} lupin_latency_spec;
#define LUPIN_LATENCY_MAX_NAME 256

/* The model of spec's three names, made on first use; a reopen sets its
 * half-life, quantile and export in place, and a new feature count starts
 * it afresh.  NULL: bad spec, LUPIN_LATENCY_MAX_MODELS exist already, or no
 * memory. */
lupin_latency_model *lupin__latency_open(lupin_runtime *rt, const lupin_latency_spec *spec);
/* Trains on x[0..features) -> y at time now (seconds).  0, or -1: a
 * non-finite (or absurdly large) input, the sample ignored. */
int lupin__latency_train(lupin_latency_model *m, const double *x, double y, double now);
/* out[i] = models[i]'s prediction for the row x[i * stride ..] (its own
 * feature count of values), trained[i] (may be NULL) its samples; a NULL
 * model, or one with more features than stride, gives NaN and 0. */
void lupin__latency_predict(lupin_latency_model *const *models, size_t n, const double *x,
                            size_t stride, double *out, uint64_t *trained);
/* Counts |predicted - actual| / actual of a prediction a scheduler used
 * (actual > 0, predicted >= 0, both finite; else nothing). */
void lupin__latency_observe(lupin_latency_model *m, double predicted, double actual);
void lupin__latency_stats(lupin_latency_model *m, lupin_latency_stats *out);

/* The table of these functions handed to Lua (lupin_capi.shared). */
typedef struct lupin_capi_shared {
  lupin_prefix_view *(*prefix_open)(lupin_runtime *rt, const char *key, uint32_t capacity);
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
  lupin_dict *(*dict_open)(lupin_runtime *rt, const char *name, size_t max_entries);
  int (*dict_get)(lupin_dict *d, const char *key, size_t klen, lupin_dict_value *out, char *buf,
                  size_t cap);
  int (*dict_set)(lupin_dict *d, const char *key, size_t klen, int type, double num,
                  const char *str, size_t slen);
  int (*dict_incr)(lupin_dict *d, const char *key, size_t klen, double delta, double init,
                   int has_init, double *out);
  size_t (*dict_count)(lupin_dict *d);
  size_t (*dict_max)(lupin_dict *d);
  /* adds delta to the process's queued requests; returns the new count (a
   * double: Lua reads it without boxing a 64-bit integer) */
  double (*flow_add)(lupin_runtime *rt, int64_t delta);
  /* on: flow control keeps idle state (flows, bands) to drop at a tick,
   * so ticks reach it while no request does */
  void (*flow_keep)(lupin_runtime *rt, int on);
  /* token-id block hashes (blockhash.c; here, not beside block_hashes, so
   * that lupin_capi keeps its layout) and the token cache of the runtime's
   * lupin_shared (token_cache.c) */
  uint64_t (*token_seed)(const char *hash_seed, size_t hash_seed_len, const char *lora,
                         size_t lora_len, const char *salt, size_t salt_len);
  long (*token_block_hashes)(uint64_t prev, const uint32_t *ids, size_t n, size_t block_size,
                             uint64_t *out, size_t cap);
  int (*tokens_put)(lupin_runtime *rt, uint64_t key, const uint32_t *ids, size_t n);
  long (*tokens_hashes)(lupin_runtime *rt, uint64_t key, uint64_t prev, size_t block_size,
                        uint64_t *out, size_t cap);
  long (*tokens_count)(lupin_runtime *rt, uint64_t key);
  int (*tokens_want)(lupin_runtime *rt, const lupin_tokenize_job *job);
  /* a keyed index's endpoint the host cannot vouch for now, and the
   * removal of blocks through a view (prefix_shared.c) */
  int (*prefix_unsure)(lupin_prefix_view *v, uint32_t id);
  int (*prefix_remove)(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n);
  long (*prefix_match_runs)(lupin_prefix_view *v, const uint64_t *hashes, size_t n, uint32_t *ids,
                            uint32_t *counts, size_t cap);
  /* latency models (latency_model.c) */
  lupin_latency_model *(*latency_open)(lupin_runtime *rt, const lupin_latency_spec *spec);
  int (*latency_train)(lupin_latency_model *m, const double *x, double y, double now);
  void (*latency_predict)(lupin_latency_model *const *models, size_t n, const double *x,
                          size_t stride, double *out, uint64_t *trained);
  void (*latency_observe)(lupin_latency_model *m, double predicted, double actual);
  void (*latency_stats)(lupin_latency_model *m, lupin_latency_stats *out);
} lupin_capi_shared;

extern const lupin_capi_shared lupin__capi_shared;

/* token_cache.c: made and freed with its lupin_shared; the capi's calls. */
lupin_token_cache *lupin__tokens_new(void);
void lupin__tokens_free(lupin_token_cache *c);
int lupin__tokens_put(lupin_runtime *rt, uint64_t key, const uint32_t *ids, size_t n);
long lupin__tokens_hashes(lupin_runtime *rt, uint64_t key, uint64_t prev, size_t block_size,
                          uint64_t *out, size_t cap);
long lupin__tokens_count(lupin_runtime *rt, uint64_t key);
int lupin__tokens_want(lupin_runtime *rt, const lupin_tokenize_job *job);

/* What a generation's plugins can observe (lua/lupin/runtime/engine.lua's flags):
 * without them the core skips the calls into Lua. */
enum {
  LUPIN_GEN_OBSERVES_RESPONSE = 1, /* response_header, _chunk, _complete or finish */
  LUPIN_GEN_HAS_FINISH = 2,
  LUPIN_GEN_OBSERVES_CHUNKS = 4,   /* response_chunk */
  LUPIN_GEN_OBSERVES_COMPLETE = 8, /* response_complete */
  LUPIN_GEN_TIMES_RESPONSE = 16,   /* a plugin with times_response: chunks timed */
};

struct lupin_generation {
  uint64_t number;
  int ref;       /* the generation's Lua table */
  int flags;     /* LUPIN_GEN_* */
  size_t pinned; /* requests begun on it and not ended */
  int current;
  double loaded_at, loaded_unix; /* lupin_now(), wall clock */
  double load_seconds;           /* build, validate, dry cycle */
  char *source;
  char digest[17]; /* xxh64 of the config text and plugin files, hex */
  lupin_generation *next;
};

/* The function table handed to Lua (lua/lupin/runtime/capi.lua mirrors it). */
typedef struct lupin_capi {
  lupin_runtime *rt;
  lupin_alloc *alloc;
  /* lupin_now: through FFI a call that returns a double, where reading a
   * struct timespec from Lua boxes each 64-bit field when interpreted */
  double (*now)(void);
  void (*log)(lupin_runtime *rt, int level, const char *msg);
  void (*endpoint_free)(lupin_endpoint *ep);
  /* req: the request's address as the number its Lua state keeps
   * (lupin_request_begin), not a pointer cdata: no box per request */
  int (*result_add_pick)(uintptr_t req, const lupin_endpoint *ep);
  /* sets the requests and tokens req counts in flight on ep until it ends
   * (negative: unchanged) */
  int (*request_count)(uintptr_t req, const lupin_endpoint *ep, int64_t requests, int64_t tokens);
  int (*result_add_header)(uintptr_t req, const char *name, const char *value);
  int (*client_add_header)(uintptr_t req, const char *name, const char *value);
  /* a header's value in the begin hook's header block (request.c) */
  const char *(*header_find)(const char *block, size_t len, const char *name, size_t name_len,
                             size_t *value_len);
  /* the prefix primitives (blockhash.c, prefix_index.c) */
  long (*block_hashes)(const lupin_hash_input *in, uint64_t *out, size_t cap);
  lupin_prefix_index *(*prefix_new)(lupin_runtime *rt, uint32_t default_capacity);
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
  /* call budgets (budget.c) */
  lupin_budget *budget;
  int (*budget_poll)(const volatile int32_t *cut);
  /* keyed prefix indexes and shared dicts (prefix_shared.c, shared_dict.c) */
  const lupin_capi_shared *shared;
  /* ctx.timing (lupin_request_timing) */
  void (*request_timing)(uintptr_t req, lupin_response_timing *out);
  /* sets the prefill tokens req counts on ep until its first body byte */
  int (*request_prefill)(uintptr_t req, const lupin_endpoint *ep, int64_t tokens);
} lupin_capi;

/* abi.c: each structure capi.lua declares, as C lays it out: its size (or
 * the size of the head Lua declares) with field NULL, or a field's offset;
 * the list ends with type NULL. */
typedef struct lupin_abi_entry {
  const char *type, *field, *lua_field;
  size_t size, offset;
} lupin_abi_entry;

const lupin_abi_entry *lupin__abi(void);
/* Pushes {outcome=, request_flag=, gen_flag=, hook=} of name -> value. */
void lupin__abi_push_enums(lua_State *L, const char *const *hooks, int n_hooks);

/* The Lua functions of lua/lupin/runtime/init.lua the core calls: the enum
 * and the names core/runtime.c looks up are made from this one list. */
#define LUPIN_HOOKS(X)                                                                             \
  X(LOAD, "load")                                                                                  \
  X(RELEASE, "release")                                                                            \
  X(BEGIN, "begin")                                                                                \
  X(SCHEDULE, "schedule")                                                                          \
  X(RESPONSE_HEADER, "response_header")                                                            \
  X(RESPONSE_CHUNK, "response_chunk")                                                              \
  X(RESPONSE_COMPLETE, "response_complete")                                                        \
  X(FINISH, "finish")                                                                              \
  X(ENDPOINT_ADD, "endpoint_add")                                                                  \
  X(ENDPOINT_REMOVE, "endpoint_remove")                                                            \
  X(ENDPOINT_LABELS, "endpoint_labels")                                                            \
  X(ENDPOINT_ADAPTERS, "endpoint_adapters")                                                        \
  X(STATS, "stats")                                                                                \
  X(PLUGIN_STATS, "plugin_stats")                                                                  \
  X(CHECK_LEAKS, "check_leaks")                                                                    \
  X(EVAL, "eval")                                                                                  \
  X(HOST, "host") /* what a host asks beyond requests (core/host.c) */                             \
  X(ENDPOINT_HEALTH, "endpoint_health")                                                            \
  X(FALLBACKS, "fallbacks")                                                                        \
  X(EXPLAIN, "explain")                                                                            \
  X(FLOW, "flow")       /* flow control (core/flow.c) */                                           \
  X(INSTALL, "install") /* a built generation becomes current */

// clang-format off
enum lupin_hook {
#define LUPIN_HOOK_ENUM(id, name) LUPIN_HOOK_##id,
  LUPIN_HOOKS(LUPIN_HOOK_ENUM)
#undef LUPIN_HOOK_ENUM
  LUPIN_HOOK_COUNT
};
// clang-format on

/* A generation built and not yet installed (lupin_runtime_stage). */
typedef struct lupin_staged {
  int ref, flags;
  uint64_t digest;
  double seconds;
} lupin_staged;

/* The collector paced by the host (collector.c). */
typedef struct lupin_collector {
  int on;          /* lupin_options.host_paces_collector */
  int in_cycle;    /* a cycle started and not finished */
  size_t next;     /* the heap's size that starts the next cycle */
  uint64_t paced;  /* alloc.allocated up to which steps were made */
  uint64_t cycles; /* completed, for lupin_stats */
  double seconds;  /* in steps, for lupin_stats */
} lupin_collector;

void lupin__collector_start(lupin_runtime *rt);

struct lupin_runtime {
  lua_State *L;
  lupin_shared *shared;     /* the host's, or own_shared */
  lupin_shared *own_shared; /* made for a runtime given none, freed with it */
  lupin_alloc alloc;
  lupin_budget budget;
  lupin_capi capi;
  int hooks[LUPIN_HOOK_COUNT];
  int traceback; /* registry ref of the message handler of every call into Lua */
  lupin_log_fn log;
  void *log_ud;
  int log_level;
  char *config_path;
  /* generations: current first, then older ones still pinned */
  lupin_generation *generations;
  uint64_t generation_seq;
  lupin_staged staged;
  int has_staged;
  /* endpoints */
  lupin_endpoint **endpoints;
  size_t n_endpoints, cap_endpoints;
  uint32_t *endpoint_names; /* by name: index + 1, 0 empty (endpoint.c); NULL: scan */
  size_t endpoint_names_mask;
  lupin_prefix_index *prefix_indexes; /* live indexes, purged on endpoint removal */
  /* requests */
  lupin_request *requests, *requests_tail; /* live, oldest first */
  lupin_request *spare_requests;           /* ended, for reuse (request.c) */
  size_t n_spare_requests;
  uint64_t requests_begun, requests_ended;
  /* flow control (flow.c) */
  lupin_dispatch_fn dispatch;
  void *dispatch_ud;
  lupin_evict_fn evict; /* enableEviction's: lupin_runtime_set_evict */
  void *evict_ud;
  uint64_t flow_requests; /* live requests flow control knows of */
  int flow_kept;          /* flow control has idle state to drop at a tick */
  int64_t flow_queued;    /* of the store's flow_queued, this runtime's */
  int pumping, pump_again;
  lupin_collector collector;
};

/* Built-ins bounded by the call budget and the C stack (guard.c, pattern.c):
 * the module lupin.guard.native, preloaded in every runtime's state with the
 * runtime's budget as upvalue (NULL: nothing is ever cut). */
typedef struct lupin_guard {
  lupin_budget *budget;
  int trip;                  /* registry ref of budget.lua's trip, or LUA_NOREF */
  char *stack_lo, *stack_hi; /* the running thread's stack */
  size_t reserve;            /* kept free for the error path */
} lupin_guard;

int lupin__guard_open(lua_State *L);
lupin_guard *lupin__guard_of(lua_State *L); /* a guard function's upvalue */
/* C stack left to the running thread beyond the reserve (0: none). */
size_t lupin_stack_room(lupin_guard *g);
/* Throws a Lua error when the C stack has no room for one more callback. */
void lupin__guard_stack_check(lua_State *L, lupin_guard *g);
/* Calls budget.lua's trip when the budget's flag is set, or (eta > 0) when
 * work taking eta seconds more would end past the deadline. */
void lupin__guard_poll(lua_State *L, lupin_guard *g, double eta);
/* Sets find, match, gmatch and gsub in the table on top, over the guard at
 * stack index `guard`. */
void lupin__pattern_register(lua_State *L, int guard);

/* json.cpp: the module lupin.json.native, preloaded in every runtime's state
 * (lua/lupin/runtime/json.lua) */
int lupin__json_open(lua_State *L);

/* runtime.c */
int lupin__push_hook(lupin_runtime *rt, enum lupin_hook hook);
int lupin__call(lupin_runtime *rt, int nargs, int nresults, char *err, size_t errlen);
void lupin__log(lupin_runtime *rt, int level, const char *fmt, ...);
void lupin__errf(char *err, size_t errlen, const char *fmt, ...);
/* Runs a Lua chunk in the runtime's state; returns its result as a string
 * (JSON-encoded when not a string).  For specs and debugging only. */
char *lupin__eval(lupin_runtime *rt, const char *code, char *err, size_t errlen);

/* generation.c */
lupin_generation *lupin__generation_current(lupin_runtime *rt);
int lupin__generation_install(lupin_runtime *rt, int ref, int flags, const char *source,
                              uint64_t digest, double load_seconds);
void lupin__generation_unpin(lupin_runtime *rt, lupin_generation *g);
void lupin__generation_free_all(lupin_runtime *rt);
/* Releases a generation table that was never installed. */
void lupin__generation_drop(lupin_runtime *rt, int ref);

/* endpoint.c */
void lupin__endpoint_free(lupin_endpoint *ep);

/* request.c */
int lupin__result_add_pick(uintptr_t req, const lupin_endpoint *ep);
int lupin__result_add_header(uintptr_t req, const char *name, const char *value);
int lupin__client_add_header(uintptr_t req, const char *name, const char *value);
const char *lupin__header_find(const char *block, size_t len, const char *name, size_t name_len,
                               size_t *value_len);
int lupin__request_count(uintptr_t req, const lupin_endpoint *ep, int64_t requests, int64_t tokens);
void lupin__request_timing(uintptr_t req, lupin_response_timing *out);
int lupin__request_prefill(uintptr_t req, const lupin_endpoint *ep, int64_t tokens);
void lupin__requests_cancel_all(lupin_runtime *rt);
void lupin__requests_free_spares(lupin_runtime *rt);
/* Runs scheduling (or reads its answer again) into *out. */
int lupin__request_schedule_into(lupin_request *req, lupin_result *out);

/* flow.c: hands the queue's final results to the host's callback. */
void lupin__flow_pump(lupin_runtime *rt, int sweep);
double lupin__flow_add(lupin_runtime *rt, int64_t delta);
void lupin__flow_keep(lupin_runtime *rt, int on);
/* The number of the generation a request is pinned to (the gateway's
 * /admin/requests shows it). */

#endif
