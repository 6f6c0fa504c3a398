/* The admin listener (loopback by default, optional bearer token):
 *   GET  /metrics          Prometheus text
 *   GET  /healthz          the process answers
 *   GET  /readyz           200 when an endpoint is healthy with fresh metrics
 *   GET  /admin/endpoints  the pool with its metrics, JSON
 *   GET  /admin/requests   requests in flight with age and generation, JSON
 *   GET  /admin/generations  live generations: number, load time, digest, pinned
 *   POST /admin/reload     re-reads the config and plugins; answers the new
 *                          generation and the time it took, or the error */
#include "gateway.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void reply(gw_conn *c, int status, const char *type, const gw_buf *b) {
  lupin_header h = {"content-type", type};
  gw_conn_respond(c, status, &h, 1, b->data ? b->data : "", b->len);
}

/* --- /metrics ------------------------------------------------------------ */

/* Names from the config (endpoints, plugins) go into label values escaped:
 * a quote or a newline in one must not start a series of its own. */
static void plugin_stat(void *ud, const lupin_plugin_stat *s) {
  gw_buf *b = ud, l = {0};
  gw_buf_printf(&l, "plugin=");
  gw_buf_label(&l, s->plugin);
  gw_buf_printf(&l, ",type=");
  gw_buf_label(&l, s->type);
  gw_buf_printf(&l, ",point=");
  gw_buf_label(&l, s->point);
  const char *labels = l.data ? l.data : "";
  gw_buf_printf(b, "lupin_plugin_calls_total{%s} %llu\n", labels, (unsigned long long)s->calls);
  gw_buf_printf(b, "lupin_plugin_errors_total{%s} %llu\n", labels, (unsigned long long)s->errors);
  gw_buf_printf(b, "lupin_plugin_seconds_total{%s} %.9f\n", labels, (double)s->nanoseconds / 1e9);
  gw_buf_printf(b, "lupin_plugin_budget_cuts_total{%s} %llu\n", labels, (unsigned long long)s->cuts);
  gw_buf_printf(b, "lupin_plugin_disabled{%s} %d\n", labels, s->disabled);
  gw_buf_free(&l);
}

/* name{endpoint="..."} value, the value in Prometheus' spelling. */
static void endpoint_sample(gw_buf *b, const char *name, const gw_endpoint *ep, double v) {
  gw_buf_printf(b, "%s{endpoint=", name);
  gw_buf_label(b, ep->name);
  if (isnan(v))
    gw_buf_printf(b, "} NaN\n");
  else if (isinf(v))
    gw_buf_printf(b, "} %sInf\n", v > 0 ? "+" : "-");
  else
    gw_buf_printf(b, "} %.17g\n", v);
}

static void metrics_requests(lupin_gateway *gw, gw_buf *b) {
  gw_stats *s = &gw->stats;
  gw_buf_printf(b, "# TYPE lupin_requests_total counter\n");
  for (int i = 100; i < 600; i++)
    if (s->by_status[i])
      gw_buf_printf(b, "lupin_requests_total{status=\"%d\"} %llu\n", i,
                    (unsigned long long)s->by_status[i]);
  gw_buf_printf(b, "# TYPE lupin_request_outcomes_total counter\n");
  for (int o = LUPIN_OK; o <= LUPIN_INVALID_REQUEST; o++)
    gw_buf_printf(b, "lupin_request_outcomes_total{outcome=\"%s\"} %llu\n", lupin_outcome_name(o),
                  (unsigned long long)s->by_outcome[o]);
  gw_buf_printf(b, "# TYPE lupin_scheduling_seconds histogram\n");
  uint64_t cum = 0;
  for (int i = 0; i < GW_SCHED_BUCKETS; i++) {
    cum += s->sched_buckets[i];
    gw_buf_printf(b, "lupin_scheduling_seconds_bucket{le=\"%g\"} %llu\n", gw_sched_bounds[i],
                  (unsigned long long)cum);
  }
  gw_buf_printf(b, "lupin_scheduling_seconds_bucket{le=\"+Inf\"} %llu\n",
                (unsigned long long)s->sched_count);
  gw_buf_printf(b, "lupin_scheduling_seconds_sum %.9f\nlupin_scheduling_seconds_count %llu\n",
                s->sched_sum, (unsigned long long)s->sched_count);
}

