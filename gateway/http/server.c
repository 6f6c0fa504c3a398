/* The client side: an HTTP/1.1 server on libuv.  Accepts, parses requests
 * with http_parser, enforces the header and body limits and the header read
 * timeout, hands each full request to a handler and writes its response,
 * keeping the connection alive between requests.
 *
 * A connection runs one request at a time: bytes that arrive while a response
 * is in progress (pipelining) wait in `pending` with the parser paused. */
#include "http/http.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

struct gw_server {
  lupin_gateway *gw;
  uv_tcp_t tcp;
  gw_handler handler;
  void *ud;
  gw_conn *conns;
  size_t n_conns;
  int closing;
  int listener_open;
  uint64_t started_ns; /* tells generated request ids of two runs apart */
  unsigned long long id_seq;
  /* A connection there was no memory for is still accepted (libuv polls a
   * listener again only once its pending connection is taken), answered
   * 503 if the socket takes it at once, and closed, on this handle. */
  uv_tcp_t refused;
  int refusing;       /* refused is in use until its close callback */
  int accept_waiting; /* a connection waits for refused to be free */
};

struct gw_conn {
  uv_tcp_t tcp;
  gw_timer timer;
  uv_shutdown_t shutdown;
  gw_server *srv;
  http_parser parser;
  gw_http_request req;
  lh_buf url;
  size_t header_bytes;
  int fail_status; /* set by a parser callback that refused the request */
  const char *fail_msg;
  int ready;      /* a full request is parsed, not yet handed over */
  int busy;       /* the handler owns the response */
  int keep_alive; /* of the current request */
  int chunked;    /* the current response uses chunked encoding */
  int closing;    /* shutting down after the last write */
  int closed;
  int handles; /* open libuv handles; freed at 0 */
  lh_buf pending;
  lh_buf head; /* a response head not yet written (gw_conn_start) */
  lh_buf out;  /* what a corked connection has to write (gw_conn_cork) */
  int corked;
  gw_abort_fn abort_fn;
  void *owner;
  gw_abort_fn drain_fn;
  void *drain_owner;
  /* memory bounds: this connection's share of the gateway's totals */
  int in_flight;      /* its request counts in gw->in_flight */
  size_t body_bytes;  /* its request body bytes counted in gw->body_bytes */
  int paused;         /* reading stopped: enough pipelined bytes are waiting */
  char fail_buf[256]; /* a refusal's message naming a setting */
  gw_conn *prev, *next;
  char request_id[48]; /* made for an answer the client sent no id for */
};

static const http_parser_settings parser_settings;

const char *gw_status_text(int status) {
  switch (status) {
  case 200:
    return "OK";
  case 400:
    return "Bad Request";
  case 401:
    return "Unauthorized";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 408:
    return "Request Timeout";
  case 413:
    return "Payload Too Large";
  case 429:
    return "Too Many Requests";
  case 431:
    return "Request Header Fields Too Large";
  case 500:
    return "Internal Server Error";
  case 502:
    return "Bad Gateway";
  case 503:
    return "Service Unavailable";
  case 504:
    return "Gateway Timeout";
  default:
    return status < 300 ? "OK" : status < 500 ? "Client Error" : "Server Error";
  }
}

/* --- memory bounds -------------------------------------------------------- */

/* The caps apply to the public listener only: the admin API stays reachable
 * when the gateway is full. */
static int capped(const gw_conn *c) { return c->srv == c->srv->gw->server; }

static void count_in_flight(gw_conn *c, int on) {
  if (c->in_flight == on) return;
  c->in_flight = on;
  lupin_gateway *gw = c->srv->gw;
  gw->in_flight += on ? 1 : (size_t)-1;
  __atomic_add_fetch(&gw->totals->in_flight, on ? 1 : (size_t)-1, __ATOMIC_RELAXED);
}

static void count_body(gw_conn *c, int64_t delta) {
  lupin_gateway *gw = c->srv->gw;
  c->body_bytes += (size_t)delta;
  gw->body_bytes += (uint64_t)delta;
  __atomic_add_fetch(&gw->totals->body_bytes, (uint64_t)delta, __ATOMIC_RELAXED);
}

static void uncount_body(gw_conn *c) { count_body(c, -(int64_t)c->body_bytes); }

