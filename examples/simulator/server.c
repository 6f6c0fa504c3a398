/* HTTP/1.1 for one endpoint: listener, connections, routing, response framing.
 *
 * Parsing is node's http_parser. A connection answers one request at a time:
 * the parser is paused at the end of each message and resumed when that
 * response's last byte is written, so pipelined and keep-alive requests are
 * answered in order. Reading goes on while a response streams, so a client that
 * hangs up is noticed at once and its request leaves the engine (as vLLM aborts
 * a request whose client went away). Streams use chunked transfer encoding. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <http_parser.h>

#include "sim.h"

typedef struct conn {
  uv_tcp_t tcp;
  endpoint *ep;
  struct conn *prev, *next; /* the endpoint's open connections */
  http_parser parser;
  strbuf url, body, hfield, hvalue;
  bool in_value;
  bool too_large;
  bool expect_continue;
  char *request_id;   /* x-request-id, received or generated */
  char *destination;  /* x-gateway-destination-endpoint, echoed as x-sim-destination */
  char *content_type; /* the request's, for the multipart audio routes */
  bool keep_alive;
  bool busy; /* a request is being answered; input waits in `pending` */
  bool closing;
  bool write_failed; /* uv_write refused: drop further output, wait for the read side */
  strbuf pending;
  job *job;
} conn;

typedef struct write_req {
  uv_write_t req;
  conn *c;
  bool last; /* the response's final bytes: resume or close after them */
  char data[];
} write_req;

static void conn_feed(conn *c, const char *data, size_t len);
static void conn_close(conn *c);

/* ---- writing --------------------------------------------------------------- */

static void conn_resume(conn *c) {
  c->busy = false;
  if (!c->keep_alive) {
    conn_close(c);
    return;
  }
  http_parser_pause(&c->parser, 0);
  strbuf rest = c->pending;
  memset(&c->pending, 0, sizeof c->pending);
  if (rest.len) conn_feed(c, rest.data, rest.len);
  sb_free(&rest);
}

static void on_written(uv_write_t *req, int status) {
  write_req *w = (write_req *)req;
  conn *c = w->c;
  bool last = w->last;
  free(w);
  if (c->closing) return;
  if (status < 0)
    conn_close(c);
  else if (last)
    conn_resume(c);
}

static void conn_write(conn *c, const char *data, size_t len, bool last) {
  if (c->closing || c->write_failed) return;
  write_req *w = malloc(sizeof *w + len);
  if (!w) abort();
  w->c = c;
  w->last = last;
  memcpy(w->data, data, len);
  uv_buf_t buf = uv_buf_init(w->data, (unsigned)len);
  if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_written) < 0) {
    /* Not closed here: the caller may be the engine mid-tick, and closing
     * cancels (frees) the job it is working on. The dead socket's read side
     * reports the error and closes the connection from the loop. */
    free(w);
    c->write_failed = true;
  }
}

static void write_head(conn *c, strbuf *out, int status, const char *ctype, long length,
                       const char *extra) {
  sb_printf(out, "HTTP/1.1 %d %s\r\ncontent-type: %s\r\n", status,
            http_status_str((enum http_status)status), ctype);
  if (length >= 0)
    sb_printf(out, "content-length: %ld\r\n", length);
  else
    sb_adds(out, "transfer-encoding: chunked\r\ncache-control: no-cache\r\n");
  sb_printf(out, "x-request-id: %s\r\nx-sim-endpoint: %s\r\n", c->request_id, c->ep->addr);
  if (c->destination) sb_printf(out, "x-sim-destination: %s\r\n", c->destination);
  if (extra) sb_adds(out, extra);
  sb_adds(out, c->keep_alive ? "connection: keep-alive\r\n\r\n" : "connection: close\r\n\r\n");
}

static void reply_with(conn *c, int status, const char *ctype, const char *body, size_t len,
                       const char *extra) {
  strbuf out = {0};
  write_head(c, &out, status, ctype, (long)len, extra);
  sb_add(&out, body, len);
  c->job = NULL;
  conn_write(c, out.data, out.len, true);
  sb_free(&out);
}

void conn_reply(conn *c, int status, const char *ctype, const char *body, size_t len) {
  reply_with(c, status, ctype, body, len, NULL);
}

void conn_stream_begin(conn *c) {
  strbuf out = {0};
  write_head(c, &out, 200, "text/event-stream; charset=utf-8", -1, NULL);
  conn_write(c, out.data, out.len, false);
  sb_free(&out);
}

