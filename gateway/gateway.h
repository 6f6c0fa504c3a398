/* gateway.h -- the gateway host `lupin serve` (docs/gateway.md): the types
 * its files share.  It embeds the runtime as any host does, through lupin.h
 * alone.
 *
 * One gateway object owns everything of one worker: the runtime, the loop's
 * handles, the endpoints and their upstream pools, the listener, the stats.
 * There is no global mutable state.  A worker runs on one libuv loop, one
 * thread; with several workers (workers.c) the first one, the leader, also
 * owns what the process has once: the admin listener, the signals, the
 * watches and the scrapes, whose results it hands to the others. */
#ifndef LUPIN_GATEWAY_H
#define LUPIN_GATEWAY_H

#include "lupin.h"
#include "lupin_host.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <strings.h>

#include <http_parser.h>
#include <uv.h>

typedef struct lupin_gateway lupin_gateway;
typedef struct gw_endpoint gw_endpoint;
typedef struct gw_server gw_server;
typedef struct gw_conn gw_conn;
typedef struct gw_upstream gw_upstream;
typedef struct gw_uconn gw_uconn;
typedef struct gw_exchange gw_exchange;
typedef struct gw_workers gw_workers;
typedef struct gw_inbox gw_inbox;

/* --- timeouts pushed back by a store (timer.c) ---------------------------- */

/* A timeout that moves at every request and every piece read: restarting a
 * libuv timer each time is a removal from its heap and an insertion.  The
 * deadline moves in a field; the libuv timer, armed for the earliest
 * deadline it was given, finds on firing whether it has moved since and
 * re-arms for what is left.  handle comes first: callbacks get &handle, and
 * its data is the owner's. */
typedef struct gw_timer {
  uv_timer_t handle;
  uint64_t due; /* loop time (ms) of the deadline, while pending */
  int pending;
  uv_timer_cb cb;
} gw_timer;

void gw_timer_init(uv_loop_t *loop, gw_timer *t, void *data);
/* cb runs once, ms from now, unless set again (to a new deadline) or cleared */
void gw_timer_set(gw_timer *t, uv_timer_cb cb, uint64_t ms);
void gw_timer_clear(gw_timer *t);

/* --- writing to sockets (write.c) ----------------------------------------- */

/* Called for a write that had to be queued, once its bytes have left (or
 * failed); never for a write the socket took at once. */
typedef void (*gw_written_fn)(uv_stream_t *s, int status, void *data);
/* Writes the parts in order: at once as far as the socket takes them, the
 * rest copied and queued.  Returns 0 or a libuv error (nothing queued). */
int gw_write(uv_stream_t *s, const uv_buf_t *parts, unsigned n, gw_written_fn cb, void *data);
/* The same without the copy (at most 4 parts): what the socket does not take
 * is queued by reference, so the caller keeps the bytes until cb has run or
 * the stream is closed (libuv reads none of them after uv_close).  For
 * request bodies, which a copy would double. */
int gw_write_kept(uv_stream_t *s, const uv_buf_t *parts, unsigned n, gw_written_fn cb, void *data);

/* --- settings (the config's "gateway" section, lua/lupin/config.lua) ------ */

typedef struct gw_settings {
  uint64_t max_body_bytes, max_header_bytes;
  uint64_t header_timeout_ms, connect_timeout_ms, first_byte_timeout_ms, idle_timeout_ms;
  uint64_t refresh_interval_ms, scrape_timeout_ms, metrics_staleness_ms;
  uint64_t pool_size, drain_timeout_ms, resolve_interval_ms;
  uint64_t max_lua_memory_bytes, max_requests_in_flight, max_buffered_body_bytes;
  /* retries and endpoint health (health.c, proxy.c) */
  uint64_t pool_idle_ms, retry_non_idempotent, retry_budget_percent, retry_budget_min;
  uint64_t consecutive_errors, base_ejection_time_ms, max_ejection_time_ms;
  uint64_t max_ejection_percent, stale_ejection_ms;
  uint64_t explain_without_token; /* x-lupin-explain without the admin token */
  uint64_t allow_empty_endpoints; /* an empty endpoints list empties the pool */
  uint64_t workers;               /* event loops (threads), 0: one per core */
} gw_settings;

