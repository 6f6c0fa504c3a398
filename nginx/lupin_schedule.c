/* The precontent phase of a `lupin_schedule on` location: the client body
 * read into memory, the request begun (the body checked and decoded once, by
 * the runtime, on its API routes) and scheduled, before the content handler
 * (proxy_pass) starts the upstream.  The balancer only reads the stored
 * result: a refusal (admission, a bad body, no endpoint) is answered here,
 * with lupin's status and OpenAI error body, never as nginx's 502.
 *
 * The request ends once, from a cleanup on the request's pool: the pool of
 * every request is destroyed exactly once, whatever path it took (answered,
 * refused, upstream failure, client gone, timeout). */
#include "ngx_http_lupin.h"

#include <stdlib.h>

/* at most that many headers go to the runtime (lupin serve's limit) */
#define NGX_HTTP_LUPIN_HEADERS LH_MAX_HEADERS

static ngx_int_t ngx_http_lupin_handler(ngx_http_request_t *r);

ngx_int_t ngx_http_lupin_schedule_init(ngx_conf_t *cf) {
  ngx_http_core_main_conf_t *cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);
  ngx_http_handler_pt *h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
  if (h == NULL) return NGX_ERROR;
  *h = ngx_http_lupin_handler;
  return NGX_OK;
}

/* How the request ended, for the plugins' finish hooks. */
static lupin_outcome ngx_http_lupin_outcome(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx) {
  if (ctx->completed) return LUPIN_OK;
  if (r->connection->error || r->headers_out.status == NGX_HTTP_CLIENT_CLOSED_REQUEST)
    return LUPIN_CANCELLED;
  if (r->headers_out.status == NGX_HTTP_GATEWAY_TIME_OUT) return LUPIN_TIMEOUT;
  /* an attempt failed, or the answer broke off with the client still there */
  if (ctx->failed || ctx->answered || r->headers_out.status == NGX_HTTP_BAD_GATEWAY)
    return LUPIN_UPSTREAM_ERROR;
  return LUPIN_CANCELLED;
}

typedef struct {
  ngx_http_request_t *r;
  ngx_http_lupin_ctx_t *ctx;
} ngx_http_lupin_cleanup_t;

static void ngx_http_lupin_cleanup(void *data) {
  ngx_http_lupin_cleanup_t *c = data;
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (c->ctx->req == NULL || w->rt == NULL) return; /* the runtime ended it when freed */
  /* a refusal's outcome is the runtime's (it wins over the one given) */
  lupin_outcome o = c->ctx->scheduled ? ngx_http_lupin_outcome(c->r, c->ctx)
                                      : (lupin_outcome)c->ctx->result.outcome;
  w->outcomes[o & 15]++;
  ngx_uint_t status = c->r->headers_out.status;
  if (status < 600) w->by_status[status]++;
  ngx_http_lupin_explain_ended(c->r, c->ctx, o);
  lupin_request_end(c->ctx->req, o);
  c->ctx->req = NULL;
  ngx_http_lupin_collect_later();
}

/* The body in one piece: nginx's buffers, or its temp file read back. */
ngx_int_t ngx_http_lupin_body(ngx_http_request_t *r, const char **body, size_t *len) {
  ngx_http_request_body_t *rb = r->request_body;
  *body = "";
  *len = 0;
  if (rb == NULL || rb->bufs == NULL) return NGX_OK;
  size_t n = 0;
  for (ngx_chain_t *cl = rb->bufs; cl; cl = cl->next)
    n += ngx_buf_size(cl->buf);
  if (rb->bufs->next == NULL && !rb->bufs->buf->in_file) { /* the common case: no copy */
    *body = (const char *)rb->bufs->buf->pos;
    *len = n;
    return NGX_OK;
  }
  u_char *p = ngx_pnalloc(r->pool, n + 1), *q = p;
  if (p == NULL) return NGX_ERROR;
  for (ngx_chain_t *cl = rb->bufs; cl; cl = cl->next) {
    ngx_buf_t *b = cl->buf;
    if (b->in_file) {
      ssize_t got = ngx_read_file(b->file, q, b->file_last - b->file_pos, b->file_pos);
      if (got != b->file_last - b->file_pos) return NGX_ERROR;
      q += got;
    } else {
      q = ngx_cpymem(q, b->pos, b->last - b->pos);
    }
  }
  *body = (const char *)p;
  *len = q - p;
  return NGX_OK;
}

static int ngx_http_lupin_route_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether the runtime knows the path as an API route: its body is checked. */
static int ngx_http_lupin_is_route(const char *path) {
  ngx_array_t *routes = &ngx_http_lupin_worker.routes;
  return bsearch(&path, routes->elts, routes->nelts, sizeof(char *), ngx_http_lupin_route_cmp) !=
         NULL;
}

