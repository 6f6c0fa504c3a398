/*
 * lupin.h -- the embedding API of the lupin plugin runtime.
 *
 * A runtime owns one LuaJIT state, the endpoint pool and the loaded
 * generations of plugins.  It is single-threaded: every call on a runtime and
 * on its requests must come from one thread.  A multi-threaded host makes one
 * runtime per thread and gives them one lupin_shared: the process-wide state
 * (endpoint identities and in-flight counters, prefix indexes, plugins'
 * shared dicts) that those runtimes see alike.
 *
 * Errors are returned, never printed: calls that can fail take an error buffer
 * (err, errlen) and return 0 on success, -1 on failure with a message in err.
 *
 * The request lifecycle:
 *
 *   req = lupin_request_begin(rt, &desc, ...)   state table created, pinned to
 *                                               the current generation
 *   lupin_request_schedule(req, &result)        admit, prepare, profiles,
 *                                               pre_request
 *   lupin_request_response_header(req, ...)     after the upstream answered
 *   lupin_request_response_chunk(req, ...)      per body chunk
 *   lupin_request_response_complete(req)        on a full response
 *   lupin_request_end(req, outcome)             finish hooks, state dropped
 *
 * lupin_request_end is the only way a request handle dies; it runs every
 * reached plugin's finish hook exactly once, whatever happened before.
 */
#ifndef LUPIN_H
#define LUPIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LUPIN_VERSION "0.1.0"

/* The LuaJIT the runtime was built with ("LuaJIT 2.1.0-beta3"). */
const char *lupin_luajit_version(void);

typedef struct lupin_runtime lupin_runtime;
typedef struct lupin_request lupin_request;
typedef struct lupin_shared lupin_shared;

/* A name/value pair: HTTP headers, endpoint labels. */
typedef struct lupin_header {
  const char *name;
  const char *value;
} lupin_header;

enum lupin_log_level { LUPIN_LOG_ERROR, LUPIN_LOG_WARN, LUPIN_LOG_INFO, LUPIN_LOG_DEBUG };

typedef void (*lupin_log_fn)(void *ud, int level, const char *msg);

/* An allocator for the Lua heap, with lua_Alloc's contract: nsize 0 frees
 * ptr and returns NULL; otherwise it returns a block of nsize bytes holding
 * ptr's first min(osize, nsize) bytes (ptr NULL: a new block), or NULL,
 * leaving ptr as it was.  osize is the block's size when ptr is not NULL. */
typedef void *(*lupin_allocator)(void *ud, void *ptr, size_t osize, size_t nsize);

typedef struct lupin_options {
  /* Directory holding lua/ and plugins/.  NULL: $LUPIN_HOME, else the
   * compiled-in install prefix. */
  const char *home;
  /* Extra plugin directories, searched after home/plugins. */
  const char *const *plugin_dirs;
  size_t n_plugin_dirs;
  /* Limit on Lua memory in bytes (0: none).  An allocation over the limit
   * fails the plugin call that made it; the core's own bookkeeping may run
   * over it so a request can always be finished. */
  size_t memory_limit;
  /* Log sink (NULL: stderr) and the most verbose level passed to it. */
  lupin_log_fn log;
  void *log_ud;
  int log_level;
  /* Seed for the plugins' random numbers (0: from the clock). */
  uint64_t seed;
  /* The process-wide state this runtime shares with others, on any thread
   * (NULL: a private one).  It must outlive the runtime. */
  lupin_shared *shared;
  /* What the Lua heap's blocks come from (NULL: LuaJIT's own allocator).
   * The runtime still counts every byte and applies memory_limit above it.
   * Called on the runtime's thread only; Lua's small objects come and go by
   * the thousand per second, so its speed is the runtime's (docs/design.md,
   * "The Lua heap's allocator"). */
  lupin_allocator allocator;
  void *allocator_ud;
  /* Nonzero: the host paces the Lua collector by calling
   * lupin_runtime_collect_step between requests, and no collection work
   * happens inside a request's calls (docs/design.md, "The collector
   * between requests").  0: LuaJIT paces it from the allocations, inside
   * whatever call makes them. */
  int host_paces_collector;
} lupin_options;

/* --- state shared between runtimes (docs/workers.md) ----------------------
 *
 * Everything in a lupin_shared is thread-safe: runtimes on several threads
 * read and write it at once.  What it holds:
 *  - endpoint identities: an endpoint (name, address, port) has the same id
 *    in every runtime, and one pair of in-flight counters (requests and
 *    prompt tokens the runtimes' requests have there now), which plugins read
 *    as ep.in_flight and ep.in_flight_tokens;
 *  - prefix indexes: lupin.prefix's index of a plugin instance is one index
 *    for the process, whichever runtime records or looks up;
 *  - plugins' shared dicts (lupin.shared, as OpenResty's ngx.shared.DICT);
 *  - plugins' latency models (lupin.predictor: lupin_shared_latency_each).
 */
/* threads: how many threads will run runtimes on it at once (a hint; at
 * least 1).  Each prefix index gets that many lock stripes, twice over, up
 * to 8; with 1 it has one lock and no striping, which a single thread runs
 * faster (docs/workers.md). */
lupin_shared *lupin_shared_new(unsigned threads, char *err, size_t errlen);
/* Frees it; every runtime made with it must have been freed first. */
void lupin_shared_free(lupin_shared *s);

/* --- prefix records across processes (docs/replicas.md) -------------------
 *
 * Replicas of a host (several processes, each with its own lupin_shared)
 * share what their keyed prefix indexes learn: a host hears every record
 * and applies the records other processes heard to its own indexes.
 * Endpoints are named by their name (ids differ between processes). */

