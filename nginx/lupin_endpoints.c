/* The config's endpoints in a worker: their addresses, their metrics and
 * their health, on nginx's own event loop (no second loop, no blocking
 * call).
 *
 * Each endpoint's metrics page is fetched every refreshIntervalMs (the
 * config's "gateway" section, as lupin serve reads it) over a connection
 * of nginx's (ngx_event_connect_peer), the answer parsed by http_parser and
 * read with the names of its engine (lupin_runtime_metric_source) into
 * lupin_endpoint_set_metrics.  Failed attempts, 5xx answers and failed
 * scrapes go through the host library's outlier detection (host/health.c):
 * an ejected or stale endpoint is taken out of the candidates
 * (lupin_endpoint_set_healthy) and comes back as in lupin serve.  Every
 * worker scrapes and judges for itself (docs/nginx.md). */
#include "ngx_http_lupin.h"

#include <http_parser.h>
#include <stdlib.h>
#include <time.h>

#define NGX_HTTP_LUPIN_TICK_MS    100
#define NGX_HTTP_LUPIN_SCRAPE_MAX (8 << 20) /* a metrics page past this is cut */

struct ngx_http_lupin_scrape_s {
  ngx_http_lupin_endpoint_t *ep;
  ngx_peer_connection_t pc;
  ngx_event_t deadline; /* scrapeTimeoutMs from the start */
  http_parser parser;
  lh_buf request, body;
  size_t sent;
  int status;
  unsigned complete : 1;
};

static void ngx_http_lupin_scrape_tick(ngx_event_t *ev);
static void ngx_http_lupin_health_tick(ngx_event_t *ev);

/* --- health: host/health.c's decisions, applied --------------------------- */

static void ngx_http_lupin_check_outage(void) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  ngx_uint_t healthy = 0;
  for (ngx_http_lupin_endpoint_t *e = w->endpoints; e; e = e->next)
    healthy += !e->removed && e->health.state == LH_HEALTHY;
  if (w->n_endpoints && !healthy && !w->no_healthy) {
    w->no_healthy = 1;
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "lupin: no healthy endpoint: all %ui are ejected or have stale metrics; "
                  "requests are answered 503 until one recovers",
                  w->n_endpoints);
  } else if (healthy && w->no_healthy) {
    w->no_healthy = 0;
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0, "lupin: recovered: %ui of %ui endpoints healthy",
                  healthy, w->n_endpoints);
  }
}

static void ngx_http_lupin_set_state(ngx_http_lupin_endpoint_t *e, lh_health_state s) {
  e->health.state = s;
  int healthy = s == LH_HEALTHY;
  if (healthy != e->health.in_runtime && !e->removed) {
    e->health.in_runtime = healthy;
    lupin_endpoint_set_healthy(ngx_http_lupin_worker.rt, e->name, healthy);
  }
  ngx_http_lupin_check_outage();
}

static void ngx_http_lupin_eject(ngx_http_lupin_endpoint_t *e, const char *why) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  size_t ejected = 0;
  for (ngx_http_lupin_endpoint_t *o = w->endpoints; o; o = o->next)
    ejected += !o->removed && o->health.state == LH_EJECTED;
  lh_health_policy p = lh_settings_health(&w->set);
  double now = lupin_now();
  double t = lh_health_eject(&e->health, &p, ejected, w->n_endpoints, now, (double)time(NULL));
  if (t == 0) {
    if (lh_health_warn_due(&e->health, now))
      ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                    "lupin: endpoint %s (%V): %s, but not ejected: %uz of %ui endpoints are "
                    "ejected already (maxEjectionPercent %uL)",
                    e->name, &e->text, why, ejected, w->n_endpoints, w->set.max_ejection_percent);
    return;
  }
  ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                "lupin: endpoint %s (%V) ejected for %.1f s: %s; %uz of %ui ejected", e->name,
                &e->text, t, why, ejected + 1, w->n_endpoints);
  ngx_http_lupin_set_state(e, LH_EJECTED);
}

/* A failure, the run-th in a row, of a request or a scrape: logged when it
 * is the first of a run, ejecting when the run is long enough. */