/* Whether a header of the request is named name (without case). */
static int ngx_http_lupin_named(ngx_table_elt_t *h, const char *name, size_t nlen) {
  return h->key.len == nlen && ngx_strncasecmp(h->key.data, (u_char *)name, nlen) == 0;
}

/* Drops the request's headers of that name: proxy_pass forwards the
 * request's headers, and these are not the upstream's to see. */
static ngx_int_t ngx_http_lupin_drop_header(ngx_http_request_t *r, const char *name) {
  size_t nlen = ngx_strlen(name);
  ngx_list_t *list = &r->headers_in.headers;
  int present = 0;
  for (ngx_list_part_t *part = &list->part; part && !present; part = part->next) {
    ngx_table_elt_t *h = part->elts;
    for (ngx_uint_t i = 0; i < part->nelts; i++)
      present |= ngx_http_lupin_named(&h[i], name, nlen);
  }
  if (!present) return NGX_OK;
  /* an ngx_list_t has no removal: the list is made again */
  ngx_list_t fresh;
  if (ngx_list_init(&fresh, r->pool, 20, sizeof(ngx_table_elt_t)) != NGX_OK) return NGX_ERROR;
  for (ngx_list_part_t *part = &list->part; part; part = part->next) {
    ngx_table_elt_t *h = part->elts;
    for (ngx_uint_t i = 0; i < part->nelts; i++) {
      if (ngx_http_lupin_named(&h[i], name, nlen)) continue;
      ngx_table_elt_t *copy = ngx_list_push(&fresh);
      if (copy == NULL) return NGX_ERROR;
      *copy = h[i];
    }
  }
  *list = fresh;
  /* a list of one part points at its own part: the copy's, not the stack's */
  if (fresh.last == &fresh.part) list->last = &list->part;
  return NGX_OK;
}

/* Sets a header of the request as the upstream will get it: any the client
 * sent by that name go. */
static ngx_int_t ngx_http_lupin_set_header(ngx_http_request_t *r, const char *name,
                                           const char *value) {
  if (ngx_http_lupin_drop_header(r, name) != NGX_OK) return NGX_ERROR;
  size_t nlen = ngx_strlen(name);
  ngx_table_elt_t *h = ngx_list_push(&r->headers_in.headers);
  if (h == NULL) return NGX_ERROR;
  h->key.len = nlen;
  h->key.data = (u_char *)name;
  h->value.len = ngx_strlen(value);
  h->value.data = (u_char *)value;
  h->lowcase_key = ngx_pnalloc(r->pool, nlen);
  if (h->lowcase_key == NULL) return NGX_ERROR;
  h->hash = ngx_hash_strlow(h->lowcase_key, h->key.data, nlen);
  return NGX_OK;
}

/* The refusal: lupin's status and OpenAI error body. */
static ngx_int_t ngx_http_lupin_refuse(ngx_http_request_t *r, const lupin_result *res) {
  lh_buf b = {0};
  if (lh_openai_error(&b, res->status, res->message, res->param) != 0) {
    lh_buf_free(&b);
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  }
  return ngx_http_lupin_send(r, (ngx_uint_t)res->status, "application/json", &b);
}

/* A C string of an ngx_str_t, in the request's pool. */
static char *ngx_http_lupin_str(ngx_http_request_t *r, ngx_str_t *s) {
  char *p = ngx_pnalloc(r->pool, s->len + 1);
  if (p == NULL) return NULL;
  ngx_memcpy(p, s->data, s->len);
  p[s->len] = '\0';
  return p;
}

/* Splits the x-gateway-destination-endpoint-subset hint ("a,b, c") in place. */
static size_t ngx_http_lupin_subset(char *text, const char **out, size_t max) {
  size_t n = 0;
  for (char *save = NULL, *t = strtok_r(text, ", ", &save); t && n < max;
       t = strtok_r(NULL, ", ", &save))
    out[n++] = t;
  return n;
}

/* The picks' "ip:port", primary first, comma-separated, in the request's
 * pool; NULL when a pick is none of lupin_config's endpoints. */
static char *ngx_http_lupin_destination(ngx_http_request_t *r, const lupin_result *res) {
  size_t len = 1;
  for (size_t i = 0; i < res->n_picks; i++) {
    ngx_http_lupin_endpoint_t *e = ngx_http_lupin_endpoint(res->picks[i].name);
    if (e == NULL) return NULL;
    len += e->text.len + 1;
  }
  u_char *dest = ngx_pnalloc(r->pool, len), *q = dest;
  if (dest == NULL) return NULL;
  for (size_t i = 0; i < res->n_picks; i++) {
    ngx_http_lupin_endpoint_t *e = ngx_http_lupin_endpoint(res->picks[i].name);
    if (i) *q++ = ',';
    q = ngx_cpymem(q, e->text.data, e->text.len);
  }
  *q = '\0';
  return (char *)dest;
}

