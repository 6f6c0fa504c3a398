/* Explain records in nginx (docs/explain.md, docs/nginx.md): why a request
 * went where it went.
 *
 *   x-lupin-explain: 1 on a scheduled request, in a `lupin_explain on`
 *     location: the response gains x-lupin-explain, the one-line summary,
 *     and x-lupin-explain-record, where the admin location serves the full
 *     record once the request has ended.  Who may ask is nginx's access
 *     rule for that location: lupin serve's admin token has no place here.
 *     The request header is consumed: it never reaches the model server.
 *   GET  <admin>/explain        the ids this worker kept, newest first
 *   GET  <admin>/explain/<id>   one record: the runtime's, plus nginx's
 *                               attempts (r->upstream_states)
 *   POST <admin>/explain        an OpenAI body scheduled against the live
 *                               endpoints, decided and explained, never
 *                               forwarded: any worker answers it alike
 *
 * Each worker keeps the last NGX_HTTP_LUPIN_EXPLAIN_KEPT records of its own
 * requests: a record's link reaches it when it reaches that worker (one
 * worker, or a keep-alive connection). */
#include "ngx_http_lupin.h"

#include <stdio.h>
#include <stdlib.h>

static ngx_str_t ngx_http_lupin_explain_name = ngx_string("x-lupin-explain");

/* The x-lupin-explain header the client sent, taken out of the request's
 * headers (proxy_pass forwards what is left): its value, or NULL. */
static ngx_str_t *ngx_http_lupin_explain_take(ngx_http_request_t *r) {
  ngx_str_t *found = NULL;
  for (ngx_list_part_t *part = &r->headers_in.headers.part; part; part = part->next) {
    ngx_table_elt_t *h = part->elts;
    for (ngx_uint_t i = 0; i < part->nelts; i++) {
      if (h[i].key.len != ngx_http_lupin_explain_name.len ||
          ngx_strncasecmp(h[i].key.data, ngx_http_lupin_explain_name.data, h[i].key.len))
        continue;
      found = &h[i].value; /* the value's bytes stay in the request's buffer */
      ngx_str_t *copy = ngx_palloc(r->pool, sizeof(*copy));
      if (copy == NULL) return NULL;
      *copy = *found;
      found = copy;
      ngx_memmove(&h[i], &h[i + 1], (part->nelts - i - 1) * sizeof(ngx_table_elt_t));
      part->nelts--;
      i--;
    }
  }
  return found;
}

void ngx_http_lupin_explain_begin(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx,
                                  lupin_request_desc *d) {
  ngx_http_lupin_loc_conf_t *lcf = ngx_http_get_module_loc_conf(r, ngx_http_lupin_module);
  ngx_str_t *ask = ngx_http_lupin_explain_take(r);
  if (ask == NULL || ask->len != 1 || ask->data[0] != '1') return;
  ctx->explain = lcf->explain ? 1 : 2;
  if (lcf->explain) d->flags |= LUPIN_REQUEST_EXPLAIN;
}

void ngx_http_lupin_explain_scheduled(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx) {
  if (ctx->explain != 1) return;
  size_t len;
  const char *line = lupin_request_explain(ctx->req, LUPIN_EXPLAIN_SUMMARY, &len);
  if (line == NULL) return;
  ctx->explain_summary = ngx_pnalloc(r->pool, len + 1);
  if (ctx->explain_summary) *ngx_cpymem(ctx->explain_summary, line, len) = '\0';
}

static ngx_int_t ngx_http_lupin_add_header(ngx_http_request_t *r, const char *name, u_char *value,
                                           size_t len) {
  ngx_table_elt_t *h = ngx_list_push(&r->headers_out.headers);
  if (h == NULL) return NGX_ERROR;
  h->hash = 1;
  h->key.data = (u_char *)name;
  h->key.len = ngx_strlen(name);
  h->value.data = value;
  h->value.len = len;
  h->lowcase_key = NULL;
  return NGX_OK;
}

/* Where the record will be: the admin location's explain/<id>, or the id
 * alone when no lupin_admin location is a prefix one. */
static ngx_int_t ngx_http_lupin_record_link(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx) {
  ngx_http_lupin_main_conf_t *mcf = ngx_http_get_module_main_conf(r, ngx_http_lupin_module);
  const char *id = lupin_request_id(ctx->req);
  size_t idlen = ngx_strlen(id), len = mcf->admin.len + sizeof("/explain/") + idlen;
  u_char *link = ngx_pnalloc(r->pool, len), *p = link;
  if (link == NULL) return NGX_ERROR;
  if (mcf->admin.len) {
    p = ngx_cpymem(p, mcf->admin.data, mcf->admin.len);
    if (p[-1] != '/') *p++ = '/';
    p = ngx_cpymem(p, "explain/", 8);
  }
  p = ngx_cpymem(p, id, idlen);
  return ngx_http_lupin_add_header(r, "x-lupin-explain-record", link, p - link);
}