/* The process's body bytes (every worker's). */
static uint64_t body_total(const lupin_gateway *gw) {
  return __atomic_load_n(&gw->totals->body_bytes, __ATOMIC_RELAXED);
}

/* A request over a cap: 503, naming the cap and its setting. */
static const char *over_cap(gw_conn *c, size_t more) {
  lupin_gateway *gw = c->srv->gw;
  if (!capped(c)) return NULL;
  size_t in_flight = __atomic_load_n(&gw->totals->in_flight, __ATOMIC_RELAXED);
  if (in_flight >= gw->set.max_requests_in_flight) {
    gw->refused_in_flight++;
    snprintf(c->fail_buf, sizeof c->fail_buf,
             "the gateway is at its cap of %zu requests in flight (gateway.maxRequestsInFlight "
             "= %llu): retry later",
             in_flight, (unsigned long long)gw->set.max_requests_in_flight);
    return c->fail_buf;
  }
  if (more && body_total(gw) + more > gw->set.max_buffered_body_bytes) {
    gw->refused_body_bytes++;
    snprintf(c->fail_buf, sizeof c->fail_buf,
             "the gateway holds %llu bytes of request bodies and this one would pass its cap "
             "(gateway.maxBufferedBodyBytes = %llu): retry later",
             (unsigned long long)body_total(gw),
             (unsigned long long)gw->set.max_buffered_body_bytes);
    return c->fail_buf;
  }
  return NULL;
}

/* --- closing ------------------------------------------------------------- */

/* A small body's buffer, a small corked response's and the header texts'
 * first block stay for the connection's next request; big buffers go. */
enum { KEPT_BUFFER_BYTES = 4096 };

static void reset_request(gw_conn *c) {
  uncount_body(c);
  lh_headers_clear(&c->req.headers);
  if (c->req.body.cap > KEPT_BUFFER_BYTES) lh_buf_free(&c->req.body);
  c->req.body.len = 0;
  if (c->req.body.data) c->req.body.data[0] = 0;
  c->url.len = 0;
  if (c->url.data) c->url.data[0] = 0;
  c->req.url = c->url.data ? c->url.data : "";
  c->header_bytes = 0;
  c->request_id[0] = 0;
}

static void on_close(uv_handle_t *h) {
  gw_conn *c = h->data;
  if (--c->handles) return;
  gw_server *s = c->srv;
  if (c->abort_fn) { /* closed under its owner (a write found no memory): the owner lets go */
    gw_abort_fn fn = c->abort_fn;
    c->abort_fn = NULL;
    c->busy = 0;
    fn(c->owner);
  }
  if (c->prev)
    c->prev->next = c->next;
  else
    s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  count_in_flight(c, 0);
  reset_request(c);
  lh_headers_free(&c->req.headers);
  lh_buf_free(&c->req.body);
  lh_buf_free(&c->url);
  lh_buf_free(&c->pending);
  lh_buf_free(&c->head);
  lh_buf_free(&c->out);
  free(c);
  gw_check_drained(s->gw); /* a closed connection may be what a drain waits for */
}

static void close_now(gw_conn *c) {
  if (c->closed) return;
  c->closed = 1;
  c->drain_fn = NULL;
  uv_close((uv_handle_t *)&c->tcp, on_close);
  uv_close((uv_handle_t *)&c->timer.handle, on_close);
}

static void on_shutdown(uv_shutdown_t *r, int status) {
  gw_conn *c = r->data;
  if (status < 0) close_now(c);
  /* otherwise wait for the client's EOF (or the timer): closing a socket with
   * unread input resets it, and the client could lose our answer */
}

static void on_timer(uv_timer_t *t) {
  gw_conn *c = t->data;
  if (c->closing || c->busy) {
    close_now(c);
    return;
  }
  if (c->parser.nread || c->url.len || c->req.headers.n) {
    c->keep_alive = 0;
    c->busy = 1;
    gw_conn_error(c, 408, "timed out reading the request: send it within headerTimeoutMs", NULL,
                  NULL, 0);
    return;
  }
  close_now(c); /* an idle keep-alive connection */
}

/* Ends the connection after what was written has left. */
static void close_after_writes(gw_conn *c) {
  if (c->closing || c->closed) return;
  gw_conn_uncork(c);
  c->closing = 1;
  c->shutdown.data = c;
  gw_timer_set(&c->timer, on_timer, c->srv->gw->set.header_timeout_ms);
  if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown)) close_now(c);
}

