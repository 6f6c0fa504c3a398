/* The admin listener (loopback by default, optional bearer token):
 *   GET  /metrics          Prometheus text
 *   GET  /healthz          the process answers
 *   GET  /readyz           200 when an endpoint is healthy with fresh metrics
 *                          (and, with --k8s-pool, the pool is synced)
 *   GET  /admin/endpoints  the pool with its metrics, JSON
 *   GET  /admin/requests   requests in flight with age and generation, JSON
 *   GET  /admin/generations  live generations: number, load time, digest, pinned
 *   POST /admin/reload     re-reads the config and plugins; answers the new
 *                          generation and the time it took, or the error */
#include "admin/admin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void reply(gw_conn *c, int status, const char *type, const lh_buf *b) {
  lupin_header h = {"content-type", type};
  gw_conn_respond(c, status, &h, 1, b->data ? b->data : "", b->len);
}

/* --- /metrics ------------------------------------------------------------ */

/* Every family through the registry (metrics.c): its # HELP and # TYPE, its
 * label values escaped, so a quote or a newline in a name from the config
 * (endpoints, plugins) or from a client (models) cannot start a series. */

typedef struct plugin_pass {
  lh_expo *e;
  lh_family_id id; /* the family this pass writes */
} plugin_pass;

/* The runtime's per-(plugin, point) counters, one family per pass: a family's
 * samples must all follow its header. */
static void plugin_stat(void *ud, const lupin_plugin_stat *s) {
  plugin_pass *p = ud;
  const char *own[] = {s->plugin, s->type, s->point};
  double seconds = (double)s->nanoseconds / 1e9;
  switch (p->id) {
  case LH_M_PLUGIN_DURATION: { /* the EPP's names and label order */
    /* the EPP's name of the point (lua/lupin/generation/points.lua), so
     * that its dashboards' selectors match */
    const char *epp[] = {s->epp_point, s->type, s->plugin};
    lh_expo_buckets(p->e, epp, s->buckets, seconds);
    break;
  }
  case LH_M_PLUGIN_CALLS:
    lh_expo_sample(p->e, own, (double)s->calls);
    break;
  case LH_M_PLUGIN_ERRORS:
    lh_expo_sample(p->e, own, (double)s->errors);
    break;
  case LH_M_PLUGIN_SECONDS:
    lh_expo_sample(p->e, own, seconds);
    break;
  case LH_M_PLUGIN_CUTS:
    lh_expo_sample(p->e, own, (double)s->cuts);
    break;
  default:
    lh_expo_sample(p->e, own, s->disabled);
    break;
  }
}

static void metrics_plugins(lupin_gateway *gw, lh_expo *e) {
  static const lh_family_id ids[] = {LH_M_PLUGIN_CALLS, LH_M_PLUGIN_ERRORS,   LH_M_PLUGIN_SECONDS,
                                     LH_M_PLUGIN_CUTS,  LH_M_PLUGIN_DISABLED, LH_M_PLUGIN_DURATION};
  for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
    plugin_pass p = {e, ids[k]};
    lh_expo_family(e, ids[k]);
    lupin_runtime_plugin_stats(gw->rt, plugin_stat, &p);
  }
}

static void metrics_requests(lupin_gateway *gw, lh_expo *e) {
  gw_stats *s = &gw->stats;
  char status[12]; /* an int, whatever the compiler proves of i */
  lh_expo_family(e, LH_M_REQUESTS);
  for (int i = 100; i < 600; i++)
    if (s->by_status[i]) {
      snprintf(status, sizeof status, "%d", i);
      lh_expo_sample(e, (const char *[]){status}, (double)s->by_status[i]);
    }
  lh_expo_family(e, LH_M_OUTCOMES);
  for (int o = LUPIN_OK; o <= LUPIN_OUTCOME_LAST; o++)
    lh_expo_sample(e, (const char *[]){lupin_outcome_name(o)}, (double)s->by_outcome[o]);
  lh_expo_family(e, LH_M_SCHEDULING);
  lh_expo_histogram(e, NULL, &s->sched);
  /* how the connections spread over the workers: one series each */
  uint64_t answered = 0;
  for (int i = 100; i < 600; i++)
    answered += s->by_status[i];
  char worker[16];
  snprintf(worker, sizeof worker, "%d", gw->worker);
  lh_expo_family(e, LH_M_WORKER_REQUESTS);
  lh_expo_sample(e, (const char *[]){worker}, (double)answered);
}