ngx_int_t ngx_http_lupin_explain_headers(ngx_http_request_t *r) {
  static u_char refused[] = "refused: lupin_explain is off in this location";
  if (r != r->main) return NGX_OK;
  ngx_http_lupin_ctx_t *ctx = ngx_http_get_module_ctx(r, ngx_http_lupin_module);
  if (ctx == NULL || ctx->explain == 0 || ctx->req == NULL) return NGX_OK;
  if (ctx->explain == 2)
    return ngx_http_lupin_add_header(r, "x-lupin-explain", refused, sizeof refused - 1);
  u_char *line = (u_char *)(ctx->explain_summary ? ctx->explain_summary : "");
  if (ngx_http_lupin_add_header(r, "x-lupin-explain", line, ngx_strlen(line)) != NGX_OK)
    return NGX_ERROR;
  return ngx_http_lupin_record_link(r, ctx);
}

/* nginx's attempts as lupin serve's access log writes them: each peer the
 * upstream tried, the status it gave (nginx's 502 or 504 for one that
 * failed) and the time it took. */
static void ngx_http_lupin_attempts(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx, lh_buf *b) {
  if (r->upstream_states == NULL) return;
  ngx_http_upstream_state_t *s = r->upstream_states->elts;
  for (ngx_uint_t i = 0; i < r->upstream_states->nelts; i++) {
    if (s[i].peer == NULL) continue;
    ngx_http_lupin_endpoint_t *found = ngx_http_lupin_worker.endpoints;
    while (found && &found->text != s[i].peer) /* removed ones too: their address stays */
      found = found->next;
    lh_buf_printf(b, "%s{\"endpoint\":\"%.*s\",\"name\":", b->len ? "," : "", (int)s[i].peer->len,
                  s[i].peer->data);
    lh_buf_json(b, found ? found->name : NULL);
    lh_buf_printf(b, ",\"via\":\"%s\",\"status\":%u,\"ms\":%u}",
                  i < ctx->result.n_picks ? "pick" : "fallback", (unsigned)s[i].status,
                  (unsigned)s[i].response_time);
  }
}

void ngx_http_lupin_explain_ended(ngx_http_request_t *r, ngx_http_lupin_ctx_t *ctx,
                                  lupin_outcome o) {
  lh_explain_ring *ring = ngx_http_lupin_worker.admin.ring;
  if (ctx->explain != 1 || ring == NULL) return;
  ngx_time_t *now = ngx_timeofday();
  double ms = (double)(now->sec - r->start_sec) * 1000 + (double)now->msec - r->start_msec;
  lh_buf attempts = {0}, b = {0};
  ngx_http_lupin_attempts(r, ctx, &attempts);
  if (lh_explain_record(&b, ctx->req, (int)r->headers_out.status, lupin_outcome_name(o), ms,
                        attempts.data, attempts.len) == 0 &&
      b.data)
    lh_explain_keep(ring, lupin_request_id(ctx->req), b.data); /* it takes b.data */
  else
    lh_buf_free(&b);
  lh_buf_free(&attempts);
}

/* --- the admin routes ---------------------------------------------------- */

static ngx_int_t ngx_http_lupin_explain_list(ngx_http_request_t *r) {
  lh_buf b = {0};
  lh_explain_ids(&b, ngx_http_lupin_worker.admin.ring);
  return ngx_http_lupin_admin_json(r, NGX_HTTP_OK, &b);
}

static ngx_int_t ngx_http_lupin_explain_one(ngx_http_request_t *r, ngx_str_t *id) {
  char key[512], msg[1024];
  ngx_memcpy(key, id->data, ngx_min(id->len, sizeof key - 1));
  key[ngx_min(id->len, sizeof key - 1)] = '\0';
  char *json = lh_explain_find(ngx_http_lupin_worker.admin.ring, key);
  if (json == NULL) {
    snprintf(msg, sizeof msg,
             "no explain record for request %.200s in worker %lu: each worker keeps the last "
             "%d explained requests of its own, once they have ended (ask with "
             "x-lupin-explain: 1)",
             key, (unsigned long)ngx_worker, NGX_HTTP_LUPIN_EXPLAIN_KEPT);
    return ngx_http_lupin_admin_error(r, NGX_HTTP_NOT_FOUND, msg, NULL);
  }
  lh_buf b = {json, ngx_strlen(json), ngx_strlen(json) + 1};
  return ngx_http_lupin_admin_json(r, NGX_HTTP_OK, &b);
}