static void metrics_endpoints(lupin_gateway *gw, gw_buf *b) {
  static const char *const names[] = {"waiting_queue_size", "running_requests", "kv_cache_usage",
                                      "max_lora"};
  double now = lupin_now();
  char name[64];
  for (int k = 0; k < 4; k++) {
    gw_buf_printf(b, "# TYPE lupin_endpoint_%s gauge\n", names[k]);
    snprintf(name, sizeof name, "lupin_endpoint_%s", names[k]);
    for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next) {
      const lupin_metrics *m = &ep->metrics;
      double v[] = {m->waiting_queue_size, m->running_requests, m->kv_cache_usage, m->max_lora};
      endpoint_sample(b, name, ep, v[k]);
    }
  }
  gw_buf_printf(b, "# TYPE lupin_endpoint_scrape_age_seconds gauge\n");
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    endpoint_sample(b, "lupin_endpoint_scrape_age_seconds", ep,
                    ep->scraped_at ? now - ep->scraped_at : -1);
  gw_buf_printf(b, "# TYPE lupin_endpoint_scrape_errors_total counter\n");
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    endpoint_sample(b, "lupin_endpoint_scrape_errors_total", ep, (double)ep->scrape_errors);
}

/* Health and retries, per endpoint (health.c, proxy.c). */
static void metrics_health(lupin_gateway *gw, gw_buf *b) {
  gw_buf_printf(b, "# TYPE lupin_endpoint_healthy gauge\n");
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    endpoint_sample(b, "lupin_endpoint_healthy", ep, ep->health.state == GW_HEALTHY);
  gw_buf_printf(b, "# TYPE lupin_endpoint_ejections_total counter\n");
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    endpoint_sample(b, "lupin_endpoint_ejections_total", ep, (double)ep->health.ejections);
  gw_buf_printf(b, "# TYPE lupin_endpoint_restorations_total counter\n");
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    endpoint_sample(b, "lupin_endpoint_restorations_total", ep, (double)ep->health.restorations);
  static const char *const families[] = {"lupin_upstream_failures_total",
                                         "lupin_upstream_retries_total"};
  for (int f = 0; f < 2; f++) {
    gw_buf_printf(b, "# TYPE %s counter\n", families[f]);
    for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
      for (int e = 0; e < GW_UP_ERRORS; e++) {
        uint64_t v = f ? ep->health.retries[e] : ep->health.failures[e];
        if (!v) continue;
        gw_buf_printf(b, "%s{endpoint=", families[f]);
        gw_buf_label(b, ep->name);
        gw_buf_printf(b, ",reason=\"%s\"} %llu\n", gw_failure_name(e), (unsigned long long)v);
      }
  }
  gw_buf_printf(b,
                "# TYPE lupin_upstream_retries_denied_total counter\n"
                "lupin_upstream_retries_denied_total %llu\n"
                "# TYPE lupin_endpoints_healthy gauge\nlupin_endpoints_healthy %zu\n",
                (unsigned long long)gw->retries_denied, gw_healthy_endpoints(gw));
}

static void metrics_reloads(lupin_gateway *gw, gw_buf *b) {
  const gw_reload_stats *r = &gw->reloads;
  gw_buf_printf(b,
                "# TYPE lupin_reloads_total counter\n"
                "lupin_reloads_total{result=\"ok\"} %llu\n"
                "lupin_reloads_total{result=\"error\"} %llu\n"
                "# TYPE lupin_reload_duration_seconds summary\n"
                "lupin_reload_duration_seconds_sum %.9f\n"
                "lupin_reload_duration_seconds_count %llu\n"
                "# TYPE lupin_reload_last_duration_seconds gauge\n"
                "lupin_reload_last_duration_seconds %.9f\n",
                (unsigned long long)r->ok, (unsigned long long)r->error, r->seconds_sum,
                (unsigned long long)(r->ok + r->error), r->last_seconds);
}

static void metrics_bounds(lupin_gateway *gw, const lupin_stats *st, gw_buf *b) {
  gw_buf_printf(
      b,
      "# TYPE lupin_requests_in_flight gauge\nlupin_requests_in_flight %zu\n"
      "# TYPE lupin_buffered_body_bytes gauge\nlupin_buffered_body_bytes %llu\n"
      "# TYPE lupin_capacity_refusals_total counter\n"
      "lupin_capacity_refusals_total{cap=\"maxRequestsInFlight\"} %llu\n"
      "lupin_capacity_refusals_total{cap=\"maxBufferedBodyBytes\"} %llu\n"
      "# TYPE lupin_lua_memory_limit_bytes gauge\nlupin_lua_memory_limit_bytes %llu\n"
      "# TYPE lupin_lua_memory_limit_hits_total counter\n"
      "lupin_lua_memory_limit_hits_total %llu\n",
      gw->in_flight, (unsigned long long)gw->body_bytes, (unsigned long long)gw->refused_in_flight,
      (unsigned long long)gw->refused_body_bytes, (unsigned long long)gw->set.max_lua_memory_bytes,
      (unsigned long long)st->memory_limit_hits);
}