/* One gauge or counter per endpoint. */
static void per_endpoint(lupin_gateway *gw, lh_expo *e, lh_family_id id) {
  double now = lupin_now();
  lh_expo_family(e, id);
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next) {
    lh_endpoint_state s = {&ep->metrics, ep->scraped_at, ep->scrape_errors, &ep->health};
    lh_expo_sample(e, (const char *[]){ep->name}, lh_endpoint_sample(id, &s, now));
  }
}

static void metrics_endpoints(lupin_gateway *gw, lh_expo *e) {
  for (lh_family_id id = LH_M_EP_WAITING; id <= LH_M_EP_RESTORATIONS; id++)
    per_endpoint(gw, e, id);
  for (int f = 0; f < 2; f++) {
    lh_expo_family(e, f ? LH_M_UP_RETRIES : LH_M_UP_FAILURES);
    for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
      for (int r = 0; r < GW_UP_ERRORS; r++) {
        uint64_t v = f ? ep->health.retries[r] : ep->health.failures[r];
        if (v) lh_expo_sample(e, (const char *[]){ep->name, gw_failure_name(r)}, (double)v);
      }
  }
  lh_expo_family(e, LH_M_UP_RETRIES_DENIED);
  lh_expo_sample(e, NULL, (double)gw->retries_denied);
  lh_expo_family(e, LH_M_ENDPOINTS_HEALTHY);
  lh_expo_sample(e, NULL, (double)gw_healthy_endpoints(gw));
}

static void metrics_reloads(lupin_gateway *gw, lh_expo *e) {
  const gw_reload_stats *r = &gw->reloads;
  lh_expo_family(e, LH_M_RELOADS);
  lh_expo_sample(e, (const char *[]){"ok"}, (double)r->ok);
  lh_expo_sample(e, (const char *[]){"error"}, (double)r->error);
  lh_expo_family(e, LH_M_RELOAD_SECONDS);
  lh_expo_summary(e, NULL, r->seconds_sum, r->ok + r->error);
  lh_expo_family(e, LH_M_RELOAD_LAST);
  lh_expo_sample(e, NULL, r->last_seconds);
}

/* A family with one unlabelled sample. */
static void scalar(lh_expo *e, lh_family_id id, double v) {
  lh_expo_family(e, id);
  lh_expo_sample(e, NULL, v);
}

static void metrics_runtime(lupin_gateway *gw, lh_expo *e) {
  lupin_stats st;
  lupin_runtime_stats(gw->rt, &st);
  scalar(e, LH_M_LIVE_REQUESTS, (double)st.live_requests);
  scalar(e, LH_M_LIVE_TABLES, (double)st.live_request_tables);
  scalar(e, LH_M_LUA_MEMORY, (double)st.lua_memory);
  scalar(e, LH_M_LUA_PEAK, (double)st.lua_memory_peak);
  scalar(e, LH_M_LUA_GC_CYCLES, (double)st.collector_cycles);
  scalar(e, LH_M_LUA_GC_SECONDS, (double)st.collector_ns / 1e9);
  scalar(e, LH_M_GENERATION, (double)st.generation);
  scalar(e, LH_M_GENERATIONS_ALIVE, (double)st.generations_alive);
  scalar(e, LH_M_ENDPOINTS, (double)gw->n_endpoints);
  scalar(e, LH_M_IN_FLIGHT, (double)gw->in_flight);
  scalar(e, LH_M_BODY_BYTES, (double)gw->body_bytes);
  lh_expo_family(e, LH_M_REFUSALS);
  lh_expo_sample(e, (const char *[]){"maxRequestsInFlight"}, (double)gw->refused_in_flight);
  lh_expo_sample(e, (const char *[]){"maxBufferedBodyBytes"}, (double)gw->refused_body_bytes);
  scalar(e, LH_M_LUA_LIMIT, (double)gw->set.max_lua_memory_bytes);
  scalar(e, LH_M_LUA_LIMIT_HITS, (double)st.memory_limit_hits);
  scalar(e, LH_M_EMPTY_ENDPOINTS_KEPT, (double)gw->empty_endpoints_kept);
  lh_expo_family(e, LH_M_BUILD_INFO);
  lh_expo_sample(e, (const char *[]){LUPIN_VERSION, lupin_luajit_version()}, 1);
}