/* --- writing ------------------------------------------------------------- */

/* Tells the one waiting for the client to catch up once nothing is left
 * queued or gathered. */
static void check_drained(gw_conn *c) {
  if (c->drain_fn && !c->tcp.write_queue_size && !c->out.len) {
    gw_abort_fn fn = c->drain_fn;
    c->drain_fn = NULL;
    fn(c->drain_owner);
  }
}

static void on_written(uv_stream_t *s, int status, void *data) {
  (void)status; /* a failed write shows up as a read error too */
  (void)data;
  check_drained(s->data);
}

size_t gw_conn_backlog(const gw_conn *c) { return c->tcp.write_queue_size + c->out.len; }

void gw_conn_on_drain(gw_conn *c, gw_abort_fn fn, void *owner) {
  c->drain_fn = fn;
  c->drain_owner = owner;
}

/* Sends the response head held back by gw_conn_start first, in the same
 * write: one system call per reply instead of two.  A corked connection
 * gathers the bytes instead, for one write when it is uncorked. */
static void write_bufs(gw_conn *c, const uv_buf_t *parts, unsigned n) {
  if (c->closed) {
    c->head.len = 0;
    return;
  }
  uv_buf_t all[4];
  unsigned k = 0;
  if (c->head.len) all[k++] = uv_buf_init(c->head.data, (unsigned)c->head.len);
  for (unsigned i = 0; i < n && k < 4; i++)
    all[k++] = parts[i];
  int rc = 0;
  if (c->corked) {
    for (unsigned i = 0; i < k && !rc; i++)
      rc = lh_buf_append(&c->out, all[i].base, all[i].len) ? UV_ENOMEM : 0;
  } else {
    rc = gw_write((uv_stream_t *)&c->tcp, all, k, on_written, NULL);
  }
  c->head.len = 0;
  if (rc == UV_ENOMEM) close_now(c);
}

void gw_conn_cork(gw_conn *c) { c->corked = 1; }

void gw_conn_uncork(gw_conn *c) {
  if (!c->corked) return;
  c->corked = 0;
  if (!c->out.len) return;
  int rc = 0;
  if (!c->closed) {
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    rc = gw_write((uv_stream_t *)&c->tcp, &b, 1, on_written, NULL);
  }
  if (c->out.cap > KEPT_BUFFER_BYTES) lh_buf_free(&c->out);
  c->out.len = 0;
  if (rc == UV_ENOMEM) {
    close_now(c);
    return;
  }
  check_drained(c); /* all of it taken at once: on_written will not run */
}

static void flush_head(gw_conn *c) {
  if (c->head.len) write_bufs(c, NULL, 0);
}

/* The head of a response with a length waits for its first body bytes (or
 * its end), which usually come in the same read from upstream: they leave
 * together.  A chunked (streamed) response's head leaves at once, so a client
 * sees the status before the first token. */
void gw_conn_start(gw_conn *c, int status, const lupin_header *h, size_t n,
                   int64_t content_length) {
  lh_buf *head = &c->head;
  int keep = c->keep_alive && !c->srv->closing;
  c->keep_alive = keep;
  head->len = 0;
  int rc = lh_buf_str(head, "HTTP/1.1 ") || lh_buf_uint(head, (unsigned)status) ||
           lh_buf_append(head, " ", 1) || lh_buf_str(head, gw_status_text(status)) ||
           lh_buf_append(head, "\r\n", 2);
  for (size_t i = 0; i < n; i++)
    if (!lh_hop_by_hop(h[i].name)) rc |= lh_buf_header(head, h[i].name, h[i].value);
  /* 204 and 304 carry no body and no framing (RFC 9110 §8.6, §15.3.5) */
  int bodiless = status == 204 || status == 304;
  c->chunked = content_length < 0 && !bodiless;
  if (c->chunked) {
    rc |= lh_buf_str(head, "transfer-encoding: chunked\r\n");
  } else if (!bodiless) {
    rc |= lh_buf_str(head, "content-length: ") ||
          lh_buf_uint(head, (unsigned long long)content_length) || lh_buf_append(head, "\r\n", 2);
  }
  rc |= lh_buf_str(head, keep ? "connection: keep-alive\r\n\r\n" : "connection: close\r\n\r\n");
  if (rc) {
    head->len = 0;
    close_now(c);
    return;
  }
  if (c->chunked) flush_head(c);
}

