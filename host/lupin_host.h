/* lupin_host.h -- what every host of liblupin needs besides lupin.h, with no
 * I/O and no event loop (no libuv, no http_parser): lupin serve links it,
 * and so can an Envoy ext_proc picker or an nginx module.
 *
 *   buf.c               growing buffers, header lists, JSON and label escaping
 *   prometheus.c        the Prometheus text format, parsed
 *   endpoint_metrics.c  an engine's metrics page (vLLM's, sglang's names) read
 *                       into lupin_metrics
 *   metrics.c           the /metrics registry of lupin's families and its
 *                       exposition
 *   health.c            endpoint health and ejection, Envoy's outlier
 *                       detection: the decisions, the time passed in
 *   settings.c          the config's "gateway" section, declared and read
 *   lua_heap.c          the Lua heaps on mimalloc
 *   log.c               diagnostic and access log lines, the admin token's
 *                       comparison
 *   openai_error.c      the OpenAI error body a refused request is answered with
 *   model_rewrite.c     the model-name rewrite of a forwarded body
 *   admin_json.c        the admin API's JSON answers: endpoints, requests in
 *                       flight, generations, a reload's result, leaks
 *   flows_json.c        flow control's queue as the admin API shows it, summed
 *                       over a host's runtimes
 *   explain_ring.c      explain records kept in a ring (one lock, pthreads):
 *                       the ids listed, one record with the host's attempts
 *   kv_wire.c           vLLM's KV-cache events: one msgpack payload of its
 *                       ZMQ publisher decoded into flat arrays (msgpack-c)
 *   kv_index.c          an endpoint's blocks as its engine's KV events announce
 *                       them: engine hashes mapped to lupin's keys
 *
 * Prefix lh_ ("lupin host"): short like the gateway's gw_, distinct from
 * the core's lupin_ (this library is not the embedding API) and from gw_
 * (nothing here belongs to one host).  It includes lupin.h from the core,
 * nothing else of it. */
#ifndef LUPIN_HOST_H
#define LUPIN_HOST_H

#include "lupin.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

/* --- small buffers and header lists (buf.c) ------------------------------ */

typedef struct lh_buf {
  char *data;
  size_t len, cap;
} lh_buf;

int lh_buf_append(lh_buf *b, const char *data, size_t len);
/* Room for more bytes exactly (a body of known length): no doubling. */
int lh_buf_reserve(lh_buf *b, size_t more);
/* The hot path's appends: no format string to interpret (a request's heads
 * are written with these, not lh_buf_printf). */
int lh_buf_str(lh_buf *b, const char *s);
int lh_buf_uint(lh_buf *b, unsigned long long v);
/* v with that many decimals (at most 6), as "%.*f" would write it but
 * for a tie's rounding; a value past 2^53 or not finite as lh_buf_number. */
