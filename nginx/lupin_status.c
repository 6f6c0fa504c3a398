/* `lupin_status;` in a location: the worker's runtime in Prometheus text,
 * written through the host library's registry (host/metrics.c), so the
 * families carry the names, types and help lupin serve's /metrics gives
 * them.  Each worker answers for itself: with several workers a scrape sees
 * the one that took the connection, named in x-lupin-worker (docs/nginx.md). */
#include "ngx_http_lupin.h"

#include <stdio.h>

typedef struct {
  lh_expo *e;
  lh_family_id id;
} ngx_http_lupin_plugin_pass_t;

static void ngx_http_lupin_plugin_stat(void *ud, const lupin_plugin_stat *s) {
  ngx_http_lupin_plugin_pass_t *p = ud;
  const char *own[] = {s->plugin, s->type, s->point};
  double v = p->id == LH_M_PLUGIN_CALLS    ? (double)s->calls
             : p->id == LH_M_PLUGIN_ERRORS ? (double)s->errors
             : p->id == LH_M_PLUGIN_CUTS   ? (double)s->cuts
                                           : (double)s->nanoseconds / 1e9;
  lh_expo_sample(p->e, own, v);
}

static void ngx_http_lupin_gauge(lh_expo *e, lh_family_id id, uint64_t v) {
  lh_expo_family(e, id);
  lh_expo_sample(e, NULL, (double)v);
}

static void ngx_http_lupin_exposition(lh_buf *b) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  lh_expo e = {.b = b};
  char status[12];
  lh_expo_family(&e, LH_M_REQUESTS);
  for (int i = 100; i < 600; i++)
    if (w->by_status[i]) {
      snprintf(status, sizeof status, "%d", i);
      lh_expo_sample(&e, (const char *[]){status}, (double)w->by_status[i]);
    }
  lh_expo_family(&e, LH_M_OUTCOMES);
  for (int o = LUPIN_OK; o <= LUPIN_OUTCOME_LAST; o++)
    lh_expo_sample(&e, (const char *[]){lupin_outcome_name(o)}, (double)w->outcomes[o]);

  lh_expo_family(&e, LH_M_RELOADS); /* this worker's: lupin_reload.c */
  lh_expo_sample(&e, (const char *[]){"ok"}, (double)w->admin.reloads[0]);
  lh_expo_sample(&e, (const char *[]){"error"}, (double)w->admin.reloads[1]);
  lh_expo_family(&e, LH_M_RELOAD_LAST);
  lh_expo_sample(&e, NULL, w->admin.last_seconds);

  static const lh_family_id plugin_ids[] = {LH_M_PLUGIN_CALLS, LH_M_PLUGIN_ERRORS,
                                            LH_M_PLUGIN_SECONDS, LH_M_PLUGIN_CUTS};
  for (size_t k = 0; k < sizeof plugin_ids / sizeof plugin_ids[0]; k++) {
    ngx_http_lupin_plugin_pass_t p = {&e, plugin_ids[k]};
    lh_expo_family(&e, plugin_ids[k]);
    lupin_runtime_plugin_stats(w->rt, ngx_http_lupin_plugin_stat, &p);
  }

  lupin_stats st;
  lupin_runtime_stats(w->rt, &st);
  ngx_http_lupin_gauge(&e, LH_M_LIVE_REQUESTS, st.live_requests);
  ngx_http_lupin_gauge(&e, LH_M_LIVE_TABLES, st.live_request_tables);
  ngx_http_lupin_gauge(&e, LH_M_LUA_MEMORY, st.lua_memory);
  ngx_http_lupin_gauge(&e, LH_M_LUA_PEAK, st.lua_memory_peak);
  ngx_http_lupin_gauge(&e, LH_M_GENERATION, st.generation);
  ngx_http_lupin_gauge(&e, LH_M_GENERATIONS_ALIVE, st.generations_alive);
  ngx_http_lupin_gauge(&e, LH_M_ENDPOINTS, st.endpoints);
  ngx_http_lupin_endpoints_expo(&e);
  if (w->prefix_zone) { /* the prefix records shared with the other workers */
    ngx_http_lupin_gauge(&e, LH_M_REPLICA_PUBLISHED, w->prefix_published);
    ngx_http_lupin_gauge(&e, LH_M_REPLICA_APPLIED, w->prefix_applied);
    ngx_http_lupin_gauge(&e, LH_M_REPLICA_IGNORED, w->prefix_ignored);
    ngx_http_lupin_gauge(&e, LH_M_REPLICA_DROPPED, w->prefix_dropped + w->prefix_too_long);
  }
}

static ngx_int_t ngx_http_lupin_status_handler(ngx_http_request_t *r) {
  if (!(r->method & (NGX_HTTP_GET | NGX_HTTP_HEAD))) return NGX_HTTP_NOT_ALLOWED;
  if (ngx_http_lupin_worker.rt == NULL) return NGX_HTTP_NOT_FOUND;
  ngx_int_t rc = ngx_http_discard_request_body(r);
  if (rc != NGX_OK) return rc;
  /* a full collection first: live_request_tables then counts live ones
   * only, not the tables of ended requests the collector has not reached */
  if (r->args.len == 7 && ngx_strncmp(r->args.data, "collect", 7) == 0)
    lupin_runtime_collect(ngx_http_lupin_worker.rt);

  if (ngx_http_lupin_worker_header(r) != NGX_OK) return NGX_HTTP_INTERNAL_SERVER_ERROR;
  lh_buf text = {0};
  ngx_http_lupin_exposition(&text);
  return ngx_http_lupin_send(r, NGX_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", &text);
}

char *ngx_http_lupin_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf) {
  ngx_http_core_loc_conf_t *clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
  (void)cmd;
  (void)conf;
  clcf->handler = ngx_http_lupin_status_handler;
  return NGX_CONF_OK;
}