void gw_conn_write(gw_conn *c, const char *data, size_t len) {
  if (!len) return; /* an empty chunk would end a chunked body */
  if (!c->chunked) {
    uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
    write_bufs(c, &b, 1);
    return;
  }
  char size[20];
  int k = sizeof size - 2;
  memcpy(size + k, "\r\n", 2);
  for (size_t v = len; v; v >>= 4)
    size[--k] = "0123456789abcdef"[v & 15];
  uv_buf_t parts[3] = {uv_buf_init(size + k, (unsigned)(sizeof size - (size_t)k)),
                       uv_buf_init((char *)data, (unsigned)len), uv_buf_init("\r\n", 2)};
  write_bufs(c, parts, 3);
}

static void feed(gw_conn *c, const char *data, size_t len);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void response_done(gw_conn *c) {
  c->busy = 0;
  count_in_flight(c, 0);
  c->drain_fn = NULL;
  c->abort_fn = NULL;
  c->owner = NULL;
  reset_request(c);
  if (!c->keep_alive || c->srv->closing || c->closed) {
    close_after_writes(c);
    return;
  }
  gw_timer_set(&c->timer, on_timer, c->srv->gw->set.header_timeout_ms);
  http_parser_pause(&c->parser, 0);
  if (c->pending.len) {
    lh_buf p = c->pending;
    c->pending = (lh_buf){0};
    feed(c, p.data, p.len);
    lh_buf_free(&p);
  }
  if (c->paused && !c->closing && !c->closed &&
      c->pending.len <= c->srv->gw->set.max_header_bytes) {
    c->paused = 0;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  }
}

void gw_conn_end(gw_conn *c) {
  if (c->chunked) {
    uv_buf_t b = uv_buf_init("0\r\n\r\n", 5);
    write_bufs(c, &b, 1);
  }
  flush_head(c);
  gw_conn_uncork(c);
  response_done(c);
}

void gw_conn_abort(gw_conn *c) {
  flush_head(c); /* the client sees the response start, then the close */
  gw_conn_uncork(c);
  c->drain_fn = NULL;
  c->keep_alive = 0;
  c->busy = 0;
  count_in_flight(c, 0);
  c->abort_fn = NULL;
  close_after_writes(c);
}

void gw_conn_respond(gw_conn *c, int status, const lupin_header *h, size_t n, const char *body,
                     size_t len) {
  gw_conn_start(c, status, h, n, (int64_t)len);
  gw_conn_write(c, body, len);
  gw_conn_end(c);
}

/* Generated ids: the listener's start time, the worker, a count (each
 * worker counts its own). */
const char *gw_conn_request_id(gw_conn *c) {
  const char *id = lh_headers_get(&c->req.headers, "x-request-id");
  if (id && *id) return id;
  if (!c->request_id[0])
    snprintf(c->request_id, sizeof c->request_id, "gw-%llx-%d-%llu",
             (unsigned long long)c->srv->started_ns, c->srv->gw->worker, ++c->srv->id_seq);
  return c->request_id;
}

void gw_conn_error(gw_conn *c, int status, const char *message, const char *param,
                   const lupin_header *h, size_t n) {
  lh_buf b = {0};
  lh_openai_error(&b, status, message, param);
  lupin_header all[8]; /* callers pass three headers at most */
  if (n > 6) n = 6;
  size_t k = 0;
  all[k++] = (lupin_header){"content-type", "application/json"};
  int has_id = 0;
  for (size_t i = 0; i < n; i++) {
    has_id |= lh_name_is(h[i].name, "x-request-id");
    all[k++] = h[i];
  }
  /* every answer names its request, errors before the runtime included */
  if (!has_id) all[k++] = (lupin_header){"x-request-id", gw_conn_request_id(c)};
  gw_conn_respond(c, status, all, k, b.data ? b.data : "", b.len);
  lh_buf_free(&b);
}

void gw_conn_on_abort(gw_conn *c, gw_abort_fn fn, void *owner) {
  c->abort_fn = fn;
  c->owner = owner;
}

/* --- parsing ------------------------------------------------------------- */

static int refuse(gw_conn *c, int status, const char *msg) {
  c->fail_status = status;
  c->fail_msg = msg;
  return -1;
}

/* A buffer of this request's could not grow: this request is answered,
 * the gateway goes on. */