/* Called after a keyed prefix index (lupin.prefix.index(capacity, key))
 * recorded a prompt's block hashes for an endpoint, on the thread that
 * recorded, with no lock of the lupin_shared held.  The pointers are valid
 * during the call only: copy what you keep.  It must not call back into
 * the lupin_shared's indexes. */
typedef void (*lupin_prefix_record_fn)(void *ud, const char *key, const char *endpoint,
                                       const uint64_t *hashes, size_t n);
/* Sets the hook (fn NULL: none).  Set it before other threads use s, and
 * clear it only once they stopped: it is read without a lock. */
void lupin_shared_on_prefix_record(lupin_shared *s, lupin_prefix_record_fn fn, void *ud);
/* Records hashes[0..n) for the endpoint named `endpoint` in the keyed index
 * of `key`, as if a runtime of s had, without calling the hook (no echo).
 * Thread-safe, from any thread, one that runs no runtime too (a host's
 * subscriber thread).  1: applied; 0: ignored (no index has that key now, or
 * no runtime of s has an endpoint of that name); -1: bad arguments or out of
 * memory. */
int lupin_shared_prefix_apply(lupin_shared *s, const char *key, const char *endpoint,
                              const uint64_t *hashes, size_t n);
/* The endpoint named `endpoint` no longer holds hashes[0..n) in the keyed
 * index of `key` (an engine evicted those blocks); hashes it did not hold are
 * skipped.  As lupin_shared_prefix_apply: no hook, any thread, 1 applied, 0
 * ignored, -1 bad arguments. */
int lupin_shared_prefix_remove(lupin_shared *s, const char *key, const char *endpoint,
                               const uint64_t *hashes, size_t n);
/* Drops everything the endpoint named `endpoint` holds in the keyed index of
 * `key` (an engine restarted or cleared its cache).  The same conventions. */
int lupin_shared_prefix_purge(lupin_shared *s, const char *key, const char *endpoint);
/* The keyed index of `key` cannot vouch for the endpoint named `endpoint`
 * for `seconds` (0: it can again): a host that purged what an engine's
 * events had told it, and learns it again, says so; plugins then score the
 * endpoint otherwise meanwhile (lupin.prefix's index:unsure).  The same
 * conventions. */
int lupin_shared_prefix_unsure(lupin_shared *s, const char *key, const char *endpoint,
                               double seconds);

/* --- block hashes of token ids (docs/prefix-index.md) ---------------------
 *
 * The key of a KV-cache block by the token ids it holds, so that what an
 * engine reports it stored (token ids, in its events) and what a request will
 * need (its prompt's token ids) meet on one key lupin computes itself. */

/* The chain's start for one model adapter and tenant: hash_seed is the
 * config's hashSeed, lora the LoRA adapter's name ("" or NULL: the base
 * model), salt the request's cache_salt. */
uint64_t lupin_token_seed(const char *hash_seed, size_t hash_seed_len, const char *lora,
                          size_t lora_len, const char *salt, size_t salt_len);
/* Chained xxh64 of the full blocks of ids[0..n), block_size ids each:
 *   h[i] = xxh64(le32 bytes of block i's ids ‖ le64(h[i-1])),  h[-1] = prev
 * (prev: a seed, or a stored block's hash to continue its chain).  Writes at
 * most cap; returns how many, -1 on bad arguments.  Allocates nothing. */
long lupin_token_block_hashes(uint64_t prev, const uint32_t *ids, size_t n, size_t block_size,
                              uint64_t *out, size_t cap);

/* --- the token cache (docs/prefix-index.md) -------------------------------
 *
 * The token ids of prompt prefixes, under a key the caller chooses (a plugin
 * uses its character-chain hash of the prefix), shared by every runtime of s,
 * bounded in bytes (least recently used out first).  Thread-safe.  Ids come
 * from a tokenizer the host calls: a plugin asks for them with
 * lupin_shared_tokens_want (through lupin.tokens), the host's hook receives
 * the job and later answers with lupin_shared_tokens_put, or with
 * lupin_shared_tokens_failed. */

/* Caches ids[0..n) under key, replacing what it held (and ending a pending
 * job for it).  0: cached; -1: bad arguments, more than the cache's limit,
 * or out of memory. */
int lupin_shared_tokens_put(lupin_shared *s, uint64_t key, const uint32_t *ids, size_t n);
/* lupin_token_block_hashes(prev, ...) of the ids cached under key, computed
 * under the cache's lock (no copy to the caller); the entry becomes the most
 * recently used.  The number written, or -1 when key is not cached (or bad
 * arguments).  Counts a hit or a miss. */
long lupin_shared_tokens_hashes(lupin_shared *s, uint64_t key, uint64_t prev, size_t block_size,
                                uint64_t *out, size_t cap);
/* How many ids are cached under key, -1: none are.  Counts nothing. */
long lupin_shared_tokens_count(lupin_shared *s, uint64_t key);
/* The cache's bound in bytes (ids and bookkeeping; default 64 MiB): a lower
 * one evicts at once. */
void lupin_shared_tokens_limit(lupin_shared *s, size_t bytes);
/* How long a job asked for stays pending (default 5 s): a key is not asked
 * for again meanwhile, and is once it expired (a job the host lost).  Set it
 * above the host's tokenizer timeout. */
void lupin_shared_tokens_pending_seconds(lupin_shared *s, double seconds);