static void metrics(lupin_gateway *gw, gw_conn *c) {
  gw_buf b = {0};
  metrics_requests(gw, &b);
  gw_buf_printf(&b, "# TYPE lupin_plugin_calls_total counter\n"
                    "# TYPE lupin_plugin_errors_total counter\n"
                    "# TYPE lupin_plugin_seconds_total counter\n"
                    "# TYPE lupin_plugin_budget_cuts_total counter\n"
                    "# TYPE lupin_plugin_disabled gauge\n");
  lupin_runtime_plugin_stats(gw->rt, plugin_stat, &b);
  metrics_endpoints(gw, &b);
  metrics_health(gw, &b);
  metrics_reloads(gw, &b);
  lupin_stats st;
  lupin_runtime_stats(gw->rt, &st);
  gw_buf_printf(&b,
                "# TYPE lupin_live_requests gauge\nlupin_live_requests %llu\n"
                "# TYPE lupin_live_request_tables gauge\nlupin_live_request_tables %llu\n"
                "# TYPE lupin_lua_memory_bytes gauge\nlupin_lua_memory_bytes %llu\n"
                "# TYPE lupin_lua_memory_peak_bytes gauge\nlupin_lua_memory_peak_bytes %llu\n"
                "# TYPE lupin_generation gauge\nlupin_generation %llu\n"
                "# TYPE lupin_generations_alive gauge\nlupin_generations_alive %llu\n"
                "# TYPE lupin_endpoints gauge\nlupin_endpoints %zu\n",
                (unsigned long long)st.live_requests, (unsigned long long)st.live_request_tables,
                (unsigned long long)st.lua_memory, (unsigned long long)st.lua_memory_peak,
                (unsigned long long)st.generation, (unsigned long long)st.generations_alive,
                gw->n_endpoints);
  metrics_bounds(gw, &st, &b);
  reply(c, 200, "text/plain; version=0.0.4", &b);
  gw_buf_free(&b);
}

/* --- JSON views ---------------------------------------------------------- */

static void endpoints(lupin_gateway *gw, gw_conn *c) {
  gw_buf b = {0};
  double now = lupin_now(), stale = (double)gw->set.metrics_staleness_ms / 1000;
  gw_buf_printf(&b, "{\"endpoints\":[");
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next) {
    const lupin_metrics *m = &ep->metrics;
    gw_buf_printf(&b, "%s{\"name\":", ep == gw->endpoints ? "" : ",");
    gw_buf_json(&b, ep->name);
    gw_buf_printf(&b, ",\"address\":");
    gw_buf_json(&b, ep->address);
    gw_buf_printf(&b, ",\"addresses\":[");
    for (int i = 0; i < ep->n_addrs; i++) { /* in the order connects try them */
      char name[80];
      gw_addr_name(&ep->addrs[(ep->addr_first + i) % ep->n_addrs], name, sizeof name);
      gw_buf_printf(&b, "%s\"%s\"", i ? "," : "", name);
    }
    gw_buf_printf(&b, "]");
    gw_buf_printf(&b, ",\"port\":%d,\"fresh\":%s,\"scrape_age_seconds\":", ep->port,
                  ep->scraped_at && now - ep->scraped_at <= stale ? "true" : "false");
    gw_buf_number(&b, ep->scraped_at ? now - ep->scraped_at : -1);
    gw_buf_printf(&b,
                  ",\"scrapes\":%llu,\"scrape_errors\":%llu,\"idle_connections\":%zu,"
                  "\"metrics\":{",
                  (unsigned long long)ep->scrapes, (unsigned long long)ep->scrape_errors,
                  ep->pools[GW_POOL_GEN].n_idle);
    /* numbers a host or a scrape set: JSON has no NaN or Infinity, null then */
    static const char *const keys[] = {"waiting_queue_size", "running_requests", "kv_cache_usage",
                                       "max_lora",           "cache_block_size", "num_blocks"};
    double v[] = {m->waiting_queue_size, m->running_requests, m->kv_cache_usage,
                  m->max_lora,           m->cache_block_size, m->num_blocks};
    for (int k = 0; k < 6; k++) {
      gw_buf_printf(&b, "\"%s\":", keys[k]);
      gw_buf_number(&b, v[k]);
      gw_buf_printf(&b, ",");
    }
    gw_buf_printf(&b, "\"running_lora_adapters\":");
    gw_buf_json(&b, ep->running_lora);
    gw_buf_printf(&b, ",\"waiting_lora_adapters\":");
    gw_buf_json(&b, ep->waiting_lora);
    const gw_health *h = &ep->health;
    gw_buf_printf(&b,
                  "},\"health\":{\"state\":\"%s\",\"consecutive_errors\":%llu,"
                  "\"consecutive_scrape_failures\":%llu,\"ejections\":%llu,"
                  "\"restorations\":%llu,\"ejected_for_seconds\":%.3f,"
                  "\"last_ejection_unix\":%.3f,\"last_error\":",
                  gw_health_state_name(h->state), (unsigned long long)h->errors,
                  (unsigned long long)h->scrape_failures, (unsigned long long)h->ejections,
                  (unsigned long long)h->restorations,
                  h->state == GW_EJECTED && h->ejected_until > now ? h->ejected_until - now : 0,
                  h->ejected_unix);
    gw_buf_json(&b, h->last_error);
    gw_buf_printf(&b, "}}");
  }
  gw_buf_printf(&b, "]}\n");
  reply(c, 200, "application/json", &b);
  gw_buf_free(&b);
}