static int out_of_memory(gw_conn *c) {
  return refuse(c, 503, "the gateway could not allocate memory for this request: retry later");
}

static int count_header(gw_conn *c, size_t len) {
  c->header_bytes += len;
  if (c->header_bytes > c->srv->gw->set.max_header_bytes)
    return refuse(c, 431,
                  "the request line and headers are larger than maxHeaderBytes: send fewer or "
                  "smaller headers");
  return 0;
}

static int on_message_begin(http_parser *p) {
  gw_conn *c = p->data;
  reset_request(c);
  c->req.started = lupin_now();
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  gw_conn *c = p->data;
  if (count_header(c, len)) return -1;
  if (lh_buf_append(&c->url, at, len)) return out_of_memory(c);
  c->req.url = c->url.data;
  return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
  gw_conn *c = p->data;
  if (count_header(c, len)) return -1;
  if (c->req.headers.in_value && c->req.headers.n >= LH_MAX_HEADERS) {
    snprintf(c->fail_buf, sizeof c->fail_buf,
             "the request has more than %d headers, the most the gateway takes: send fewer",
             LH_MAX_HEADERS);
    return refuse(c, 431, c->fail_buf);
  }
  int rc = lh_headers_field(&c->req.headers, at, len);
  if (rc == 1) {
    c->fail_status = 400;
    c->fail_msg = "malformed HTTP request: whitespace in a header field name";
  }
  return rc == -1 ? out_of_memory(c) : rc ? -1 : 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  gw_conn *c = p->data;
  if (count_header(c, len)) return -1;
  return lh_headers_value(&c->req.headers, at, len) ? out_of_memory(c) : 0;
}

static const char too_large[] = "the request body is larger than maxBodyBytes: send a smaller "
                                "body or raise gateway.maxBodyBytes in the config";

static int on_headers_complete(http_parser *p) {
  gw_conn *c = p->data;
  c->req.method = p->method;
  gw_timer_set(&c->timer, on_timer, c->srv->gw->set.header_timeout_ms);
  if (p->content_length != ULLONG_MAX && p->content_length > c->srv->gw->set.max_body_bytes)
    return refuse(c, 413, too_large);
  int sized = p->content_length != ULLONG_MAX;
  const char *full = over_cap(c, sized ? p->content_length : 0);
  if (full) return refuse(c, 503, full);
  if (sized && capped(c)) { /* held from now: a body that fits is never cut short */
    count_body(c, (int64_t)p->content_length);
    lh_buf_reserve(&c->req.body, p->content_length); /* what is counted, not up to twice */
  }
  const char *expect = lh_headers_get(&c->req.headers, "expect");
  if (expect && !strcasecmp(expect, "100-continue")) {
    uv_buf_t b = uv_buf_init("HTTP/1.1 100 Continue\r\n\r\n", 25);
    write_bufs(c, &b, 1);
  }
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  gw_conn *c = p->data;
  if (c->req.body.len + len > c->srv->gw->set.max_body_bytes) return refuse(c, 413, too_large);
  lupin_gateway *gw = c->srv->gw;
  size_t more = c->req.body.len + len > c->body_bytes ? c->req.body.len + len - c->body_bytes : 0;
  if (capped(c) && more && body_total(gw) + more > gw->set.max_buffered_body_bytes)
    return refuse(c, 503, over_cap(c, more)); /* a chunked body grew past the cap */
  /* headerTimeoutMs runs between body pieces: a big body may take longer */
  gw_timer_set(&c->timer, on_timer, gw->set.header_timeout_ms);
  if (lh_buf_append(&c->req.body, at, len)) return out_of_memory(c);
  if (capped(c)) count_body(c, (int64_t)more);
  return 0;
}

static int on_message_complete(http_parser *p) {
  gw_conn *c = p->data;
  gw_timer_clear(&c->timer);
  c->keep_alive = http_should_keep_alive(p);
  if (!c->req.body.data && lh_buf_append(&c->req.body, "", 0)) return out_of_memory(c);
  c->ready = 1;
  http_parser_pause(p, 1); /* one request at a time */
  return 0;
}