typedef struct lupin_token_cache_stats {
  uint64_t entries, bytes, limit;  /* now */
  uint64_t pending;                /* jobs asked for, not answered nor expired */
  uint64_t hits, misses;           /* lupin_shared_tokens_hashes */
  uint64_t evictions;              /* entries dropped for room */
  uint64_t asked, failed, expired; /* jobs given to the hook, failed, expired */
} lupin_token_cache_stats;
void lupin_shared_tokens_stats(lupin_shared *s, lupin_token_cache_stats *out);

/* A prompt prefix to tokenize.  The pointers are valid during the hook's
 * call only: copy what you keep. */
typedef struct lupin_tokenize_job {
  uint64_t key;         /* answer with lupin_shared_tokens_put(s, key, ...) */
  const char *endpoint; /* the endpoint to ask, by name, or NULL: any */
  const char *model;
  const char *text; /* the prompt's prefix, or with chat a JSON array of messages */
  size_t text_len;
  int chat;
} lupin_tokenize_job;
/* Called with no lock of s held, on the thread that asked (a runtime's, in a
 * plugin's call): be quick, hand the job to the thread that tokenizes.  It
 * may call lupin_shared_tokens_put or _failed at once. */
typedef void (*lupin_tokenize_fn)(void *ud, const lupin_tokenize_job *job);
/* Sets the hook (fn NULL: none; jobs are then never asked for). */
void lupin_shared_on_tokenize(lupin_shared *s, lupin_tokenize_fn fn, void *ud);
/* Gives job to the hook unless its key is cached or pending already.  1:
 * asked (the key is now pending); 0: not needed (cached, pending, or no
 * hook); -1: bad arguments or out of memory. */
int lupin_shared_tokens_want(lupin_shared *s, const lupin_tokenize_job *job);
/* The job for key failed: no longer pending (asked for again on the next
 * want), counted. */
void lupin_shared_tokens_failed(lupin_shared *s, uint64_t key);

/* --- latency models (docs/latency-prediction.md) ---------------------------
 *
 * Plugins predict a request's latency at each endpoint (time to first token,
 * time per output token) with online regression models they train on every
 * finished request (lupin.predictor).  The models live in the lupin_shared,
 * one per (plugin, target, group), every runtime training and reading the
 * same one; at most LUPIN_LATENCY_MAX_MODELS of them.  A host reads those the
 * plugins export, for its metrics. */
#define LUPIN_LATENCY_MAX_FEATURES 16
#define LUPIN_LATENCY_MAX_MODELS   4096

/* What a model has learnt and how well it predicts, copied under its lock. */
typedef struct lupin_latency_stats {
  uint64_t trained; /* samples trained */
  double weight;    /* effective (decayed) sample weight */
  /* the absolute percentage error of each sample's prediction made before
   * training on it: how many, and their exponentially weighted mean (1/64
   * a sample) */
  uint64_t apriori_n;
  double apriori_mape;
  /* the same for the predictions a scheduler used, as the plugin reports
   * them: how many, their sum (a counter: rate(sum) / rate(n) is the mean
   * over a window) and their weighted mean */
  uint64_t served_n;
  double served_ape_sum;
  double served_mape;
  double factor; /* the quantile factor predictions are multiplied by (1: the mean) */
  int32_t features;
  double w[LUPIN_LATENCY_MAX_FEATURES]; /* the weights now, 0 past features */
} lupin_latency_stats;

typedef struct lupin_latency_model_info {
  const char *plugin, *target, *group; /* the model's names */
  lupin_latency_stats stats;
} lupin_latency_model_info;

/* Calls fn with each model a plugin exported (lupin.predictor's exported =
 * true), oldest last, from any thread.  The names are valid during the call
 * only.  Models made during the walk may be missed. */
void lupin_shared_latency_each(lupin_shared *s,
                               void (*fn)(const lupin_latency_model_info *m, void *ud), void *ud);

/* Creates a runtime.  opts may be NULL for the defaults. */
lupin_runtime *lupin_runtime_new(const lupin_options *opts, char *err, size_t errlen);
/* Loads a config file (JSON, EndpointPickerConfig shape) as a new generation.
 * On failure the current generation, if any, keeps serving. */
int lupin_runtime_load(lupin_runtime *rt, const char *path, char *err, size_t errlen);
/* Same, from a string; source names it in error messages. */
int lupin_runtime_load_string(lupin_runtime *rt, const char *json, const char *source, char *err,
                              size_t errlen);
/* Re-reads the file last given to lupin_runtime_load. */
int lupin_runtime_reload(lupin_runtime *rt, char *err, size_t errlen);
/* A reload in two steps, for a host that swaps several runtimes together:
 * stage builds and checks the next generation from the file last loaded (the
 * dry cycle included) without serving it; commit makes the staged one
 * current, abort drops it (its plugins' shutdown hooks run).  A runtime holds
 * at most one staged generation: staging again drops the previous one. */
int lupin_runtime_stage(lupin_runtime *rt, char *err, size_t errlen);
int lupin_runtime_commit(lupin_runtime *rt, char *err, size_t errlen);
void lupin_runtime_abort(lupin_runtime *rt);
/* Frees the runtime.  Requests still alive are ended as cancelled first. */
void lupin_runtime_free(lupin_runtime *rt);

