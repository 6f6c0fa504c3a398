/* endpoints.h -- lupin serve's view of its endpoints: the registry's
 * entries (endpoint.c), their addresses (resolve.c), upstream pools and
 * exchanges (upstream.c), scrapes (scrape.c), health (health.c), the
 * prefix records shared with other replicas (replicas.c), the engines'
 * KV-cache events (kv_events.c) and the tokenize jobs of the precise
 * plugins (tokenize.c), and the
 * endpoints read from Kubernetes (k8s_config.c, k8s_client.c, k8s_pool.c). */
#ifndef LUPIN_GW_ENDPOINTS_H
#define LUPIN_GW_ENDPOINTS_H

#include "http/http.h"

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
  lh_headers labels; /* as the source listed them (/admin/endpoints) */
  gw_endpoint *next;
};

void gw_endpoint_ref(gw_endpoint *ep);
void gw_endpoint_unref(gw_endpoint *ep);
gw_endpoint *gw_endpoint_find(lupin_gateway *gw, const char *name);

/* Healthy endpoints with metrics fresher than metricsStalenessMs. */
size_t gw_fresh_endpoints(lupin_gateway *gw);
int gw_endpoint_fresh(const gw_endpoint *ep, double now);
/* Why requests cannot be scheduled yet (buf may hold it), or NULL: ready.
 * /readyz and lupin epp's readiness both ask. */
const char *gw_not_ready(lupin_gateway *gw, char *buf, size_t len);

/* --- an endpoint's addresses (resolve.c) ------------------------------------ */

void gw_endpoint_resolve(gw_endpoint *ep);
/* Looks the endpoint's name up again off the loop when its addresses are
 * older than resolveIntervalMs, or (failed) when every address failed. */
void gw_endpoint_refresh_addrs(gw_endpoint *ep, int failed);
int gw_resolve_pinned(const gw_endpoint *ep);
/* The address for a connect's attempt-th try (the last good one first);
 * NULL when none is left.  _worked remembers the one that connected. */
const struct sockaddr *gw_endpoint_addr(gw_endpoint *ep, int attempt);
void gw_endpoint_addr_worked(gw_endpoint *ep, int attempt);

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

/* The leader's scrape result for ep, handed to the followers (scrape.c). */
void gw_workers_scraped(gw_endpoint *ep, int ok, const char *detail);

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

/* --- the engines' KV-cache events (kv_events.c) ---------------------------- */

typedef struct gw_kv_events gw_kv_events;
/* The leader, after every load or reload and every change of the
 * endpoints: subscribes to what the current generation's precise plugins
 * ask for (lupin_runtime_kv_events) on each endpoint, through a thread of
 * its own started the first time. */
void gw_kv_events_sync(lupin_gateway *gw);
/* Joins the thread (shutdown); free once every worker has stopped. */
void gw_kv_events_stop(lupin_gateway *gw);
void gw_kv_events_free(lupin_gateway *gw);
void gw_kv_events_metrics(lupin_gateway *gw, lh_expo *e);
/* GET /admin/kv-events */
void gw_kv_events_admin(lupin_gateway *gw, gw_conn *c);

/* --- tokenize jobs of the precise plugins (tokenize.c) ----------------------- */

typedef struct gw_tokenize gw_tokenize;
/* The leader, at open: hooks the runtime's tokenize jobs and answers them
 * on its loop.  -1 with err. */
int gw_tokenize_start(lupin_gateway *gw, char *err, size_t errlen);
/* Refuses new jobs and closes the queue's handle (shutdown); free once
 * every worker has stopped. */
void gw_tokenize_stop(lupin_gateway *gw);
void gw_tokenize_free(lupin_gateway *gw);
void gw_tokenize_metrics(lupin_gateway *gw, lh_expo *e);

/* --- endpoints from Kubernetes: an InferencePool's ready pods ------------ */

/* Where the API server is and the credentials to show it (k8s_config.c):
 * kubeconfig (a path; NULL: $KUBECONFIG, else in-cluster when
 * KUBERNETES_SERVICE_HOST is set, else ~/.kube/config). */
