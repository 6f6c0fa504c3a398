/* The response, as the runtime's request sees it: the upstream's status and
 * headers from a header filter (lupin_request_response_header, the plugins'
 * response headers added for the client), each body buffer from a body
 * filter (lupin_request_response_chunk), and the last one
 * (lupin_request_response_complete).
 *
 * The module is loaded after nginx's own filters, so its filters run first:
 * they see the upstream's bytes before gzip or chunked framing.  Buffers
 * that nginx spooled to a temporary file (a large buffered answer) are read
 * back when a plugin observes chunks; a streamed request is not buffered at
 * all (lupin_balancer.c). */
#include "ngx_http_lupin.h"

static ngx_http_output_header_filter_pt ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt ngx_http_next_body_filter;

/* The request's ctx when the response is the upstream's answer to a
 * scheduled request, else NULL (a refusal, nginx's own error page). */
static ngx_http_lupin_ctx_t *ngx_http_lupin_response_ctx(ngx_http_request_t *r) {
  if (r != r->main) return NULL;
  ngx_http_lupin_ctx_t *ctx = ngx_http_get_module_ctx(r, ngx_http_lupin_module);
  if (ctx == NULL || !ctx->scheduled || ctx->req == NULL) return NULL;
  return ctx;
}

static ngx_int_t ngx_http_lupin_header_filter(ngx_http_request_t *r) {
  if (ngx_http_lupin_explain_headers(r) != NGX_OK) return NGX_ERROR;
  ngx_http_lupin_ctx_t *ctx = ngx_http_lupin_response_ctx(r);
  if (ctx == NULL || r->upstream == NULL || r->upstream->headers_in.status_n == 0)
    return ngx_http_next_header_filter(r);
  ctx->answered = 1;

  lupin_header headers[LH_MAX_HEADERS];
  size_t n = 0;
  if (r->headers_out.content_type.len) {
    u_char *ct = ngx_pnalloc(r->pool, r->headers_out.content_type.len + 1);
    if (ct == NULL) return NGX_ERROR;
    *ngx_cpymem(ct, r->headers_out.content_type.data, r->headers_out.content_type.len) = '\0';
    headers[n++] = (lupin_header){"content-type", (const char *)ct};
  }
  for (ngx_list_part_t *part = &r->headers_out.headers.part; part; part = part->next) {
    ngx_table_elt_t *h = part->elts;
    for (ngx_uint_t i = 0; i < part->nelts && n < LH_MAX_HEADERS; i++) {
      if (h[i].hash == 0) continue; /* removed */
      u_char *kv = ngx_pnalloc(r->pool, h[i].key.len + h[i].value.len + 2);
      if (kv == NULL) return NGX_ERROR;
      u_char *v = ngx_cpymem(kv, h[i].key.data, h[i].key.len);
      *v++ = '\0';
      *ngx_cpymem(v, h[i].value.data, h[i].value.len) = '\0';
      headers[n++] = (lupin_header){(const char *)kv, (const char *)v};
    }
  }
  lupin_request_response_header(ctx->req, (int)r->headers_out.status, headers, n);

  /* what the plugins set for the client (ctx:set_response_header) */
  const lupin_header *add;
  size_t n_add = lupin_request_client_headers(ctx->req, &add);
  for (size_t i = 0; i < n_add; i++) {
    ngx_table_elt_t *h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) return NGX_ERROR;
    h->hash = 1;
    h->key.data = (u_char *)add[i].name;
    h->key.len = ngx_strlen(add[i].name);
    h->value.data = (u_char *)add[i].value;
    h->value.len = ngx_strlen(add[i].value);
    h->lowcase_key = NULL;
  }
  return ngx_http_next_header_filter(r);
}

/* A part of the answer nginx spooled to its temporary file (a buffered
 * answer past proxy_buffers), read back for the plugins that observe
 * chunks: the bytes they would have had in memory. */
static ngx_int_t ngx_http_lupin_file_chunks(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx,
                                            ngx_buf_t *b) {
  u_char piece[16384];
  for (off_t at = b->file_pos; at < b->file_last;) {
    size_t n = (size_t)ngx_min(b->file_last - at, (off_t)sizeof piece);
    ssize_t got = ngx_read_file(b->file, piece, n, at);
    if (got <= 0) {
      ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                    "lupin: reading back the answer's temporary file failed");
      return NGX_ERROR;
    }
    lupin_request_response_chunk(ctx->req, (const char *)piece, (size_t)got);
    at += got;
  }
  return NGX_OK;
}

static ngx_int_t ngx_http_lupin_body_filter(ngx_http_request_t *r, ngx_chain_t *in) {
  ngx_http_lupin_ctx_t *ctx = ngx_http_lupin_response_ctx(r);
  if (ctx == NULL || !ctx->answered || ctx->completed) return ngx_http_next_body_filter(r, in);
  for (ngx_chain_t *cl = in; cl; cl = cl->next) {
    ngx_buf_t *b = cl->buf;
    if (ngx_buf_in_memory(b) && b->last > b->pos)
      lupin_request_response_chunk(ctx->req, (const char *)b->pos, b->last - b->pos);
    else if (b->in_file && b->file_last > b->file_pos && lupin_request_wants_chunks(ctx->req) &&
             ngx_http_lupin_file_chunks(r, ctx, b) != NGX_OK)
      return NGX_ERROR;
    if (b->last_buf) {
      ctx->completed = 1;
      lupin_request_response_complete(ctx->req);
    }
  }
  return ngx_http_next_body_filter(r, in);
}

ngx_int_t ngx_http_lupin_filters_init(ngx_conf_t *cf) {
  (void)cf;
  ngx_http_next_header_filter = ngx_http_top_header_filter;
  ngx_http_top_header_filter = ngx_http_lupin_header_filter;
  ngx_http_next_body_filter = ngx_http_top_body_filter;
  ngx_http_top_body_filter = ngx_http_lupin_body_filter;
  return NGX_OK;
}