typedef struct lupin_stats {
  uint64_t requests_begun;
  uint64_t requests_ended;
  uint64_t live_requests;       /* begun, not ended */
  uint64_t live_request_tables; /* request tables the Lua GC has not reclaimed */
  uint64_t lua_memory;          /* bytes held by the Lua state */
  uint64_t lua_memory_peak;
  uint64_t memory_limit_hits; /* allocations refused by the limit */
  uint64_t generations_alive;
  uint64_t generation; /* number of the current generation, 0: none */
  uint64_t endpoints;
  /* the collector paced by the host (lupin_options.host_paces_collector):
   * the cycles its steps completed and the time they took; 0 otherwise */
  uint64_t collector_cycles;
  uint64_t collector_ns;
} lupin_stats;

void lupin_runtime_stats(lupin_runtime *rt, lupin_stats *out);

/* Per plugin instance and extension point: calls, errors, time spent. */
#define LUPIN_PLUGIN_BUCKETS 10
#define LUPIN_PLUGIN_BOUNDS  0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1
typedef struct lupin_plugin_stat {
  const char *plugin; /* instance name */
  const char *type;
  const char *point; /* "score", "pre_request", ... */
  uint64_t calls;
  uint64_t errors; /* cuts included */
  uint64_t nanoseconds;
  uint64_t cuts; /* calls cut by the call budget (docs/plugins.md) */
  int disabled;  /* the instance is disabled (budgets.disableAfterCuts) */
  /* calls by duration, not cumulative: [i] took at most the i-th bound of
   * LUPIN_PLUGIN_BOUNDS (seconds; the endpoint picker's buckets), the last
   * took longer */
  uint64_t buckets[LUPIN_PLUGIN_BUCKETS + 1];
  /* the endpoint picker's name of the point ("Scorer", "PreRequest"...:
   * lua/lupin/generation/points.lua), point itself where it has none */
  const char *epp_point;
} lupin_plugin_stat;

typedef void (*lupin_plugin_stat_fn)(void *ud, const lupin_plugin_stat *stat);
/* Calls fn for each (plugin, point) of the current generation that was called. */
void lupin_runtime_plugin_stats(lupin_runtime *rt, lupin_plugin_stat_fn fn, void *ud);

/* One live generation: the current one, or an older one still pinned by
 * requests in flight (released when its last one ends). */
typedef struct lupin_generation_info {
  uint64_t number;     /* 1 for the first load, +1 per successful load */
  double loaded_at;    /* when it was swapped in, on lupin_now()'s clock */
  double loaded_unix;  /* the same, wall clock (seconds since the epoch) */
  double load_seconds; /* building it: read, validate, instantiate, dry cycle */
  const char *source;  /* the config's file name or source string */
  const char *digest;  /* xxh64 of the config (its canonical JSON form: a
                          YAML and a JSON form digest alike) and of each
                          plugin file loaded (path and text, by type), 16
                          hex digits: equal digests, same sources */
  uint64_t pinned;     /* requests begun on it and not ended */
  int current;         /* new requests begin on it */
} lupin_generation_info;

typedef void (*lupin_generation_fn)(void *ud, const lupin_generation_info *g);
/* Calls fn for each live generation, current first, then older ones, newest
 * first.  The pointers in g are valid during the call only.  fn must not call
 * back into the runtime. */
void lupin_runtime_generations(lupin_runtime *rt, lupin_generation_fn fn, void *ud);

/* Runs a full garbage collection and reports request state that outlived its
 * request: returns the number of ended requests whose table is still alive and
 * writes a report naming the plugin and the place holding it. */
int lupin_runtime_check_leaks(lupin_runtime *rt, char *report, size_t len);
/* A full garbage collection, for a host's idle moments: the state of ended
 * requests is reclaimed and live_request_tables counts live ones again.
 * Blocks for the collection (about a millisecond per MB of Lua heap). */
void lupin_runtime_collect(lupin_runtime *rt);
/* With lupin_options.host_paces_collector: the collection work owed for
 * what Lua allocated since the last call, done now, the amount LuaJIT's own
 * pacing would have done inside the calls that allocated.  Call it between
 * requests and often (an event loop: once per iteration); the heap grows
 * until it is called.  Without that option it does nothing. */
void lupin_runtime_collect_step(lupin_runtime *rt);

/* --- what a host builds on ----------------------------------------------- */

/* A setting of a host's config section: an integer within [min, max], or
 * (text set) a string. */
typedef struct lupin_setting {
  const char *name;
  double def; /* when the config leaves it out */
  double min;
  double max; /* below min: no upper bound */
  /* a string setting: its default (def, min and max unused); read it with
   * lupin_runtime_section_text (lupin_runtime_section gives 0 for it) */
  const char *text;
  const char *pattern; /* a Lua pattern the string must match; NULL: any */
  const char *what;    /* what the pattern asks, for the error ("HOST:PORT") */
} lupin_setting;

/* Declares a top-level config section the host reads (lupin serve's
 * "gateway").  From the next load on the runtime checks it with the rest of
 * the config — every field known, an integer within bounds, errors naming
 * file, line and field — and keeps its values with the generation.  The
 * settings are copied.  A section no host declared is a config error. */
int lupin_runtime_declare_section(lupin_runtime *rt, const char *section,
                                  const lupin_setting *settings, size_t n, char *err,
                                  size_t errlen);
/* The current generation's values of a declared section, in declaration
 * order, defaults for what the config leaves out.  -1: no generation, or the
 * section was not declared when it was loaded. */
int lupin_runtime_section(lupin_runtime *rt, const char *section, double *values, size_t n);
/* A string setting's value in the current generation (its default when the
 * config leaves it out), copied into out.  -1: no generation, no such
 * string setting, or longer than len - 1. */
int lupin_runtime_section_text(lupin_runtime *rt, const char *section, const char *name, char *out,
                               size_t len);