static void ngx_http_lupin_failed(ngx_http_lupin_endpoint_t *e, uint64_t run, const char *what,
                                  const char *detail) {
  lh_health *h = &e->health;
  if (lh_health_failed(h, run, what, detail, lupin_now())) {
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0, "lupin: endpoint %s (%V) failing: %s", e->name,
                  &e->text, h->last_error);
    h->suppressed = 0;
  }
  lh_health_policy p = lh_settings_health(&ngx_http_lupin_worker.set);
  if (lh_health_ejection_due(h, &p, run)) {
    char why[256];
    ngx_snprintf((u_char *)why, sizeof why - 1, "%uL %ss in a row failed (last: %s)%Z", run, what,
                 h->last_error);
    why[sizeof why - 1] = '\0';
    ngx_http_lupin_eject(e, why);
  }
}

/* Time-driven changes, decided by lh_health_evaluate, applied in order. */
static void ngx_http_lupin_evaluate(ngx_http_lupin_endpoint_t *e, double now) {
  lh_health_policy p = lh_settings_health(&ngx_http_lupin_worker.set);
  int changes = lh_health_evaluate(&e->health, &p, e->scraped_at, now);
  if (changes & LH_RESTORED) {
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "lupin: endpoint %s (%V) restored: ejection over and scrapes succeed", e->name,
                  &e->text);
    ngx_http_lupin_set_state(e, LH_HEALTHY);
  }
  if (changes & LH_WENT_STALE) {
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "lupin: endpoint %s (%V): no metrics for %.1f s (staleEjectionMs %uL), no "
                  "longer a candidate: %s",
                  e->name, &e->text, lh_health_metrics_age(&e->health, e->scraped_at, now),
                  ngx_http_lupin_worker.set.stale_ejection_ms,
                  e->health.last_error[0] ? e->health.last_error : "scrapes fail");
    ngx_http_lupin_set_state(e, LH_STALE);
  } else if (changes & LH_FRESH_AGAIN) {
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "lupin: endpoint %s (%V) restored: metrics fresh again", e->name, &e->text);
    ngx_http_lupin_set_state(e, LH_HEALTHY);
  }
}

void ngx_http_lupin_endpoint_attempt(ngx_http_lupin_endpoint_t *e, ngx_uint_t failed,
                                     ngx_uint_t status) {
  lh_health *h = &e->health;
  if (e->removed) return;
  if (!failed && status < 500) {
    h->errors = 0;
    return;
  }
  h->failures[failed ? 1 : 0]++;
  char detail[32];
  ngx_snprintf((u_char *)detail, sizeof detail, "answered %ui%Z", status);
  ngx_http_lupin_failed(e, ++h->errors, "request", failed ? "the attempt failed" : detail);
}

/* Idle: nothing in flight and requests ended since the last collection,
 * so lupin_live_request_tables counts live requests' tables only. */
static void ngx_http_lupin_collect_when_idle(void) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  uint64_t ended = 0;
  for (int i = 0; i < 16; i++)
    ended += w->outcomes[i];
  lupin_stats st;
  lupin_runtime_stats(w->rt, &st);
  if (st.live_requests || ended == w->ended_at_gc) return;
  w->ended_at_gc = ended;
  lupin_runtime_collect(w->rt);
  lh_heap_release(); /* what the ended requests held, back to the system */
}

static void ngx_http_lupin_health_tick(ngx_event_t *ev) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (w->rt == NULL) return;
  double now = lupin_now();
  for (ngx_http_lupin_endpoint_t *e = w->endpoints; e; e = e->next)
    if (!e->removed) ngx_http_lupin_evaluate(e, now);
  lupin_runtime_tick(w->rt);
  ngx_http_lupin_prefix_zone_drain(w->shared); /* an idle worker keeps up with the ring */
  if (++w->ticks % (1000 / NGX_HTTP_LUPIN_TICK_MS) == 0) ngx_http_lupin_collect_when_idle();
  if (!ngx_exiting) ngx_add_timer(ev, NGX_HTTP_LUPIN_TICK_MS);
}