/* Reads the gateway section (settings.c): declare before loading a config,
 * read after each load. */
int gw_settings_declare(lupin_runtime *rt, char *err, size_t errlen);
int gw_settings_read(lupin_runtime *rt, gw_settings *out, char *err, size_t errlen);

/* Merges /v1/models answers (models.c); returns a malloc'd JSON text. */
char *gw_models_merge(const lh_buf *bodies, size_t n);

/* Replaces the model a request body names (a JSON object's "model", or a
 * multipart/form-data body's "model" field, by content_type) with model,
 * every other byte unchanged (rewrite.c); *was gets the name replaced
 * (malloc'd).  -1 when the body names none. */
int gw_rewrite_model(lh_buf *body, const char *content_type, const char *model, char **was);

/* --- endpoints: the gateway's view, its upstream pool, its scrape ---------- */

#define GW_MAX_ADDRS 8

/* Idle keep-alive connections, newest first.  Generation requests and the
 * gateway's own GETs (scrapes, /v1/models) never share one (upstream.c). */
enum { GW_POOL_GEN, GW_POOL_AUX, GW_POOLS };
typedef struct gw_pool {
  gw_uconn *idle;
  size_t n_idle;
} gw_pool;

typedef enum gw_upstream_error {
  GW_UP_OK,
  GW_UP_CONNECT,         /* could not connect: the next pick may be tried */
  GW_UP_CONNECT_TIMEOUT, /* same, by the connect timeout */
  GW_UP_FIRST_BYTE_TIMEOUT,
  GW_UP_IDLE_TIMEOUT,
  GW_UP_NOT_SENT, /* closed before any byte of the request was written: safe to resend */
  GW_UP_CLOSED,   /* closed after the request was written, before any response byte */
  GW_UP_BROKEN,   /* the connection failed or the response was malformed */
  GW_UP_ERRORS
} gw_upstream_error;

/* An endpoint's health (host/health.c decides, health.c applies): its
 * failures counted by gw_upstream_error. */
_Static_assert(GW_UP_ERRORS == LH_FAILURE_KINDS, "lh_health counts gw_upstream_error's kinds");

struct gw_endpoint {
  lupin_gateway *gw;
  char *name, *address;
  int port;
  char hostport[80];
  /* every address of the name, getaddrinfo's order (resolve.c) */
  struct sockaddr_storage addrs[GW_MAX_ADDRS];
  int n_addrs, addr_first; /* addr_first: connected last, tried first */
  int resolving;
  double resolved_at;
  int refs;                /* the registry's one, plus one per upstream exchange */
  int removed;             /* gone from the registry; freed at its last ref */
  int seen;                /* marks of an endpoints file re-read */
  gw_pool pools[GW_POOLS]; /* keep-alive connections */
  lh_health health;
  /* scraping (scrape.c) */
  uv_timer_t *timer;
  gw_upstream *scrape;
  lh_buf scrape_body;
  int scrape_status;
  double scraped_at; /* lupin_now() of the last good scrape, 0: never */
  uint64_t scrapes, scrape_errors;
  lupin_metrics metrics;
  char *running_lora, *waiting_lora;
  gw_endpoint *next;
};

void gw_endpoint_ref(gw_endpoint *ep);
void gw_endpoint_unref(gw_endpoint *ep);
gw_endpoint *gw_endpoint_find(lupin_gateway *gw, const char *name);

/* --- client side HTTP/1.1 server (server.c) ------------------------------ */

typedef struct gw_http_request {
  int method; /* enum http_method */
  char *url;
  lh_headers headers;
  lh_buf body;
  double started; /* lupin_now() at the first byte */
} gw_http_request;

