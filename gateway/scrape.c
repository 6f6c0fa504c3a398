/* Scraping: each endpoint's /metrics every refreshIntervalMs, read with
 * vLLM's names (current and legacy) into the runtime's endpoint metrics.
 * A failed scrape keeps the old values and does not refresh the scrape time,
 * so plugins and /readyz see the endpoint go stale. */
#include "gateway.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  lupin_metrics *m;
  char **running, **waiting;
  double lora_ts; /* the lora_requests_info series with the latest value wins */
  int known;
  int bad; /* series of a known metric refused: not finite, out of range */
} reading;

static const char *label(const lupin_header *l, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(l[i].name, name)) return l[i].value;
  return NULL;
}

static void set_string(char **dst, const char *v) {
  free(*dst);
  *dst = strdup(v ? v : "");
}

/* A value plugins may read: finite, within [lo, hi].  A series outside is
 * a scrape error for that series and the old value stays (NaN would make
 * every comparison a scorer makes false; JSON has no NaN). */
static int in_range(reading *r, double v, double lo, double hi) {
  if (isfinite(v) && v >= lo && v <= hi) return 1;
  r->bad++;
  return 0;
}

static void on_sample(void *ud, const char *name, const lupin_header *l, size_t n, double v) {
  reading *r = ud;
  if (strncmp(name, "vllm:", 5)) return;
  name += 5;
  if (!strcmp(name, "num_requests_waiting")) {
    if (!in_range(r, v, 0, HUGE_VAL)) return;
    r->m->waiting_queue_size = v;
  } else if (!strcmp(name, "num_requests_running")) {
    if (!in_range(r, v, 0, HUGE_VAL)) return;
    r->m->running_requests = v;
  } else if (!strcmp(name, "kv_cache_usage_perc") || !strcmp(name, "gpu_cache_usage_perc")) {
    if (!in_range(r, v, 0, 1)) return;
    r->m->kv_cache_usage = v;
  } else if (!strcmp(name, "lora_requests_info")) {
    if (!in_range(r, v, -HUGE_VAL, HUGE_VAL)) return;
    if (r->lora_ts && v < r->lora_ts) return;
    r->lora_ts = v;
    const char *max = label(l, n, "max_lora");
    double m = max ? atof(max) : 0;
    r->m->max_lora = in_range(r, m, 0, HUGE_VAL) ? m : 0;
    set_string(r->running, label(l, n, "running_lora_adapters"));
    set_string(r->waiting, label(l, n, "waiting_lora_adapters"));
  } else if (!strcmp(name, "cache_config_info")) {
    const char *bs = label(l, n, "block_size"), *nb = label(l, n, "num_gpu_blocks");
    if (bs && in_range(r, atof(bs), 0, HUGE_VAL)) r->m->cache_block_size = atof(bs);
    if (nb && in_range(r, atof(nb), 0, HUGE_VAL)) r->m->num_blocks = atof(nb);
  } else {
    return;
  }
  r->known = 1;
}

static int read_metrics(const char *text, size_t len, lupin_metrics *m, char **running,
                        char **waiting, int *bad) {
  reading r = {m, running, waiting, 0, 0, 0};
  gw_prometheus_parse(text, len, on_sample, &r);
  *bad = r.bad;
  return r.known ? 0 : -1;
}

int gw_metrics_from_text(const char *text, size_t len, lupin_metrics *m, char **running,
                         char **waiting) {
  int bad;
  return read_metrics(text, len, m, running, waiting, &bad);
}

/* --- the scrape loop ----------------------------------------------------- */

static void on_headers(void *ud, int status, const gw_headers *h, int64_t cl) {
  (void)h;
  (void)cl;
  gw_endpoint *ep = ud;
  ep->scrape_status = status;
}

static void on_body(void *ud, const char *data, size_t len) {
  gw_endpoint *ep = ud;
  if (ep->scrape_body.len < 8 << 20) gw_buf_append(&ep->scrape_body, data, len);
}

static void apply(gw_endpoint *ep) {
  lupin_metrics m = ep->metrics;
  char *running = NULL, *waiting = NULL;
  int bad = 0;
  int rc = read_metrics(ep->scrape_body.data, ep->scrape_body.len, &m, &running, &waiting, &bad);
  if (bad) {
    ep->scrape_errors += (uint64_t)bad;
    gw_log(ep->gw, LUPIN_LOG_DEBUG,
           "scrape %s: %d series not finite or out of range (queue < 0, KV usage outside 0-1): "
           "their old values stay",
           ep->name, bad);
  }
  if (rc) {
    ep->scrape_errors++;
    gw_log(ep->gw, LUPIN_LOG_DEBUG, "scrape %s: no vLLM metric in the answer", ep->name);
    gw_health_scrape(ep, 0, "no vLLM metric in the answer");
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
    if (!ep->removed) gw_health_scrape(ep, 0, e ? detail : "the endpoint did not answer 200");
  }
  gw_buf_free(&ep->scrape_body);
  gw_endpoint_unref(ep);
}

static const gw_upstream_cb scrape_cb = {on_headers, on_body, on_done};

static void tick(uv_timer_t *t) {
  gw_endpoint *ep = t->data;
  if (ep->scrape || ep->removed) return; /* one at a time */
  lupin_gateway *gw = ep->gw;
  gw_timeouts to = {gw->set.scrape_timeout_ms, gw->set.scrape_timeout_ms,
                    gw->set.scrape_timeout_ms};
  lupin_header accept = {"accept", "text/plain"};
  ep->scrape_status = 0;
  gw_endpoint_ref(ep);
  ep->scrape = gw_upstream_start(ep, "GET", "/metrics", &accept, 1, NULL, 0, to, &scrape_cb, ep);
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
    gw_buf_free(&ep->scrape_body);
    gw_endpoint_unref(ep);
  }
  if (ep->timer) {
    uv_timer_stop(ep->timer);
    uv_close((uv_handle_t *)ep->timer, on_timer_closed);
    ep->timer = NULL;
  }
}
