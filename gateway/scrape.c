/* Scraping: each endpoint's metrics page every refreshIntervalMs, read with
 * the names of its engine (lupin_runtime_metric_source: vLLM's, current and
 * legacy, unless the config's data layer says otherwise) into the runtime's
 * endpoint metrics.  A failed scrape keeps the old values and does not
 * refresh the scrape time, so plugins and /readyz see the endpoint go stale. */
#include "gateway.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const lupin_metric_source *src;
  lupin_metrics *m;
  char **running, **waiting;
  double lora_ts; /* the lora_requests_info series with the latest value wins */
  int kv_current; /* a kv_usage series of the current name was read: legacy ones no longer count */
  int known;
  int bad; /* series of a known metric refused: not finite, out of range */
} reading;

/* vLLM's names: what a runtime without a data layer hands out, and what
 * gw_metrics_from_text reads. */
static const lupin_metric_source vllm = {
    "vllm",
    "/metrics",
    {"vllm:num_requests_waiting", NULL, {{0}}, 0},
    {"vllm:num_requests_running", NULL, {{0}}, 0},
    {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", {{0}}, 0},
    {"vllm:lora_requests_info", NULL, {{0}}, 0},
    {"vllm:cache_config_info", NULL, {{0}}, 0},
    "block_size",
    "num_gpu_blocks",
    {NULL, NULL, {{0}}, 0},
    {NULL, NULL, {{0}}, 0},
};

static const char *label(const lupin_header *l, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(l[i].name, name)) return l[i].value;
  return NULL;
}

/* 1: the sample is a series of spec's family name (2: of its legacy name)
 * carrying the spec's labels. */
static int matches(const lupin_metric_spec *spec, const char *name, const lupin_header *l,
                   size_t n) {
  int which = spec->name && !strcmp(name, spec->name)       ? 1
              : spec->legacy && !strcmp(name, spec->legacy) ? 2
                                                            : 0;
  for (size_t i = 0; which && i < spec->n_labels; i++) {
    const char *v = label(l, n, spec->labels[i].name);
    if (!v || strcmp(v, spec->labels[i].value)) return 0;
  }
  return which;
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

static void on_lora(reading *r, const lupin_header *l, size_t n, double v) {
  if (!in_range(r, v, -HUGE_VAL, HUGE_VAL)) return;
  if (r->lora_ts && v < r->lora_ts) return;
  r->lora_ts = v;
  const char *max = label(l, n, "max_lora");
  double m = max ? atof(max) : 0;
  r->m->max_lora = in_range(r, m, 0, HUGE_VAL) ? m : 0;
  set_string(r->running, label(l, n, "running_lora_adapters"));
  set_string(r->waiting, label(l, n, "waiting_lora_adapters"));
}

static void on_cache_info(reading *r, const lupin_header *l, size_t n) {
  const lupin_metric_source *s = r->src;
  const char *bs = label(l, n, s->block_size_label ? s->block_size_label : "block_size");
  const char *nb = label(l, n, s->num_blocks_label ? s->num_blocks_label : "num_gpu_blocks");
  if (bs && in_range(r, atof(bs), 0, HUGE_VAL)) r->m->cache_block_size = atof(bs);
  if (nb && in_range(r, atof(nb), 0, HUGE_VAL)) r->m->num_blocks = atof(nb);
}

static void on_sample(void *ud, const char *name, const lupin_header *l, size_t n, double v) {
  reading *r = ud;
  const lupin_metric_source *s = r->src;
  int kv;
  if (matches(&s->queue, name, l, n)) {
    if (!in_range(r, v, 0, HUGE_VAL)) return;
    r->m->waiting_queue_size = v;
  } else if (matches(&s->running, name, l, n)) {
    if (!in_range(r, v, 0, HUGE_VAL)) return;
    r->m->running_requests = v;
  } else if ((kv = matches(&s->kv_usage, name, l, n))) {
    if (kv == 2 && r->kv_current) return;
    if (!in_range(r, v, 0, 1)) return;
    r->kv_current |= kv == 1;
    r->m->kv_cache_usage = v;
  } else if (matches(&s->lora, name, l, n)) {
    on_lora(r, l, n, v);
  } else if (matches(&s->cache_info, name, l, n)) {
    on_cache_info(r, l, n);
  } else if (matches(&s->block_size, name, l, n)) {
    if (in_range(r, v, 0, HUGE_VAL)) r->m->cache_block_size = v;
  } else if (matches(&s->num_blocks, name, l, n)) {
    if (in_range(r, v, 0, HUGE_VAL)) r->m->num_blocks = v;
  } else {
    return;
  }
  r->known = 1;
}

static int read_metrics(const lupin_metric_source *src, const char *text, size_t len,
                        lupin_metrics *m, char **running, char **waiting, int *bad) {
  reading r = {src, m, running, waiting, 0, 0, 0, 0};
  gw_prometheus_parse(text, len, on_sample, &r);
  *bad = r.bad;
  return r.known ? 0 : -1;
}

int gw_metrics_from_text(const char *text, size_t len, lupin_metrics *m, char **running,
                         char **waiting) {
  int bad;
  return read_metrics(&vllm, text, len, m, running, waiting, &bad);
}

/* The endpoint's mapping now: the current generation's, valid until the
 * next load (so fetched again for each scrape). */
static const lupin_metric_source *source_of(gw_endpoint *ep, lupin_metric_source *buf) {
  if (lupin_runtime_metric_source(ep->gw->rt, ep->name, buf)) return &vllm;
  return buf;
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
  lupin_metric_source buf;
  const lupin_metric_source *src = source_of(ep, &buf);
  int rc =
      read_metrics(src, ep->scrape_body.data, ep->scrape_body.len, &m, &running, &waiting, &bad);
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
  gw_buf_free(&ep->scrape_body);
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
    gw_buf_free(&ep->scrape_body);
    gw_endpoint_unref(ep);
  }
  if (ep->timer) {
    uv_timer_stop(ep->timer);
    uv_close((uv_handle_t *)ep->timer, on_timer_closed);
    ep->timer = NULL;
  }
}