/* --- a scrape: one connection, one GET, the answer read to its end -------- */

static int ngx_http_lupin_on_status(http_parser *p, const char *at, size_t len) {
  (void)at;
  (void)len;
  ((ngx_http_lupin_scrape_t *)p->data)->status = (int)p->status_code;
  return 0;
}

static int ngx_http_lupin_on_body(http_parser *p, const char *at, size_t len) {
  ngx_http_lupin_scrape_t *s = p->data;
  if (s->body.len + len > NGX_HTTP_LUPIN_SCRAPE_MAX) return 1;
  return lh_buf_append(&s->body, at, len) ? 1 : 0;
}

static int ngx_http_lupin_on_complete(http_parser *p) {
  ((ngx_http_lupin_scrape_t *)p->data)->complete = 1;
  return 0;
}

static const http_parser_settings ngx_http_lupin_scrape_parser = {
    .on_status = ngx_http_lupin_on_status,
    .on_body = ngx_http_lupin_on_body,
    .on_message_complete = ngx_http_lupin_on_complete,
};

/* The endpoint's metric names now: the current generation's. */
static const lupin_metric_source *ngx_http_lupin_source(ngx_http_lupin_endpoint_t *e,
                                                        lupin_metric_source *buf) {
  if (lupin_runtime_metric_source(ngx_http_lupin_worker.rt, e->name, buf)) return &lh_vllm_metrics;
  return buf;
}

/* A page that answered 200: its metrics into the runtime, or why not. */
static const char *ngx_http_lupin_apply(ngx_http_lupin_endpoint_t *e, ngx_http_lupin_scrape_t *s) {
  lupin_metrics m = e->metrics;
  char *running = NULL, *waiting = NULL;
  int bad = 0;
  lupin_metric_source buf;
  const lupin_metric_source *src = ngx_http_lupin_source(e, &buf);
  if (lh_metrics_read(src, s->body.data, s->body.len, &m, &running, &waiting, &bad) != 0)
    return "no metric lupin knows in the answer";
  e->scrape_errors += (uint64_t)bad; /* series out of range keep their old values */
  if (running) {
    free(e->running_lora);
    e->running_lora = running;
  }
  if (waiting) {
    free(e->waiting_lora);
    e->waiting_lora = waiting;
  }
  m.running_lora_adapters = e->running_lora;
  m.waiting_lora_adapters = e->waiting_lora;
  m.scraped_at = lupin_now();
  e->metrics = m;
  e->scraped_at = m.scraped_at;
  e->scrapes++;
  lupin_endpoint_set_metrics(ngx_http_lupin_worker.rt, e->name, &m);
  return NULL;
}

/* The scrape's end, success (why NULL and a whole answer) or not. */
static void ngx_http_lupin_scrape_done(ngx_http_lupin_scrape_t *s, const char *why) {
  ngx_http_lupin_endpoint_t *e = s->ep;
  if (s->pc.connection) ngx_close_connection(s->pc.connection);
  if (s->deadline.timer_set) ngx_del_timer(&s->deadline);
  e->scrape = NULL;
  if (why == NULL && !s->complete) why = "the answer ended early";
  if (why == NULL && s->status != 200) why = "the endpoint did not answer 200";
  if (!e->removed && ngx_http_lupin_worker.rt) {
    if (why == NULL) why = ngx_http_lupin_apply(e, s);
    if (why == NULL) {
      e->health.scrape_failures = 0;
      ngx_http_lupin_evaluate(e, lupin_now());
    } else {
      e->scrape_errors++;
      ngx_log_error(NGX_LOG_DEBUG, ngx_cycle->log, 0, "lupin: scrape %s: %s", e->name, why);
      ngx_http_lupin_failed(e, ++e->health.scrape_failures, "scrape", why);
    }
  }
  lh_buf_free(&s->request);
  lh_buf_free(&s->body);
  free(s);
}

static void ngx_http_lupin_scrape_timeout(ngx_event_t *ev) {
  ngx_http_lupin_scrape_done(ev->data, "timed out (scrapeTimeoutMs)");
}