/* The EPP's model-name rewrite (x-llm-d-model-name-rewrite, or GIE's
 * x-gateway-model-name-rewrite): when the runtime scheduled the request for
 * that model, the body proxy_pass forwards names it (lh_model_rewrite: the
 * one value replaced, every other byte the client's). */
static ngx_int_t ngx_http_lupin_rewrite(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx,
                                        const char *to, const char *body, size_t len) {
  const char *model = lupin_request_model(ctx->req);
  if (*to == '\0' || model == NULL || strcmp(model, to) != 0) return NGX_OK;
  const char *type = NULL;
  if (r->headers_in.content_type) type = ngx_http_lupin_str(r, &r->headers_in.content_type->value);
  lh_buf b = {0};
  char *was = NULL;
  if (lh_buf_append(&b, body, len) || lh_model_rewrite(&b, type, to, &was)) {
    lh_buf_free(&b);
    return NGX_OK; /* a body it cannot follow goes unchanged, as in lupin serve */
  }
  free(was);
  ngx_buf_t *out = ngx_create_temp_buf(r->pool, b.len ? b.len : 1);
  ngx_chain_t *cl = ngx_alloc_chain_link(r->pool);
  if (out == NULL || cl == NULL) {
    lh_buf_free(&b);
    return NGX_ERROR;
  }
  out->last = ngx_cpymem(out->pos, b.data, b.len);
  out->last_buf = 1;
  lh_buf_free(&b);
  cl->buf = out;
  cl->next = NULL;
  r->request_body->bufs = cl;
  r->request_body->buf = out;
  /* proxy_pass sends the length of the body it forwards from here */
  r->headers_in.content_length_n = out->last - out->pos;
  if (r->headers_in.content_length) {
    u_char *v = ngx_pnalloc(r->pool, NGX_OFF_T_LEN);
    if (v == NULL) return NGX_ERROR;
    r->headers_in.content_length->value.data = v;
    r->headers_in.content_length->value.len =
        ngx_sprintf(v, "%O", r->headers_in.content_length_n) - v;
  }
  return NGX_OK;
}

/* Begins and schedules the request: NGX_DECLINED to go on to the content
 * handler with the picks stored, NGX_DONE when answered here (the request,
 * its pool and ctx may be freed by then: the caller touches neither). */