static const http_parser_settings parser_settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void refuse_connection(gw_conn *c, enum http_errno e) {
  char msg[256];
  int status = c->fail_status;
  const char *text = c->fail_msg;
  if (!status && e == HPE_HEADER_OVERFLOW) {
    status = 431;
    text = "the request headers are too large";
  }
  if (!status) {
    status = 400;
    snprintf(msg, sizeof msg, "malformed HTTP request: %s", http_errno_description(e));
    text = msg;
  }
  c->keep_alive = 0;
  c->busy = 1;
  lupin_header retry = {"retry-after", "1"};
  gw_conn_error(c, status, text, NULL, &retry, status == 503);
}

static void feed(gw_conn *c, const char *data, size_t len) {
  size_t n = http_parser_execute(&c->parser, &parser_settings, data, len);
  enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
  if (e == HPE_PAUSED || c->ready) {
    /* pipelined bytes that found no room: this answer is the last */
    if (n < len && lh_buf_append(&c->pending, data + n, len - n)) c->keep_alive = 0;
    c->ready = 0;
    c->busy = 1;
    const char *full = over_cap(c, 0); /* others may have begun since its headers */
    if (full) {
      lupin_header retry = {"retry-after", "1"};
      gw_conn_error(c, 503, full, NULL, &retry, 1);
      return;
    }
    if (capped(c)) count_in_flight(c, 1);
    c->srv->handler(c->srv->ud, c, &c->req);
    return;
  }
  if (e != HPE_OK) refuse_connection(c, e);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  lupin_gateway *gw = ((gw_conn *)h->data)->srv->gw;
  *buf = uv_buf_init(gw->read_buf, sizeof gw->read_buf);
}

/* The client went away (or its connection failed). */
static void conn_gone(gw_conn *c) {
  count_in_flight(c, 0);
  if (c->busy && c->abort_fn) {
    gw_abort_fn fn = c->abort_fn;
    c->abort_fn = NULL;
    c->busy = 0;
    fn(c->owner);
  }
  close_now(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  gw_conn *c = s->data;
  if (nread < 0) {
    conn_gone(c);
  } else if (nread > 0 && !c->closing) {
    if (c->busy || c->ready) {
      /* pipelined bytes wait while a response is in progress; past
       * maxHeaderBytes of them, stop reading (TCP holds the rest back) */
      if (lh_buf_append(&c->pending, buf->base, (size_t)nread)) {
        conn_gone(c);
      } else if (c->pending.len > c->srv->gw->set.max_header_bytes && !c->paused) {
        c->paused = 1;
        uv_read_stop(s);
      }
    } else {
      feed(c, buf->base, (size_t)nread);
    }
  }
}

static void on_connection(uv_stream_t *ls, int status);

static void on_refused_closed(uv_handle_t *h) {
  gw_server *s = h->data;
  s->refusing = 0;
  s->n_conns--;
  if (s->accept_waiting && !s->closing) {
    s->accept_waiting = 0;
    on_connection((uv_stream_t *)&s->tcp, 0);
  }
  gw_check_drained(s->gw);
}

/* No memory for a connection: take it off the listener all the same (else
 * libuv would stop polling the listener for good), answer 503 when the
 * socket takes the answer at once (no memory needed), close it. */
static void refuse_connection_no_memory(gw_server *s) {
  static const char body[] =
      "{\"error\":{\"message\":\"the gateway is out of memory: retry later\",\"type\":"
      "\"server_error\",\"param\":null,\"code\":null}}\n";
  char head[192];
  if (s->refusing) { /* the handle is busy until its close callback: then */
    s->accept_waiting = 1;
    return;
  }
  s->refusing = 1;
  s->n_conns++; /* a drain waits for it too */
  uv_tcp_init(s->gw->loop, &s->refused);
  s->refused.data = s;
  if (!uv_accept((uv_stream_t *)&s->tcp, (uv_stream_t *)&s->refused)) {
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                     "retry-after: 1\r\nconnection: close\r\ncontent-length: %zu\r\n\r\n",
                     sizeof body - 1);
    uv_buf_t b[2] = {uv_buf_init(head, (unsigned)n), uv_buf_init((char *)body, sizeof body - 1)};
    uv_try_write((uv_stream_t *)&s->refused, b, 2);
  }
  uv_close((uv_handle_t *)&s->refused, on_refused_closed);
}

