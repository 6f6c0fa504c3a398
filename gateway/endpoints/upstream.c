/* The upstream side: one HTTP/1.1 exchange with an endpoint over a pooled
 * keep-alive connection (or a new one), with connect, first-byte and idle
 * timeouts, the response parsed by http_parser and handed over as it comes.
 *
 * Each endpoint keeps two pools of at most gateway.poolSize idle
 * connections: one for generation requests (POST), one for the gateway's own
 * GETs (scrapes, /v1/models), so a scrape never leaves behind a connection a
 * generation request then finds closed.  A connection idle longer than
 * poolIdleMs is closed rather than reused: servers close idle keep-alive
 * connections after a few seconds (uvicorn, which vLLM runs on: 5 s).
 *
 * Nothing is sent twice here unless that is provably harmless: a GET on a
 * reused connection that fails before any response byte is retried once on a
 * fresh one; a POST is reported (GW_UP_NOT_SENT when no byte of it was
 * written, GW_UP_CLOSED when it was written and no answer came) and the
 * caller decides. */
#include "endpoints/endpoints.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gw_uconn {
  uv_tcp_t tcp;
  uv_connect_t connect;
  gw_endpoint *ep;
  http_parser parser;
  gw_upstream *u; /* the exchange using it; NULL while idle */
  int closed;
  int in_pool;
  int pool;            /* GW_POOL_* */
  uint64_t idle_since; /* uv_now() when it went back to the pool */
  gw_uconn *next;      /* in the idle list */
};

struct gw_upstream {
  gw_timer timer;
  gw_endpoint *ep;
  gw_uconn *conn;
  lh_buf request;   /* the request line and headers, kept for a retry */
  const char *body; /* the caller's, sent from where it is (no copy) */
  size_t body_len;
  lh_headers headers;
  gw_timeouts t;
  gw_upstream_cb cb;
  void *ud;
  int reused, connected, got_bytes, complete, done, keep_alive, paused;
  int addr_try;               /* which of the endpoint's addresses (resolve.c) */
  uint64_t connect_start;     /* uv_now() of the first address's try */
  int idempotent;             /* a GET: may be sent again on a fresh connection */
  int interim;                /* the message being parsed is a 1xx (skipped) */
  int refused;                /* the response was refused (detail says why) */
  gw_upstream_error deferred; /* reported from the timer: never from start */
  const char *deferred_detail;
  char detail[160];
  gw_upstream *next_spare; /* in gw->spare_upstreams */
};

const char *gw_upstream_error_text(gw_upstream_error e) {
  switch (e) {
  case GW_UP_OK:
    return "ok";
  case GW_UP_CONNECT:
    return "connect failed";
  case GW_UP_CONNECT_TIMEOUT:
    return "connect timed out";
  case GW_UP_FIRST_BYTE_TIMEOUT:
    return "no response within firstByteTimeoutMs";
  case GW_UP_IDLE_TIMEOUT:
    return "response stalled longer than idleTimeoutMs";
  case GW_UP_NOT_SENT:
    return "connection closed before the request was written";
  case GW_UP_CLOSED:
    return "connection closed before any response";
  case GW_UP_BROKEN:
    return "connection failed";
  case GW_UP_ERRORS:
    break;
  }
  return "?";
}

static const http_parser_settings response_settings;

/* --- connections --------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h) {
  gw_uconn *c = h->data;
  gw_endpoint_unref(c->ep);
  free(c);
}

static void pool_remove(gw_uconn *c) {
  if (!c->in_pool) return;
  gw_pool *pool = &c->ep->pools[c->pool];
  for (gw_uconn **p = &pool->idle; *p; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
  c->in_pool = 0;
  pool->n_idle--;
}

static void conn_close(gw_uconn *c) {
  if (c->closed) return;
  c->closed = 1;
  c->u = NULL;
  pool_remove(c);
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void pool_put(gw_uconn *c) {
  gw_endpoint *ep = c->ep;
  gw_pool *pool = &ep->pools[c->pool];
  if (ep->removed || pool->n_idle >= ep->gw->set.pool_size || ep->gw->draining) {
    conn_close(c);
    return;
  }
  c->next = pool->idle;
  pool->idle = c;
  pool->n_idle++;
  c->in_pool = 1;
  c->idle_since = uv_now(ep->gw->loop);
}

/* The most recently used idle connection, unless it has been idle longer
 * than poolIdleMs: the pool is newest first, so the rest are older still and
 * all go. */
