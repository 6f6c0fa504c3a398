/* The gateway object: opens the runtime and the listeners, keeps the
 * endpoints in step with the config, the endpoints file (watched) or a
 * Kubernetes InferencePool (endpoints/k8s_pool.c), turns
 * SIGTERM/SIGINT into a drain and SIGHUP into a reload, and closes everything
 * in order so the loop ends by itself. */
#include "gateway.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static void runtime_log(void *ud, int level, const char *msg) { gw_log(ud, level, "%s", msg); }

/* --- endpoints ----------------------------------------------------------- */

static void endpoint_remove(lupin_gateway *gw, gw_endpoint *ep) {
  for (gw_endpoint **p = &gw->endpoints; *p; p = &(*p)->next)
    if (*p == ep) {
      *p = ep->next;
      break;
    }
  gw->n_endpoints--;
  ep->removed = 1;
  lupin_endpoint_remove(gw->rt, ep->name);
  gw_scrape_stop(ep);
  gw_pool_clear(ep);
  if (gw->worker == 0)
    gw_log(gw, LUPIN_LOG_INFO, "endpoint %s (%s) removed", ep->name, ep->hostport);
  gw_endpoint_unref(ep);
}

static gw_endpoint *endpoint_new(lupin_gateway *gw, const lupin_endpoint_desc *d) {
  gw_endpoint *ep = calloc(1, sizeof *ep);
  if (!ep) return NULL;
  ep->gw = gw;
  ep->refs = 1;
  ep->name = strdup(d->name);
  ep->address = strdup(d->address);
  ep->port = d->port;
  snprintf(ep->hostport, sizeof ep->hostport, strchr(d->address, ':') ? "[%s]:%d" : "%s:%d",
           d->address, d->port);
  gw_endpoint_resolve(ep); /* none: connects fail with a message naming why */
  gw_health_init(ep);
  ep->next = gw->endpoints;
  gw->endpoints = ep;
  gw->n_endpoints++;
  return ep;
}

/* Adds or updates one endpoint of a fresh list (marks it seen). */
static void endpoint_sync(void *ud, const lupin_endpoint_desc *d) {
  lupin_gateway *gw = ud;
  gw_endpoint *ep = gw_endpoint_find(gw, d->name);
  if (ep && (strcmp(ep->address, d->address) || ep->port != d->port)) {
    endpoint_remove(gw, ep); /* moved: a new pool and fresh metrics */
    ep = NULL;
  }
  int added = !ep;
  if (!ep && !(ep = endpoint_new(gw, d))) return;
  ep->seen = 1;
  lh_headers_clear(&ep->labels); /* for /admin/endpoints */
  for (size_t i = 0; i < d->n_labels; i++)
    lh_headers_add(&ep->labels, d->labels[i].name, strlen(d->labels[i].name), d->labels[i].value,
                   strlen(d->labels[i].value));
  char err[256];
  if (lupin_endpoint_upsert(gw->rt, d, err, sizeof err)) {
    gw_log(gw, LUPIN_LOG_ERROR, "endpoint %s: %s", d->name, err);
    return;
  }
  if (added) {
    if (gw->worker == 0)
      gw_log(gw, LUPIN_LOG_INFO, "endpoint %s (%s) added", ep->name, ep->hostport);
    if (!gw->draining && gw->worker == 0) gw_scrape_start(ep); /* the leader scrapes for all */
  }
}

/* Whether a list that named none of the current endpoints must be ignored:
 * a source that goes from some endpoints to none is more often a mistake (a
 * truncated file, a template rendered empty) than a wish, and applying it
 * answers every request 503.  gateway.allowEmptyEndpoints 1 applies it; the
 * current generation's value, so a reload can set it and empty the pool. */
