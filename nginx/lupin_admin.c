/* `lupin_admin;` in a location: lupin serve's admin operations, answered by
 * the worker that took the request, as JSON made by the host library
 * (host/admin_json.c).  The operations are named after the location's own
 * name, so `location /lupin/ { lupin_admin; }` serves
 *
 *   GET  /lupin/generations      this worker's live generations
 *   POST /lupin/reload           this worker's runtime reloaded, then every
 *                                other worker's (lupin_reload.c)
 *   POST /lupin/leaks            a full collection, then request state that
 *                                outlived its request
 *   POST /lupin/explain          a dry run's explain record
 *   GET  /lupin/explain[/<id>]   the records this worker kept (lupin_explain.c)
 *
 * Who may call them is nginx's to say (allow and deny, auth_basic,
 * auth_request...): the module adds no access rule of its own. */
#include "ngx_http_lupin.h"

#include <stdio.h>

typedef struct {
  ngx_str_t name;
  ngx_uint_t methods; /* 0: the operation answers a wrong method itself */
  unsigned prefix : 1;
  ngx_int_t (*run)(ngx_http_request_t *r, ngx_str_t *rest);
} ngx_http_lupin_admin_op_t;

/* Each worker answers for itself: x-lupin-worker says which one did (0 to
 * worker_processes - 1), on the admin's answers and on lupin_status's. */
ngx_int_t ngx_http_lupin_worker_header(ngx_http_request_t *r) {
  ngx_table_elt_t *h = ngx_list_push(&r->headers_out.headers);
  u_char *v = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
  if (h == NULL || v == NULL) return NGX_ERROR;
  h->hash = 1;
  ngx_str_set(&h->key, "x-lupin-worker");
  h->value.data = v;
  h->value.len = ngx_sprintf(v, "%ui", ngx_worker) - v;
  h->lowcase_key = NULL;
  return NGX_OK;
}

ngx_int_t ngx_http_lupin_admin_json(ngx_http_request_t *r, ngx_uint_t status, lh_buf *b) {
  if (ngx_http_lupin_worker_header(r) != NGX_OK) {
    lh_buf_free(b);
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  }
  return ngx_http_lupin_send(r, status, "application/json", b);
}

ngx_int_t ngx_http_lupin_admin_error(ngx_http_request_t *r, ngx_uint_t status, const char *msg,
                                     const char *param) {
  lh_buf b = {0};
  if (lh_openai_error(&b, (int)status, msg, param) != 0) {
    lh_buf_free(&b);
    return NGX_HTTP_INTERNAL_SERVER_ERROR;
  }
  return ngx_http_lupin_admin_json(r, status, &b);
}

static ngx_int_t ngx_http_lupin_admin_generations(ngx_http_request_t *r, ngx_str_t *rest) {
  lupin_runtime *rt = ngx_http_lupin_worker.rt;
  lh_buf b = {0};
  (void)rest;
  lh_admin_generations_open(&b, rt);
  lh_admin_generations_worker(&b, rt, (int)ngx_worker); /* which worker answered */
  lh_admin_list_end(&b);
  return ngx_http_lupin_admin_json(r, NGX_HTTP_OK, &b);
}

/* A config that fails is the caller's to fix: 400 with lupin's
 * `file:line: path: message`, as lupin serve answers. */
static ngx_int_t ngx_http_lupin_admin_reload(ngx_http_request_t *r, ngx_str_t *rest) {
  char err[2048];
  (void)rest;
  if (ngx_http_lupin_reload(r->connection->log, "admin", 1, err, sizeof err) != NGX_OK)
    return ngx_http_lupin_admin_error(r, NGX_HTTP_BAD_REQUEST, err, NULL);
  lupin_stats st;
  lupin_runtime_stats(ngx_http_lupin_worker.rt, &st);
  lh_buf b = {0};
  lh_admin_reloaded(&b, st.generation, ngx_http_lupin_worker.admin.last_seconds);
  return ngx_http_lupin_admin_json(r, NGX_HTTP_OK, &b);
}

/* Blocks the worker for a full collection (about a millisecond per MB of
 * Lua heap). */
static ngx_int_t ngx_http_lupin_admin_leaks(ngx_http_request_t *r, ngx_str_t *rest) {
  lh_leaks l = {0};
  lh_buf b = {0};
  ngx_int_t rc;
  (void)rest;
  lh_leaks_check(&l, ngx_http_lupin_worker.rt, -1);
  if (l.failed) {
    lh_leaks_failure(&b, &l);
    rc = ngx_http_lupin_admin_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                    b.data ? b.data : "the leak check failed", NULL);
    lh_buf_free(&b);
  } else {
    lh_admin_leaks(&b, &l);
    rc = ngx_http_lupin_admin_json(r, NGX_HTTP_OK, &b);
  }
  lh_leaks_free(&l);
  return rc;
}

