/* Endpoint health, as Envoy's outlier detection: consecutive failures of
 * proxied requests (connect failures, resets, timeouts, 5xx answers) or of
 * scrapes eject an endpoint from the candidates plugins see, for
 * baseEjectionTimeMs doubled with each ejection in a row (at most
 * maxEjectionTimeMs), never more than maxEjectionPercent of the endpoints at
 * once (at least one).  An ejected endpoint comes back once its time has
 * passed and its last scrape succeeded.  Metrics older than
 * staleEjectionMs also take an endpoint out (without the cap: with no
 * metrics the scorers are blind), until a scrape succeeds again.
 *
 * The decisions are host/health.c's (lh_health_*, no loop); this file
 * applies them: the runtime is told with lupin_endpoint_set_healthy; state changes, the
 * first failure of a run, "no healthy endpoint" and recovery are logged at
 * warn.  The same timer runs a garbage collection when the gateway has been
 * idle, so lupin_live_request_tables counts live requests' tables only. */
#include "endpoints/endpoints.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TICK_MS 100

const char *gw_failure_name(gw_upstream_error e) {
  static const char *const names[GW_UP_ERRORS] = {
      "status_5xx",   "connect_failed",   "connect_timeout",         "first_byte_timeout",
      "idle_timeout", "stale_connection", "closed_without_response", "broken_response"};
  return (unsigned)e < GW_UP_ERRORS ? names[e] : "?";
}

void gw_health_init(gw_endpoint *ep) { lh_health_init(&ep->health, lupin_now()); }

static lh_health_policy policy(const lupin_gateway *gw) { return lh_settings_health(&gw->set); }

static size_t count_state(lupin_gateway *gw, lh_health_state s) {
  size_t n = 0;
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    n += ep->health.state == s;
  return n;
}

size_t gw_healthy_endpoints(lupin_gateway *gw) { return count_state(gw, LH_HEALTHY); }

/* Logs "no healthy endpoint" and the recovery once each. */
static void check_outage(lupin_gateway *gw) {
  if (!gw->n_endpoints || gw->draining) return;
  size_t n = gw_healthy_endpoints(gw);
  if (!n && !gw->no_healthy) {
    gw->no_healthy = 1;
    gw_log(gw, LUPIN_LOG_WARN,
           "no healthy endpoint: all %zu are ejected or have stale metrics; requests are "
           "answered 503 and /readyz says 503 until one recovers",
           gw->n_endpoints);
  } else if (n && gw->no_healthy) {
    gw->no_healthy = 0;
    gw_log(gw, LUPIN_LOG_WARN, "recovered: %zu of %zu endpoints healthy", n, gw->n_endpoints);
  }
}

/* Tells the runtime when the verdict changed. */
static void sync_runtime(gw_endpoint *ep) {
  int healthy = ep->health.state == LH_HEALTHY;
  if (healthy == ep->health.in_runtime || ep->removed) return;
  ep->health.in_runtime = healthy;
  lupin_endpoint_set_healthy(ep->gw->rt, ep->name, healthy);
}

static void set_state(gw_endpoint *ep, lh_health_state s) {
  ep->health.state = s;
  sync_runtime(ep);
  check_outage(ep->gw);
}

/* An ejection one worker decided, for the others (workers.c): the endpoint
 * is out for the same time everywhere, so a dead endpoint costs its failed
 * attempts once, not once per worker.  Counted where it was decided. */
typedef struct ejection {
  char *name;
  double until;
  uint64_t backoff;
} ejection;

static void ejection_free(void *p) {
  ejection *e = p;
  free(e->name);
  free(e);
}

static void ejected_elsewhere(lupin_gateway *gw, void *arg) {
  const ejection *e = arg;
  gw_endpoint *ep = gw_endpoint_find(gw, e->name);
  if (!ep || ep->health.state == LH_EJECTED) return;
  ep->health.ejected_until = e->until;
  ep->health.backoff = e->backoff;
  ep->health.errors = 0;
  set_state(ep, LH_EJECTED);
}

static void tell_workers(gw_endpoint *ep) {
  ejection *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(ep->name))) {
    free(e);
    return;
  }
  e->until = ep->health.ejected_until;
  e->backoff = ep->health.backoff;
  gw_workers_post(ep->gw, ejected_elsewhere, e, ejection_free);
}

static void eject(gw_endpoint *ep, const char *why) {
  lupin_gateway *gw = ep->gw;
  lh_health *h = &ep->health;
  size_t ejected = count_state(gw, LH_EJECTED);
  double now = lupin_now();
  struct timespec wall;
  clock_gettime(CLOCK_REALTIME, &wall);
  lh_health_policy p = policy(gw);
  double t = lh_health_eject(h, &p, ejected, gw->n_endpoints, now,
                             (double)wall.tv_sec + wall.tv_nsec / 1e9);
  if (!t) {
    if (lh_health_warn_due(h, now))
      gw_log(gw, LUPIN_LOG_WARN,
             "endpoint %s (%s): %s, but not ejected: %zu of %zu endpoints are ejected "
             "already (maxEjectionPercent %llu)",
             ep->name, ep->hostport, why, ejected, gw->n_endpoints,
             (unsigned long long)gw->set.max_ejection_percent);
    return;
  }
  gw_log(gw, LUPIN_LOG_WARN, "endpoint %s (%s) ejected for %.1f s: %s; %zu of %zu ejected",
         ep->name, ep->hostport, t, why, ejected + 1, gw->n_endpoints);
  set_state(ep, LH_EJECTED);
  tell_workers(ep);
}