static void ngx_http_lupin_scrape_read(ngx_event_t *ev) {
  ngx_connection_t *c = ev->data;
  ngx_http_lupin_scrape_t *s = c->data;
  u_char buf[16384];
  for (;;) {
    ssize_t n = c->recv(c, buf, sizeof buf);
    if (n == NGX_AGAIN) {
      if (ngx_handle_read_event(ev, 0) != NGX_OK) ngx_http_lupin_scrape_done(s, "read failed");
      return;
    }
    if (n == NGX_ERROR) {
      ngx_http_lupin_scrape_done(s, "the connection failed");
      return;
    }
    /* n == 0: the end, which ends an answer framed by the close */
    size_t used = http_parser_execute(&s->parser, &ngx_http_lupin_scrape_parser, (char *)buf, n);
    if (HTTP_PARSER_ERRNO(&s->parser) != HPE_OK || used != (size_t)n) {
      ngx_http_lupin_scrape_done(s, s->body.len >= NGX_HTTP_LUPIN_SCRAPE_MAX
                                        ? "the page is over 8 MB"
                                        : "a broken answer");
      return;
    }
    if (s->complete || n == 0) {
      ngx_http_lupin_scrape_done(s, NULL);
      return;
    }
  }
}

static void ngx_http_lupin_scrape_idle(ngx_event_t *ev) { (void)ev; }

static void ngx_http_lupin_scrape_write(ngx_event_t *ev) {
  ngx_connection_t *c = ev->data;
  ngx_http_lupin_scrape_t *s = c->data;
  while (s->sent < s->request.len) {
    ssize_t n = c->send(c, (u_char *)s->request.data + s->sent, s->request.len - s->sent);
    if (n == NGX_AGAIN) {
      if (ngx_handle_write_event(ev, 0) != NGX_OK) ngx_http_lupin_scrape_done(s, "write failed");
      return;
    }
    if (n == NGX_ERROR) {
      ngx_http_lupin_scrape_done(s, "connect failed");
      return;
    }
    s->sent += (size_t)n;
  }
  c->write->handler = ngx_http_lupin_scrape_idle;
  c->read->handler = ngx_http_lupin_scrape_read;
  if (c->read->ready) {
    ngx_http_lupin_scrape_read(c->read);
  } else if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
    ngx_http_lupin_scrape_done(s, "read failed");
  }
}

static void ngx_http_lupin_scrape_start(ngx_http_lupin_endpoint_t *e) {
  ngx_http_lupin_scrape_t *s = calloc(1, sizeof *s);
  if (s == NULL) return;
  lupin_metric_source buf;
  const char *path = ngx_http_lupin_source(e, &buf)->path;
  /* HTTP/1.0: the answer is framed by its length or the close, never chunked */
  if (lh_buf_printf(&s->request,
                    "GET %s HTTP/1.0\r\nHost: %.*s\r\nAccept: text/plain\r\n"
                    "User-Agent: lupin-nginx\r\n\r\n",
                    path ? path : "/metrics", (int)e->text.len, e->text.data)) {
    free(s);
    return;
  }
  s->ep = e;
  e->scrape = s;
  http_parser_init(&s->parser, HTTP_RESPONSE);
  s->parser.data = s;
  s->deadline.handler = ngx_http_lupin_scrape_timeout;
  s->deadline.data = s;
  s->deadline.log = ngx_cycle->log;
  s->deadline.cancelable = 1;
  ngx_add_timer(&s->deadline, ngx_http_lupin_worker.set.scrape_timeout_ms);

  s->pc.sockaddr = e->sockaddr;
  s->pc.socklen = e->socklen;
  s->pc.name = &e->text;
  s->pc.get = ngx_event_get_peer;
  /* nginx logs a refused connect at error level: once per scrape of a dead
   * endpoint.  The scrape's connection logs at crit only; the failures are
   * told by the health lines (the first of a run, then the ejection) */
  ngx_http_lupin_worker.scrape_log = *ngx_cycle->log;
  ngx_http_lupin_worker.scrape_log.log_level = NGX_LOG_CRIT;
  s->pc.log = &ngx_http_lupin_worker.scrape_log;
  s->pc.log_error = NGX_ERROR_INFO;
  ngx_int_t rc = ngx_event_connect_peer(&s->pc);
  if (rc == NGX_ERROR || rc == NGX_BUSY || rc == NGX_DECLINED) {
    s->pc.connection = NULL; /* closed by nginx already */
    ngx_http_lupin_scrape_done(s, "connect failed");
    return;
  }
  ngx_connection_t *c = s->pc.connection;
  c->data = s;
  c->write->handler = ngx_http_lupin_scrape_write;
  c->read->handler = ngx_http_lupin_scrape_idle;
  if (rc == NGX_OK) ngx_http_lupin_scrape_write(c->write);
  /* NGX_AGAIN: the write event says when the connect is through */
}