static ngx_int_t ngx_http_lupin_begin(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  lupin_header headers[NGX_HTTP_LUPIN_HEADERS];
  const char *subset[256];
  lupin_request_desc d = {.headers = headers};
  const char *rewrite = NULL;
  char *path = ngx_http_lupin_str(r, &r->uri);
  if (path == NULL || ngx_http_lupin_body(r, &d.body, &d.body_len) != NGX_OK)
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  d.path = path;
  d.check_body = ngx_http_lupin_is_route(path);
  ngx_http_lupin_explain_begin(r, ctx, &d);
  for (ngx_list_part_t *part = &r->headers_in.headers.part; part; part = part->next) {
    ngx_table_elt_t *h = part->elts;
    for (ngx_uint_t i = 0; i < part->nelts && d.n_headers < NGX_HTTP_LUPIN_HEADERS; i++) {
      char *name = ngx_http_lupin_str(r, &h[i].key), *value = ngx_http_lupin_str(r, &h[i].value);
      if (name == NULL || value == NULL) return NGX_HTTP_INTERNAL_SERVER_ERROR;
      headers[d.n_headers++] = (lupin_header){name, value};
      if (strcasecmp(name, "x-request-id") == 0) d.id = value;
      if (strcasecmp(name, "x-llm-d-model-name-rewrite") == 0 ||
          (!rewrite && strcasecmp(name, "x-gateway-model-name-rewrite") == 0))
        rewrite = value;
      if (strcasecmp(name, "x-gateway-destination-endpoint-subset") == 0) {
        char *copy = ngx_http_lupin_str(r, &h[i].value); /* strtok_r writes in it */
        if (copy == NULL) return NGX_HTTP_INTERNAL_SERVER_ERROR;
        d.subset = subset;
        d.n_subset = ngx_http_lupin_subset(copy, subset, 256);
      }
    }
  }

  ngx_pool_cleanup_t *cln = ngx_pool_cleanup_add(r->pool, sizeof(ngx_http_lupin_cleanup_t));
  if (cln == NULL) return NGX_HTTP_INTERNAL_SERVER_ERROR;
  char err[1024];
  ctx->req = lupin_request_begin(w->rt, &d, err, sizeof err);
  if (ctx->req == NULL) {
    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0, "lupin: beginning a request: %s", err);
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  }
  cln->handler = ngx_http_lupin_cleanup;
  *(ngx_http_lupin_cleanup_t *)cln->data = (ngx_http_lupin_cleanup_t){r, ctx};
  if (rewrite && (ngx_http_lupin_rewrite(r, ctx, rewrite, d.body, d.body_len) != NGX_OK ||
                  ngx_http_lupin_drop_header(r, "x-llm-d-model-name-rewrite") != NGX_OK ||
                  ngx_http_lupin_drop_header(r, "x-gateway-model-name-rewrite") != NGX_OK))
    return NGX_HTTP_INTERNAL_SERVER_ERROR;

  ngx_http_lupin_prefix_zone_drain(w->shared); /* what the other workers learnt */
  int status = lupin_request_schedule(ctx->req, &ctx->result);
  ngx_http_lupin_collect_later();
  ngx_http_lupin_explain_scheduled(r, ctx);
  if (status != 200) { /* LUPIN_QUEUED needs a dispatch callback: none is set */
    ngx_log_error(NGX_LOG_INFO, r->connection->log, 0, "lupin: request %s refused: %d %s",
                  lupin_request_id(ctx->req), status,
                  ctx->result.message ? ctx->result.message : "");
    ctx->status = NGX_DONE; /* answered: not begun again should the phase run again */
    ngx_http_finalize_request(r, ngx_http_lupin_refuse(r, &ctx->result));
    return NGX_DONE;
  }
  ctx->scheduled = 1;

  /* what the upstream request carries: the plugins' pre_request headers and
   * the destination as the endpoint picker protocol gives it, every pick in
   * order ("ip:port,ip:port", lupin epp's value): proxy_pass builds the
   * upstream request once, before the first attempt, so one value has to
   * hold for the primary and for a retry on the next pick alike */
  char *dest = ngx_http_lupin_destination(r, &ctx->result);
  if (dest == NULL || ngx_http_lupin_set_header(r, "x-gateway-destination-endpoint", dest))
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  for (size_t i = 0; i < ctx->result.n_headers; i++)
    if (ngx_http_lupin_set_header(r, ctx->result.headers[i].name, ctx->result.headers[i].value))
      return NGX_HTTP_INTERNAL_SERVER_ERROR;
  return NGX_DECLINED;
}

static void ngx_http_lupin_body_read(ngx_http_request_t *r) {
  ngx_http_lupin_ctx_t *ctx = ngx_http_get_module_ctx(r, ngx_http_lupin_module);
  ctx->body_read = 1;
  r->main->count--; /* ngx_http_read_client_request_body's reference */
  if (ctx->waiting) {
    ctx->waiting = 0;
    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
  }
}

static ngx_int_t ngx_http_lupin_handler(ngx_http_request_t *r) {
  ngx_http_lupin_loc_conf_t *lcf = ngx_http_get_module_loc_conf(r, ngx_http_lupin_module);
  if (!lcf->schedule || r != r->main) return NGX_DECLINED;
  ngx_http_lupin_ctx_t *ctx = ngx_http_get_module_ctx(r, ngx_http_lupin_module);
  if (ctx == NULL) {
    if (ngx_http_lupin_worker.rt == NULL) {
      ngx_log_error(NGX_LOG_ERR, r->connection->log, 0, "lupin_schedule: no lupin_config");
      return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    /* only requests with a body are scheduled: a GET (/v1/models) goes to
     * any healthy endpoint (lupin_balancer.c) */
    if (r->method != NGX_HTTP_POST) return NGX_DECLINED;
    ctx = ngx_pcalloc(r->pool, sizeof(*ctx));
    if (ctx == NULL) return NGX_HTTP_INTERNAL_SERVER_ERROR;
    ctx->status = NGX_AGAIN;
    ngx_http_set_ctx(r, ctx, ngx_http_lupin_module);
    r->request_body_in_single_buf = 1;
    ngx_int_t rc = ngx_http_read_client_request_body(r, ngx_http_lupin_body_read);
    if (rc == NGX_ERROR || rc >= NGX_HTTP_SPECIAL_RESPONSE) return rc;
    if (!ctx->body_read) {
      ctx->waiting = 1;
      return NGX_DONE;
    }
  }
  if (!ctx->body_read) return NGX_DONE;
  if (ctx->status != NGX_AGAIN) return ctx->status;
  /* a refusal finalizes the request inside begin, which may free its pool
   * and ctx with it (AddressSanitizer found the store into ctx after it) */
  ngx_int_t rc = ngx_http_lupin_begin(r, ctx);
  if (rc != NGX_DONE) ctx->status = rc;
  return rc;
}