typedef void (*gw_handler)(void *ud, gw_conn *c, gw_http_request *req);
/* Called when the client goes away while owner's response is in progress;
 * the connection must not be used after. */
typedef void (*gw_abort_fn)(void *owner);

/* share: another worker's server whose listening socket this one polls
 * too (hostport is then only for messages); NULL: bind hostport.  role
 * ("listen", "admin") names the listener in the error message. */
gw_server *gw_server_listen(lupin_gateway *gw, const char *hostport, const char *role,
                            const gw_server *share, gw_handler h, void *ud, char *err,
                            size_t errlen);
/* Stops accepting and closes idle connections; busy ones close when done. */
void gw_server_close(gw_server *s);
size_t gw_server_connections(const gw_server *s);
void gw_server_free(gw_server *s);

void gw_conn_on_abort(gw_conn *c, gw_abort_fn fn, void *owner);
/* The current request's id: the client's x-request-id, or one made for it
 * (answers that never reach the runtime: bad requests, unknown routes). */
const char *gw_conn_request_id(gw_conn *c);
/* Bytes written to the client and not yet sent. */
size_t gw_conn_backlog(const gw_conn *c);
/* Calls fn(owner) once, when the backlog has been sent (slow clients). */
void gw_conn_on_drain(gw_conn *c, gw_abort_fn fn, void *owner);
/* A full response.  Adds content-length, connection. */
void gw_conn_respond(gw_conn *c, int status, const lupin_header *h, size_t n, const char *body,
                     size_t len);
/* The OpenAI error shape: {"error":{"message","type","param","code"}}. */
void gw_conn_error(gw_conn *c, int status, const char *message, const char *param,
                   const lupin_header *h, size_t n);
/* A streamed response: headers now, then writes, then end.  content_length
 * < 0: chunked transfer encoding. */
void gw_conn_start(gw_conn *c, int status, const lupin_header *h, size_t n, int64_t content_length);
void gw_conn_write(gw_conn *c, const char *data, size_t len);
void gw_conn_end(gw_conn *c);
/* Gives up on a response already started: the client sees the connection
 * close before the response ends. */
void gw_conn_abort(gw_conn *c);
/* Corked, a connection gathers what is written to it until uncorked, then
 * writes it at once: a streamed response whose head, chunks and end come in
 * one read from upstream leaves in one system call instead of one each.
 * Ending, aborting or closing the connection uncorks it. */
void gw_conn_cork(gw_conn *c);
void gw_conn_uncork(gw_conn *c);
const char *gw_status_text(int status);

/* --- upstream client (upstream.c) ---------------------------------------- */

typedef struct gw_upstream_cb {
  void (*on_headers)(void *ud, int status, const lh_headers *h, int64_t content_length);
  void (*on_body)(void *ud, const char *data, size_t len);
  /* Last call; the upstream handle is freed after it returns. */
  void (*on_done)(void *ud, gw_upstream_error e, const char *detail);
  /* Optional: the bytes of one read from the endpoint have been handed on
   * (not called once on_done has been). */
  void (*on_read_end)(void *ud);
} gw_upstream_cb;

typedef struct gw_timeouts {
  uint64_t connect_ms, first_byte_ms, idle_ms;
} gw_timeouts;

/* Sends one request to ep over a pooled or new connection.  head holds the
 * headers to send (host and content-length are added).  body is not copied:
 * the caller keeps it unchanged until on_done has run or the exchange is
 * cancelled (a request body is then held once, maxBufferedBodyBytes).  A GET uses the
 * pool of the gateway's own requests and may be resent on a fresh connection
 * when a reused one fails before answering; anything else is sent once. */
gw_upstream *gw_upstream_start(gw_endpoint *ep, const char *method, const char *path,
                               const lupin_header *head, size_t n, const char *body, size_t len,
                               gw_timeouts t, const gw_upstream_cb *cb, void *ud);