static void stream_write(conn *c, const char *data, size_t len, bool last) {
  strbuf out = {0};
  sb_printf(&out, "%zx\r\n", len);
  sb_add(&out, data, len);
  sb_adds(&out, last ? "\r\n0\r\n\r\n" : "\r\n");
  conn_write(c, out.data, out.len, last);
  sb_free(&out);
}

void conn_stream_chunk(conn *c, const char *data, size_t len) { stream_write(c, data, len, false); }

void conn_stream_end(conn *c, const char *data, size_t len) {
  c->job = NULL;
  stream_write(c, data, len, true);
}

void conn_drop(conn *c) {
  c->job = NULL;
  conn_close(c);
}

static void reply_error(conn *c, http_reply *r, const char *extra) {
  reply_with(c, r->status, "application/json", r->body.data, r->body.len, extra);
  sb_free(&r->body);
}

/* ---- routing --------------------------------------------------------------- */

static void serve_generation(conn *c, enum job_kind kind) {
  endpoint *ep = c->ep;
  const sim_config *cfg = &ep->sim->cfg;
  http_reply err = {0};
  ep->m.requests++;
  job *j = openai_parse(ep, kind, c->body.data ? c->body.data : "", c->body.len, &err);
  if (!j) {
    reply_error(c, &err, NULL);
    return;
  }
  if (rng_unit(&ep->rng) < cfg->error_rate) {
    ep->m.injected_errors++;
    job_free(j);
    openai_error(&err, 500, "server_error", NULL, NULL,
                 "Injected failure: endpoint %s answers 500 (--error-rate %g)", ep->addr,
                 cfg->error_rate);
    reply_error(c, &err, NULL);
    return;
  }
  if (rng_unit(&ep->rng) < cfg->drop_rate) j->drop_at = j->max_tokens > 1 ? j->max_tokens / 2 : 1;
  if (cfg->log_requests)
    fprintf(stderr, "endpoint %d: %s model=%s prompt_tokens=%d max_tokens=%d stream=%d\n",
            ep->index, c->request_id, j->model, j->prompt_tokens, j->max_tokens, j->stream);
  j->conn = c;
  c->job = j;
  if (j->stream) conn_stream_begin(c);
  engine_submit(ep, j);
}

static void serve_text(conn *c, const char *ctype, strbuf *body) {
  conn_reply(c, 200, ctype, body->data, body->len);
  sb_free(body);
}

typedef struct route {
  const char *path;
  const char *method;
  int id;
} route;

enum { R_COMPLETIONS, R_CHAT, R_MODELS, R_METRICS, R_HEALTH };

static const route routes[] = {
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/models", "GET", R_MODELS},
    {"/metrics", "GET", R_METRICS},
    {"/health", "GET", R_HEALTH},
};

static void dispatch(conn *c, int id) {
  strbuf out = {0};
  switch (id) {
  case R_COMPLETIONS:
    serve_generation(c, JOB_COMPLETION);
    return;
  case R_CHAT:
    serve_generation(c, JOB_CHAT);
    return;
  case R_MODELS:
    openai_models(c->ep, &out);
    serve_text(c, "application/json", &out);
    return;
  case R_METRICS:
    metrics_render(c->ep, &out);
    serve_text(c, "text/plain; version=0.0.4; charset=utf-8", &out);
    return;
  default:
    conn_reply(c, 200, "text/plain", "", 0);
    return;
  }
}

/* The routes that generate no tokens (routes.c): answered at once; the
 * model served comes back in x-sim-model, so specs can see what arrived. */
static void serve_aux(conn *c, size_t plen) {
  http_reply r = {0};
  strbuf model = {0};
  aux_serve(c->ep, c->url.data, plen, c->content_type, c->body.data ? c->body.data : "",
            c->body.len, &r, &model);
  strbuf extra = {0};
  if (model.len) sb_printf(&extra, "x-sim-model: %s\r\n", model.data);
  reply_with(c, r.status ? r.status : 500, "application/json", r.body.data ? r.body.data : "",
             r.body.len, extra.data);
  sb_free(&r.body);
  sb_free(&model);
  sb_free(&extra);
}

/* Whether method is one of an Allow header's list ("GET, POST"). */
static bool method_listed(const char *allow, const char *method) {
  size_t n = strlen(method);
  for (const char *a = allow; *a; a += strspn(a, ", ")) {
    size_t len = strcspn(a, ", ");
    if (len == n && !strncmp(a, method, n)) return true;
    a += len;
  }
  return false;
}