static void requests(lupin_gateway *gw, gw_conn *c) {
  gw_buf b = {0};
  double now = lupin_now();
  gw_buf_printf(&b, "{\"requests\":[");
  for (gw_exchange *x = gw->exchanges; x; x = x->next) {
    gw_buf_printf(&b, "%s{\"id\":", x == gw->exchanges ? "" : ",");
    gw_buf_json(&b, lupin_request_id(x->req));
    gw_buf_printf(&b, ",\"model\":");
    gw_buf_json(&b, x->model);
    gw_buf_printf(&b, ",\"path\":");
    gw_buf_json(&b, x->path);
    gw_buf_printf(&b, ",\"endpoint\":");
    gw_buf_json(&b, x->ep ? x->ep->hostport : "");
    gw_buf_printf(&b, ",\"stream\":%s,\"age_seconds\":%.3f,\"generation\":%llu}",
                  x->stream ? "true" : "false", now - x->started,
                  (unsigned long long)lupin_request_generation(x->req));
  }
  gw_buf_printf(&b, "]}\n");
  reply(c, 200, "application/json", &b);
  gw_buf_free(&b);
}

static void generation_json(void *ud, const lupin_generation_info *g) {
  gw_buf *b = ud;
  gw_buf_printf(
      b, "%s{\"number\":%llu,\"current\":%s,\"source\":", b->data[b->len - 1] == '[' ? "" : ",",
      (unsigned long long)g->number, g->current ? "true" : "false");
  gw_buf_json(b, g->source);
  gw_buf_printf(b,
                ",\"digest\":\"%s\",\"loaded_at\":%.3f,\"age_seconds\":%.3f,"
                "\"load_seconds\":%.6f,\"pinned\":%llu}",
                g->digest, g->loaded_unix, lupin_now() - g->loaded_at, g->load_seconds,
                (unsigned long long)g->pinned);
}

static void generations(lupin_gateway *gw, gw_conn *c) {
  gw_buf b = {0};
  lupin_stats st;
  lupin_runtime_stats(gw->rt, &st);
  gw_buf_printf(&b, "{\"current\":%llu,\"generations\":[", (unsigned long long)st.generation);
  lupin_runtime_generations(gw->rt, generation_json, &b);
  gw_buf_printf(&b, "]}\n");
  reply(c, 200, "application/json", &b);
  gw_buf_free(&b);
}

static void reload(lupin_gateway *gw, gw_conn *c) {
  char err[2048];
  uint64_t n = 0;
  double dt = 0;
  if (gw_reload(gw, "admin", err, sizeof err, &n, &dt)) {
    gw_conn_error(c, 400, err, NULL, NULL, 0);
    return;
  }
  gw_buf b = {0};
  gw_buf_printf(&b, "{\"reloaded\":true,\"generation\":%llu,\"duration_seconds\":%.6f}\n",
                (unsigned long long)n, dt);
  reply(c, 200, "application/json", &b);
  gw_buf_free(&b);
}