/* The plugin directories the current generation was loaded from (home's,
 * the options', the config's pluginDirs): what a host watches for changes
 * beside the config file. */
typedef void (*lupin_path_fn)(void *ud, const char *path);
void lupin_runtime_plugin_dirs(lupin_runtime *rt, lupin_path_fn fn, void *ud);

/* The API routes the runtime knows, sorted: one row each in
 * lua/lupin/runtime/openai.lua says how a body on that path is checked and
 * where its prompt is.  A host serves these (and GET /v1/models) and takes
 * the list from here rather than keeping its own. */
void lupin_runtime_routes(lupin_runtime *rt, lupin_path_fn fn, void *ud);

/* Runs the current generation's dry scheduling cycle again, over the
 * endpoints in the pool now (a load runs one before a host has added any):
 * what `lupin check` does with the endpoints it was given. */
int lupin_runtime_dry_run(lupin_runtime *rt, char *err, size_t errlen);

/* Sets the Lua memory limit (lupin_options.memory_limit) from now on. */
void lupin_runtime_set_memory_limit(lupin_runtime *rt, size_t bytes);

/* --- endpoints ---------------------------------------------------------- */

typedef struct lupin_endpoint_desc {
  const char *name; /* unique key; NULL: "address:port" */
  const char *address;
  int port;
  const lupin_header *labels;
  size_t n_labels;
} lupin_endpoint_desc;

/* Metrics as scraped.  Adapter lists are comma-separated names (NULL or ""
 * for none).  scraped_at is in seconds on lupin_now()'s clock; 0 means now. */
typedef struct lupin_metrics {
  double waiting_queue_size;
  double running_requests;
  double kv_cache_usage; /* 0..1 */
  const char *running_lora_adapters;
  const char *waiting_lora_adapters;
  double max_lora;
  double cache_block_size; /* tokens per block, 0: not reported */
  double num_blocks;       /* 0: not reported */
  double scraped_at;
} lupin_metrics;

/* Adds an endpoint or replaces its address and labels; metrics are kept. */
int lupin_endpoint_upsert(lupin_runtime *rt, const lupin_endpoint_desc *desc, char *err,
                          size_t errlen);
typedef void (*lupin_endpoint_desc_fn)(void *ud, const lupin_endpoint_desc *d);
/* Reads the endpoints a config lists (its "endpoints" section, file NULL:
 * the current generation's) or an endpoints file holds (a JSON or YAML list
 * of {name, address, port, labels}), checked as a config is; calls fn for
 * each.  The pointers in d are valid during the call only. */
int lupin_runtime_read_endpoints(lupin_runtime *rt, const char *file, lupin_endpoint_desc_fn fn,
                                 void *ud, char *err, size_t errlen);
/* The metrics the same list's entries give ("metrics": {waiting_queue_size,
 * running_requests, kv_cache_usage, max_lora, cache_block_size, num_blocks,
 * running_lora_adapters, waiting_lora_adapters}): what `lupin explain`
 * schedules over.  fn is called for each entry that has them, with its name;
 * the pointers are valid during the call only. */
typedef void (*lupin_endpoint_metrics_fn)(void *ud, const char *name, const lupin_metrics *m);
int lupin_runtime_read_endpoint_metrics(lupin_runtime *rt, const char *file,
                                        lupin_endpoint_metrics_fn fn, void *ud, char *err,
                                        size_t errlen);
/* The InferencePool a config file holds beside its EndpointPickerConfig (a
 * Kubernetes manifest's, or llm-d-router's chart values' modelServers;
 * docs/kubernetes.md): what a host reading pods from Kubernetes selects
 * them by instead of the API server's pool. */
#define LUPIN_POOL_PORTS 8
typedef struct lupin_pool {
  const char *name;     /* metadata.name; "" when the file gives none (chart values) */
  const char *group;    /* inference.networking.k8s.io or inference.networking.x-k8s.io */
  const char *version;  /* v1, v1alpha2 */
  const char *selector; /* "k=v,k2=v2": matchLabels, keys sorted */
  int ports[LUPIN_POOL_PORTS];
  int n_ports;
  const char *where; /* "file:line" of the pool */
} lupin_pool;
/* The current config's pool named `name` in namespace `ns` (one the file
 * gives without a name or namespace matches any; NULL: the first).  1: out filled (strings
 * valid until the next load); 0: none matches, `others` lists the pools the
 * file holds ("" for none); -1: the call failed. */
int lupin_runtime_config_pool(lupin_runtime *rt, const char *name, const char *ns, lupin_pool *out,
                              char *others, size_t otherslen);
/* Removes an endpoint; requests that already hold it keep a valid view. */
int lupin_endpoint_remove(lupin_runtime *rt, const char *name);
int lupin_endpoint_set_metrics(lupin_runtime *rt, const char *name, const lupin_metrics *m);
/* Takes an endpoint out of the candidates plugins see (healthy 0: ejected,
 * e.g. after consecutive failures) or puts it back (1).  Its metrics, labels
 * and prefix-cache entries are kept.  New endpoints are healthy.  Returns -1
 * for an unknown name. */
int lupin_endpoint_set_healthy(lupin_runtime *rt, const char *name, int healthy);

/* --- the data layer: what a host scrapes --------------------------------- */

#define LUPIN_METRIC_LABELS 4

/* One quantity as an engine publishes it on its Prometheus page: the
 * series of family `name` carrying every label of `labels` (more labels
 * are fine).  `legacy`: an older family name read only when the page has
 * no `name` series (vLLM's gpu_cache_usage_perc), or NULL.  name NULL: the
 * engine does not publish it, the value stays 0. */