/* Time-driven changes, decided by lh_health_evaluate, applied in order. */
static void evaluate(gw_endpoint *ep, double now) {
  lh_health *h = &ep->health;
  lupin_gateway *gw = ep->gw;
  lh_health_policy p = policy(gw);
  int changes = lh_health_evaluate(h, &p, ep->scraped_at, now);
  if (changes & LH_RESTORED) {
    gw_log(gw, LUPIN_LOG_WARN, "endpoint %s (%s) restored: ejection over and scrapes succeed",
           ep->name, ep->hostport);
    set_state(ep, LH_HEALTHY);
  }
  if (changes & LH_WENT_STALE) {
    gw_log(gw, LUPIN_LOG_WARN,
           "endpoint %s (%s): no metrics for %.1f s (staleEjectionMs %llu), no longer a "
           "candidate: %s",
           ep->name, ep->hostport, lh_health_metrics_age(h, ep->scraped_at, now),
           (unsigned long long)gw->set.stale_ejection_ms,
           h->last_error[0] ? h->last_error : "scrapes fail");
    set_state(ep, LH_STALE);
  } else if (changes & LH_FRESH_AGAIN) {
    gw_log(gw, LUPIN_LOG_WARN, "endpoint %s (%s) restored: metrics fresh again", ep->name,
           ep->hostport);
    set_state(ep, LH_HEALTHY);
  }
}

/* The first failure after a success is logged (rate-limited per endpoint). */
static void failed(gw_endpoint *ep, uint64_t run, const char *what, const char *detail) {
  lh_health *h = &ep->health;
  if (!lh_health_failed(h, run, what, detail, lupin_now())) return;
  char more[64] = "";
  if (h->suppressed)
    snprintf(more, sizeof more, " (%llu more since the last such line)",
             (unsigned long long)h->suppressed);
  h->suppressed = 0;
  gw_log(ep->gw, LUPIN_LOG_WARN, "endpoint %s (%s) failing: %s%s", ep->name, ep->hostport,
         h->last_error, more);
}

void gw_health_request(gw_endpoint *ep, gw_upstream_error e, int status, int reused,
                       const char *detail) {
  lh_health *h = &ep->health;
  int bad = e != GW_UP_OK || status >= 500;
  /* a pooled connection found closed before the write says nothing of the
   * endpoint: servers close idle connections */
  if (e == GW_UP_NOT_SENT && reused) bad = 0;
  if (e != GW_UP_OK || status >= 500) h->failures[e]++;
  if (!bad) {
    if (e == GW_UP_OK) h->errors = 0;
    return;
  }
  char st[32];
  if (e == GW_UP_OK) snprintf(st, sizeof st, "answered %d", status);
  failed(ep, ++h->errors, "request", e == GW_UP_OK ? st : detail);
  lh_health_policy p = policy(ep->gw);
  if (lh_health_ejection_due(h, &p, h->errors)) {
    char why[256];
    snprintf(why, sizeof why, "%llu requests in a row failed (last: %s)",
             (unsigned long long)h->errors, h->last_error);
    eject(ep, why);
  }
}

void gw_health_scrape(gw_endpoint *ep, int ok, const char *detail) {
  lh_health *h = &ep->health;
  if (ok) {
    h->scrape_failures = 0;
    evaluate(ep, lupin_now());
    return;
  }
  failed(ep, ++h->scrape_failures, "scrape", detail);
  lh_health_policy p = policy(ep->gw);
  if (lh_health_ejection_due(h, &p, h->scrape_failures)) {
    char why[256];
    snprintf(why, sizeof why, "%llu scrapes in a row failed (last: %s)",
             (unsigned long long)h->scrape_failures, h->last_error);
    eject(ep, why);
  }
}

/* --- the timer ------------------------------------------------------------ */

/* Idle: nothing in flight and requests ended since the last collection. */
static void collect_when_idle(lupin_gateway *gw) {
  uint64_t ended = 0;
  for (int i = 0; i < 16; i++)
    ended += gw->stats.by_outcome[i];
  if (gw->n_exchanges || ended == gw->ended_at_gc) return;
  gw->ended_at_gc = ended;
  lupin_runtime_collect(gw->rt);
  /* what the ended requests held goes back to the system: now, and on the
   * next ticks, since mimalloc purges what it freed after a delay (10 ms) */
  gw->heap_releases = 3;
}

static void tick(uv_timer_t *t) {
  lupin_gateway *gw = t->data;
  double now = lupin_now();
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    evaluate(ep, now);
  check_outage(gw);
  lupin_runtime_tick(gw->rt); /* flow control: TTLs, and the gate tried again */
  if (++gw->health_ticks % (1000 / TICK_MS) == 0) collect_when_idle(gw);
  if (gw->heap_releases && !gw->n_exchanges) {
    gw->heap_releases--;
    lh_heap_release();
  }
}

/* The tick runs flow control's TTLs and the ejections: no gateway serves
 * without it. */
int gw_health_start(lupin_gateway *gw, char *err, size_t errlen) {
  gw->health_timer = malloc(sizeof *gw->health_timer);
  if (!gw->health_timer) {
    lh_errf(err, errlen, "cannot start the health timer: out of memory");
    return -1;
  }
  uv_timer_init(gw->loop, gw->health_timer);
  gw->health_timer->data = gw;
  uv_timer_start(gw->health_timer, tick, TICK_MS, TICK_MS);
  uv_unref((uv_handle_t *)gw->health_timer);
  return 0;
}

static void close_free(uv_handle_t *h) { free(h); }

void gw_health_stop(lupin_gateway *gw) {
  if (!gw->health_timer) return;
  uv_close((uv_handle_t *)gw->health_timer, close_free);
  gw->health_timer = NULL;
}
