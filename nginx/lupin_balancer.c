/* `lupin;` inside upstream {}: the upstream's peers are the endpoints of
 * lupin_config, and each attempt goes where the runtime said.  Scheduling
 * happened before (lupin_schedule.c); init_peer only finds its result.  The
 * first attempt goes to the primary pick, a retry (proxy_next_upstream) to
 * the next pick, then to the runtime's ranked fallbacks
 * (lupin_request_fallbacks); when none is left nginx answers 502.
 *
 * A request lupin does not schedule (a GET: /v1/models) goes to the healthy
 * endpoints in turn.
 *
 * nginx's own rule keeps a generation request from being replayed silently:
 * a POST is not sent again once it reached an endpoint unless
 * proxy_next_upstream says non_idempotent (lupin serve's policy: docs/nginx.md). */
#include "ngx_http_lupin.h"

static ngx_int_t ngx_http_lupin_init_upstream(ngx_conf_t *cf, ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_lupin_init_peer(ngx_http_request_t *r, ngx_http_upstream_srv_conf_t *us);
static ngx_int_t ngx_http_lupin_get_peer(ngx_peer_connection_t *pc, void *data);
static void ngx_http_lupin_free_peer(ngx_peer_connection_t *pc, void *data, ngx_uint_t state);

char *ngx_http_lupin_upstream(ngx_conf_t *cf, ngx_command_t *cmd, void *conf) {
  ngx_http_upstream_srv_conf_t *uscf =
      ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);
  (void)cmd;
  (void)conf;
  if (uscf->peer.init_upstream)
    ngx_conf_log_error(NGX_LOG_WARN, cf, 0, "load balancing method redefined");
  uscf->peer.init_upstream = ngx_http_lupin_init_upstream;
  uscf->flags = NGX_HTTP_UPSTREAM_CREATE;
  /* nginx refuses an upstream {} without a server line: one that no attempt
   * uses stands for lupin's endpoints */
  ngx_http_upstream_server_t *stand_in = ngx_array_push(uscf->servers);
  if (stand_in == NULL) return NGX_CONF_ERROR;
  ngx_memzero(stand_in, sizeof(*stand_in));
  return NGX_CONF_OK;
}

static ngx_int_t ngx_http_lupin_init_upstream(ngx_conf_t *cf, ngx_http_upstream_srv_conf_t *us) {
  if (us->servers && us->servers->nelts > 1)
    ngx_log_error(NGX_LOG_WARN, cf->log, 0,
                  "upstream \"%V\": its server lines are not used: lupin's endpoints "
                  "(lupin_config) are the peers",
                  &us->host);
  us->peer.init = ngx_http_lupin_init_peer;
  return NGX_OK;
}

static ngx_int_t ngx_http_lupin_init_peer(ngx_http_request_t *r, ngx_http_upstream_srv_conf_t *us) {
  ngx_http_lupin_ctx_t *ctx = ngx_http_get_module_ctx(r, ngx_http_lupin_module);
  if (ctx == NULL && (r->method & (NGX_HTTP_GET | NGX_HTTP_HEAD))) {
    /* not scheduled (GET /v1/models): any healthy endpoint answers */
    ctx = ngx_pcalloc(r->pool, sizeof(*ctx));
    if (ctx == NULL) return NGX_ERROR;
    ngx_http_set_ctx(r, ctx, ngx_http_lupin_module);
  } else if (ctx == NULL || !ctx->scheduled) {
    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "lupin: upstream \"%V\" reached without a scheduled request: "
                  "its location needs lupin_schedule on",
                  &us->host);
    return NGX_ERROR;
  }
  ngx_http_upstream_t *u = r->upstream;
  ctx->r = r;
  u->peer.data = ctx;
  u->peer.get = ngx_http_lupin_get_peer;
  u->peer.free = ngx_http_lupin_free_peer;
  /* the picks and fallbacks bound the attempts (get_peer says NGX_BUSY when
   * none is left); proxy_next_upstream_tries bounds them too */
  u->peer.tries = NGX_MAX_INT32_VALUE;
  /* a streamed answer goes to the client as it comes (SSE) */
  if (ctx->scheduled && lupin_request_stream(ctx->req)) u->buffering = 0;
  return NGX_OK;
}

/* The next healthy endpoint in turn for a request lupin did not schedule;
 * each is tried once. */
static ngx_http_lupin_endpoint_t *ngx_http_lupin_any(ngx_http_lupin_ctx_t *ctx) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  ngx_uint_t healthy = 0;
  for (ngx_http_lupin_endpoint_t *e = w->endpoints; e; e = e->next)
    healthy += !e->removed && e->health.state == LH_HEALTHY;
  if (ctx->attempt >= healthy) return NULL;
  ngx_uint_t k = (w->turn++) % healthy;
  for (ngx_http_lupin_endpoint_t *e = w->endpoints; e; e = e->next)
    if (!e->removed && e->health.state == LH_HEALTHY && k-- == 0) return e;
  return NULL;
}

static ngx_int_t ngx_http_lupin_connect(ngx_peer_connection_t *pc, ngx_http_lupin_ctx_t *ctx,
                                        ngx_http_lupin_endpoint_t *e) {
  ctx->endpoint = e;
  pc->sockaddr = e->sockaddr;
  pc->socklen = e->socklen;
  pc->name = &e->text;
  pc->cached = 0;
  pc->connection = NULL;
  return NGX_OK;
}

static ngx_int_t ngx_http_lupin_get_peer(ngx_peer_connection_t *pc, void *data) {
  ngx_http_lupin_ctx_t *ctx = data;
  const lupin_pick *p;
  ngx_uint_t k = ctx->attempt;
  if (!ctx->scheduled) {
    ngx_http_lupin_endpoint_t *e = ngx_http_lupin_any(ctx);
    if (e == NULL) {
      pc->name = NULL;
      return NGX_BUSY;
    }
    ctx->attempt++;
    return ngx_http_lupin_connect(pc, ctx, e);
  }
  if (k < ctx->result.n_picks) {
    p = &ctx->result.picks[k];
  } else {
    if (k == ctx->result.n_picks)
      ctx->n_fallbacks = lupin_request_fallbacks(ctx->req, &ctx->fallbacks);
    if (k - ctx->result.n_picks >= ctx->n_fallbacks) {
      pc->name = NULL;
      return NGX_BUSY;
    }
    p = &ctx->fallbacks[k - ctx->result.n_picks];
    ngx_http_lupin_worker.fallbacks_tried++;
  }
  ctx->attempt++;
  ngx_http_lupin_endpoint_t *e = ngx_http_lupin_endpoint(p->name);
  if (e == NULL) { /* a reload dropped it since */
    ngx_log_error(NGX_LOG_ERR, pc->log, 0, "lupin: pick \"%s\" is not a known endpoint", p->name);
    return NGX_BUSY;
  }
  return ngx_http_lupin_connect(pc, ctx, e);
}

/* An attempt's end: its endpoint's health told (a failure, a 5xx answer,
 * or a success that ends a run of failures). */
static void ngx_http_lupin_free_peer(ngx_peer_connection_t *pc, void *data, ngx_uint_t state) {
  ngx_http_lupin_ctx_t *ctx = data;
  ngx_uint_t failed = (state & NGX_PEER_FAILED) != 0;
  if (failed) {
    ctx->failed = 1;
    ngx_http_lupin_worker.attempts_failed++;
  }
  if (ctx->endpoint) {
    ngx_http_lupin_endpoint_attempt(ctx->endpoint, failed, ctx->r->upstream->headers_in.status_n);
    ctx->endpoint = NULL;
  }
  if (pc->tries) pc->tries--;
}