static void on_connection(uv_stream_t *ls, int status) {
  gw_server *s = ls->data;
  if (status < 0 || s->closing) return;
  gw_conn *c = calloc(1, sizeof *c);
  if (!c) {
    refuse_connection_no_memory(s);
    return;
  }
  c->srv = s;
  uv_tcp_init(s->gw->loop, &c->tcp);
  gw_timer_init(s->gw->loop, &c->timer, c);
  c->tcp.data = c;
  c->handles = 2;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  if (uv_accept(ls, (uv_stream_t *)&c->tcp)) {
    close_now(c);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  reset_request(c);
  gw_timer_set(&c->timer, on_timer, s->gw->set.header_timeout_ms);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* --- the listener -------------------------------------------------------- */

int gw_parse_hostport(const char *hp, struct sockaddr_storage *ss, char *err, size_t errlen) {
  char host[256];
  const char *colon = strrchr(hp, ':');
  if (!colon || colon == hp || (size_t)(colon - hp) >= sizeof host) {
    lh_errf(err, errlen, "%s: give an address as host:port, e.g. 127.0.0.1:8080", hp);
    return -1;
  }
  memcpy(host, hp, (size_t)(colon - hp));
  host[colon - hp] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 0 || port > 65535) {
    lh_errf(err, errlen, "%s: bad port", hp);
    return -1;
  }
  if (host[0] == '[') { /* [::1]:8080 */
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = 0;
  }
  if (gw_resolve(host, (int)port, ss)) {
    lh_errf(err, errlen, "%s: cannot resolve %s", hp, host);
    return -1;
  }
  return 0;
}

/* Workers listen on one socket: each loop polls it, and whichever is free
 * first accepts.  (SO_REUSEPORT would let a second `lupin serve` on the
 * same port share its traffic instead of failing, and hashes connections
 * to loops whether they are busy or not.) */
static int adopt(uv_tcp_t *tcp, const gw_server *share) {
  uv_os_fd_t fd;
  int rc = uv_fileno((const uv_handle_t *)&share->tcp, &fd);
  if (rc) return rc;
  int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return uv_translate_sys_error(errno);
  rc = uv_tcp_open(tcp, copy);
  if (rc) close(copy);
  return rc;
}

gw_server *gw_server_listen(lupin_gateway *gw, const char *hostport, const char *role,
                            const gw_server *share, gw_handler h, void *ud, char *err,
                            size_t errlen) {
  struct sockaddr_storage ss;
  if (gw_parse_hostport(hostport, &ss, err, errlen)) return NULL;
  gw_server *s = calloc(1, sizeof *s);
  if (!s) {
    lh_errf(err, errlen, "cannot listen on %s (%s): out of memory", hostport, role);
    return NULL;
  }
  *s = (gw_server){.gw = gw, .handler = h, .ud = ud, .started_ns = uv_hrtime()};
  uv_tcp_init(gw->loop, &s->tcp);
  s->tcp.data = s;
  s->listener_open = 1;
  int rc = share ? adopt(&s->tcp, share) : uv_tcp_bind(&s->tcp, (struct sockaddr *)&ss, 0);
  if (!rc) rc = uv_listen((uv_stream_t *)&s->tcp, 511, on_connection);
  if (rc) {
    lh_errf(err, errlen, "cannot listen on %s (%s): %s", hostport, role, uv_strerror(rc));
    gw_server_close(s);
    s->closing = 2; /* free once the handle is closed */
    return NULL;
  }
  return s;
}

/* The bound address (port 0 picks one), for the start-up line. */
int gw_server_address(gw_server *s, char *out, size_t len) {
  struct sockaddr_storage ss;
  int n = sizeof ss;
  if (uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&ss, &n)) return -1;
  gw_addr_name(&ss, out, len);
  return 0;
}

static void on_listener_closed(uv_handle_t *h) {
  gw_server *s = h->data;
  s->listener_open = 0;
  if (s->closing == 2) free(s);
}

void gw_server_close(gw_server *s) {
  if (s->closing) return;
  s->closing = 1;
  uv_close((uv_handle_t *)&s->tcp, on_listener_closed);
  for (gw_conn *c = s->conns; c; c = c->next)
    if (!c->busy && !c->ready) close_now(c);
}

size_t gw_server_connections(const gw_server *s) { return s ? s->n_conns : 0; }

/* Frees a closed server once its listener and connections are gone. */
void gw_server_free(gw_server *s) {
  if (!s) return;
  if (s->listener_open || s->n_conns) {
    s->closing = 2;
    return;
  }
  free(s);
}