static int keep_last_endpoints(lupin_gateway *gw) {
  size_t listed = 0;
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    listed += ep->seen;
  gw_settings now;
  char e[256];
  if (listed || !gw->n_endpoints ||
      (!gw_settings_read(gw->rt, &now, e, sizeof e) && now.allow_empty_endpoints))
    return 0;
  if (gw->worker == 0) {
    gw->empty_endpoints_kept++;
    gw_log(gw, LUPIN_LOG_WARN,
           "%s lists no endpoints: the %zu current endpoints stay (set "
           "gateway.allowEmptyEndpoints to 1 to empty the pool)",
           gw->opts.endpoints_file ? gw->opts.endpoints_file : "the config", gw->n_endpoints);
  }
  return 1;
}

/* Makes the endpoints those of a full list from a source: each listed one
 * added or updated, the others removed.  empty_ok: a list with none of
 * them empties the pool (Kubernetes: a pool with no ready pod is one);
 * else keep_last_endpoints decides. */
void gw_endpoints_apply(lupin_gateway *gw, const lupin_endpoint_desc *d, size_t n, int empty_ok) {
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    ep->seen = 0;
  for (size_t i = 0; i < n; i++)
    endpoint_sync(gw, &d[i]);
  if (!empty_ok && keep_last_endpoints(gw)) return;
  for (gw_endpoint *ep = gw->endpoints, *next; ep; ep = next) {
    next = ep->next;
    if (!ep->seen) endpoint_remove(gw, ep);
  }
  gw_kv_events_sync(gw);
}

/* A list of endpoints owned: a source's callback lends each one only for
 * the call, and the followers apply the leader's list later. */
typedef struct desc_list {
  lupin_endpoint_desc *d;
  size_t n, cap;
  int failed;
} desc_list;

static char *dup_or_null(const char *s, int *failed) {
  char *c = s ? strdup(s) : NULL;
  if (s && !c) *failed = 1;
  return c;
}

static void desc_collect(void *ud, const lupin_endpoint_desc *d) {
  desc_list *l = ud;
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    lupin_endpoint_desc *grown = realloc(l->d, cap * sizeof *grown);
    if (!grown) {
      l->failed = 1;
      return;
    }
    l->d = grown;
    l->cap = cap;
  }
  lupin_endpoint_desc *c = &l->d[l->n++];
  lupin_header *labels = d->n_labels ? calloc(d->n_labels, sizeof *labels) : NULL;
  *c = (lupin_endpoint_desc){dup_or_null(d->name, &l->failed), dup_or_null(d->address, &l->failed),
                             d->port, labels, labels ? d->n_labels : 0};
  if (d->n_labels && !labels) l->failed = 1;
  for (size_t i = 0; i < c->n_labels; i++)
    labels[i] = (lupin_header){dup_or_null(d->labels[i].name, &l->failed),
                               dup_or_null(d->labels[i].value, &l->failed)};
}

static void desc_list_free(desc_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    lupin_endpoint_desc *d = &l->d[i];
    for (size_t j = 0; j < d->n_labels; j++) {
      free((char *)d->labels[j].name);
      free((char *)d->labels[j].value);
    }
    free((void *)d->labels);
    free((char *)d->name);
    free((char *)d->address);
  }
  free(l->d);
  *l = (desc_list){0};
}

/* Makes the endpoints those of the config or of the endpoints file. */
int gw_endpoints_load(lupin_gateway *gw, char *err, size_t errlen) {
  desc_list l = {0};
  int rc =
      lupin_runtime_read_endpoints(gw->rt, gw->opts.endpoints_file, desc_collect, &l, err, errlen);
  if (!rc && l.failed) {
    lh_errf(err, errlen, "out of memory reading the endpoints");
    rc = -1;
  }
  if (!rc) gw_endpoints_apply(gw, l.d, l.n, 0);
  desc_list_free(&l);
  return rc;
}

/* Whether the config lists the endpoints (no file, no Kubernetes pool). */
static int config_endpoints(const lupin_gateway *gw) {
  return !gw->opts.endpoints_file && !gw->opts.k8s_pool;
}