static void ngx_http_lupin_scrape_tick(ngx_event_t *ev) {
  ngx_http_lupin_endpoint_t *e = ev->data;
  if (e->removed || ngx_exiting || ngx_http_lupin_worker.rt == NULL) return;
  if (e->scrape == NULL) ngx_http_lupin_scrape_start(e); /* one at a time */
  ngx_add_timer(ev, ngx_http_lupin_worker.set.refresh_interval_ms);
}

/* --- the list ------------------------------------------------------------- */

ngx_http_lupin_endpoint_t *ngx_http_lupin_endpoint(const char *name) {
  for (ngx_http_lupin_endpoint_t *e = ngx_http_lupin_worker.endpoints; e; e = e->next)
    if (!e->removed && strcmp(e->name, name) == 0) return e;
  return NULL;
}

static void ngx_http_lupin_endpoint_free(ngx_http_lupin_endpoint_t *e) {
  if (e->scrape) ngx_http_lupin_scrape_done(e->scrape, "stopped");
  if (e->tick.timer_set) ngx_del_timer(&e->tick);
  if (e->pool) ngx_destroy_pool(e->pool);
  free(e->name);
  free(e->address);
  free(e->running_lora);
  free(e->waiting_lora);
  free(e);
}

/* A new endpoint, its address resolved now (a name is looked up once). */
static ngx_http_lupin_endpoint_t *ngx_http_lupin_endpoint_new(const lupin_endpoint_desc *d,
                                                              ngx_log_t *log, char *err,
                                                              size_t errlen) {
  ngx_http_lupin_endpoint_t *e = calloc(1, sizeof *e);
  if (e == NULL || !(e->name = strdup(d->name)) || !(e->address = strdup(d->address)) ||
      !(e->pool = ngx_create_pool(1024, log)))
    goto nomem;
  e->port = d->port;
  ngx_url_t u;
  ngx_memzero(&u, sizeof u);
  u.url.data = ngx_pnalloc(e->pool, ngx_strlen(d->address) + 16);
  if (u.url.data == NULL) goto nomem;
  int ipv6 = strchr(d->address, ':') != NULL;
  u.url.len = ngx_sprintf(u.url.data, ipv6 ? "[%s]:%d" : "%s:%d", d->address, d->port) - u.url.data;
  u.default_port = (in_port_t)d->port;
  if (ngx_parse_url(e->pool, &u) != NGX_OK || u.naddrs == 0) {
    lh_errf(err, errlen, "endpoint %s: %s: %s", d->name, d->address, u.err ? u.err : "no address");
    ngx_http_lupin_endpoint_free(e);
    return NULL;
  }
  e->sockaddr = u.addrs[0].sockaddr;
  e->socklen = u.addrs[0].socklen;
  e->text = u.addrs[0].name;
  lh_health_init(&e->health, lupin_now());
  e->health.in_runtime = 1;
  e->tick.handler = ngx_http_lupin_scrape_tick;
  e->tick.data = e;
  e->tick.log = ngx_cycle->log;
  e->tick.cancelable = 1;
  return e;
nomem:
  lh_errf(err, errlen, "out of memory");
  if (e) ngx_http_lupin_endpoint_free(e);
  return NULL;
}

typedef struct {
  ngx_log_t *log;
  char *err;
  size_t errlen;
  int failed;
} ngx_http_lupin_sync_t;