static void route_request(conn *c) {
  const char *method = http_method_str((enum http_method)c->parser.method);
  size_t plen = strcspn(c->url.data ? c->url.data : "", "?");
  http_reply err = {0};
  if (c->too_large) {
    openai_error(&err, 413, "invalid_request_error", NULL, NULL,
                 "Request body too large: the limit is %zu bytes (--max-body-bytes)",
                 c->ep->sim->cfg.max_body_bytes);
    c->keep_alive = false; /* the unread rest of the body would be parsed as a request */
    reply_error(c, &err, NULL);
    return;
  }
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
    const route *r = &routes[i];
    if (strlen(r->path) != plen || strncmp(r->path, c->url.data, plen) != 0) continue;
    if (strcmp(method, r->method) == 0) {
      dispatch(c, r->id);
      return;
    }
    char allow[64];
    snprintf(allow, sizeof allow, "allow: %s\r\n", r->method);
    openai_error(&err, 405, "invalid_request_error", NULL, NULL,
                 "Method %s is not allowed on %s: use %s", method, r->path, r->method);
    reply_error(c, &err, allow);
    return;
  }
  const char *allow = control_route_allow(c->url.data, plen);
  if (allow) {
    if (!method_listed(allow, method)) {
      char hdr[64];
      snprintf(hdr, sizeof hdr, "allow: %s\r\n", allow);
      openai_error(&err, 405, "invalid_request_error", NULL, NULL,
                   "Method %s is not allowed on %.*s: use %s", method, (int)plen, c->url.data,
                   allow);
      reply_error(c, &err, hdr);
      return;
    }
    control_serve(c->ep, method, c->url.data, plen, c->url.data + plen,
                  c->body.data ? c->body.data : "", c->body.len, &err);
    reply_error(c, &err, NULL);
    return;
  }
  if (aux_route_known(c->url.data, plen)) {
    if (strcmp(method, "POST")) {
      openai_error(&err, 405, "invalid_request_error", NULL, NULL,
                   "Method %s is not allowed on %.*s: use POST", method, (int)plen, c->url.data);
      reply_error(c, &err, "allow: POST\r\n");
      return;
    }
    serve_aux(c, plen);
    return;
  }
  openai_error(&err, 404, "invalid_request_error", NULL, NULL,
               "Unknown route %s %.*s: this server serves POST /v1/completions, "
               "POST /v1/chat/completions, GET /v1/models, GET /metrics and GET /health, and "
               "minimally POST /v1/embeddings, /v1/responses, /v1/messages, /v1/audio/*, "
               "/tokenize, /detokenize, /v1/completions/render, /v1/chat/completions/render, "
               "/pooling, /classify, /score, /rerank, and POST /sim/reset, /sim/oracle, GET|POST "
               "/sim/speed",
               method, (int)plen, c->url.data ? c->url.data : "");
  reply_error(c, &err, NULL);
}

/* ---- parsing --------------------------------------------------------------- */

static conn *conn_of(http_parser *p) { return p->data; }

static void header_done(conn *c) {
  if (!c->in_value) return;
  c->in_value = false;
  const char *f = c->hfield.data ? c->hfield.data : "";
  const char *v = c->hvalue.data ? c->hvalue.data : "";
  if (strcasecmp(f, "x-request-id") == 0 && *v) {
    free(c->request_id);
    c->request_id = strdup(v);
  } else if (strcasecmp(f, "expect") == 0 && strcasecmp(v, "100-continue") == 0) {
    c->expect_continue = true;
  } else if (strcasecmp(f, "x-gateway-destination-endpoint") == 0) {
    free(c->destination);
    c->destination = strdup(v);
  } else if (strcasecmp(f, "content-type") == 0) {
    free(c->content_type);
    c->content_type = strdup(v);
  }
  c->hfield.len = c->hvalue.len = 0;
  if (c->hfield.data) c->hfield.data[0] = '\0';
  if (c->hvalue.data) c->hvalue.data[0] = '\0';
}

static int on_message_begin(http_parser *p) {
  conn *c = conn_of(p);
  c->url.len = c->body.len = c->hfield.len = c->hvalue.len = 0;
  c->in_value = c->too_large = c->expect_continue = false;
  free(c->request_id);
  free(c->destination);
  free(c->content_type);
  c->request_id = c->destination = c->content_type = NULL;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t len) {
  sb_add(&conn_of(p)->url, at, len);
  return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len) {
  conn *c = conn_of(p);
  header_done(c);
  sb_add(&c->hfield, at, len);
  return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len) {
  conn *c = conn_of(p);
  c->in_value = true;
  sb_add(&c->hvalue, at, len);
  return 0;
}