/* --- endpoints from Kubernetes --------------------------------------------- */

static void k8s_follower(lupin_gateway *gw, void *arg) {
  desc_list *l = arg;
  gw_endpoints_apply(gw, l->d, l->n, 1);
}

static void desc_list_drop(void *arg) {
  desc_list_free(arg);
  free(arg);
}

/* The pool's list, on the leader then (a copy) on every follower. */
static void k8s_apply(lupin_gateway *gw, const lupin_endpoint_desc *d, size_t n) {
  gw_endpoints_apply(gw, d, n, 1);
  if (gw_workers_count(gw) < 2) return;
  desc_list *l = calloc(1, sizeof *l);
  for (size_t i = 0; l && i < n; i++)
    desc_collect(l, &d[i]);
  if (l && !l->failed) {
    gw_workers_post(gw, k8s_follower, l, desc_list_drop);
    return;
  }
  gw_log(gw, LUPIN_LOG_ERROR, "kubernetes: out of memory: the followers keep their endpoints");
  if (l) desc_list_drop(l);
}

static void reread_follower(lupin_gateway *gw, void *arg) {
  (void)arg;
  char err[1024];
  gw_endpoints_load(gw, err, sizeof err); /* the leader logged the outcome */
}

static void reread(uv_timer_t *t) {
  lupin_gateway *gw = t->data;
  char err[1024];
  if (gw_endpoints_load(gw, err, sizeof err)) {
    gw_log(gw, LUPIN_LOG_ERROR, "endpoints file not applied, the current endpoints stay: %s", err);
    return;
  }
  gw_log(gw, LUPIN_LOG_INFO, "endpoints file re-read: %zu endpoints", gw->n_endpoints);
  gw_workers_post(gw, reread_follower, NULL, NULL);
}

/* Editors replace files rather than write them: the directory is watched,
 * and a burst of events becomes one re-read. */
static void on_fs_event(uv_fs_event_t *h, const char *file, int events, int status) {
  (void)events;
  lupin_gateway *gw = h->data;
  const char *base = strrchr(gw->opts.endpoints_file, '/');
  base = base ? base + 1 : gw->opts.endpoints_file;
  if (status < 0 || (file && strcmp(file, base))) return;
  uv_timer_start(gw->rewatch, reread, 20, 0);
}

static int watch_file(lupin_gateway *gw, char *err, size_t errlen) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", gw->opts.endpoints_file);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = 0;
  else
    snprintf(dir, sizeof dir, ".");
  gw->watch = malloc(sizeof *gw->watch);
  gw->rewatch = malloc(sizeof *gw->rewatch);
  if (!gw->watch || !gw->rewatch) {
    free(gw->watch);
    free(gw->rewatch);
    gw->watch = NULL;
    gw->rewatch = NULL;
    lh_errf(err, errlen, "cannot watch %s: out of memory", dir);
    return -1;
  }
  uv_fs_event_init(gw->loop, gw->watch);
  uv_timer_init(gw->loop, gw->rewatch);
  gw->watch->data = gw->rewatch->data = gw;
  int rc = uv_fs_event_start(gw->watch, on_fs_event, dir, 0);
  if (rc) lh_errf(err, errlen, "cannot watch %s: %s", dir, uv_strerror(rc));
  return rc ? -1 : 0;
}

/* --- reload, drain, shutdown --------------------------------------------- */

/* A reload over every worker: each stages the next generation (build,
 * checks, dry cycle), and only when all of them could does each commit;
 * else each drops its own.  The leader stages first: a config error costs
 * the followers nothing. */
typedef struct reload_run {
  int failed;
  char *err;
  size_t errlen;
} reload_run;

