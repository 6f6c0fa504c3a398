/* Scraping: each endpoint's metrics page every refreshIntervalMs, read with
 * the names of its engine (lupin_runtime_metric_source: vLLM's, current and
 * legacy, unless the config's data layer says otherwise) into the runtime's
 * endpoint metrics.  A failed scrape keeps the old values and does not
 * refresh the scrape time, so plugins and /readyz see the endpoint go stale. */
#include "endpoints/endpoints.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The endpoint's mapping now: the current generation's, valid until the
 * next load (so fetched again for each scrape). */
static const lupin_metric_source *source_of(gw_endpoint *ep, lupin_metric_source *buf) {
  if (lupin_runtime_metric_source(ep->gw->rt, ep->name, buf)) return &lh_vllm_metrics;
  return buf;
}

/* --- the leader's scrapes handed to the other workers (docs/workers.md) --- */

typedef struct scraped {
  char *name;
  lupin_metrics m;
  char *running, *waiting;
  int ok;
  char detail[160];
} scraped;

static void scraped_free(void *p) {
  scraped *s = p;
  free(s->name);
  free(s->running);
  free(s->waiting);
  free(s);
}

static void scraped_apply(lupin_gateway *gw, void *arg) {
  const scraped *s = arg;
  gw_endpoint *ep = gw_endpoint_find(gw, s->name);
  if (!ep) return;
  if (!s->ok) {
    ep->scrape_errors++;
    gw_health_scrape(ep, 0, s->detail);
    return;
  }
  free(ep->running_lora);
  free(ep->waiting_lora);
  ep->running_lora = s->running ? strdup(s->running) : NULL;
  ep->waiting_lora = s->waiting ? strdup(s->waiting) : NULL;
  ep->metrics = s->m;
  ep->metrics.running_lora_adapters = ep->running_lora;
  ep->metrics.waiting_lora_adapters = ep->waiting_lora;
  ep->scraped_at = s->m.scraped_at;
  ep->scrapes++;
  lupin_endpoint_set_metrics(gw->rt, ep->name, &ep->metrics);
  gw_health_scrape(ep, 1, NULL);
}

void gw_workers_scraped(gw_endpoint *ep, int ok, const char *detail) {
  lupin_gateway *gw = ep->gw;
  if (gw_workers_count(gw) < 2 || ep->removed) return;
  scraped *s = calloc(1, sizeof *s);
  if (!s || !(s->name = strdup(ep->name))) {
    free(s);
    return;
  }
  s->ok = ok;
  s->m = ep->metrics;
  s->running = ep->running_lora ? strdup(ep->running_lora) : NULL;
  s->waiting = ep->waiting_lora ? strdup(ep->waiting_lora) : NULL;
  s->m.running_lora_adapters = s->m.waiting_lora_adapters = NULL;
  snprintf(s->detail, sizeof s->detail, "%s", detail ? detail : "");
  gw_workers_post(gw, scraped_apply, s, scraped_free);
}

/* --- start and join ------------------------------------------------------ */

/* --- the scrape loop ----------------------------------------------------- */

static void on_headers(void *ud, int status, const lh_headers *h, int64_t cl) {
  (void)h;
  (void)cl;
  gw_endpoint *ep = ud;
  ep->scrape_status = status;
}

static void on_body(void *ud, const char *data, size_t len) {
  gw_endpoint *ep = ud;
  if (ep->scrape_body.len < 8 << 20) lh_buf_append(&ep->scrape_body, data, len);
}