/* One endpoint of the config: kept when it is the same, else added (a
 * changed address makes a new one: the old address may be in use). */
static void ngx_http_lupin_sync_one(void *ud, const lupin_endpoint_desc *d) {
  ngx_http_lupin_sync_t *sy = ud;
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (sy->failed) return;
  ngx_http_lupin_endpoint_t *e = ngx_http_lupin_endpoint(d->name);
  if (lupin_endpoint_upsert(w->rt, d, sy->err, sy->errlen) != 0) {
    sy->failed = 1;
    return;
  }
  if (e && strcmp(e->address, d->address) == 0 && e->port == d->port) {
    e->seen = 1;
    return;
  }
  ngx_http_lupin_endpoint_t *fresh = ngx_http_lupin_endpoint_new(d, sy->log, sy->err, sy->errlen);
  if (fresh == NULL) {
    sy->failed = 1;
    return;
  }
  if (e) {
    e->removed = 1; /* replaced: the runtime's entry is the fresh one's now */
    w->n_endpoints--;
  }
  fresh->seen = 1;
  fresh->next = w->endpoints;
  w->endpoints = fresh;
  w->n_endpoints++;
  ngx_add_timer(&fresh->tick, 1); /* the first scrape now */
}

ngx_int_t ngx_http_lupin_endpoints_sync(ngx_log_t *log, char *err, size_t errlen) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (lh_settings_read(w->rt, &w->set, err, errlen) != 0) return NGX_ERROR;
  for (ngx_http_lupin_endpoint_t *e = w->endpoints; e; e = e->next)
    e->seen = 0;
  ngx_http_lupin_sync_t sy = {log, err, errlen, 0};
  if (lupin_runtime_read_endpoints(w->rt, NULL, ngx_http_lupin_sync_one, &sy, err, errlen) != 0 ||
      sy.failed)
    return NGX_ERROR;
  for (ngx_http_lupin_endpoint_t *e = w->endpoints; e; e = e->next) {
    if (e->seen || e->removed) continue;
    e->removed = 1;
    w->n_endpoints--;
    lupin_endpoint_remove(w->rt, e->name);
    if (e->tick.timer_set) ngx_del_timer(&e->tick);
  }
  if (!w->health_tick.timer_set) {
    w->health_tick.handler = ngx_http_lupin_health_tick;
    w->health_tick.log = ngx_cycle->log;
    w->health_tick.cancelable = 1;
    ngx_add_timer(&w->health_tick, NGX_HTTP_LUPIN_TICK_MS);
  }
  return NGX_OK;
}

void ngx_http_lupin_endpoints_stop(void) {
  ngx_http_lupin_worker_t *w = &ngx_http_lupin_worker;
  if (w->health_tick.timer_set) ngx_del_timer(&w->health_tick);
  while (w->endpoints) {
    ngx_http_lupin_endpoint_t *e = w->endpoints;
    w->endpoints = e->next;
    e->removed = 1; /* the scrape it may have ends without a word */
    ngx_http_lupin_endpoint_free(e);
  }
  w->n_endpoints = 0;
}

/* --- /lupin_status -------------------------------------------------------- */

void ngx_http_lupin_endpoints_expo(lh_expo *x) {
  double now = lupin_now();
  size_t healthy = 0;
  for (lh_family_id id = LH_M_EP_WAITING; id <= LH_M_EP_RESTORATIONS; id++) {
    lh_expo_family(x, id);
    for (ngx_http_lupin_endpoint_t *e = ngx_http_lupin_worker.endpoints; e; e = e->next) {
      if (e->removed) continue;
      lh_endpoint_state s = {&e->metrics, e->scraped_at, e->scrape_errors, &e->health};
      double v = lh_endpoint_sample(id, &s, now);
      if (id == LH_M_EP_HEALTHY) healthy += v != 0;
      lh_expo_sample(x, (const char *[]){e->name}, v);
    }
  }
  lh_expo_family(x, LH_M_ENDPOINTS_HEALTHY);
  lh_expo_sample(x, NULL, (double)healthy);
}