static gw_uconn *pool_take(gw_endpoint *ep, int which) {
  gw_pool *pool = &ep->pools[which];
  gw_uconn *c = pool->idle;
  if (!c) return NULL;
  if (uv_now(ep->gw->loop) - c->idle_since > ep->gw->set.pool_idle_ms) {
    while (pool->idle)
      conn_close(pool->idle);
    return NULL;
  }
  pool_remove(c);
  return c;
}

void gw_pool_clear(gw_endpoint *ep) {
  for (int i = 0; i < GW_POOLS; i++)
    while (ep->pools[i].idle)
      conn_close(ep->pools[i].idle);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_timeout(uv_timer_t *t);

/* --- finishing ----------------------------------------------------------- */

/* Ended exchanges kept for reuse: their request buffer and header texts
 * spare the next exchange its allocations.  A request buffer past
 * SPARE_REQUEST_BYTES (a big body) is not kept.  MAX_SPARES is above what
 * one loop usually has in flight: a list capped at the concurrency frees at
 * every lull (all responses out, scrapes in flight) and allocates again. */
enum { MAX_SPARES = 256, SPARE_REQUEST_BYTES = 16384 };

static void upstream_free(gw_upstream *u) {
  lh_headers_free(&u->headers);
  lh_buf_free(&u->request);
  free(u);
}

static gw_upstream *upstream_new(lupin_gateway *gw) {
  gw_upstream *u = gw->spare_upstreams;
  if (!u) return calloc(1, sizeof(gw_upstream));
  gw->spare_upstreams = u->next_spare;
  gw->n_spare_upstreams--;
  lh_buf request = u->request;
  lh_headers headers = u->headers;
  *u = (gw_upstream){.request = request, .headers = headers};
  return u;
}

void gw_upstream_free_spares(lupin_gateway *gw) {
  while (gw->spare_upstreams) {
    gw_upstream *u = gw->spare_upstreams;
    gw->spare_upstreams = u->next_spare;
    upstream_free(u);
  }
  gw->n_spare_upstreams = 0;
}

static void on_timer_closed(uv_handle_t *h) {
  gw_upstream *u = h->data;
  gw_endpoint *ep = u->ep;
  lupin_gateway *gw = ep->gw;
  gw->n_upstreams--;
  gw_endpoint_unref(ep);
  if (gw->n_spare_upstreams >= MAX_SPARES || u->request.cap > SPARE_REQUEST_BYTES) {
    upstream_free(u);
    return;
  }
  lh_headers_clear(&u->headers);
  u->request.len = 0;
  u->next_spare = gw->spare_upstreams;
  gw->spare_upstreams = u;
  gw->n_spare_upstreams++;
}

static void release(gw_upstream *u) {
  u->done = 1;
  uv_close((uv_handle_t *)&u->timer.handle, on_timer_closed);
}

static void finish(gw_upstream *u, gw_upstream_error e, const char *detail) {
  if (u->done) return;
  gw_uconn *c = u->conn;
  u->conn = NULL;
  if (c) {
    c->u = NULL;
    if (e == GW_UP_OK && u->keep_alive && u->paused) /* read again, to notice a close */
      uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    /* a connection still sending (the endpoint answered before it read the
     * whole body) is not reused: the rest would precede the next request,
     * and it is sent from the caller's body, which goes now */
    if (e == GW_UP_OK && u->keep_alive && !uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp))
      pool_put(c);
    else
      conn_close(c);
  }
  u->done = 1;
  u->cb.on_done(u->ud, e, detail);
  release(u);
}

void gw_upstream_pause(gw_upstream *u, int pause) {
  if (u->done || !u->conn || !u->connected || u->paused == pause) return;
  u->paused = pause;
  if (pause) {
    uv_read_stop((uv_stream_t *)&u->conn->tcp);
    gw_timer_clear(&u->timer);
  } else {
    uv_read_start((uv_stream_t *)&u->conn->tcp, on_alloc, on_read);
    gw_timer_set(&u->timer, on_timeout, u->t.idle_ms);
  }
}

void gw_upstream_cancel(gw_upstream *u) {
  if (!u || u->done) return;
  if (u->conn) conn_close(u->conn);
  u->conn = NULL;
  release(u);
}

/* --- the exchange -------------------------------------------------------- */