/* llm_d_epp_request_* (twins: inference_objective_*): per model as the
 * client named it and as it was sent (target_model_name: the model-name
 * rewrite's, else the same); the running gauge has the first label only, so
 * it sums a model's targets. */
static void metrics_objectives(lupin_gateway *gw, lh_expo *e) {
  static const lh_family_id hists[] = {LH_M_OBJ_DURATION, LH_M_OBJ_REQUEST_SIZES,
                                       LH_M_OBJ_RESPONSE_SIZES};
  lh_expo_family(e, LH_M_OBJ_REQUESTS);
  for (gw_objective *o = gw->objectives; o; o = o->next)
    if (o->requests) lh_expo_sample(e, (const char *[]){o->model, o->target}, (double)o->requests);
  lh_expo_family(e, LH_M_OBJ_ERRORS);
  for (gw_objective *o = gw->objectives; o; o = o->next)
    for (int c = 0; c < GW_ERRS; c++)
      if (o->errors[c])
        lh_expo_sample(e, (const char *[]){o->model, o->target, gw_error_codes[c]},
                       (double)o->errors[c]);
  for (int k = 0; k < 3; k++) {
    lh_expo_family(e, hists[k]);
    for (gw_objective *o = gw->objectives; o; o = o->next) {
      const lh_histogram *h = k == 0   ? &o->duration
                              : k == 1 ? &o->request_sizes
                                       : &o->response_sizes;
      if (h->count) lh_expo_histogram(e, (const char *[]){o->model, o->target}, h);
    }
  }
  lh_expo_family(e, LH_M_OBJ_RUNNING);
  for (gw_objective *o = gw->objectives; o; o = o->next) {
    gw_objective *p = gw->objectives;
    while (p != o && strcmp(p->model, o->model))
      p = p->next;
    if (p != o) continue; /* the model's first record sums them */
    uint64_t running = 0;
    int any = 0;
    for (; p; p = p->next)
      if (!strcmp(p->model, o->model)) {
        running += p->running;
        any |= p->requests > 0;
      }
    if (any) lh_expo_sample(e, (const char *[]){o->model}, (double)running);
  }
}

/* The pool's llm_d_epp_* (twins: inference_pool_*): over the endpoints with
 * fresh metrics, as the EPP computes them; the pool's name is "lupin"
 * (there is no InferencePool). */
#define POOL_NAME "lupin"

static void metrics_pool(lupin_gateway *gw, lh_expo *e) {
  double now = lupin_now(), kv = 0, queue = 0, n = 0;
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    if (gw_endpoint_fresh(ep, now)) {
      kv += ep->metrics.kv_cache_usage;
      queue += ep->metrics.waiting_queue_size;
      n++;
    }
  const char *pool[] = {POOL_NAME};
  lh_expo_family(e, LH_M_POOL_READY);
  lh_expo_sample(e, pool, n);
  /* no mean of nothing: the EPP leaves them unset then too */
  lh_expo_family(e, LH_M_POOL_KV);
  if (n) lh_expo_sample(e, pool, kv / n);
  lh_expo_family(e, LH_M_POOL_QUEUE);
  if (n) lh_expo_sample(e, pool, queue / n);
  lh_expo_family(e, LH_M_POOL_POD_QUEUE);
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    if (gw_endpoint_fresh(ep, now))
      lh_expo_sample(e, (const char *[]){ep->name, POOL_NAME}, ep->metrics.waiting_queue_size);
  lh_expo_family(e, LH_M_SCHEDULER_E2E);
  lh_expo_histogram(e, NULL, &gw->stats.sched_epp);
}

typedef struct latency_pass {
  lh_expo *e;
  lh_family_id id;
  int started; /* the family's header written: only once a model is exported */
} latency_pass;