/* A full collection, then whatever request state outlived its request: lets
 * an operator tell tables merely not yet collected (lupin_live_request_tables
 * counts those) from a leak.  Blocks the loop for the collection (ms). */
static void leaks(lupin_gateway *gw, gw_conn *c) {
  char report[4096];
  int n = lupin_runtime_check_leaks(gw->rt, report, sizeof report);
  if (n < 0) {
    char msg[4200];
    snprintf(msg, sizeof msg, "the leak check failed: %s", report);
    gw_conn_error(c, 500, msg, NULL, NULL, 0);
    return;
  }
  lupin_stats st;
  lupin_runtime_stats(gw->rt, &st);
  gw_buf b = {0};
  gw_buf_printf(&b,
                "{\"leaked\":%d,\"live_requests\":%llu,\"live_request_tables\":%llu,"
                "\"lua_memory_bytes\":%llu,\"report\":",
                n, (unsigned long long)st.live_requests, (unsigned long long)st.live_request_tables,
                (unsigned long long)st.lua_memory);
  gw_buf_json(&b, report);
  gw_buf_printf(&b, "}\n");
  reply(c, 200, "application/json", &b);
  gw_buf_free(&b);
}

static void text(gw_conn *c, int status, const char *msg) {
  gw_buf b = {0};
  gw_buf_printf(&b, "%s\n", msg);
  reply(c, status, "text/plain", &b);
  gw_buf_free(&b);
}

/* Compares in a time that depends on the length of what the client sent,
 * never on how much of the token it got right (strcmp stops at the first
 * difference, which lets a client find the token byte by byte). */
static int same_secret(const char *given, const char *token) {
  size_t n = strlen(given), t = strlen(token);
  volatile unsigned char diff = n != t;
  for (size_t i = 0; i < n; i++)
    diff |= (unsigned char)given[i] ^ (unsigned char)token[i % t];
  return diff == 0;
}

static int authorized(lupin_gateway *gw, gw_http_request *req) {
  const char *token = gw->opts.admin_token;
  if (!token || !*token) return 1;
  const char *auth = gw_headers_get(&req->headers, "authorization");
  return auth && !strncasecmp(auth, "Bearer ", 7) && same_secret(auth + 7, token);
}

void gw_admin_handle(void *ud, gw_conn *c, gw_http_request *req) {
  lupin_gateway *gw = ud;
  char path[256];
  snprintf(path, sizeof path, "%s", req->url);
  path[strcspn(path, "?")] = 0;
  if (!authorized(gw, req)) {
    lupin_header h = {"www-authenticate", "Bearer"};
    gw_conn_error(c, 401, "missing or wrong admin token: send Authorization: Bearer <token>", NULL,
                  &h, 1);
  } else if (!strcmp(path, "/admin/reload") || !strcmp(path, "/admin/leaks")) {
    if (req->method != HTTP_POST)
      gw_conn_error(c, 405, "method not allowed: use POST", NULL, NULL, 0);
    else if (!strcmp(path, "/admin/reload"))
      reload(gw, c);
    else
      leaks(gw, c);
  } else if (req->method != HTTP_GET) {
    gw_conn_error(c, 405, "method not allowed: use GET", NULL, NULL, 0);
  } else if (!strcmp(path, "/metrics")) {
    metrics(gw, c);
  } else if (!strcmp(path, "/healthz")) {
    text(c, 200, "ok");
  } else if (!strcmp(path, "/readyz")) {
    size_t n = gw_fresh_endpoints(gw);
    text(c, n ? 200 : 503,
         n ? "ready" : "not ready: no healthy endpoint with fresh metrics (see /admin/endpoints)");
  } else if (!strcmp(path, "/admin/endpoints")) {
    endpoints(gw, c);
  } else if (!strcmp(path, "/admin/requests")) {
    requests(gw, c);
  } else if (!strcmp(path, "/admin/generations")) {
    generations(gw, c);
  } else {
    gw_conn_error(c, 404,
                  "unknown admin route: GET /metrics, /healthz, /readyz, /admin/endpoints, "
                  "/admin/requests, /admin/generations; POST /admin/reload, /admin/leaks",
                  NULL, NULL, 0);
  }
}