/* Whether the exchange went over a pooled connection. */
int gw_upstream_reused(const gw_upstream *u);
/* Frees the ended exchanges kept for reuse (at the end of gw_run). */
void gw_upstream_free_spares(lupin_gateway *gw);
/* Stops or resumes reading the response (a slow client's backpressure);
 * the idle timeout does not run while paused. */
void gw_upstream_pause(gw_upstream *u, int pause);
/* Stops an exchange; no callback runs after.  Its connection is closed. */
void gw_upstream_cancel(gw_upstream *u);
/* Closes an endpoint's idle connections. */
void gw_pool_clear(gw_endpoint *ep);
const char *gw_upstream_error_text(gw_upstream_error e);

/* --- the EPP's per-model request series (objective.c) --------------------- */

/* Per model name (model_name; target_model_name is the same: lupin does not
 * rewrite models), what the EPP's inference_objective_* families count. */
enum {
  GW_ERR_BAD_REQUEST,  /* "BadRequest": the body or a plugin refused the request */
  GW_ERR_EXHAUSTED,    /* "InferencePoolResourceExhausted": no endpoint, or shed */
  GW_ERR_INTERNAL,     /* "Internal": a plugin failed */
  GW_ERR_MODEL_SERVER, /* "ModelServerError": not 200 from the endpoint, or none */
  GW_ERRS
};
extern const char *const gw_error_codes[GW_ERRS];

#define GW_MAX_MODELS 100 /* series kept per model name; more share "<other>" */

typedef struct gw_objective {
  char *model;  /* as the client named it */
  char *target; /* as it was sent (the model-name rewrite's) */
  uint64_t requests, errors[GW_ERRS];
  uint64_t running;
  lh_histogram duration, request_sizes, response_sizes;
  struct gw_objective *next;
} gw_objective;

/* The series of model sent as target (NULL: model); created on first use,
 * "<other>" past GW_MAX_MODELS. */
gw_objective *gw_objective_get(lupin_gateway *gw, const char *model, const char *target);
void gw_objectives_free(lupin_gateway *gw);

/* --- the process (process.c) ---------------------------------------------- */

/* process_* as Prometheus' process collector names them, from /proc/self. */
void gw_process_metrics(lh_expo *e);

/* --- the Lua heap's allocator (lua_heap.c) -------------------------------- */

/* lupin_options.allocator for the gateway's runtimes: mimalloc. */
void *gw_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
/* Returns the memory the heaps freed to the system (lua_heap.c). */
void gw_heap_release(void);

/* --- scraping (scrape.c) -------------------------------------------------- */

void gw_scrape_start(gw_endpoint *ep);
void gw_scrape_stop(gw_endpoint *ep);

/* --- endpoint health (health.c) ------------------------------------------- */

/* The name of an attempt's failure for logs and metrics ("connect_failed";
 * GW_UP_OK: "status_5xx"). */
const char *gw_failure_name(gw_upstream_error e);

void gw_health_init(gw_endpoint *ep);
/* A proxied request's outcome at ep: e, or for a response its status (5xx
 * counts as a failure).  reused: over a pooled connection. */
void gw_health_request(gw_endpoint *ep, gw_upstream_error e, int status, int reused,
                       const char *detail);
void gw_health_scrape(gw_endpoint *ep, int ok, const char *detail);
/* Re-evaluates every endpoint (ejection time, staleness); started by gw_open. */
int gw_health_start(lupin_gateway *gw, char *err, size_t errlen);
void gw_health_stop(lupin_gateway *gw);
/* Endpoints requests may go to: neither ejected nor stale. */
size_t gw_healthy_endpoints(lupin_gateway *gw);

/* --- the public API (proxy.c) and the admin listener (admin.c) ------------ */