static void latency_model(const lupin_latency_model_info *m, void *ud) {
  latency_pass *p = ud;
  const char *names[] = {m->plugin, m->target, m->group};
  const lupin_latency_stats *s = &m->stats;
  if (!p->started++) lh_expo_family(p->e, p->id);
  switch (p->id) {
  case LH_M_LATENCY_ERROR:
    lh_expo_sample(p->e, names, s->served_mape);
    break;
  case LH_M_LATENCY_OBSERVED:
    lh_expo_sample(p->e, names, (double)s->served_n);
    break;
  case LH_M_LATENCY_APE:
    lh_expo_sample(p->e, names, s->served_ape_sum);
    break;
  default:
    lh_expo_sample(p->e, names, (double)s->trained);
    break;
  }
}

/* The plugins' exported latency models: the process's (its lupin_shared),
 * so written by the first worker alone. */
static void metrics_latency(lupin_gateway *gw, lh_expo *e) {
  static const lh_family_id ids[] = {LH_M_LATENCY_ERROR, LH_M_LATENCY_OBSERVED, LH_M_LATENCY_APE,
                                     LH_M_LATENCY_SAMPLES};
  if (gw->worker != 0) return;
  for (size_t k = 0; k < sizeof ids / sizeof ids[0]; k++) {
    latency_pass p = {e, ids[k], 0};
    lupin_shared_latency_each(gw->shared, latency_model, &p);
  }
}

/* One worker's exposition, written on its thread into texts[worker]. */
static void metrics_of(lupin_gateway *gw, void *texts) {
  /* the EPP's deprecated names too, unless gateway.deprecatedMetricNames 0 */
  lh_expo e = {.b = &((lh_buf *)texts)[gw->worker], .twins = (int)gw->set.deprecated_metric_names};
  metrics_requests(gw, &e);
  metrics_plugins(gw, &e);
  metrics_endpoints(gw, &e);
  metrics_reloads(gw, &e);
  metrics_runtime(gw, &e);
  if (gw->worker == 0) gw_process_metrics(&e); /* the process's: once */
  metrics_objectives(gw, &e);
  metrics_pool(gw, &e);
  gw_flow_metrics(gw, &e);
  gw_replicas_metrics(gw, &e);
  gw_kv_events_metrics(gw, &e);
  gw_tokenize_metrics(gw, &e);
  metrics_latency(gw, &e);
  gw_k8s_metrics(gw, &e);
  lh_expo_end(&e);
}

static void metrics(lupin_gateway *gw, gw_conn *c) {
  size_t n = gw_workers_count(gw);
  lh_buf *texts = calloc(n, sizeof *texts), merged = {0};
  if (!texts) {
    gw_conn_error(c, 503, "out of memory", NULL, NULL, 0);
    return;
  }
  gw_workers_each(gw, metrics_of, texts);
  if (n > 1) gw_metrics_merge(&merged, texts, n);
  reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", n > 1 ? &merged : &texts[0]);
  for (size_t i = 0; i < n; i++)
    lh_buf_free(&texts[i]);
  free(texts);
  lh_buf_free(&merged);
}

/* --- JSON views: host/admin_json.c writes them ---------------------------- */

static void reply_json(gw_conn *c, lh_buf *b) {
  reply(c, 200, "application/json", b);
  lh_buf_free(b);
}

static void endpoints(lupin_gateway *gw, gw_conn *c) {
  lh_buf b = {0};
  double now = lupin_now(), stale = (double)gw->set.metrics_staleness_ms / 1000;
  lh_admin_endpoints_open(&b);
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next) {
    char names[GW_MAX_ADDRS][80];
    const char *addresses[GW_MAX_ADDRS];
    for (int i = 0; i < ep->n_addrs; i++) { /* in the order connects try them */
      gw_addr_name(&ep->addrs[(ep->addr_first + i) % ep->n_addrs], names[i], sizeof names[i]);
      addresses[i] = names[i];
    }
    lh_endpoint_view v = {.name = ep->name,
                          .address = ep->address,
                          .addresses = addresses,
                          .n_addresses = ep->n_addrs,
                          .port = ep->port,
                          .scraped_at = ep->scraped_at,
                          .scrapes = ep->scrapes,
                          .scrape_errors = ep->scrape_errors,
                          .idle_connections = ep->pools[GW_POOL_GEN].n_idle,
                          .metrics = &ep->metrics,
                          .running_lora = ep->running_lora,
                          .waiting_lora = ep->waiting_lora,
                          .health = &ep->health,
                          .labels = ep->labels.v,
                          .n_labels = ep->labels.n};
    lh_admin_endpoint(&b, &v, now, stale);
  }
  lh_admin_list_end(&b);
  reply_json(c, &b);
}