static void apply(gw_endpoint *ep) {
  lupin_metrics m = ep->metrics;
  char *running = NULL, *waiting = NULL;
  int bad = 0;
  lupin_metric_source buf;
  const lupin_metric_source *src = source_of(ep, &buf);
  int rc =
      lh_metrics_read(src, ep->scrape_body.data, ep->scrape_body.len, &m, &running, &waiting, &bad);
  if (bad) {
    ep->scrape_errors += (uint64_t)bad;
    gw_log(ep->gw, LUPIN_LOG_DEBUG,
           "scrape %s: %d series not finite or out of range (queue < 0, KV usage outside 0-1): "
           "their old values stay",
           ep->name, bad);
  }
  if (rc) {
    char why[96];
    snprintf(why, sizeof why, "no %s metric in the answer",
             !strcmp(src->engine, "vllm") ? "vLLM" : src->engine);
    ep->scrape_errors++;
    gw_log(ep->gw, LUPIN_LOG_DEBUG, "scrape %s: %s", ep->name, why);
    gw_health_scrape(ep, 0, why);
    gw_workers_scraped(ep, 0, why);
  } else {
    if (running) {
      free(ep->running_lora);
      ep->running_lora = running;
    }
    if (waiting) {
      free(ep->waiting_lora);
      ep->waiting_lora = waiting;
    }
    m.running_lora_adapters = ep->running_lora;
    m.waiting_lora_adapters = ep->waiting_lora;
    m.scraped_at = lupin_now();
    ep->metrics = m;
    ep->scraped_at = m.scraped_at;
    ep->scrapes++;
    if (!ep->removed) lupin_endpoint_set_metrics(ep->gw->rt, ep->name, &m);
    gw_health_scrape(ep, 1, NULL);
    gw_workers_scraped(ep, 1, NULL);
  }
}

static void on_done(void *ud, gw_upstream_error e, const char *detail) {
  gw_endpoint *ep = ud;
  ep->scrape = NULL;
  if (e == GW_UP_OK && ep->scrape_status == 200) {
    apply(ep);
  } else {
    ep->scrape_errors++;
    gw_log(ep->gw, LUPIN_LOG_DEBUG, "scrape %s: %s", ep->name,
           e ? detail : "the endpoint did not answer 200");
    if (!ep->removed) {
      gw_health_scrape(ep, 0, e ? detail : "the endpoint did not answer 200");
      gw_workers_scraped(ep, 0, e ? detail : "the endpoint did not answer 200");
    }
  }
  lh_buf_free(&ep->scrape_body);
  gw_endpoint_unref(ep);
}

static const gw_upstream_cb scrape_cb = {on_headers, on_body, on_done, NULL};

static void tick(uv_timer_t *t) {
  gw_endpoint *ep = t->data;
  if (ep->scrape || ep->removed) return; /* one at a time */
  lupin_gateway *gw = ep->gw;
  gw_timeouts to = {gw->set.scrape_timeout_ms, gw->set.scrape_timeout_ms,
                    gw->set.scrape_timeout_ms};
  lupin_header accept = {"accept", "text/plain"};
  lupin_metric_source buf;
  const char *path = source_of(ep, &buf)->path;
  ep->scrape_status = 0;
  gw_endpoint_ref(ep);
  ep->scrape = gw_upstream_start(ep, "GET", path ? path : "/metrics", &accept, 1, NULL, 0, to,
                                 &scrape_cb, ep);
  if (!ep->scrape) gw_endpoint_unref(ep);
}

static void on_timer_closed(uv_handle_t *h) {
  gw_endpoint *ep = h->data;
  free(h);
  gw_endpoint_unref(ep);
}

void gw_scrape_start(gw_endpoint *ep) {
  ep->timer = malloc(sizeof *ep->timer);
  if (!ep->timer) return;
  uv_timer_init(ep->gw->loop, ep->timer);
  ep->timer->data = ep;
  gw_endpoint_ref(ep);
  uv_timer_start(ep->timer, tick, 0, ep->gw->set.refresh_interval_ms);
}

void gw_scrape_stop(gw_endpoint *ep) {
  if (ep->scrape) {
    gw_upstream_cancel(ep->scrape);
    ep->scrape = NULL;
    lh_buf_free(&ep->scrape_body);
    gw_endpoint_unref(ep);
  }
  if (ep->timer) {
    uv_timer_stop(ep->timer);
    uv_close((uv_handle_t *)ep->timer, on_timer_closed);
    ep->timer = NULL;
  }
}