static int on_headers_complete(http_parser *p) {
  conn *c = conn_of(p);
  header_done(c);
  /* curl sends large bodies only after this (or after a 1 s wait). */
  if (c->expect_continue) conn_write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, false);
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  conn *c = conn_of(p);
  if (c->body.len + len > c->ep->sim->cfg.max_body_bytes) c->too_large = true;
  if (!c->too_large) sb_add(&c->body, at, len);
  return 0;
}

static int on_message_complete(http_parser *p) {
  conn *c = conn_of(p);
  if (!c->url.data) sb_adds(&c->url, "");
  if (!c->request_id) {
    char id[64];
    snprintf(id, sizeof id, "sim-%d-%llu", c->ep->index, (unsigned long long)++c->ep->seq);
    c->request_id = strdup(id);
  }
  c->keep_alive = http_should_keep_alive(p) && !c->ep->sim->stopping;
  c->busy = true;
  http_parser_pause(p, 1); /* one request at a time; resumed after the response */
  route_request(c);
  return 0;
}

static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_body = on_body,
    .on_message_complete = on_message_complete,
};

static void conn_feed(conn *c, const char *data, size_t len) {
  size_t n = http_parser_execute(&c->parser, &settings, data, len);
  enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
  if (e == HPE_PAUSED) {
    if (n < len && !c->closing) sb_add(&c->pending, data + n, len - n);
  } else if (e != HPE_OK) {
    http_reply err = {0};
    openai_error(&err, 400, "invalid_request_error", NULL, NULL, "Malformed HTTP request: %s",
                 http_errno_description(e));
    if (!c->request_id) c->request_id = strdup("-");
    c->keep_alive = false;
    c->busy = true;
    reply_error(c, &err, NULL);
  }
}

/* ---- connections ----------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  buf->base = malloc(suggested);
  buf->len = buf->base ? suggested : 0;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  conn *c = s->data;
  if (n < 0)
    conn_close(c); /* EOF or error: the client is gone */
  else if (n > 0 && c->busy && c->pending.len > c->ep->sim->cfg.max_body_bytes)
    conn_close(c);
  else if (n > 0 && c->busy)
    sb_add(&c->pending, buf->base, (size_t)n);
  else if (n > 0)
    conn_feed(c, buf->base, (size_t)n);
  free(buf->base);
}

static void on_conn_closed(uv_handle_t *h) {
  conn *c = h->data;
  sb_free(&c->url);
  sb_free(&c->body);
  sb_free(&c->hfield);
  sb_free(&c->hvalue);
  sb_free(&c->pending);
  free(c->request_id);
  free(c->destination);
  free(c->content_type);
  free(c);
}

static void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = true;
  if (c->job) {
    job *j = c->job;
    c->job = NULL;
    engine_cancel(j);
  }
  endpoint *ep = c->ep;
  if (c->prev)
    c->prev->next = c->next;
  else
    ep->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_connection(uv_stream_t *server, int status) {
  endpoint *ep = server->data;
  if (status < 0) return;
  conn *c = calloc(1, sizeof *c);
  if (!c) abort();
  c->ep = ep;
  uv_tcp_init(ep->sim->loop, &c->tcp);
  c->tcp.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1); /* SSE chunks are small and latency is the point */
  http_parser_init(&c->parser, HTTP_REQUEST);
  c->parser.data = c;
  c->next = ep->conns;
  if (ep->conns) ep->conns->prev = c;
  ep->conns = c;
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* An IPv4 or IPv6 address, the latter bare or in brackets.  "::" listens on
 * both families (Linux dual-stack sockets), as vLLM does with --host ::. */
int server_listen(endpoint *ep) {
  const sim_config *cfg = &ep->sim->cfg;
  char host[64];
  size_t len = strlen(cfg->host);
  if (len >= sizeof host) return UV_EINVAL;
  memcpy(host, cfg->host, len + 1);
  if (host[0] == '[' && len > 2 && host[len - 1] == ']') {
    memmove(host, host + 1, len - 2);
    host[len - 2] = 0;
  }
  struct sockaddr_storage addr;
  int rc = uv_ip4_addr(host, ep->port, (struct sockaddr_in *)&addr);
  if (rc < 0) rc = uv_ip6_addr(host, ep->port, (struct sockaddr_in6 *)&addr);
  if (rc < 0) return rc;
  uv_tcp_init(ep->sim->loop, &ep->listener);
  ep->listener.data = ep;
  ep->listening = true;
  rc = uv_tcp_bind(&ep->listener, (const struct sockaddr *)&addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&ep->listener, 512, on_connection);
  return rc;
}

void server_close(endpoint *ep) {
  if (ep->listening) uv_close((uv_handle_t *)&ep->listener, NULL);
  ep->listening = false;
  while (ep->conns)
    conn_close(ep->conns);
}