/* One worker's requests in flight, appended to the list in b. */
static void requests_of(lupin_gateway *gw, void *arg) {
  double now = lupin_now();
  for (gw_exchange *x = gw->exchanges; x; x = x->next)
    lh_admin_request(arg, &(lh_request_view){.req = x->req,
                                             .model = x->model,
                                             .path = x->path,
                                             .endpoint = x->ep ? x->ep->hostport : "",
                                             .stream = x->stream,
                                             .age_seconds = now - x->started,
                                             .worker = gw->worker});
}

static void requests(lupin_gateway *gw, gw_conn *c) {
  lh_buf b = {0};
  lh_admin_requests_open(&b);
  gw_workers_each(gw, requests_of, &b);
  lh_admin_list_end(&b);
  reply_json(c, &b);
}

static void generations_of(lupin_gateway *gw, void *arg) {
  lh_admin_generations_worker(arg, gw->rt, gw->worker);
}

/* The leader's generations, as with one worker, then every worker's: a
 * reload swaps them together, so they differ only while one is pinned. */
static void generations(lupin_gateway *gw, gw_conn *c) {
  lh_buf b = {0};
  lh_admin_generations_open(&b, gw->rt);
  gw_workers_each(gw, generations_of, &b);
  lh_admin_list_end(&b);
  reply_json(c, &b);
}

static void reload(lupin_gateway *gw, gw_conn *c) {
  char err[2048];
  uint64_t n = 0;
  double dt = 0;
  if (gw->reload(gw, "admin", err, sizeof err, &n, &dt)) {
    gw_conn_error(c, 400, err, NULL, NULL, 0);
    return;
  }
  lh_buf b = {0};
  lh_admin_reloaded(&b, n, dt);
  reply_json(c, &b);
}

static void leaks_of(lupin_gateway *gw, void *arg) {
  lh_leaks_check(arg, gw->rt, gw_workers_count(gw) > 1 ? gw->worker : -1);
}

/* A full collection, then whatever request state outlived its request: lets
 * an operator tell tables merely not yet collected (lupin_live_request_tables
 * counts those) from a leak.  Blocks each worker's loop for its collection
 * (ms). */
static void leaks(lupin_gateway *gw, gw_conn *c) {
  lh_leaks r = {0};
  lh_buf b = {0};
  gw_workers_each(gw, leaks_of, &r);
  if (r.failed) {
    lh_leaks_failure(&b, &r);
    gw_conn_error(c, 500, b.data, NULL, NULL, 0);
    lh_buf_free(&b);
  } else {
    lh_admin_leaks(&b, &r);
    reply_json(c, &b);
  }
  lh_leaks_free(&r);
}

static void text(gw_conn *c, int status, const char *msg) {
  lh_buf b = {0};
  lh_buf_printf(&b, "%s\n", msg);
  reply(c, status, "text/plain", &b);
  lh_buf_free(&b);
}

static int authorized(lupin_gateway *gw, gw_http_request *req) {
  const char *token = gw->opts.admin_token;
  if (gw->admin_closed) return 0;
  if (!token || !*token) return 1;
  const char *auth = lh_headers_get(&req->headers, "authorization");
  return auth && !strncasecmp(auth, "Bearer ", 7) && lh_same_secret(auth + 7, token);
}

static void healthz(lupin_gateway *gw, gw_conn *c) {
  (void)gw;
  text(c, 200, "ok");
}

static void readyz(lupin_gateway *gw, gw_conn *c) {
  char why[1200];
  const char *not_ready = gw_not_ready(gw, why, sizeof why);
  text(c, not_ready ? 503 : 200, not_ready ? not_ready : "ready");
}