static void on_timeout(uv_timer_t *t);
static void connect_new(gw_upstream *u);

/* Reports e from the timer, never from inside gw_upstream_start. */
static void fail_soon(gw_upstream *u, gw_upstream_error e, const char *detail) {
  u->deferred = e;
  u->deferred_detail = detail;
  gw_timer_set(&u->timer, on_timeout, 0);
}

/* A send that failed.  written: some bytes may have left (a queued write
 * failed); else the socket refused the first byte.  A GET on a reused
 * connection is sent again on a fresh one; a POST is the caller's call. */
static void send_failed(gw_upstream *u, int status, int written) {
  if (u->idempotent && u->reused && !u->got_bytes) {
    connect_new(u);
    return;
  }
  snprintf(u->detail, sizeof u->detail, "sending the request: %s", uv_strerror(status));
  if (written)
    finish(u, GW_UP_CLOSED, u->detail);
  else
    fail_soon(u, GW_UP_NOT_SENT, u->detail);
}

static void on_written(uv_stream_t *s, int status, void *data) {
  (void)data;
  gw_uconn *c = s->data;
  if (status < 0 && !c->closed && c->u) send_failed(c->u, status, 1);
}

static void send_request(gw_upstream *u) {
  gw_uconn *c = u->conn;
  http_parser_init(&c->parser, HTTP_RESPONSE);
  c->parser.data = c;
  gw_timer_set(&u->timer, on_timeout, u->t.first_byte_ms);
  uv_buf_t b[2] = {uv_buf_init(u->request.data, (unsigned)u->request.len),
                   uv_buf_init((char *)u->body, (unsigned)u->body_len)};
  int rc = gw_write_kept((uv_stream_t *)&c->tcp, b, u->body_len ? 2 : 1, on_written, NULL);
  if (rc) send_failed(u, rc, 0);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  lupin_gateway *gw = ((gw_uconn *)h->data)->ep->gw;
  *buf = uv_buf_init(gw->read_buf, sizeof gw->read_buf);
}

static void on_eof(gw_upstream *u, ssize_t nread) {
  gw_uconn *c = u->conn;
  if (nread == UV_EOF) http_parser_execute(&c->parser, &response_settings, NULL, 0);
  if (u->complete) {
    u->keep_alive = 0;
    finish(u, GW_UP_OK, NULL);
  } else if (u->idempotent && u->reused && !u->got_bytes) {
    connect_new(u); /* the server had closed the idle connection */
  } else if (!u->got_bytes) {
    snprintf(u->detail, sizeof u->detail,
             "the endpoint closed the connection without answering (%s)", uv_strerror((int)nread));
    finish(u, GW_UP_CLOSED, u->detail);
  } else {
    snprintf(u->detail, sizeof u->detail,
             "the endpoint closed the connection before the "
             "response ended (%s)",
             uv_strerror((int)nread));
    finish(u, GW_UP_BROKEN, u->detail);
  }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  gw_uconn *c = s->data;
  gw_upstream *u = c->u;
  if (!u) { /* idle: the server closed it or spoke out of turn */
    if (nread != 0) conn_close(c);
  } else if (nread < 0) {
    on_eof(u, nread);
  } else if (nread > 0) {
    u->got_bytes = 1;
    if (!u->paused) gw_timer_set(&u->timer, on_timeout, u->t.idle_ms);
    size_t n = http_parser_execute(&c->parser, &response_settings, buf->base, (size_t)nread);
    enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
    if (!u->done && u->complete) {
      if (n < (size_t)nread - 1) u->keep_alive = 0; /* bytes past the response */
      finish(u, GW_UP_OK, NULL);
    } else if (!u->done && u->refused) {
      finish(u, GW_UP_BROKEN, u->detail);
    } else if (!u->done && e != HPE_OK) {
      snprintf(u->detail, sizeof u->detail, "malformed response: %s", http_errno_description(e));
      finish(u, GW_UP_BROKEN, u->detail);
    }
    if (!u->done && u->cb.on_read_end) u->cb.on_read_end(u->ud);
  }
}

static void connect_addr(gw_upstream *u);

/* The next of the endpoint's addresses, if one is left and time is. */
static int connect_next(gw_upstream *u) {
  uint64_t spent = uv_now(u->ep->gw->loop) - u->connect_start;
  if (!gw_endpoint_addr(u->ep, u->addr_try + 1) || spent >= u->t.connect_ms) return 0;
  conn_close(u->conn);
  u->conn = NULL;
  u->addr_try++;
  connect_addr(u);
  return 1;
}