static void stage_one(lupin_gateway *gw, void *arg) {
  reload_run *r = arg;
  if (r->failed) return;
  char err[2048];
  if (lupin_runtime_stage(gw->rt, err, sizeof err)) {
    r->failed = 1;
    if (gw->worker)
      lh_errf(r->err, r->errlen, "worker %d: %s", gw->worker, err);
    else
      lh_errf(r->err, r->errlen, "%s", err);
  }
}

static void commit_one(lupin_gateway *gw, void *arg) {
  reload_run *r = arg;
  char err[2048];
  if (r->failed) {
    lupin_runtime_abort(gw->rt);
  } else if (lupin_runtime_commit(gw->rt, err, sizeof err)) {
    gw_log(gw, LUPIN_LOG_ERROR, "worker %d: reload not committed: %s", gw->worker, err);
  } else if (gw->worker && config_endpoints(gw) && gw_endpoints_load(gw, err, sizeof err)) {
    gw_log(gw, LUPIN_LOG_ERROR, "worker %d: the config's endpoints: %s", gw->worker, err);
  }
}

int gw_reload(lupin_gateway *gw, const char *why, char *err, size_t errlen, uint64_t *generation,
              double *seconds) {
  double t0 = lupin_now();
  reload_run r = {0, err, errlen};
  gw_workers_each(gw, stage_one, &r);
  gw_workers_each(gw, commit_one, &r);
  double dt = lupin_now() - t0;
  if (seconds) *seconds = dt;
  gw->reloads.seconds_sum += dt;
  gw->reloads.last_seconds = dt;
  lupin_stats st;
  lupin_runtime_stats(gw->rt, &st);
  uint64_t n = st.generation;
  if (r.failed) {
    gw->reloads.error++;
    gw_log(gw, LUPIN_LOG_ERROR,
           "reload (%s) failed after %.1f ms, generation %llu keeps serving: %s", why, dt * 1e3,
           (unsigned long long)n, err);
    return -1;
  }
  gw->reloads.ok++;
  if (generation) *generation = n;
  gw_log(gw, LUPIN_LOG_INFO,
         "reload (%s): generation %llu serving on %zu workers, built in %.1f ms", why,
         (unsigned long long)n, gw_workers_count(gw), dt * 1e3);
  if (!gw->opts.no_watch) gw_watch_sync(gw); /* pluginDirs may have changed */
  if (config_endpoints(gw) && gw_endpoints_load(gw, err, errlen)) return -1;
  gw_kv_events_sync(gw);     /* the precise plugins' settings may have changed */
  gw_k8s_config_changed(gw); /* and the config file's InferencePool */
  return 0;
}

static void close_free(uv_handle_t *h) { free(h); }

static void close_handle(void *h) {
  if (h && !uv_is_closing(h)) uv_close(h, close_free);
}

/* Everything in flight is done: close what is left; the loop then ends. */
static void shutdown_all(lupin_gateway *gw) {
  if (gw->draining == 2) return;
  gw->draining = 2;
  if (gw->admin) gw_server_close(gw->admin);
  gw_epp_close(gw);
  while (gw->endpoints)
    endpoint_remove(gw, gw->endpoints);
  gw_health_stop(gw);
  close_handle(gw->sigterm);
  close_handle(gw->sigint);
  close_handle(gw->sighup);
  close_handle(gw->drain_timer);
  close_handle(gw->collector);
  gw_inbox_close(gw);
  close_handle(gw->watch);
  close_handle(gw->rewatch);
  gw_watch_stop(gw);
  gw_replicas_stop(gw);
  gw_k8s_stop(gw);
  gw_kv_events_stop(gw);
  gw_tokenize_stop(gw);
  gw->sigterm = gw->sigint = gw->sighup = NULL;
  gw->drain_timer = gw->rewatch = NULL;
  gw->collector = NULL;
  gw->watch = NULL;
}

static void check_drained(lupin_gateway *gw) {
  if (gw->draining == 1 && !gw->n_exchanges && !gw_server_connections(gw->server) &&
      !gw_epp_calls(gw)) {
    gw_log(gw, LUPIN_LOG_INFO, "drained, exiting");
    shutdown_all(gw);
  }
}

