/* endpoints.h -- lupin serve's view of its endpoints: the registry's
 * entries (endpoint.c), their addresses (resolve.c), upstream pools and
 * exchanges (upstream.c), scrapes (scrape.c), health (health.c), and the
 * prefix records shared with other replicas (replicas.c). */
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
  gw_endpoint *next;
};

void gw_endpoint_ref(gw_endpoint *ep);
void gw_endpoint_unref(gw_endpoint *ep);
gw_endpoint *gw_endpoint_find(lupin_gateway *gw, const char *name);

/* Healthy endpoints with metrics fresher than metricsStalenessMs. */
size_t gw_fresh_endpoints(lupin_gateway *gw);
int gw_endpoint_fresh(const gw_endpoint *ep, double now);

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

#endif