static void on_connect(uv_connect_t *r, int status) {
  gw_uconn *c = r->data;
  gw_upstream *u = c->u;
  if (!u || c->closed) return; /* given up on (timeout, cancel) */
  if (status < 0) {
    if (connect_next(u)) return;
    gw_endpoint_refresh_addrs(u->ep, 1);
    if (u->addr_try)
      snprintf(u->detail, sizeof u->detail, "%s (each of its %d addresses)", uv_strerror(status),
               u->addr_try + 1);
    else
      snprintf(u->detail, sizeof u->detail, "%s", uv_strerror(status));
    finish(u, GW_UP_CONNECT, u->detail);
    return;
  }
  gw_endpoint_addr_worked(u->ep, u->addr_try);
  u->connected = 1;
  uv_tcp_nodelay(&c->tcp, 1);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  send_request(u);
}

static void connect_new(gw_upstream *u) {
  if (u->conn) conn_close(u->conn);
  u->conn = NULL;
  u->reused = u->connected = u->got_bytes = u->complete = 0;
  lh_headers_clear(&u->headers);
  u->interim = u->refused = 0;
  u->addr_try = 0;
  u->connect_start = uv_now(u->ep->gw->loop);
  gw_endpoint_refresh_addrs(u->ep, 0);
  connect_addr(u);
}

/* Connects to the addr_try-th address, with its share of connectTimeoutMs
 * left, so one address that never answers does not starve the others. */
static void connect_addr(gw_upstream *u) {
  gw_endpoint *ep = u->ep;
  const struct sockaddr *addr = gw_endpoint_addr(ep, u->addr_try);
  if (!addr) {
    gw_endpoint_refresh_addrs(ep, 1);
    fail_soon(u, GW_UP_CONNECT, "the endpoint's address could not be resolved");
    return;
  }
  gw_uconn *c = calloc(1, sizeof *c);
  if (!c) {
    fail_soon(u, GW_UP_CONNECT, "out of memory");
    return;
  }
  c->ep = ep;
  c->pool = u->idempotent ? GW_POOL_AUX : GW_POOL_GEN;
  gw_endpoint_ref(ep);
  uv_tcp_init(ep->gw->loop, &c->tcp);
  c->tcp.data = c->connect.data = c;
  c->u = u;
  u->conn = c;
  uint64_t spent = uv_now(ep->gw->loop) - u->connect_start;
  uint64_t left = u->t.connect_ms > spent ? u->t.connect_ms - spent : 1;
  int untried = ep->n_addrs - u->addr_try;
  gw_timer_set(&u->timer, on_timeout, untried > 1 ? left / (uint64_t)untried + 1 : left);
  int rc = uv_tcp_connect(&c->connect, &c->tcp, addr, on_connect);
  if (rc) {
    snprintf(u->detail, sizeof u->detail, "%s", uv_strerror(rc));
    fail_soon(u, GW_UP_CONNECT, u->detail);
  }
}

static void on_timeout(uv_timer_t *t) {
  gw_upstream *u = t->data;
  if (u->deferred) {
    finish(u, u->deferred, u->deferred_detail);
  } else if (!u->connected) {
    if (connect_next(u)) return;
    finish(u, GW_UP_CONNECT_TIMEOUT, "no connection within connectTimeoutMs");
  } else if (!u->got_bytes) {
    finish(u, GW_UP_FIRST_BYTE_TIMEOUT, gw_upstream_error_text(GW_UP_FIRST_BYTE_TIMEOUT));
  } else {
    finish(u, GW_UP_IDLE_TIMEOUT, gw_upstream_error_text(GW_UP_IDLE_TIMEOUT));
  }
}