typedef struct lupin_metric_spec {
  const char *name;
  const char *legacy;
  lupin_header labels[LUPIN_METRIC_LABELS];
  size_t n_labels;
} lupin_metric_spec;

/* Where an endpoint's metrics are and under which names, from the current
 * generation's data layer (the config's metrics-data-source and
 * core-metrics-extractor plugins, its data/dataLayer section; without them,
 * vLLM's names on /metrics).  The endpoint's engine is its engine label
 * (core-metrics-extractor's engineLabelKey, "llm-d.ai/engine-type"), else
 * the default engine (docs/metrics.md, "Engines"). */
typedef struct lupin_metric_source {
  const char *engine;         /* "vllm", "sglang", "tgi", "triton-tensorrt-llm", ... */
  const char *path;           /* the page to GET: "/metrics" */
  lupin_metric_spec queue;    /* -> waiting_queue_size */
  lupin_metric_spec running;  /* -> running_requests */
  lupin_metric_spec kv_usage; /* -> kv_cache_usage, 0..1 */
  /* -> the adapter lists and max_lora: vLLM's lora_requests_info
   * convention (labels running_lora_adapters, waiting_lora_adapters,
   * max_lora; the series with the largest value, a timestamp, wins) */
  lupin_metric_spec lora;
  /* -> cache_block_size, num_blocks: the labels block_size_label and
   * num_blocks_label of the cache_info series, or the values of the
   * block_size and num_blocks series */
  lupin_metric_spec cache_info;
  const char *block_size_label, *num_blocks_label;
  lupin_metric_spec block_size, num_blocks;
} lupin_metric_source;

/* Fills out for the endpoint of that name (or the default engine's mapping
 * for a name not in the pool).  The pointers stay valid until the next
 * successful load or reload: a host asks again for each scrape.  -1: no
 * config loaded. */
int lupin_runtime_metric_source(lupin_runtime *rt, const char *endpoint, lupin_metric_source *out);

/* The engines' KV-cache events the current generation's precise plugins
 * want (precise-prefix-cache-scorer/-producer's kvEventsConfig and
 * tokenProcessorConfig; docs/kv-events.md).  A host subscribes to each
 * endpoint's publisher and applies what it hears to the keyed prefix index
 * `index` (lupin_shared_prefix_apply, _remove, _purge), keyed by
 * lupin_token_block_hashes from lupin_token_seed(hash_seed, LoRA, salt). */
typedef struct lupin_kv_events {
  const char *index;     /* the keyed prefix index the plugins read */
  const char *hash_seed; /* tokenProcessorConfig.hashSeed */
  const char *topic;     /* ZMQ subscription prefix ("": every topic) */
  const char *bind;      /* a ZMQ endpoint to bind that every engine connects to
                            (kvEventsConfig.zmqEndpoint); "": the host connects
                            to each endpoint's address at `port` */
  int port;              /* the engines' PUB port (vLLM's 5557) */
  int replay_port;       /* their replay ROUTER port; 0: none */
  int block_size;        /* tokens a block when an event gives none */
  size_t max_blocks;     /* an endpoint's blocks kept at most */
  size_t max_pending;    /* batches queued per endpoint before ZMQ drops (a gap) */
  double unsure_seconds; /* after a purge, how long the plugins score the
                            endpoint from the approximate index */
} lupin_kv_events;
/* 1: out filled (the strings valid until the next load or reload); 0: the
 * generation wants no events; -1: no config loaded. */
int lupin_runtime_kv_events(lupin_runtime *rt, lupin_kv_events *out);

/* Monotonic clock in seconds, the one metrics timestamps use. */
double lupin_now(void);

/* --- requests ----------------------------------------------------------- */

/* lupin_request_desc.flags */
enum {
  /* Keep an explain record of the request's scheduling: each profile the
   * handler chose, each filter's kept set, each scorer's scores and weight,
   * the totals, the picks and fallbacks, the time of every plugin call and
   * the errors with their tracebacks (docs/explain.md).  Read it with
   * lupin_request_explain.  Requests without it pay nothing for it. */
  LUPIN_REQUEST_EXPLAIN = 1,
  /* Decide only: admission, preparation and the profiles run, pre_request
   * does not (nothing is recorded against an endpoint), plugins see
   * ctx.request.dry_run and finish hooks the outcome "dry_run".  For a
   * request that is explained and never forwarded. */
  LUPIN_REQUEST_DRY_RUN = 2,
};

typedef struct lupin_request_desc {
  const char *id;   /* NULL or "": one is generated */
  const char *path; /* "/v1/completions", "/v1/embeddings", ... (one row per
                       route vLLM serves: lua/lupin/runtime/openai.lua); NULL: the
                       body's, chat when it has "messages" (decoded for it) */
  const char *body; /* the JSON body, decoded only if a plugin asks */
  size_t body_len;
  const char *model; /* NULL: taken from the body */
  const lupin_header *headers;
  size_t n_headers;
  /* Restricts candidates to these endpoint names or address:port values
   * (x-gateway-destination-endpoint-subset); NULL: all. */
  const char *const *subset;
  size_t n_subset;
  /* 1: check the body as the request path's route names (UTF-8, strict
   * JSON, the model, the route's fields, numeric fields; a multipart form
   * for the audio routes, by the content-type header) and decode it once,
   * at begin.  A body that fails reaches no plugin: lupin_request_schedule
   * answers 400 with the reason and the offending parameter.  0: the body
   * is decoded only if a plugin reads it.  The config's passthrough-parser
   * turns the checks off.  x-llm-d-model-name-rewrite (or
   * x-gateway-model-name-rewrite) among the headers names the model
   * lupin_request_model gives back. */
  int check_body;
  unsigned flags; /* LUPIN_REQUEST_* */
} lupin_request_desc;