void gw_proxy_handle(void *gw, gw_conn *c, gw_http_request *req);
void gw_proxy_cancel_all(lupin_gateway *gw);
/* Frees the ended exchanges kept for reuse (at the loop's end). */
void gw_proxy_free_spares(lupin_gateway *gw);
/* Writes the access log's waiting lines (each loop iteration, and at the end). */
void gw_access_log_flush(lupin_gateway *gw);
/* The runtime's dispatch callback: a queued request's final result. */
void gw_proxy_dispatched(void *gw, lupin_request *req, const lupin_result *res);

/* --- flow control's view (flow.c, docs/flow-control.md) ------------------- */

/* How long a request waited in the queue of band priority, by how it left
 * ("dispatched", "queue_ttl", "shed", "cancelled"). */
void gw_flow_observe(lupin_gateway *gw, int priority, const char *outcome, double waited);
void gw_flow_metrics(lupin_gateway *gw, lh_expo *e);
/* GET /admin/flows */
void gw_flow_admin(lupin_gateway *gw, gw_conn *c);
/* A gw_task_fn: the worker's queue tries its gate again (another's request ended). */
void gw_flow_pump(lupin_gateway *gw, void *arg);
void gw_flow_free(lupin_gateway *gw);
void gw_admin_handle(void *gw, gw_conn *c, gw_http_request *req);

/* --- explain records (explain.c, docs/explain.md) ------------------------- */

#define GW_EXPLAIN_RING 64 /* records kept for GET /admin/explain/<id> */
typedef struct gw_explain_ring gw_explain_ring;

/* The request headers explain.c consumes: never forwarded. */
int gw_explain_header(const char *name);
/* Whether a proxied request asks for a record: 0 no, 1 yes and allowed,
 * -1 asked without the admin token (answered with a refusal header). */
int gw_explain_wanted(lupin_gateway *gw, const gw_http_request *req);
/* After scheduling: the summary header of an explained request. */
void gw_explain_scheduled(gw_exchange *x);
/* The response headers of an exchange's record (at most 2); x may be NULL. */
size_t gw_explain_headers(const gw_exchange *x, lupin_header *out);
/* At the end of an exchange: keeps its record, with the attempts. */
void gw_explain_ended(gw_exchange *x, int status, const char *outcome);
/* GET /admin/explain[/<id>], POST /admin/explain. */
void gw_explain_admin(lupin_gateway *gw, gw_conn *c, gw_http_request *req, const char *path);
/* The ring of records: the leader's own (leader NULL), or the leader's. */
int gw_explain_open(lupin_gateway *gw, const lupin_gateway *leader);
void gw_explain_free(lupin_gateway *gw);
/* `lupin explain` (explain_cli.c): returns the exit code. */
int gw_explain_main(int argc, char **argv);
extern const char gw_explain_usage[];

/* --- the gateway object (gateway.c) --------------------------------------- */

typedef struct gw_stats {
  uint64_t by_status[600];
  uint64_t by_outcome[16]; /* by lupin_outcome */
  lh_histogram sched;      /* lupin_scheduling_seconds */
  lh_histogram sched_epp;  /* the same times in the EPP's buckets */
} gw_stats;

typedef struct gw_options {
  const char *config;
  const char *listen;
  const char *admin;
  const char *admin_token;
  const char *endpoints_file;
  int log_level;
  int log_json;               /* --log-format json: diagnostics as JSON lines */
  int no_watch;               /* --no-watch: no reload on config or plugin file changes */
  const char *max_lua_memory; /* --max-lua-memory: overrides maxLuaMemoryBytes */
  int admin_insecure;         /* --admin-insecure: a non-loopback admin without a token */
  const char *resolve[16];    /* --resolve NAME=ADDR[,ADDR...] */
  int n_resolve;
  const char *workers; /* --workers N|auto: overrides gateway.workers */
  const char *redis;   /* --redis HOST:PORT: replicas on, at that address */
} gw_options;

/* Reloads and their outcome, for /metrics. */
typedef struct gw_reload_stats {
  uint64_t ok, error;
  double seconds_sum, last_seconds;
} gw_reload_stats;