/* The admin request's headers are the explained request's, minus its
 * credentials (the admin's, not the request's) and lupin's own. */
static int ngx_http_lupin_passed(const char *name) {
  return strcasecmp(name, "authorization") && strncasecmp(name, "x-lupin-", 8) &&
         !lh_hop_by_hop(name);
}

/* Decides one request against the live endpoints, for its record only: the
 * body checked as the API checks it, its path its own (chat when it has
 * "messages"). */
static ngx_int_t ngx_http_lupin_explain_decide(ngx_http_request_t *r) {
  lupin_header headers[LH_MAX_HEADERS];
  const char *subset[256];
  char err[1024];
  lupin_request_desc d = {
      .headers = headers, .check_body = 1, .flags = LUPIN_REQUEST_EXPLAIN | LUPIN_REQUEST_DRY_RUN};
  if (ngx_http_lupin_body(r, &d.body, &d.body_len) != NGX_OK) return NGX_HTTP_INTERNAL_SERVER_ERROR;
  for (ngx_list_part_t *part = &r->headers_in.headers.part; part; part = part->next) {
    ngx_table_elt_t *h = part->elts;
    for (ngx_uint_t i = 0; i < part->nelts && d.n_headers < LH_MAX_HEADERS; i++) {
      char *name = ngx_pnalloc(r->pool, h[i].key.len + h[i].value.len + 2);
      if (name == NULL) return NGX_HTTP_INTERNAL_SERVER_ERROR;
      char *value = (char *)ngx_cpymem(name, h[i].key.data, h[i].key.len) + 1;
      value[-1] = '\0';
      *ngx_cpymem(value, h[i].value.data, h[i].value.len) = '\0';
      if (!ngx_http_lupin_passed(name)) continue;
      headers[d.n_headers++] = (lupin_header){name, value};
      if (strcasecmp(name, "x-gateway-destination-endpoint-subset") == 0) {
        char *save = NULL;
        d.subset = subset;
        for (char *t = strtok_r(value, ", ", &save); t && d.n_subset < 256;
             t = strtok_r(NULL, ", ", &save))
          subset[d.n_subset++] = t;
      }
    }
  }
  lupin_request *req = lupin_request_begin(ngx_http_lupin_worker.rt, &d, err, sizeof err);
  if (req == NULL) return ngx_http_lupin_admin_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR, err, NULL);
  lupin_result res;
  size_t len;
  const char *json;
  ngx_int_t rc;
  if (lupin_request_schedule(req, &res) == NGX_HTTP_BAD_REQUEST) { /* the API's answer */
    rc = ngx_http_lupin_admin_error(r, NGX_HTTP_BAD_REQUEST, res.message, res.param);
  } else if ((json = lupin_request_explain(req, LUPIN_EXPLAIN_JSON, &len))) {
    lh_buf b = {0};
    if (lh_buf_append(&b, json, len) != 0) {
      lh_buf_free(&b);
      rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
    } else {
      rc = ngx_http_lupin_admin_json(r, NGX_HTTP_OK, &b);
    }
  } else {
    rc =
        ngx_http_lupin_admin_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                   "the explain record could not be made: see the error log", NULL);
  }
  lupin_request_end(req, LUPIN_OK);
  return rc;
}

ngx_int_t ngx_http_lupin_explain_admin(ngx_http_request_t *r, ngx_str_t *rest) {
  if (rest->len == 0 && r->method == NGX_HTTP_POST) return ngx_http_lupin_explain_decide(r);
  if (!(r->method & (NGX_HTTP_GET | NGX_HTTP_HEAD)))
    return ngx_http_lupin_admin_error(r, NGX_HTTP_NOT_ALLOWED,
                                      "method not allowed: POST explain with a request body, "
                                      "GET explain/<request id>",
                                      NULL);
  if (rest->len == 0 || (rest->len == 1 && rest->data[0] == '/'))
    return ngx_http_lupin_explain_list(r);
  if (rest->data[0] == '/') {
    ngx_str_t id = {rest->len - 1, rest->data + 1};
    return ngx_http_lupin_explain_one(r, &id);
  }
  return ngx_http_lupin_admin_error(r, NGX_HTTP_NOT_FOUND,
                                    "unknown admin route: GET explain/<request id>", NULL);
}
