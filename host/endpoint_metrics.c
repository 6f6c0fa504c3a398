/* An endpoint's metrics page read into lupin_metrics, by the names of its
 * engine (a lupin_metric_source: vLLM's, sglang's, or a config's data
 * layer): the families a scorer reads, each value checked finite and in
 * range.  Loop-independent: the gateway's scrape hands the text over. */
#include "lupin_host.h"

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
 * lh_metrics_from_text reads. */
const lupin_metric_source lh_vllm_metrics = {
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

int lh_metrics_read(const lupin_metric_source *src, const char *text, size_t len, lupin_metrics *m,
                    char **running, char **waiting, int *bad) {
  reading r = {src, m, running, waiting, 0, 0, 0, 0};
  lh_prometheus_parse(text, len, on_sample, &r);
  *bad = r.bad;
  return r.known ? 0 : -1;
}

int lh_metrics_from_text(const char *text, size_t len, lupin_metrics *m, char **running,
                         char **waiting) {
  int bad;
  return lh_metrics_read(&lh_vllm_metrics, text, len, m, running, waiting, &bad);
}