/* A watched directory (watch.c): the config's, a plugin directory, or both. */
typedef struct gw_watch {
  uv_fs_event_t h; /* first: the handle's pointer frees the watch */
  lupin_gateway *gw;
  int config;  /* holds the config file: its name triggers a reload */
  int plugins; /* a plugin directory: any *.lua triggers a reload */
  char *dir;
  struct gw_watch *next;
} gw_watch;

/* What the caps count for the whole process, whichever worker holds it
 * (__atomic builtins): the leader's, every follower points at it. */
typedef struct gw_totals {
  size_t in_flight;    /* requests handed to the proxy and not yet answered */
  uint64_t body_bytes; /* request body bytes held */
  size_t series;       /* model series begun (GW_MAX_MODELS bounds them) */
} gw_totals;

struct lupin_gateway {
  uv_loop_t *loop;
  /* Every socket reads into this one buffer: each read callback consumes
   * its bytes before it returns, and reads never nest. */
  char read_buf[65536];
  lupin_runtime *rt;
  gw_options opts;
  gw_settings set;
  gw_server *server, *admin;
  gw_endpoint *endpoints;
  size_t n_endpoints;
  uv_fs_event_t *watch;
  uv_timer_t *rewatch;      /* debounces file events */
  gw_watch *watches;        /* config and plugin directories (watch.c) */
  uv_timer_t *reload_timer; /* debounces them into one reload */
  gw_reload_stats reloads;
  uv_signal_t *sigterm, *sigint, *sighup;
  uv_timer_t *drain_timer;
  uv_prepare_t *collector; /* paces the Lua collector between requests, writes the access log */
  int draining;
  gw_exchange *exchanges; /* live proxied requests, newest first */
  size_t n_exchanges;
  size_t n_upstreams; /* live upstream exchanges (scrapes included) */
  /* ended exchanges kept, buffers and all, for the next ones (upstream.c) */
  gw_upstream *spare_upstreams;
  size_t n_spare_upstreams;
  gw_exchange *spare_exchanges; /* the same for exchanges (proxy.c) */
  size_t n_spare_exchanges;
  lh_buf access_log;        /* lines this loop iteration ended, not written yet */
  size_t n_retrying;        /* exchanges on a second or later attempt (the retry budget) */
  uint64_t retries_denied;  /* retries the budget refused */
  uv_timer_t *health_timer; /* health.c */
  unsigned health_ticks;
  int no_healthy;       /* "no healthy endpoint" was logged */
  uint64_t ended_at_gc; /* requests ended at the last idle collection */
  int heap_releases;    /* ticks left that give freed memory back (lua_heap.c) */
  gw_stats stats;
  gw_objective *objectives;        /* by model, for the EPP's request families */
  struct gw_flow_wait *flow_waits; /* flow.c: wait histograms by band and outcome */
  size_t n_flow_waits;
  size_t n_objectives;
  int exit_code;
  int serving; /* every part of the start succeeded: the loop may serve */
  /* memory bounds (server.c): requests handed to the proxy and not yet
   * answered, request body bytes held (this worker's: the caps apply to
   * *totals), requests refused by each cap */
  gw_totals own_totals, *totals;
  size_t in_flight;
  uint64_t body_bytes;
  uint64_t refused_in_flight, refused_body_bytes;
  uint64_t empty_endpoints_kept; /* empty endpoints lists not applied (leader) */
  gw_explain_ring *explain_ring; /* explain.c: the leader's, shared */
  /* workers (workers.c): this one's index, 0 for the leader */
  int worker;
  gw_workers *workers;
  gw_inbox *inbox;
  lupin_shared *shared;         /* given to the runtime */
  struct gw_replicas *replicas; /* replicas.c: the leader's, NULL when off */
};

int gw_open(lupin_gateway *gw, const gw_options *o, char *err, size_t errlen);
/* --- addresses (resolve.c) ------------------------------------------------ */

