/* Endpoint health, as Envoy's outlier detection, without a loop: the host
 * passes the time in and applies the state changes these decide (lupin
 * serve's gateway/endpoints/health.c tells the runtime and logs them).
 * Consecutive failures eject an endpoint for baseEjectionTimeMs doubled with
 * each ejection in a row (at most maxEjectionTimeMs), never more than
 * maxEjectionPercent of the endpoints at once (at least one); an ejected
 * endpoint comes back once its time has passed and its last scrape
 * succeeded; metrics older than staleEjectionMs take it out too. */
#include "lupin_host.h"

#include <stdio.h>
#include <string.h>

#define WARN_EVERY 10.0 /* seconds between first-failure lines of one endpoint */

const char *lh_health_state_name(lh_health_state s) {
  return s == LH_HEALTHY ? "healthy" : s == LH_EJECTED ? "ejected" : "stale";
}

void lh_health_init(lh_health *h, double now) {
  *h = (lh_health){.state = LH_HEALTHY, .in_runtime = 1, .added_at = now};
}

int lh_health_failed(lh_health *h, uint64_t run, const char *what, const char *detail, double now) {
  snprintf(h->last_error, sizeof h->last_error, "%s: %s", what, detail ? detail : "failed");
  if (run != 1 || h->state != LH_HEALTHY) return 0;
  if (now - h->last_warned < WARN_EVERY) {
    h->suppressed++;
    return 0;
  }
  h->last_warned = now;
  return 1;
}

int lh_health_ejection_due(const lh_health *h, const lh_health_policy *p, uint64_t run) {
  return p->consecutive_errors && run >= p->consecutive_errors && h->state == LH_HEALTHY;
}

int lh_health_warn_due(lh_health *h, double now) {
  if (now - h->last_warned < WARN_EVERY) return 0;
  h->last_warned = now;
  return 1;
}

double lh_health_eject(lh_health *h, const lh_health_policy *p, size_t ejected, size_t n,
                       double now, double wall) {
  size_t max = n * p->max_ejection_percent / 100;
  if (max < 1) max = 1;
  if (ejected >= max) return 0;
  double base = (double)p->base_ejection_time_ms / 1000;
  double max_t = (double)p->max_ejection_time_ms / 1000;
  double t = base * (double)(1ull << (h->backoff < 20 ? h->backoff : 20));
  if (t > max_t) t = max_t;
  h->backoff++;
  h->ejections++;
  h->ejected_until = now + t;
  h->ejected_unix = wall;
  h->errors = 0;
  return t;
}

static int stale(const lh_health *h, const lh_health_policy *p, double scraped_at, double now) {
  uint64_t ms = p->stale_ejection_ms;
  double since = scraped_at > h->added_at ? scraped_at : h->added_at;
  return ms && now - since > (double)ms / 1000;
}

double lh_health_metrics_age(const lh_health *h, double scraped_at, double now) {
  return now - (scraped_at ? scraped_at : h->added_at);
}

int lh_health_evaluate(lh_health *h, const lh_health_policy *p, double scraped_at, double now) {
  int changes = 0;
  lh_health_state s = h->state;
  if (s == LH_EJECTED) {
    if (now < h->ejected_until || h->scrape_failures) return 0;
    h->restorations++;
    h->healthy_since = now;
    s = LH_HEALTHY;
    changes |= LH_RESTORED;
  }
  int is_stale = stale(h, p, scraped_at, now);
  if (s == LH_HEALTHY && is_stale) {
    s = LH_STALE;
    changes |= LH_WENT_STALE;
  } else if (s == LH_STALE && !is_stale) {
    h->restorations++;
    h->healthy_since = now;
    s = LH_HEALTHY;
    changes |= LH_FRESH_AGAIN;
  }
  double base = (double)p->base_ejection_time_ms / 1000;
  if (s == LH_HEALTHY && h->backoff && now - h->healthy_since >= base) {
    h->backoff--;
    h->healthy_since = now;
  }
  return changes;
}