typedef struct lupin_pick {
  const char *name;
  const char *address;
  int port;
} lupin_pick;

/* What scheduling decided.  Pointers stay valid until lupin_request_end. */
typedef struct lupin_result {
  int status;              /* 200: scheduled; else the HTTP status to answer */
  const char *message;     /* why, when status != 200 */
  const char *plugin;      /* the plugin responsible for a failure, or NULL */
  const lupin_pick *picks; /* primary first, then fallbacks */
  size_t n_picks;
  const lupin_header *headers; /* to add to the upstream request */
  size_t n_headers;
  int outcome;       /* a lupin_outcome: why, when status != 200 */
  const char *param; /* the request parameter at fault (a 400), or NULL */
} lupin_result;

typedef enum lupin_outcome {
  LUPIN_OK,             /* response completed */
  LUPIN_REJECTED,       /* admission said no */
  LUPIN_NO_ENDPOINT,    /* nothing to schedule on */
  LUPIN_PLUGIN_ERROR,   /* a picker or profile handler failed */
  LUPIN_UPSTREAM_ERROR, /* the model server failed */
  LUPIN_CANCELLED,      /* the client went away */
  LUPIN_TIMEOUT,
  LUPIN_INVALID_REQUEST, /* the body failed lupin_request_desc.check_body */
  /* flow control (docs/flow-control.md): answered without being scheduled */
  LUPIN_QUEUE_TTL,  /* waited in the queue past its TTL */
  LUPIN_QUEUE_FULL, /* its band or the whole queue was full */
  LUPIN_SHED,       /* evicted from the queue: room for a higher priority, or a drain */
  LUPIN_EVICTED     /* ended after it was sent: room for a higher priority (enableEviction) */
} lupin_outcome;
#define LUPIN_OUTCOME_LAST LUPIN_EVICTED

const char *lupin_outcome_name(lupin_outcome o);

lupin_request *lupin_request_begin(lupin_runtime *rt, const lupin_request_desc *desc, char *err,
                                   size_t errlen);
const char *lupin_request_id(const lupin_request *req);
/* The number of the generation the request is pinned to. */
uint64_t lupin_request_generation(const lupin_request *req);
/* The model the request names (desc.model, or the body's once checked),
 * NULL when not known; the body's "stream" flag (0 unless checked). */
const char *lupin_request_model(const lupin_request *req);
int lupin_request_stream(const lupin_request *req);
/* Runs admit, prepare, the scheduling profiles and pre_request.  Returns the
 * HTTP status (also in out->status); 200 means forward to out->picks[0].
 * With flow control on (the config's "flowControl", docs/flow-control.md)
 * and a dispatch callback set, it may answer LUPIN_QUEUED instead: the
 * request waits in the runtime's queue and its final result comes later
 * through the callback. */
int lupin_request_schedule(lupin_request *req, lupin_result *out);
/* A host's own pointer, kept with the request (the dispatch callback's way
 * back to the host's object). */
void lupin_request_set_data(lupin_request *req, void *data);
void *lupin_request_data(const lupin_request *req);
int lupin_request_response_header(lupin_request *req, int status, const lupin_header *headers,
                                  size_t n);
/* The headers plugins set for the client's response (ctx:set_response_header)
 * by now; valid until lupin_request_end. */
size_t lupin_request_client_headers(const lupin_request *req, const lupin_header **out);
int lupin_request_response_chunk(lupin_request *req, const char *data, size_t len);
/* Whether a plugin of the request's generation observes the response's
 * chunks, or their timing: 0 makes lupin_request_response_chunk a no-op,
 * so a host that must work to have the bytes (nginx reading back a body it
 * spooled to a file) asks first. */
int lupin_request_wants_chunks(const lupin_request *req);

/* When the response came, as the core saw it through the host's calls
 * (seconds, lupin_now's clock; 0: not yet).  It is kept only when a plugin
 * of the generation asks for it
 * (`times_response = true`, as predicted-latency-producer does: its TTFT
 * is first_byte_at - the dispatch, its TPOT the time between the first and
 * the last event over the events between). */
typedef struct lupin_response_timing {
  double begun_at;      /* lupin_request_begin */
  double head_at;       /* lupin_request_response_header */
  double first_byte_at; /* the first non-empty chunk */
  double last_byte_at;  /* the last chunk so far */
  uint64_t bytes, chunks;
  uint64_t events; /* server-sent events ended so far (blank lines: "\n\n") */
  int32_t newline; /* the last byte seen was '\n': an event's end may span two chunks */
} lupin_response_timing;
void lupin_request_timing(const lupin_request *req, lupin_response_timing *out);
int lupin_request_response_complete(lupin_request *req);
/* Where to send a scheduled request when its picks fail: the other
 * candidates of the primary profile (those its filters kept), best profile
 * score first, healthy ones only, none of the picks.  Computed on the first
 * call (no cost for requests that never ask); *out stays valid until
 * lupin_request_end.  pre_request is not run again for a fallback. */
size_t lupin_request_fallbacks(lupin_request *req, const lupin_pick **out);
/* The forms of an explain record. */
typedef enum lupin_explain_format {
  LUPIN_EXPLAIN_JSON,   /* one JSON object (docs/explain.md) */
  LUPIN_EXPLAIN_TEXT,   /* lines for a person, `lupin explain`'s */
  LUPIN_EXPLAIN_SUMMARY /* one line, fit for a header: profile, picks, totals */
} lupin_explain_format;