/* host (an IP or a name) and port to its first socket address; -1 when unknown. */
int gw_resolve(const char *host, int port, struct sockaddr_storage *out);
/* Every address of host (each once, at most max; --resolve pins first);
 * returns how many, 0 when unknown.  Blocking: start-up and re-reads only. */
int gw_resolve_all(const gw_options *o, const char *host, int port, struct sockaddr_storage *out,
                   int max);
void gw_endpoint_resolve(gw_endpoint *ep);
/* Looks the endpoint's name up again off the loop when its addresses are
 * older than resolveIntervalMs, or (failed) when every address failed. */
void gw_endpoint_refresh_addrs(gw_endpoint *ep, int failed);
int gw_resolve_pinned(const gw_endpoint *ep);
/* The address for a connect's attempt-th try (the last good one first);
 * NULL when none is left.  _worked remembers the one that connected. */
const struct sockaddr *gw_endpoint_addr(gw_endpoint *ep, int attempt);
void gw_endpoint_addr_worked(gw_endpoint *ep, int attempt);
/* "ip:port" or "[ip6]:port". */
int gw_addr_name(const struct sockaddr_storage *ss, char *out, size_t len);
int gw_run(lupin_gateway *gw);
/* The exit codes of `lupin` (README.md, docs/lupin.1). */
enum {
  GW_EXIT_OK = 0,
  GW_EXIT_CONFIG = 1, /* config, plugins or endpoints rejected */
  GW_EXIT_USAGE = 2,  /* bad command line */
  GW_EXIT_START = 3,  /* serve could not start: address in use, no permission */
  GW_EXIT_DRAIN = 4,  /* requests still in flight were cut at drainTimeoutMs */
};