int lh_buf_fixed(lh_buf *b, double v, unsigned decimals);
/* "name: value\r\n" */
int lh_buf_header(lh_buf *b, const char *name, const char *value);
int lh_buf_printf(lh_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Formats an error message into err (a no-op when err is NULL). */
void lh_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Appends s as a JSON string, quotes included; always valid JSON (bytes
 * that are not UTF-8 become U+FFFD). */
int lh_buf_json(lh_buf *b, const char *s);
/* Appends s as a Prometheus label value, quotes included: backslash, quote
 * and newline escaped, bytes that are not UTF-8 as U+FFFD. */
int lh_buf_label(lh_buf *b, const char *s);
/* Appends a JSON number; null when v is NaN or infinite (JSON has neither). */
int lh_buf_number(lh_buf *b, double v);
void lh_buf_free(lh_buf *b);

/* Owned name/value copies; names as received.  The texts live in blocks
 * the list owns (a header costs no allocation of its own, and a cleared
 * list keeps its first block for the next message). */
typedef struct lh_text_block lh_text_block;
/* Headers one message may carry, a request's or an endpoint's response's
 * (Envoy's max_headers_count default): more is refused (431 for a client,
 * a broken response for an endpoint).  The lists built from them (the
 * upstream request's, the client response's) are arrays on the stack of
 * a few times this size, never of a size the peer chose. */
#define LH_MAX_HEADERS 100
typedef struct lh_headers {
  lupin_header *v;
  size_t n, cap;
  int in_value;       /* parsing: the last piece was a value's */
  lh_text_block *mem; /* newest first; the string being built is last in it */
} lh_headers;

int lh_headers_add(lh_headers *h, const char *name, size_t nlen, const char *value, size_t vlen);
/* http_parser hands a header's name and value over in pieces, on both
 * sides of the proxy: these join them.  A name with whitespace in it (RFC
 * 7230 §3.2.4) is refused with 1, out of memory with -1. */
int lh_headers_field(lh_headers *h, const char *data, size_t len);
int lh_headers_value(lh_headers *h, const char *data, size_t len);
const char *lh_headers_get(const lh_headers *h, const char *name);
/* Empties the list, keeping room for the next message's headers. */
void lh_headers_clear(lh_headers *h);
void lh_headers_free(lh_headers *h);
/* A set of header names, matched without case, lengths first: the checks
 * every header of every request goes through cost a few compares. */
typedef struct lh_name {
  const char *s;
  size_t len;
} lh_name;
#define LH_NAME(lit)                                                                               \
  { lit, sizeof lit - 1 }
int lh_name_in(const char *name, const lh_name *set, size_t n);
/* Whether a header's name is `lower` (a name in lower case), without case.
 * The first bytes are compared first: most names differ there. */
static inline int lh_name_is(const char *name, const char *lower) {
  return (name[0] | 0x20) == lower[0] && !strcasecmp(name, lower);
}
/* Headers never copied from one side to the other: the hop-by-hop ones of
 * RFC 7230 §6.1, and the framing ones (host, content-length, expect) that
 * each side writes for itself. */
int lh_hop_by_hop(const char *name);

/* --- Prometheus text format (prometheus.c) -------------------------------- */

typedef void (*lh_sample_fn)(void *ud, const char *name, const lupin_header *labels, size_t n,
                             double value);
/* Calls fn for each sample; returns the number of lines it could not read. */
int lh_prometheus_parse(const char *text, size_t len, lh_sample_fn fn, void *ud);

/* --- the /metrics registry (metrics.c) ----------------------------------- */

/* Every family lupin exports is declared once, in metrics.c's table: name,
 * type, help text, label names, histogram bounds (docs/metrics.md lists
 * them).  The exposition (text format 0.0.4) is written through lh_expo, which
 * writes # HELP and # TYPE once per family and escapes every label value. */
/* LH_SUM_GAUGE: a gauge of which each worker holds a share (requests in
 * flight, Lua memory): /metrics shows the sum over the workers.
 * LH_MAX_GAUGE: a flag any worker may raise (flow control's saturation):
 * /metrics shows the largest value. */
typedef enum lh_metric_type {
  LH_COUNTER,
  LH_GAUGE,
  LH_HISTOGRAM,
  LH_SUMMARY,
  LH_SUM_GAUGE,
  LH_MAX_GAUGE
} lh_metric_type;

#define LH_MAX_LABELS 4
#define LH_MAX_BOUNDS 40

typedef struct lh_family {
  const char *name;
  lh_metric_type type;
  const char *help;
  const char *labels[LH_MAX_LABELS]; /* names, NULL after the last */
  const double *bounds;              /* histograms: upper bounds, ascending */
  size_t n_bounds;
  /* The endpoint picker's families: llm-d-router names them llm_d_epp_* and
   * still writes the older inference_* name beside each, the same samples.
   * deprecated is that older name (NULL: none), deprecated_labels its label
   * names where they differ (else {NULL}: the same). */
  const char *deprecated;
  const char *deprecated_labels[LH_MAX_LABELS];
} lh_family;

/* grouped as /metrics writes them */
// clang-format off
typedef enum lh_family_id {
  /* requests through the gateway (proxy.c) */
  LH_M_REQUESTS, LH_M_OUTCOMES, LH_M_SCHEDULING, LH_M_WORKER_REQUESTS,
  /* plugins (the runtime's counters) */
  LH_M_PLUGIN_CALLS, LH_M_PLUGIN_ERRORS, LH_M_PLUGIN_SECONDS, LH_M_PLUGIN_CUTS,
  LH_M_PLUGIN_DISABLED,
  /* endpoints, their scrapes and health */
  LH_M_EP_WAITING, LH_M_EP_RUNNING, LH_M_EP_KV, LH_M_EP_MAX_LORA, LH_M_EP_SCRAPE_AGE,
  LH_M_EP_SCRAPE_ERRORS, LH_M_EP_HEALTHY, LH_M_EP_EJECTIONS, LH_M_EP_RESTORATIONS,
  LH_M_UP_FAILURES, LH_M_UP_RETRIES, LH_M_UP_RETRIES_DENIED, LH_M_ENDPOINTS_HEALTHY,
  /* reloads */
  LH_M_RELOADS, LH_M_RELOAD_SECONDS, LH_M_RELOAD_LAST,
  /* the runtime */
  LH_M_LIVE_REQUESTS, LH_M_LIVE_TABLES, LH_M_LUA_MEMORY, LH_M_LUA_PEAK, LH_M_LUA_GC_CYCLES,
  LH_M_LUA_GC_SECONDS, LH_M_GENERATION,
  LH_M_GENERATIONS_ALIVE, LH_M_ENDPOINTS,
  /* memory bounds */
  LH_M_IN_FLIGHT, LH_M_BODY_BYTES, LH_M_REFUSALS, LH_M_LUA_LIMIT, LH_M_LUA_LIMIT_HITS,
  LH_M_EMPTY_ENDPOINTS_KEPT,
  /* the build and the process (process.c) */
  LH_M_BUILD_INFO, LH_M_CPU, LH_M_RSS, LH_M_VSIZE, LH_M_START_TIME, LH_M_OPEN_FDS, LH_M_MAX_FDS,
  /* the endpoint picker's (EPP) names: llm_d_epp_*, each with its
   * deprecated inference_* twin (llm-d-router, pkg/epp/metrics) */
  LH_M_OBJ_REQUESTS, LH_M_OBJ_ERRORS, LH_M_OBJ_DURATION, LH_M_OBJ_REQUEST_SIZES,
  LH_M_OBJ_RESPONSE_SIZES, LH_M_OBJ_RUNNING, LH_M_POOL_KV, LH_M_POOL_QUEUE, LH_M_POOL_POD_QUEUE,
  LH_M_POOL_READY, LH_M_SCHEDULER_E2E, LH_M_PLUGIN_DURATION,
  /* flow control (flow.c), the EPP's names where it has them */
  LH_M_FC_QUEUE_SIZE, LH_M_FC_QUEUE_BYTES, LH_M_FC_QUEUE_DURATION, LH_M_FC_SATURATION,
  LH_M_FC_REQUESTS, LH_M_FC_CLAMPED,
  /* replicas sharing prefix records through Redis (replicas.c) */
  LH_M_REPLICA_CONNECTED, LH_M_REPLICA_PUBLISHED, LH_M_REPLICA_APPLIED, LH_M_REPLICA_IGNORED,
  LH_M_REPLICA_DROPPED, LH_M_REPLICA_BAD, LH_M_REPLICA_PENDING, LH_M_REPLICA_LAG,
  /* the engines' KV-cache events (kv_events.c) */
  LH_M_KV_BLOCKS_APPLIED, LH_M_KV_BATCHES, LH_M_KV_BAD, LH_M_KV_GAPS, LH_M_KV_LOST,
  LH_M_KV_REPLAYS, LH_M_KV_RESYNCS, LH_M_KV_RESTARTS, LH_M_KV_BLOCKS, LH_M_KV_STATE, LH_M_KV_LAG,
  /* the precise plugins' tokenize jobs and token cache (tokenize.c) */
  LH_M_TOKENIZE, LH_M_TOKEN_CACHE_ENTRIES, LH_M_TOKEN_CACHE_BYTES, LH_M_TOKEN_CACHE_LOOKUPS,
  /* the plugins' latency models (lupin_shared_latency_each) */
  LH_M_LATENCY_ERROR, LH_M_LATENCY_OBSERVED, LH_M_LATENCY_APE, LH_M_LATENCY_SAMPLES,
  /* endpoints from a Kubernetes InferencePool (k8s_pool.c) */
  LH_M_K8S_SYNCED, LH_M_K8S_ENDPOINTS, LH_M_K8S_RESTARTS, LH_M_K8S_ERRORS,
  LH_FAMILIES
} lh_family_id;
// clang-format on

extern const lh_family lh_families[LH_FAMILIES]; /* constant */

/* A sample value as the text format spells it: NaN, +Inf, -Inf, else the
 * shortest of 15 or 17 digits that reads back as v. */
void lh_metric_number(char *out, size_t len, double v);

/* Observations of one series of a histogram family; buckets not cumulative,
 * the last one above every bound. */
typedef struct lh_histogram {
  uint64_t buckets[LH_MAX_BOUNDS + 1];
  uint64_t count;
  double sum;
} lh_histogram;

void lh_histogram_observe(lh_histogram *h, lh_family_id id, double v);

typedef struct lh_expo {
  lh_buf *b;
  const lh_family *f; /* the family being written */
  /* 1: each family with a deprecated name is written a second time under
   * it, after its own samples (a family's samples must stay together, so
   * the twin's are held in twin until the family ends) */
  int twins;
  lh_buf twin;
} lh_expo;

/* Starts a family: its # HELP and # TYPE lines.  Each family is started
 * once per exposition, its samples all after it. */
void lh_expo_family(lh_expo *e, lh_family_id id);
/* Ends the exposition: the last family's deprecated twin written (with
 * twins on) and twin freed.  Needed only when twins is set. */
void lh_expo_end(lh_expo *e);
/* A sample of the current family: values holds one value per label name
 * (NULL when it has none), written escaped (backslash, quote, newline). */
void lh_expo_sample(lh_expo *e, const char *const *values, double v);
/* A summary's _sum and _count. */
void lh_expo_summary(lh_expo *e, const char *const *values, double sum, uint64_t count);
/* A histogram series: its _bucket lines (cumulative), _sum and _count. */
void lh_expo_histogram(lh_expo *e, const char *const *values, const lh_histogram *h);
/* Same from bucket counts kept elsewhere (n_bounds + 1, not cumulative). */
void lh_expo_buckets(lh_expo *e, const char *const *values, const uint64_t *buckets, double sum);

/* An endpoint's sample of one of the families LH_M_EP_WAITING ..
 * LH_M_EP_RESTORATIONS, from what a host keeps of it: its metrics as
 * scraped, the lupin_now() of its last good scrape (0: never), its failed
 * scrapes and its health (NULL: healthy). */
typedef struct lh_endpoint_state {
  const lupin_metrics *metrics;
  double scraped_at;
  uint64_t scrape_errors;
  const struct lh_health *health;
} lh_endpoint_state;
double lh_endpoint_sample(lh_family_id id, const lh_endpoint_state *s, double now);

/* --- an engine's metrics page (endpoint_metrics.c) ------------------------- */

/* vLLM's names (current and legacy): what a runtime without a data layer
 * hands out. */
extern const lupin_metric_source lh_vllm_metrics;
/* Reads a metrics text by src's names into m; lora strings are malloc'd into
 * *running / *waiting; *bad: series of a known family refused (not finite,
 * out of range).  Returns 0 when the text held a known metric, else -1. */
int lh_metrics_read(const lupin_metric_source *src, const char *text, size_t len, lupin_metrics *m,
                    char **running, char **waiting, int *bad);
/* The same with vLLM's names. */
int lh_metrics_from_text(const char *text, size_t len, lupin_metrics *m, char **running,
                         char **waiting);

/* --- endpoint health (health.c) -------------------------------------------- */

/* Kinds of failure an attempt may end with, the host's own numbering (lupin
 * serve's gw_upstream_error, 0 standing for a 5xx answer): counted by kind. */
#define LH_FAILURE_KINDS 8

typedef enum lh_health_state { LH_HEALTHY, LH_EJECTED, LH_STALE } lh_health_state;

typedef struct lh_health {
  lh_health_state state;
  int in_runtime;                   /* the state the runtime was last told: 1 healthy */
  uint64_t errors;                  /* consecutive failed requests */
  uint64_t scrape_failures;         /* consecutive failed scrapes */
  uint64_t ejections, restorations; /* in total */
  uint64_t backoff;                 /* ejections in a row: the next lasts base << backoff */
  double ejected_until;             /* lupin_now() */
  double ejected_unix;              /* wall clock of the last ejection, 0: never */
  double healthy_since;             /* lupin_now() of the last restoration */
  double added_at;                  /* staleness counts from here until a first scrape */
  double last_warned;               /* rate limit of the first-failure line */
  uint64_t suppressed;              /* first-failure lines not written meanwhile */
  char last_error[160];
  /* by kind: attempts that failed here, and of those the ones sent again
   * (here or elsewhere); failures[0]: 5xx answers */
  uint64_t failures[LH_FAILURE_KINDS], retries[LH_FAILURE_KINDS];
} lh_health;

/* The config's outlier detection (lupin serve's gateway section). */
typedef struct lh_health_policy {
  uint64_t consecutive_errors, base_ejection_time_ms, max_ejection_time_ms;
  uint64_t max_ejection_percent, stale_ejection_ms;
} lh_health_policy;

/* What lh_health_evaluate found, in the order it happened (both may). */
enum {
  LH_RESTORED = 1,    /* an ejection over and scrapes succeed: healthy */
  LH_WENT_STALE = 2,  /* metrics older than staleEjectionMs: out */
  LH_FRESH_AGAIN = 4, /* stale, metrics fresh again: healthy */
};

const char *lh_health_state_name(lh_health_state s);
void lh_health_init(lh_health *h, double now);
/* A failure, the run-th in a row: records its text; 1 when its line is to
 * be logged now (the first of a run, at most one per 10 s; h->suppressed
 * counts the others). */
int lh_health_failed(lh_health *h, uint64_t run, const char *what, const char *detail, double now);
/* Whether a run of that many failures ejects a healthy endpoint. */
int lh_health_ejection_due(const lh_health *h, const lh_health_policy *p, uint64_t run);
/* Ejects the endpoint when fewer than maxEjectionPercent of n endpoints (at
 * least one) are ejected: returns the seconds it lasts (the state is then
 * for the caller to set to LH_EJECTED), 0 when the cap refused it. */
double lh_health_eject(lh_health *h, const lh_health_policy *p, size_t ejected, size_t n,
                       double now, double wall);
/* 1 when the line about a refused ejection is due (one per 10 s). */
int lh_health_warn_due(lh_health *h, double now);
/* Time-driven changes (an ejection over, metrics stale or fresh again, the
 * back-off forgiven one step per base ejection time healthy): returns the
 * LH_RESTORED... bits; the caller applies each state change in order.
 * scraped_at: the last good scrape's lupin_now(), 0: never. */
int lh_health_evaluate(lh_health *h, const lh_health_policy *p, double scraped_at, double now);
/* Seconds the metrics have been missing, as the stale line says. */
double lh_health_metrics_age(const lh_health *h, double scraped_at, double now);

/* --- the config's "gateway" section (settings.c) --------------------------- */

/* Declared by every host, so one config serves them all; each uses what
 * means something to it (docs/gateway.md lists them). */
typedef struct lh_settings {
  uint64_t max_body_bytes, max_header_bytes;
  uint64_t header_timeout_ms, connect_timeout_ms, first_byte_timeout_ms, idle_timeout_ms;
  uint64_t refresh_interval_ms, scrape_timeout_ms, metrics_staleness_ms;
  uint64_t pool_size, drain_timeout_ms, resolve_interval_ms;
  uint64_t max_lua_memory_bytes, max_requests_in_flight, max_buffered_body_bytes;
  /* retries and endpoint health */
  uint64_t pool_idle_ms, retry_non_idempotent, retry_budget_percent, retry_budget_min;
  uint64_t consecutive_errors, base_ejection_time_ms, max_ejection_time_ms;
  uint64_t max_ejection_percent, stale_ejection_ms;
  uint64_t explain_without_token;   /* x-lupin-explain without the admin token */
  uint64_t allow_empty_endpoints;   /* an empty endpoints list empties the pool */
  uint64_t deprecated_metric_names; /* the EPP's older names beside llm_d_epp_* */
  uint64_t workers;                 /* event loops (threads), 0: one per core */
} lh_settings;

/* Declares the section: before lupin_runtime_load. */
int lh_settings_declare(lupin_runtime *rt, char *err, size_t errlen);
/* The current generation's values (defaults for what the config omits). */
int lh_settings_read(lupin_runtime *rt, lh_settings *out, char *err, size_t errlen);
/* Outlier detection's part of them. */
lh_health_policy lh_settings_health(const lh_settings *s);

/* --- the Lua heap's allocator (lua_heap.c) -------------------------------- */

/* lupin_options.allocator on mimalloc (link -lmimalloc): each runtime on
 * one thread. */
void *lh_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
/* Gives back to the system what the heaps freed: on an idle runtime's
 * thread, after a full collection. */
void lh_heap_release(void);

/* --- log lines (log.c) ----------------------------------------------------- */

/* One diagnostic line on stderr: text, or a JSON object for log shippers. */
void lh_log_line(int json, int level, const char *msg);
/* An access log line, one JSON object and a newline. */
typedef struct lh_access {
  double ts; /* wall clock */
  const char *id, *path, *model, *endpoint, *outcome;
  int status;
  double scheduling_us, total_ms;
  const char *attempts; /* the attempts' JSON objects, comma-separated (may be NULL) */
  size_t attempts_len;
} lh_access;
int lh_access_line(lh_buf *b, const lh_access *a);
/* Whether given is the admin token, in a time that does not tell how much
 * of it was right. */
int lh_same_secret(const char *given, const char *token);

/* --- the OpenAI error body (openai_error.c) -------------------------------- */

/* Appends {"error":{"message","type","param","code"}} and a newline: what a
 * host answers a refused request with (param NULL or "": null).  -1 when
 * out of memory. */
int lh_openai_error(lh_buf *b, int status, const char *message, const char *param);
/* The error's "type" for a status: rate_limit_error, authentication_error,
 * invalid_request_error (other 4xx), server_error (5xx). */
const char *lh_openai_error_type(int status);

/* --- the model-name rewrite (model_rewrite.c) ------------------------------ */

/* Replaces the model a request body names (a JSON object's "model", or a
 * multipart/form-data body's "model" field, by content_type) with model,
 * every other byte unchanged; *was gets the name replaced (malloc'd).  -1
 * when the body names none. */
int lh_model_rewrite(lh_buf *body, const char *content_type, const char *model, char **was);

/* --- the admin API's JSON answers (admin_json.c) --------------------------- */

/* Each answer is appended to b, built from lupin.h calls and what the host
 * passes in; the host routes the request and writes the reply.  A list is
 * opened, given its items (each knows whether it is the first by what b
 * ends with), and closed with lh_admin_list_end ("]}" and a newline). */
void lh_admin_list_end(lh_buf *b);

/* GET /admin/endpoints: {"endpoints":[...]}, one object per endpoint as the
 * host knows it. */
typedef struct lh_endpoint_view {
  const char *name, *address;
  const char *const *addresses; /* resolved, in the order connects try them */
  int n_addresses;
  int port;
  double scraped_at; /* lupin_now() of the last good scrape, 0: never */
  uint64_t scrapes, scrape_errors;
  size_t idle_connections;
  const lupin_metrics *metrics;            /* NULL: none yet */
  const char *running_lora, *waiting_lora; /* as scraped, NULL: none */
  const lh_health *health;                 /* NULL: healthy */
  const lupin_header *labels;              /* as the endpoints source gave them */
  size_t n_labels;
} lh_endpoint_view;
void lh_admin_endpoints_open(lh_buf *b);
/* fresh: scraped no longer than stale_seconds before now (lupin_now()) */
void lh_admin_endpoint(lh_buf *b, const lh_endpoint_view *v, double now, double stale_seconds);

/* GET /admin/requests: {"requests":[...]}, the requests in flight. */
typedef struct lh_request_view {
  const lupin_request *req; /* its id and generation */
  const char *model, *path;
  const char *endpoint; /* host:port of the current attempt, NULL: none */
  int stream;
  double age_seconds;
  int worker; /* the thread (runtime) it runs on */
} lh_request_view;
void lh_admin_requests_open(lh_buf *b);
void lh_admin_request(lh_buf *b, const lh_request_view *v);

/* GET /admin/generations: {"current":N,"generations":[...] of rt, then
 * "workers":[...]: each runtime's {"worker","current","generations"},
 * closed with lh_admin_list_end.  lh_admin_generations: all of it for a
 * host with one runtime. */
void lh_admin_generations_open(lh_buf *b, lupin_runtime *rt);
void lh_admin_generations_worker(lh_buf *b, lupin_runtime *rt, int worker);
void lh_admin_generations(lh_buf *b, lupin_runtime *rt);

/* POST /admin/reload's answer once the new generation is in. */
void lh_admin_reloaded(lh_buf *b, uint64_t generation, double seconds);

/* POST /admin/leaks: a full collection of each runtime (it blocks its
 * thread for that), then whatever request state outlived its request;
 * tells tables merely not yet collected (lupin_stats.live_request_tables)
 * from a leak.  Start from {0}; lh_leaks_check on each runtime (worker >= 0
 * prefixes its report lines with "worker N: ", -1 not), then the answer:
 * lh_admin_leaks, or when failed the message of lh_leaks_failure. */
typedef struct lh_leaks {
  int leaked, failed;
  lupin_stats st; /* live_requests, live_request_tables, lua_memory: summed */
  lh_buf report;
} lh_leaks;
void lh_leaks_check(lh_leaks *l, lupin_runtime *rt, int worker);
void lh_admin_leaks(lh_buf *b, const lh_leaks *l);
void lh_leaks_failure(lh_buf *msg, const lh_leaks *l);
void lh_leaks_free(lh_leaks *l);

/* --- flow control's queue, as JSON (flows_json.c) -------------------------- */

/* GET /admin/flows: {"enabled","bands":[...],"saturated"}, the bands of
 * every runtime summed by priority (highest first), their flows by fairness
 * id.  Start from {0}, lh_flows_add each runtime (on the thread it runs
 * on: its strings are copied), then lh_admin_flows and lh_flows_free. */
typedef struct lh_flow_band lh_flow_band;
typedef struct lh_flows {
  lh_flow_band *bands;
  size_t n_bands;
  lh_flow_band *band; /* reading: the band the next flows belong to */
  int on, saturated;  /* on: a runtime has flow control */
} lh_flows;
void lh_flows_add(lh_flows *m, lupin_runtime *rt);
void lh_admin_flows(lh_buf *b, lh_flows *m);
void lh_flows_free(lh_flows *m);

/* --- explain records kept (explain_ring.c) --------------------------------- */

/* The last `kept` records, by request id, under one lock (pthreads): any
 * thread keeps, the admin API reads. */
typedef struct lh_explain_ring lh_explain_ring;
lh_explain_ring *lh_explain_ring_new(size_t kept);
void lh_explain_ring_free(lh_explain_ring *r);
size_t lh_explain_ring_kept(const lh_explain_ring *r);
/* Keeps json (malloc'd: the ring takes it, frees it on failure) as id's,
 * the oldest record out. */
void lh_explain_keep(lh_explain_ring *r, const char *id, char *json);
/* A malloc'd copy of the newest record of id, or NULL. */
char *lh_explain_find(lh_explain_ring *r, const char *id);
/* GET /admin/explain: {"kept":N,"ids":[...]}, newest first. */
void lh_explain_ids(lh_buf *b, lh_explain_ring *r);
/* The runtime's record of req with the host's part, "gateway": the answer's
 * status, the outcome, the time taken and the attempts' JSON objects
 * (comma-separated, may be NULL); -1 when req has no record. */
int lh_explain_record(lh_buf *b, lupin_request *req, int status, const char *outcome,
                      double total_ms, const char *attempts, size_t attempts_len);

/* --- vLLM's KV-cache events, decoded (kv_wire.c) ------------------------- */

/* One payload (the third frame of a message) of vLLM's ZMQ KV-event
 * publisher: a batch [ts, events, dp_rank] or {ts, events,
 * data_parallel_rank}, its events positional arrays or maps, both shapes
 * vLLM has sent (kv_wire.c's comment says what each field may be).  Pure
 * functions, any thread; a program linking them links -lmsgpackc.  An
 * event's arrays and strings live in the batch's memory; an array of n = 0
 * may be NULL; strings are NUL-terminated copies (their length counts).
 * event_shape is LH_KV_SHAPE_ARRAY | LH_KV_SHAPE_MAP when a batch mixes
 * both.  A batch is one allocation of at most 32 bytes per payload byte and
 * a few hundred more (msgpack-c's object tree lives in it too): bound the
 * payload before decoding it (ZMQ_MAXMSGSIZE). */
// clang-format off
typedef enum lh_kv_type { LH_KV_STORED = 1, LH_KV_REMOVED = 2, LH_KV_CLEARED = 3 } lh_kv_type;
typedef struct lh_kv_event {
  lh_kv_type type;
  const uint64_t *hashes; size_t n_hashes;     /* engine block hashes as u64 */
  int has_parent; uint64_t parent;             /* BlockStored's parent_block_hash */
  const uint32_t *tokens; size_t n_tokens;     /* BlockStored's token_ids */
  uint32_t block_size;                         /* 0: absent */
  const char *medium; size_t medium_len;       /* NULL: absent or nil (GPU) */
  const char *lora_name; size_t lora_name_len; /* NULL: none */
  const char *salt; size_t salt_len;           /* the first block's cache_salt from extra_keys: NULL none */
  int other_group; /* group_idx > 0, or kv_cache_spec_kind present and not full attention: not indexed */
} lh_kv_event;
enum { LH_KV_SHAPE_ARRAY = 1, LH_KV_SHAPE_MAP = 2 };
enum { LH_KV_EMSGPACK = -1 /* not msgpack, truncated, trailing bytes */, LH_KV_ESHAPE = -2 /* msgpack of the wrong shape or types */, LH_KV_ENOMEM = -3 };
typedef struct lh_kv_batch {
  double ts;
  int dp_rank;                   /* -1: absent or nil */
  lh_kv_event *events; size_t n;
  int batch_shape, event_shape;  /* LH_KV_SHAPE_*: the outer batch's, the events' (0: no events) */
  size_t skipped;                /* events of an unknown type, skipped (not an error) */
  void *mem_;                    /* private: what the arrays live in */
} lh_kv_batch;
/* Decodes one payload.  0: b filled (free it with lh_kv_batch_free); < 0: an LH_KV_E* code, err says what and where (event index, field), b needs no free. */
int lh_kv_decode(lh_kv_batch *b, const void *payload, size_t len, char *err, size_t errlen);
void lh_kv_batch_free(lh_kv_batch *b);
/* The sequence frame: 8 bytes, big-endian, signed (the replay's end marker is -1).  0 ok, -1 not 8 bytes. */
int lh_kv_seq(const void *frame, size_t len, int64_t *seq);
// clang-format on
/* For the specs and the fuzz harness: the bytes a decoded batch holds, and
 * whether they are one allocation (0: the estimate from the payload fell
 * short and the memory grew, a bug); whether [p, p + len) lies in them. */
size_t lh_kv_batch_mem(const lh_kv_batch *b, int *one_allocation);
int lh_kv_batch_holds(const lh_kv_batch *b, const void *p, size_t len);

/* --- an endpoint's blocks from its engine's events (kv_index.c) ----------- */

/* Engine hash -> lupin key for one endpoint, feeding the keyed prefix index
 * `key` of `shared` with lupin's own keys (lupin_token_block_hashes over the
 * events' token ids, from lupin_token_seed(hash_seed, LoRA, salt)): what a
 * request's token ids look up.  Not thread-safe: one thread per endpoint. */
typedef struct lh_kv_index lh_kv_index;
typedef struct lh_kv_target {
  lupin_shared *shared;
  const char *key;       /* the keyed index the precise plugins open */
  const char *endpoint;  /* the endpoint's name */
  const char *hash_seed; /* the config's hashSeed ("" or NULL: none) */
  size_t block_size;     /* tokens a block, when an event gives none */
} lh_kv_target;
typedef struct lh_kv_counts {
  uint64_t stored, removed, cleared; /* blocks (cleared: events) */
  uint64_t ignored;                  /* events of another tier or attention group */
  uint64_t orphans;                  /* stored blocks whose parent is unknown: not chained */
  uint64_t unknown;                  /* removed blocks never seen stored */
  uint64_t malformed;                /* stored events whose tokens are not their blocks' */
} lh_kv_counts;
/* max_blocks: the map's bound (0: none); past it apply fails. */
lh_kv_index *lh_kv_index_new(size_t max_blocks);
void lh_kv_index_free(lh_kv_index *x);
/* Applies a decoded batch, adding to c.  -1: the map is full or out of
 * memory; the index is then partial and the caller clears it (a resync). */
int lh_kv_index_apply(lh_kv_index *x, const lh_kv_target *t, const lh_kv_batch *b, lh_kv_counts *c);
/* Forgets every block, and purges the endpoint from the index (t NULL: the
 * map only). */
void lh_kv_index_clear(lh_kv_index *x, const lh_kv_target *t);
size_t lh_kv_index_blocks(const lh_kv_index *x);

#endif