static int serialize(gw_upstream *u, const char *method, const char *path, const lupin_header *h,
                     size_t n, const char *body, size_t len) {
  lh_buf *b = &u->request;
  b->len = 0;
  int rc = lh_buf_str(b, method) || lh_buf_append(b, " ", 1) || lh_buf_str(b, path) ||
           lh_buf_str(b, " HTTP/1.1\r\n") || lh_buf_header(b, "host", u->ep->hostport);
  for (size_t i = 0; i < n; i++)
    if (!lh_hop_by_hop(h[i].name)) rc |= lh_buf_header(b, h[i].name, h[i].value);
  if (body || strcmp(method, "GET"))
    rc |= lh_buf_str(b, "content-length: ") || lh_buf_uint(b, len) || lh_buf_append(b, "\r\n", 2);
  if (!u->ep->gw->set.pool_size) rc |= lh_buf_str(b, "connection: close\r\n");
  if (!rc) rc = lh_buf_append(b, "\r\n", 2);
  u->body = body;
  u->body_len = len;
  return rc;
}

gw_upstream *gw_upstream_start(gw_endpoint *ep, const char *method, const char *path,
                               const lupin_header *head, size_t n, const char *body, size_t len,
                               gw_timeouts t, const gw_upstream_cb *cb, void *ud) {
  gw_upstream *u = upstream_new(ep->gw);
  if (!u) return NULL;
  u->ep = ep;
  u->t = t;
  u->cb = *cb;
  u->ud = ud;
  u->idempotent = !strcmp(method, "GET");
  if (serialize(u, method, path, head, n, body, len)) {
    upstream_free(u);
    return NULL;
  }
  gw_endpoint_ref(ep);
  ep->gw->n_upstreams++;
  gw_timer_init(ep->gw->loop, &u->timer, u);
  gw_uconn *c = pool_take(ep, u->idempotent ? GW_POOL_AUX : GW_POOL_GEN);
  if (c) {
    c->u = u;
    u->conn = c;
    u->reused = u->connected = 1;
    send_request(u);
  } else {
    connect_new(u);
  }
  return u;
}

/* --- response parsing ---------------------------------------------------- */

static int on_header_field(http_parser *p, const char *at, size_t len) {
  gw_upstream *u = ((gw_uconn *)p->data)->u;
  if (u->headers.in_value && u->headers.n >= LH_MAX_HEADERS) {
    u->refused = 1;
    snprintf(u->detail, sizeof u->detail, "the endpoint answered more than %d headers",
             LH_MAX_HEADERS);
    return -1;
  }
  /* whitespace in a field name: a malformed response, not a second
   * content-length relayed beside ours */
  return lh_headers_field(&u->headers, at, len) ? -1 : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  gw_upstream *u = ((gw_uconn *)p->data)->u;
  return lh_headers_value(&u->headers, at, len);
}

/* A 1xx other than 101 is an interim answer (100 Continue, 103 Early
 * Hints): skipped, the final response follows on the same connection.  101
 * would hand the connection over to another protocol, which the gateway does
 * not relay; a status outside 100..599 is no HTTP status.  204 and 304 have
 * no body whatever their headers say (RFC 9112 §6.3): returning 1 tells
 * http_parser to read none. */
static int on_headers_complete(http_parser *p) {
  gw_upstream *u = ((gw_uconn *)p->data)->u;
  int status = p->status_code;
  if (status < 100 || status > 599 || status == 101) {
    u->refused = 1;
    snprintf(u->detail, sizeof u->detail, "%s %d",
             status == 101 ? "the endpoint switched protocols, which is not relayed: status"
                           : "the endpoint answered an invalid HTTP status",
             status);
    return -1;
  }
  if (status < 200) {
    u->interim = 1;
    lh_headers_clear(&u->headers);
    return 1;
  }
  int bodiless = status == 204 || status == 304;
  int64_t cl = bodiless ? 0
               : p->content_length == ULLONG_MAX || (p->flags & F_CHUNKED)
                   ? -1
                   : (int64_t)p->content_length;
  if (u->cb.on_headers) u->cb.on_headers(u->ud, status, &u->headers, cl);
  return u->done ? -1 : bodiless;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  gw_upstream *u = ((gw_uconn *)p->data)->u;
  if (u->cb.on_body) u->cb.on_body(u->ud, at, len);
  return u->done ? -1 : 0;
}

static int on_message_complete(http_parser *p) {
  gw_upstream *u = ((gw_uconn *)p->data)->u;
  if (u->interim) { /* the final response is next */
    u->interim = 0;
    return 0;
  }
  u->complete = 1;
  u->keep_alive = http_should_keep_alive(p);
  http_parser_pause(p, 1); /* nothing after the response belongs to us */
  return 0;
}

static const http_parser_settings response_settings = {
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

int gw_upstream_reused(const gw_upstream *u) { return u->reused; }