static void explain(lupin_gateway *gw, gw_conn *c, gw_http_request *req, const char *path) {
  gw_explain_admin(gw, c, req, path); /* explain.c: its methods are its own */
}

/* The admin routes: a new one is a row.  method -1: the handler takes any
 * (it answers a wrong one itself); prefix: the path and what follows it. */
typedef struct admin_route {
  int method;
  const char *path;
  int prefix;
  void (*simple)(lupin_gateway *gw, gw_conn *c);
  void (*full)(lupin_gateway *gw, gw_conn *c, gw_http_request *req, const char *path);
} admin_route;

static const admin_route routes[] = {
    {HTTP_GET, "/metrics", 0, metrics, NULL},
    {HTTP_GET, "/healthz", 0, healthz, NULL},
    {HTTP_GET, "/readyz", 0, readyz, NULL},
    {HTTP_GET, "/admin/endpoints", 0, endpoints, NULL},
    {HTTP_GET, "/admin/requests", 0, requests, NULL},
    {HTTP_GET, "/admin/generations", 0, generations, NULL},
    {HTTP_GET, "/admin/flows", 0, gw_flow_admin, NULL},
    {HTTP_GET, "/admin/replicas", 0, gw_replicas_admin, NULL},
    {HTTP_GET, "/admin/kv-events", 0, gw_kv_events_admin, NULL},
    {HTTP_POST, "/admin/reload", 0, reload, NULL},
    {HTTP_POST, "/admin/leaks", 0, leaks, NULL},
    {-1, "/admin/explain", 1, NULL, explain},
};

enum { N_ROUTES = sizeof routes / sizeof *routes };

static int matches(const admin_route *r, const char *path) {
  size_t n = strlen(r->path);
  return !strncmp(path, r->path, n) && (!path[n] || (r->prefix && path[n] == '/'));
}

/* Appends "NAME /a, /b" for the routes of one method. */
static void list_routes(lh_buf *b, int method, const char *name) {
  const char *sep = name;
  for (size_t i = 0; i < N_ROUTES; i++) {
    if (routes[i].method != method) continue;
    lh_buf_printf(b, "%s %s%s", sep, routes[i].path, routes[i].prefix ? "[/...]" : "");
    sep = ",";
  }
}

/* The 404 lists the routes, from the table. */
static void not_found(gw_conn *c) {
  lh_buf b = {0};
  lh_buf_printf(&b, "unknown admin route: GET");
  list_routes(&b, HTTP_GET, "");
  list_routes(&b, HTTP_POST, "; POST");
  list_routes(&b, -1, "; GET or POST");
  gw_conn_error(c, 404, b.data ? b.data : "unknown admin route", NULL, NULL, 0);
  lh_buf_free(&b);
}

void gw_admin_handle(void *ud, gw_conn *c, gw_http_request *req) {
  lupin_gateway *gw = ud;
  char path[256];
  snprintf(path, sizeof path, "%s", req->url);
  path[strcspn(path, "?")] = 0;
  /* lupin epp's metrics port: what a kubelet and Prometheus read is open */
  int open = gw->opts.metrics_open &&
             (!strcmp(path, "/metrics") || !strcmp(path, "/healthz") || !strcmp(path, "/readyz"));
  if (!open && !authorized(gw, req)) {
    lupin_header h = {"www-authenticate", "Bearer"};
    gw_conn_error(c, 401,
                  gw->admin_closed
                      ? "the admin API is closed on this address: start with --admin-token TOKEN "
                        "and send Authorization: Bearer <token>"
                      : "missing or wrong admin token: send Authorization: Bearer <token>",
                  NULL, &h, 1);
    return;
  }
  const admin_route *found = NULL;
  for (size_t i = 0; i < N_ROUTES; i++) {
    if (!matches(&routes[i], path)) continue;
    found = &routes[i];
    if (found->method == -1 || (int)req->method == found->method) {
      if (found->full)
        found->full(gw, c, req, path);
      else
        found->simple(gw, c);
      return;
    }
  }
  if (found)
    gw_conn_error(c, 405,
                  found->method == HTTP_POST ? "method not allowed: use POST"
                                             : "method not allowed: use GET",
                  NULL, NULL, 0);
  else
    not_found(c);
}