static void on_drain_timeout(uv_timer_t *t) {
  lupin_gateway *gw = t->data;
  gw_log(gw, LUPIN_LOG_WARN, "drainTimeoutMs passed with %zu requests in flight: exiting",
         gw->n_exchanges);
  gw->exit_code = GW_EXIT_DRAIN;
  gw_proxy_cancel_all(gw);
  gw_epp_cancel_all(gw);
}

static void drain_follower(lupin_gateway *gw, void *arg) { gw_drain(gw, arg); }

void gw_drain(lupin_gateway *gw, const char *why) {
  if (gw->draining) return;
  gw->draining = 1;
  if (gw->worker == 0) gw_workers_post(gw, drain_follower, (void *)why, NULL);
  gw_log(gw, LUPIN_LOG_INFO, "%s: draining %zu requests in flight%s", why, gw->n_exchanges,
         gw->worker ? "" : " (worker 0)");
  if (gw->server) gw_server_close(gw->server);
  gw_epp_close(gw);
  /* queued requests would only wait out the drain: answered now */
  lupin_runtime_flow_drain(gw->rt, "the gateway is shutting down: retry on another instance");
  gw->drain_timer = malloc(sizeof *gw->drain_timer);
  if (gw->drain_timer) {
    uv_timer_init(gw->loop, gw->drain_timer);
    gw->drain_timer->data = gw;
    uv_timer_start(gw->drain_timer, on_drain_timeout, gw->set.drain_timeout_ms, 0);
    uv_unref((uv_handle_t *)gw->drain_timer);
  } else { /* no timer to bound the drain: what is in flight ends now */
    gw_log(gw, LUPIN_LOG_WARN, "out of memory for the drain timer: ending %zu requests now",
           gw->n_exchanges);
    gw->exit_code = GW_EXIT_DRAIN;
    gw_proxy_cancel_all(gw);
  }
  gw_check_drained(gw);
}