typedef struct gw_k8s_config {
  char host[256]; /* a name or an IP literal: what the certificate must carry */
  int port;
  char *ca; /* PEM; NULL: the system's CAs */
  size_t ca_len;
  int insecure;     /* insecure-skip-tls-verify: no verification at all */
  char *token;      /* NULL: none, or token_file's */
  char *token_file; /* re-read at each request: service account tokens rotate */
  char *cert, *key; /* client certificate and key, PEM */
  size_t cert_len, key_len;
  char *ns;        /* the in-cluster namespace or the context's; NULL: none */
  char from[4200]; /* "kubeconfig PATH" or "in-cluster (DIR)", for messages */
} gw_k8s_config;
int gw_k8s_config_load(const char *kubeconfig, gw_k8s_config *c, char *err, size_t errlen);
void gw_k8s_config_free(gw_k8s_config *c);
/* The bearer token to send now (malloc'd); NULL: none, or with err set
 * when the token file cannot be read. */
char *gw_k8s_config_token(const gw_k8s_config *c, char *err, size_t errlen);

/* One HTTPS GET to the API server (k8s_client.c). */
typedef struct gw_k8s_client gw_k8s_client;
typedef struct gw_k8s_call gw_k8s_call;
typedef enum gw_k8s_error {
  GW_K8S_OK,          /* a whole response (any status) */
  GW_K8S_UNREACHABLE, /* lookup, connect or handshake timed out or failed */
  GW_K8S_TLS,         /* the handshake failed: the certificate, the CA, the key */
  GW_K8S_TIMEOUT,     /* nothing read for the idle timeout */
  GW_K8S_BROKEN,      /* closed mid-response, or not HTTP */
} gw_k8s_error;
typedef struct gw_k8s_call_cb {
  void (*on_status)(void *ud, int status);
  void (*on_body)(void *ud, const char *data, size_t len); /* de-chunked */
  /* Last call unless cancelled; detail says why when e is not GW_K8S_OK. */
  void (*on_done)(void *ud, gw_k8s_error e, const char *detail);
} gw_k8s_call_cb;
/* The TLS context of cfg (kept by the caller for the client's life). */
gw_k8s_client *gw_k8s_client_new(uv_loop_t *loop, const gw_k8s_config *cfg, char *err,
                                 size_t errlen);
void gw_k8s_client_free(gw_k8s_client *cl);
/* Starts GET path; idle_ms bounds the wait for each read once the request
 * is sent.  NULL with err when it could not start (no callback runs). */
gw_k8s_call *gw_k8s_get(gw_k8s_client *cl, const char *path, uint64_t idle_ms,
                        const gw_k8s_call_cb *cb, void *ud, char *err, size_t errlen);
/* No callback runs after; the connection closes. */
void gw_k8s_cancel(gw_k8s_call *c);

/* The pool (k8s_pool.c): lists and watches the InferencePool
 * gw->opts.k8s_pool and the pods it selects, and hands the full list of
 * endpoints (one per ready pod and target port) to apply after each
 * change.  The leader only.  start: -1 with err when the credentials
 * cannot be read; the API server is first asked on the loop. */
typedef void (*gw_k8s_apply_fn)(lupin_gateway *gw, const lupin_endpoint_desc *d, size_t n);
int gw_k8s_start(lupin_gateway *gw, gw_k8s_apply_fn apply, char *err, size_t errlen);
/* Cancels the calls and closes the timers (shutdown); free once the loop
 * has run their close callbacks. */
void gw_k8s_stop(lupin_gateway *gw);
/* After a reload: the config file's pool (or its going) applied. */
void gw_k8s_config_changed(lupin_gateway *gw);
void gw_k8s_free(lupin_gateway *gw);
/* Why the pool is not synced (/readyz); NULL when it is, or when off. */
const char *gw_k8s_not_ready(const lupin_gateway *gw);
void gw_k8s_metrics(lupin_gateway *gw, lh_expo *e);

#endif