/* The explain record (LUPIN_REQUEST_EXPLAIN) in the given form, its length
 * in *len (len may be NULL); NULL for a request begun without the flag.
 * After lupin_request_schedule it holds the whole decision; the fallbacks
 * are the ones lupin_request_fallbacks gives.  Valid until the next call
 * of this function on req or lupin_request_end. */
const char *lupin_request_explain(lupin_request *req, lupin_explain_format format, size_t *len);
/* Ends the request: finish hooks run exactly once, the state is dropped and
 * req is freed.  When scheduling failed, its outcome wins over this one. */
void lupin_request_end(lupin_request *req, lupin_outcome outcome);

/* --- flow control (docs/flow-control.md) -------------------------------- */

/* lupin_request_schedule's answer for a request held in the queue: no
 * result yet, nothing to answer; the dispatch callback brings it. */
#define LUPIN_QUEUED 0

/* Called once per queued request with its final result: 200 and picks
 * (admit ran before it was queued; prepare, the profiles and pre_request
 * ran now), or 429/503 with a message and the outcome LUPIN_QUEUE_TTL,
 * LUPIN_QUEUE_FULL or LUPIN_SHED, or any failure of scheduling.  res and
 * its pointers are valid until lupin_request_end.  The runtime calls it only
 * from inside lupin_request_end, lupin_endpoint_set_metrics,
 * lupin_runtime_tick and lupin_runtime_flow_drain: never from inside
 * lupin_request_schedule.  It may call any lupin_ function, including
 * lupin_request_end on req. */
typedef void (*lupin_dispatch_fn)(void *ud, lupin_request *req, const lupin_result *res);
/* Sets the callback (NULL: none).  Without one, flow control holds nothing:
 * every request is scheduled at once, as when flowControl is absent. */
void lupin_runtime_set_dispatch(lupin_runtime *rt, lupin_dispatch_fn fn, void *ud);
/* What a host calls from a timer of its own (every 100 ms or so): requests
 * past their TTL are answered, and the gate is tried again (metrics that
 * went stale, endpoints that came back). */
void lupin_runtime_tick(lupin_runtime *rt);
/* Answers every queued request now with 503 and message (a drain), outcome
 * LUPIN_SHED.  Returns how many were queued. */
size_t lupin_runtime_flow_drain(lupin_runtime *rt, const char *message);
/* Requests waiting in the flow-control queues of the other runtimes made
 * with this one's lupin_shared (the other workers): an atomic load, no lock.
 * A host with several runtimes calls lupin_runtime_tick on the others when
 * a request of its own ends and this is not 0, so that they send what they
 * hold into the freed place now rather than at their next tick. */
uint64_t lupin_runtime_flow_elsewhere(lupin_runtime *rt);
/* enableEviction: flow control asks the host to end req, a sheddable request
 * already scheduled (sent to its endpoint), so that a higher band waiting
 * gets its place: the host stops it at its endpoint, answers its client 429
 * with message when it can (or cuts its response) and ends it with
 * LUPIN_EVICTED.  Called from where the dispatch callback is, one request
 * at a time; the next only after that one ended and a grace passed. */
typedef void (*lupin_evict_fn)(void *ud, lupin_request *req, const char *message);
/* Sets the callback (NULL: none).  Without one, enableEviction does nothing. */
void lupin_runtime_set_evict(lupin_runtime *rt, lupin_evict_fn fn, void *ud);

/* Where a request stands in flow control. */
typedef struct lupin_flow_place {
  int managed;      /* its generation has flow control */
  int queued;       /* waiting now */
  int priority;     /* its band */
  const char *flow; /* its fairness id ("" for the default flow) */
  double waited;    /* seconds in the queue (so far, or in all) */
} lupin_flow_place;

/* Fills *out; the pointers are valid until lupin_request_end. */
void lupin_request_flow(const lupin_request *req, lupin_flow_place *out);

/* One band (flow NULL) or one flow of it, as the queue holds it now. */
typedef struct lupin_flow_info {
  int priority;
  const char *flow; /* NULL: the band's totals */
  uint64_t queued;  /* requests waiting */
  uint64_t bytes;   /* their bodies' bytes */
  /* bands only: counted since the runtime started */
  uint64_t dispatched, ttl, full, shed, cancelled;
  uint64_t max_requests, max_bytes; /* the band's limits, 0: none */
  const char *fairness, *ordering;  /* the policies' plugin names */
  /* bands only: requests whose integer objective was clamped into this
   * band (not a configured priority), and the flows (fairness ids) the
   * band keeps, empty ones not yet reaped included */
  uint64_t clamped, flows_kept;
} lupin_flow_info;

typedef void (*lupin_flow_fn)(void *ud, const lupin_flow_info *f);
/* Calls fn for each band, highest priority first, each followed by its
 * flows with requests waiting.  Returns 0, or -1 when flow control is off.
 * *saturated (may be NULL) tells whether the gate is closed now. */
int lupin_runtime_flows(lupin_runtime *rt, lupin_flow_fn fn, void *ud, int *saturated);
/* The saturation detector's level now (llm-d-router's: 0 idle, 1 full,
 * above 1 how far over; 1 or 0 from a detector that gives none).  Returns
 * 0, or -1 when flow control is off. */
int lupin_runtime_flow_saturation(lupin_runtime *rt, double *level);

#ifdef __cplusplus
}
#endif
#endif