static void on_signal(uv_signal_t *h, int signum) {
  lupin_gateway *gw = h->data;
  if (signum == SIGHUP) {
    char err[1024];
    gw_reload(gw, "SIGHUP", err, sizeof err, NULL, NULL);
    return;
  }
  gw_drain(gw, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static uv_signal_t *watch_signal(lupin_gateway *gw, int signum) {
  uv_signal_t *s = malloc(sizeof *s);
  if (!s) return NULL;
  uv_signal_init(gw->loop, s);
  s->data = gw;
  if (!uv_signal_start(s, on_signal, signum)) return s;
  uv_close((uv_handle_t *)s, close_free);
  return NULL;
}

/* SIGTERM and SIGINT drain, SIGHUP reloads: a gateway that could not watch
 * them would be killed with its requests in flight. */
static int watch_signals(lupin_gateway *gw, char *err, size_t errlen) {
  gw->sigterm = watch_signal(gw, SIGTERM);
  gw->sigint = watch_signal(gw, SIGINT);
  gw->sighup = watch_signal(gw, SIGHUP);
  if (gw->sigterm && gw->sigint && gw->sighup) return 0;
  lh_errf(err, errlen, "cannot watch the signals SIGTERM, SIGINT and SIGHUP");
  return -1;
}

/* --- open and run -------------------------------------------------------- */

/* "512m", "2g", "1048576": bytes; -1 when it is not a size. */
static int parse_bytes(const char *s, uint64_t *out) {
  char *end;
  double v = strtod(s, &end);
  double unit = !strcasecmp(end, "k")   ? 1024.0
                : !strcasecmp(end, "m") ? 1024.0 * 1024
                : !strcasecmp(end, "g") ? 1024.0 * 1024 * 1024
                : !*end                 ? 1.0
                                        : 0;
  if (end == s || !unit || !(v >= 0) || v * unit > 1e18) return -1;
  *out = (uint64_t)(v * unit);
  return 0;
}

/* The Lua memory limit: --max-lua-memory, else the config's. */
static int apply_memory_limit(lupin_gateway *gw, char *err, size_t errlen) {
  const char *cli = gw->opts.max_lua_memory;
  if (cli && parse_bytes(cli, &gw->set.max_lua_memory_bytes)) {
    lh_errf(err, errlen, "--max-lua-memory %s: give bytes, or a size like 512m or 2g", cli);
    return -1;
  }
  lupin_runtime_set_memory_limit(gw->rt, (size_t)gw->set.max_lua_memory_bytes);
  return 0;
}

static int open_runtime(lupin_gateway *gw, char *err, size_t errlen) {
  /* each worker its own seed: runtimes started in the same second would
   * otherwise break every tie alike and send their bursts to one endpoint */
  uint64_t seed = uv_hrtime() ^ ((uint64_t)(gw->worker + 1) * 0x9E3779B97F4A7C15ull);
  lupin_options o = {.log = runtime_log,
                     .log_ud = gw,
                     .log_level = gw->opts.log_level,
                     .seed = seed ? seed : 1,
                     .shared = gw->shared,
                     .allocator = lh_lua_alloc,
                     .host_paces_collector = 1};
  gw->rt = lupin_runtime_new(&o, err, errlen);
  if (!gw->rt) return -1;
  lupin_runtime_set_dispatch(gw->rt, gw_proxy_dispatched, gw);
  lupin_runtime_set_evict(gw->rt, gw_proxy_evict, gw);
  if (gw_settings_declare(gw->rt, err, errlen) ||
      lupin_runtime_load(gw->rt, gw->opts.config, err, errlen) ||
      gw_settings_read(gw->rt, &gw->set, err, errlen) || gw_proxy_routes_open(gw, err, errlen))
    return -1;
  return apply_memory_limit(gw, err, errlen);
}

/* 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104. */
static int loopback(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
  const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

/* The admin API reloads plugins and shows every request: off loopback it
 * needs a token, or the operator's explicit --admin-insecure. */
static int check_admin_address(lupin_gateway *gw, char *err, size_t errlen) {
  struct sockaddr_storage ss;
  if (gw_parse_hostport(gw->opts.admin, &ss, err, errlen)) return -1;
  if (loopback(&ss) || (gw->opts.admin_token && *gw->opts.admin_token)) return 0;
  if (gw->opts.metrics_open && !gw->opts.admin_insecure) { /* Prometheus scrapes it */
    gw->admin_closed = 1;
    gw_log(gw, LUPIN_LOG_INFO,
           "metrics on %s; the admin API there needs --admin-token (closed without one)",
           gw->opts.admin);
    return 0;
  }
  if (gw->opts.admin_insecure) {
    gw_log(gw, LUPIN_LOG_WARN,
           "admin listener on %s with no token (--admin-insecure): anyone "
           "who reaches it can reload plugins and read every request in flight",
           gw->opts.admin);
    return 0;
  }
  lh_errf(err, errlen,
          "refusing to serve the admin API on %s, which is not a loopback address, without "
          "--admin-token TOKEN: give a token, bind it to 127.0.0.1, or pass "
          "--admin-insecure to serve it open anyway",
          gw->opts.admin);
  return -1;
}

static int open_loop(lupin_gateway *gw, char *err, size_t errlen) {
  gw->loop = malloc(sizeof *gw->loop);
  if (gw->loop && !uv_loop_init(gw->loop)) return 0;
  free(gw->loop);
  gw->loop = NULL;
  lh_errf(err, errlen, "cannot create the event loop");
  return -1;
}

static void collect_step(uv_prepare_t *p) {
  lupin_gateway *gw = p->data;
  lupin_runtime_collect_step(gw->rt);
  gw_access_log_flush(gw);
}

/* The Lua collector's steps, made before the loop waits for events: not
 * inside the requests' calls, whose latency they would add to.  The access
 * log's lines of the iteration are written then too. */
static int start_collector(lupin_gateway *gw, char *err, size_t errlen) {
  gw->collector = malloc(sizeof *gw->collector);
  if (!gw->collector) {
    lh_errf(err, errlen, "out of memory");
    return -1;
  }
  uv_prepare_init(gw->loop, gw->collector);
  gw->collector->data = gw;
  uv_prepare_start(gw->collector, collect_step);
  uv_unref((uv_handle_t *)gw->collector); /* it keeps no loop alive */
  return 0;
}

/* The runtime and the endpoints of one worker (from Kubernetes: none yet,
 * the pool's first list comes on the loop). */
static int open_worker(lupin_gateway *gw, char *err, size_t errlen) {
  if (open_runtime(gw, err, errlen) || start_collector(gw, err, errlen) ||
      (!gw->opts.k8s_pool && gw_endpoints_load(gw, err, errlen)))
    return -1;
  /* the first load's dry cycle ran with no endpoints: run it as a reload would */
  return lupin_runtime_dry_run(gw->rt, err, errlen);
}

int gw_open(lupin_gateway *gw, const gw_options *o, char *err, size_t errlen) {
  size_t workers;
  memset(gw, 0, sizeof *gw);
  gw->opts = *o;
  gw->totals = &gw->own_totals;
  gw->check_drained = check_drained;
  gw->reload = gw_reload;
  /* the prefix indexes' stripes are set for the workers --workers or the
   * cores call for (the config's gateway.workers is read only after) */
  gw_workers_wanted(gw, &workers);
  if (open_loop(gw, err, errlen) ||
      !(gw->shared = lupin_shared_new((unsigned)workers, err, errlen)))
    return -2;
  if (gw_explain_open(gw, NULL)) {
    lh_errf(err, errlen, "out of memory");
    return -2;
  }
  if (gw_tokenize_start(gw, err, errlen)) return -2;
  if (o->endpoints_file && o->k8s_pool) {
    lh_errf(err, errlen, "--endpoints and --k8s-pool: give one source of endpoints");
    return -1;
  }
  /* what the config decides fails with -1 (exit 1), the rest with -2 */
  if (check_admin_address(gw, err, errlen) || open_worker(gw, err, errlen) ||
      gw_replicas_start(gw, err, errlen) ||
      (o->k8s_pool && gw_k8s_start(gw, k8s_apply, err, errlen)))
    return -1;
  gw_workers_wanted(gw, &workers); /* now with the config's */
  if (gw->opts.endpoints_file && watch_file(gw, err, errlen)) return -1;
  if (!gw->opts.no_watch) gw_watch_sync(gw);
  /* All or nothing: every listener, timer, signal and worker is in place
   * before the first request is served (gw_run serves only then); a
   * gateway without its admin port or its signals would be one an
   * operator cannot drain. */
  if (o->grpc) {
    if (gw_epp_open(gw, o->grpc, o->grpc_health, err, errlen)) return -2;
  } else {
    gw->server = gw_server_listen(gw, o->listen, "listen", NULL, gw_proxy_handle, gw, err, errlen);
    if (!gw->server) return -2;
  }
  gw->admin = gw_server_listen(gw, o->admin, "admin", NULL, gw_admin_handle, gw, err, errlen);
  if (!gw->admin) {
    if (o->listen && !strcmp(o->listen, o->admin))
      lh_errf(err, errlen,
              "cannot listen on %s (admin): address already in use: it is the --listen address "
              "too; give --admin another port",
              o->admin);
    return -2;
  }
  if (gw_health_start(gw, err, errlen) || watch_signals(gw, err, errlen)) return -2;
  if (o->grpc) workers = 1; /* the gRPC server hands its calls to one loop */
  int rc = workers > 1 ? gw_workers_start(gw, workers, err, errlen) : 0;
  if (rc) return rc; /* the workers started are told not to serve */
  /* libuv writes with write(2): a peer that closed (a client gone mid-answer,
   * wrk ending a run) would kill the process with SIGPIPE; take EPIPE instead */
  signal(SIGPIPE, SIG_IGN);
  char a[96] = "?", b[96] = "?";
  gw_server_address(gw->admin, b, sizeof b);
  if (o->grpc) {
    char h[96];
    gw_epp_addresses(gw, a, h, sizeof a);
    gw_log(gw, LUPIN_LOG_INFO,
           "picking on grpc://%s (health grpc://%s, admin http://%s), %zu endpoints", a, h, b,
           gw->n_endpoints);
    printf("lupin epp: listening on grpc://%s health grpc://%s admin http://%s\n", a, h, b);
    fflush(stdout);
    gw->serving = 1;
    return 0;
  }
  gw_server_address(gw->server, a, sizeof a);
  gw_log(gw, LUPIN_LOG_INFO, "serving on http://%s (admin http://%s), %zu endpoints, %zu workers",
         a, b, gw->n_endpoints, workers);
  /* the start-up line on stdout, whatever the log level: scripts wait for it */
  printf("lupin serve: listening on http://%s admin http://%s\n", a, b);
  fflush(stdout);
  gw->serving = 1;
  return 0;
}

/* A follower: its own loop and runtime, polling the leader's listening
 * socket; no admin, signals, watches or scrapes (the leader's). */
int gw_open_follower(lupin_gateway *gw, const lupin_gateway *leader, char *err, size_t errlen) {
  gw->opts = leader->opts;
  gw->shared = leader->shared;
  gw->totals = leader->totals;
  gw->check_drained = check_drained;
  gw->reload = gw_reload;
  gw_explain_open(gw, leader);
  if (open_loop(gw, err, errlen)) return -2;
  if (open_worker(gw, err, errlen)) return -1;
  if (gw_inbox_open(gw, err, errlen)) return -2;
  gw->server = gw_server_listen(gw, gw->opts.listen, "listen", leader->server, gw_proxy_handle, gw,
                                err, errlen);
  if (!gw->server) return -2;
  return gw_health_start(gw, err, errlen) ? -2 : 0;
}

/* Runs until drained; closes the rest.  Returns the exit code. */
int gw_run(lupin_gateway *gw) {
  if (gw->loop && (gw->server || gw->epp) && gw->serving) uv_run(gw->loop, UV_RUN_DEFAULT);
  if (gw->draining != 2) shutdown_all(gw); /* a failed open or a drain timeout */
  if (gw->server) gw_server_close(gw->server);
  if (gw->loop) uv_run(gw->loop, UV_RUN_DEFAULT); /* the close callbacks */
  gw_epp_free(gw);
  gw_access_log_flush(gw);
  lh_buf_free(&gw->access_log);
  if (gw->rt) lupin_runtime_free(gw->rt);
  gw_upstream_free_spares(gw);
  gw_proxy_free_spares(gw);
  gw_proxy_routes_free(gw);
  gw_server_free(gw->server);
  gw_server_free(gw->admin);
  gw_objectives_free(gw);
  gw_flow_free(gw);
  if (gw->loop) {
    uv_loop_close(gw->loop);
    free(gw->loop);
  }
  if (gw->worker == 0) { /* the followers go before what they share */
    int worst = gw_workers_join(gw);
    if (worst > gw->exit_code) gw->exit_code = worst;
    gw_replicas_free(gw); /* its hook goes before what it hooks */
    gw_k8s_free(gw);
    gw_kv_events_free(gw);
    gw_tokenize_free(gw);
    lupin_shared_free(gw->shared);
  }
  gw_explain_free(gw);
  return gw->exit_code;
}