void gw_log(lupin_gateway *gw, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Called when a request or a connection ends: a drain waits for the last. */
void gw_check_drained(lupin_gateway *gw);
/* Reloads the config and plugins; why names the trigger in the log line.
 * Returns 0 with the new generation's number in *generation (may be NULL) or
 * -1 with err; *seconds (may be NULL): how long it took either way. */
int gw_reload(lupin_gateway *gw, const char *why, char *err, size_t errlen, uint64_t *generation,
              double *seconds);
/* Watching the config file and plugin directories (watch.c): (re)computes the
 * watched set from the current generation; stop closes every watch. */
void gw_watch_sync(lupin_gateway *gw);
void gw_watch_stop(lupin_gateway *gw);
int gw_server_address(gw_server *s, char *out, size_t len);
/* host:port (or [v6]:port) to an address; -1 with err when it is not one. */
int gw_parse_hostport(const char *hp, struct sockaddr_storage *ss, char *err, size_t errlen);
/* Healthy endpoints with metrics fresher than metricsStalenessMs. */
size_t gw_fresh_endpoints(lupin_gateway *gw);
int gw_endpoint_fresh(const gw_endpoint *ep, double now);

/* The linked list of live exchanges, for /admin/requests. */
struct gw_exchange {
  lupin_gateway *gw;
  gw_conn *conn;
  gw_http_request *http;
  lupin_request *req;
  lupin_result result;
  size_t pick;
  gw_endpoint *ep;
  gw_upstream *up;
  const char *model;       /* the model scheduled for (the model-name rewrite's): the core's */
  char *requested;         /* the body's, when a rewrite replaced it */
  gw_objective *objective; /* set once scheduled: counted as running */
  uint64_t response_bytes;
  int stream;
  double started;
  double sched_us;
  int status;
  int started_response; /* headers sent to the client */
  int streamed;         /* the response has no length: each read's pieces leave in one write */
  int failed_connects, timed_out_connects;
  lh_buf connect_errors;
  /* attempts: picks first, then the runtime's ranked fallbacks */
  const lupin_pick *fallbacks;
  size_t n_fallbacks;
  int fallbacks_asked;
  int attempts, replays, resends;
  int retrying; /* counted in gw->n_retrying */
  int reused;   /* the current attempt's connection came from the pool */
  double attempt_started;
  lh_buf attempt_log; /* the access log's "attempts" entries */
  int explain;        /* gw_explain_wanted's answer */
  char *explain_summary;
  char explain_url[300];
  const char *path;
  int queued; /* waiting in the runtime's flow-control queue */
  gw_exchange *prev, *next;
};

/* --- workers (workers.c, docs/workers.md) -------------------------------- */

/* A task run on a worker's loop thread. */
typedef void (*gw_task_fn)(lupin_gateway *gw, void *arg);

/* Starts the followers once the leader is open: each opens its own loop,
 * runtime (sharing the leader's lupin_shared) and listener on the leader's
 * listening socket.  -1 with err when one could not start. */
int gw_workers_start(lupin_gateway *leader, size_t n, char *err, size_t errlen);
/* The leader's number of workers: --workers, else gateway.workers, 0: cores. */
void gw_workers_wanted(lupin_gateway *gw, size_t *n);
size_t gw_workers_count(const lupin_gateway *gw);
/* Runs fn on every worker's thread in turn, the leader's first, and waits
 * for each: the admin API's way to read a follower's runtime and stats.
 * Only from the leader's thread.  Workers that stopped are skipped. */
void gw_workers_each(lupin_gateway *leader, gw_task_fn fn, void *arg);
/* Queues fn on every worker but `from` (any worker) without waiting; the
 * tasks run on their workers' threads.  drop(arg) frees arg after the last
 * one ran or was dropped (NULL: nothing to free).  Never waits: a follower
 * may post to the leader. */
void gw_workers_post(lupin_gateway *from, gw_task_fn fn, void *arg, void (*drop)(void *));
/* The leader's scrape result for ep, handed to the followers. */
void gw_workers_scraped(gw_endpoint *ep, int ok, const char *detail);
/* Waits for the followers to end; returns the worst exit code. */
int gw_workers_join(lupin_gateway *leader);
/* A follower's inbox, closed when its loop ends (shutdown_all). */
int gw_inbox_open(lupin_gateway *gw, char *err, size_t errlen);
void gw_inbox_close(lupin_gateway *gw);
/* gateway.c's parts a follower runs. */
void gw_drain(lupin_gateway *gw, const char *why);
int gw_endpoints_load(lupin_gateway *gw, char *err, size_t errlen);
int gw_open_follower(lupin_gateway *gw, const lupin_gateway *leader, char *err, size_t errlen);
/* Merges the /metrics texts of the workers (admin.c): counters, histograms
 * and the gauges the workers hold each their own share of are summed, the
 * rest are the leader's. */
void gw_metrics_merge(lh_buf *out, const lh_buf *texts, size_t n);

/* --- replicas sharing prefix records through Redis (replicas.c) ---------- */

typedef struct gw_replicas gw_replicas;
/* Declares the config's "replicas" section (with the gateway's). */
int gw_replicas_declare(lupin_runtime *rt, char *err, size_t errlen);
/* The leader, before the followers start: reads the section (--redis
 * overrides its address and turns it on) and, when on, hooks the prefix
 * records and starts the sync on the leader's loop.  -1 with err. */
int gw_replicas_start(lupin_gateway *gw, char *err, size_t errlen);
/* Closes the connection and the timer (shutdown); free once every worker
 * has stopped. */
void gw_replicas_stop(lupin_gateway *gw);
void gw_replicas_free(lupin_gateway *gw);
void gw_replicas_metrics(lupin_gateway *gw, lh_expo *e);
/* GET /admin/replicas */
void gw_replicas_admin(lupin_gateway *gw, gw_conn *c);

/* `lupin test` (gateway/test.c): runs busted on plugin specs. */
extern const char gw_test_usage[];
int gw_test_main(int argc, char **argv);

#endif