/* A new operation is a row. */
static ngx_http_lupin_admin_op_t ngx_http_lupin_admin_ops[] = {
    {ngx_string("generations"), NGX_HTTP_GET | NGX_HTTP_HEAD, 0, ngx_http_lupin_admin_generations},
    {ngx_string("reload"), NGX_HTTP_POST, 0, ngx_http_lupin_admin_reload},
    {ngx_string("leaks"), NGX_HTTP_POST, 0, ngx_http_lupin_admin_leaks},
    {ngx_string("explain"), 0, 1, ngx_http_lupin_explain_admin},
};

static ngx_int_t ngx_http_lupin_admin_not_allowed(ngx_http_request_t *r, ngx_str_t *name,
                                                  ngx_uint_t methods) {
  char msg[256];
  const char *allow = methods & NGX_HTTP_POST ? "POST" : "GET, HEAD";
  ngx_table_elt_t *h = ngx_list_push(&r->headers_out.headers);
  if (h == NULL) return NGX_HTTP_INTERNAL_SERVER_ERROR;
  h->hash = 1;
  ngx_str_set(&h->key, "Allow");
  h->value.data = (u_char *)allow;
  h->value.len = ngx_strlen(allow);
  h->lowcase_key = NULL;
  snprintf(msg, sizeof msg, "method not allowed: %s %.*s", allow, (int)name->len, name->data);
  return ngx_http_lupin_admin_error(r, NGX_HTTP_NOT_ALLOWED, msg, NULL);
}

static ngx_int_t ngx_http_lupin_admin_route(ngx_http_request_t *r) {
  ngx_http_core_loc_conf_t *clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
  if (ngx_http_lupin_worker.rt == NULL)
    return ngx_http_lupin_admin_error(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                                      "lupin_admin: no lupin_config in this nginx", NULL);
  ngx_str_t rest = r->uri;
  if (rest.len >= clcf->name.len) {
    rest.data += clcf->name.len;
    rest.len -= clcf->name.len;
  }
  if (rest.len && rest.data[0] == '/') {
    rest.data++;
    rest.len--;
  }
  for (size_t i = 0; i < sizeof ngx_http_lupin_admin_ops / sizeof ngx_http_lupin_admin_ops[0];
       i++) {
    ngx_http_lupin_admin_op_t *op = &ngx_http_lupin_admin_ops[i];
    if (rest.len < op->name.len || ngx_strncmp(rest.data, op->name.data, op->name.len) ||
        (rest.len > op->name.len && !(op->prefix && rest.data[op->name.len] == '/')))
      continue;
    if (op->methods && !(r->method & op->methods))
      return ngx_http_lupin_admin_not_allowed(r, &op->name, op->methods);
    ngx_str_t tail = {rest.len - op->name.len, rest.data + op->name.len};
    return op->run(r, &tail);
  }
  char msg[512];
  snprintf(msg, sizeof msg,
           "unknown admin operation \"%.*s\": GET generations, POST reload, POST leaks, "
           "POST explain, GET explain, GET explain/<request id>",
           (int)ngx_min(rest.len, 200), rest.data);
  return ngx_http_lupin_admin_error(r, NGX_HTTP_NOT_FOUND, msg, NULL);
}

static void ngx_http_lupin_admin_body_read(ngx_http_request_t *r) {
  ngx_http_finalize_request(r, ngx_http_lupin_admin_route(r));
}

static ngx_int_t ngx_http_lupin_admin_handler(ngx_http_request_t *r) {
  if (r->method & (NGX_HTTP_GET | NGX_HTTP_HEAD)) {
    ngx_int_t rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) return rc;
    return ngx_http_lupin_admin_route(r);
  }
  r->request_body_in_single_buf = 1;
  ngx_int_t rc = ngx_http_read_client_request_body(r, ngx_http_lupin_admin_body_read);
  if (rc >= NGX_HTTP_SPECIAL_RESPONSE) return rc;
  return NGX_DONE;
}

char *ngx_http_lupin_admin(ngx_conf_t *cf, ngx_command_t *cmd, void *conf) {
  ngx_http_core_loc_conf_t *clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
  ngx_http_lupin_main_conf_t *mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_lupin_module);
  ngx_http_lupin_loc_conf_t *lcf = conf;
  (void)cmd;
#if (NGX_PCRE)
  if (clcf->regex) return "needs a prefix location: the operations are named after its name";
#endif
  if (clcf->named || clcf->exact_match)
    return "needs a prefix location: the operations are named after its name";
  clcf->handler = ngx_http_lupin_admin_handler;
  lcf->schedule = 0; /* an admin POST is not a request to schedule */
  /* explain records link to the first one */
  if (mcf->admin.len == 0) mcf->admin = clcf->name;
  return NGX_CONF_OK;
}
