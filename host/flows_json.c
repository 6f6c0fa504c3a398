/* GET /admin/flows: the flow-control queue (docs/flow-control.md) of one
 * runtime or several (a host's threads), summed by priority and fairness
 * id, as JSON.  Each runtime is read on its own thread (lh_flows_add), its
 * strings copied: they live in that runtime's Lua state; then
 * lh_admin_flows writes the bands, highest priority first, each with its
 * flows by id. */
#include "lupin_host.h"

#include <stdlib.h>
#include <string.h>

typedef struct sum_flow {
  char *id;
  uint64_t queued, bytes;
} sum_flow;

struct lh_flow_band {
  lupin_flow_info f; /* totals; f.fairness and f.ordering are owned copies */
  sum_flow *flows;
  size_t n_flows;
};

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static lh_flow_band *band_of(lh_flows *m, const lupin_flow_info *f) {
  for (size_t i = 0; i < m->n_bands; i++)
    if (m->bands[i].f.priority == f->priority) return &m->bands[i];
  lh_flow_band *b = realloc(m->bands, (m->n_bands + 1) * sizeof *b);
  if (!b) return NULL;
  m->bands = b;
  b = &m->bands[m->n_bands++];
  *b = (lh_flow_band){.f = *f};
  b->f.queued = b->f.bytes = b->f.dispatched = b->f.ttl = b->f.full = b->f.shed = 0;
  b->f.cancelled = b->f.clamped = b->f.flows_kept = 0;
  b->f.fairness = dup_or_null(f->fairness);
  b->f.ordering = dup_or_null(f->ordering);
  return b;
}

static void sum_flow_add(lh_flow_band *b, const lupin_flow_info *f) {
  for (size_t i = 0; i < b->n_flows; i++)
    if (!strcmp(b->flows[i].id, f->flow)) {
      b->flows[i].queued += f->queued;
      b->flows[i].bytes += f->bytes;
      return;
    }
  sum_flow *fl = realloc(b->flows, (b->n_flows + 1) * sizeof *fl);
  if (!fl) return;
  b->flows = fl;
  if (!(fl[b->n_flows].id = strdup(f->flow))) return;
  fl[b->n_flows].queued = f->queued;
  fl[b->n_flows++].bytes = f->bytes;
}

static void sum_one(void *ud, const lupin_flow_info *f) {
  lh_flows *m = ud;
  if (f->flow) {
    if (m->band) sum_flow_add(m->band, f);
    return;
  }
  lh_flow_band *b = m->band = band_of(m, f);
  if (!b) return;
  b->f.queued += f->queued;
  b->f.bytes += f->bytes;
  b->f.dispatched += f->dispatched;
  b->f.ttl += f->ttl;
  b->f.full += f->full;
  b->f.shed += f->shed;
  b->f.cancelled += f->cancelled;
  b->f.clamped += f->clamped;
  b->f.flows_kept += f->flows_kept;
}

void lh_flows_add(lh_flows *m, lupin_runtime *rt) {
  int saturated = 0;
  m->band = NULL;
  if (lupin_runtime_flows(rt, sum_one, m, &saturated)) return;
  m->on = 1;
  m->saturated |= saturated;
}

static int by_priority(const void *a, const void *b) {
  int x = ((const lh_flow_band *)a)->f.priority, y = ((const lh_flow_band *)b)->f.priority;
  return (x < y) - (x > y); /* highest first */
}

static int by_id(const void *a, const void *b) {
  return strcmp(((const sum_flow *)a)->id, ((const sum_flow *)b)->id);
}

void lh_flows_free(lh_flows *m) {
  for (size_t i = 0; i < m->n_bands; i++) {
    lh_flow_band *b = &m->bands[i];
    for (size_t k = 0; k < b->n_flows; k++)
      free(b->flows[k].id);
    free(b->flows);
    free((char *)b->f.fairness);
    free((char *)b->f.ordering);
  }
  free(m->bands);
}

static void band_json(lh_buf *b, const lh_flow_band *sb) {
  const lupin_flow_info *f = &sb->f;
  lh_buf_printf(b,
                "{\"priority\":%d,\"queued\":%llu,\"bytes\":%llu,\"max_requests\":%llu,"
                "\"max_bytes\":%llu,\"fairness\":",
                f->priority, (unsigned long long)f->queued, (unsigned long long)f->bytes,
                (unsigned long long)f->max_requests, (unsigned long long)f->max_bytes);
  lh_buf_json(b, f->fairness ? f->fairness : "");
  lh_buf_printf(b, ",\"ordering\":");
  lh_buf_json(b, f->ordering ? f->ordering : "");
  lh_buf_printf(b,
                ",\"dispatched\":%llu,\"evicted\":{\"queue_ttl\":%llu,\"queue_full\":%llu,"
                "\"shed\":%llu,\"cancelled\":%llu},\"clamped\":%llu,\"flows_kept\":%llu,"
                "\"flows\":[",
                (unsigned long long)f->dispatched, (unsigned long long)f->ttl,
                (unsigned long long)f->full, (unsigned long long)f->shed,
                (unsigned long long)f->cancelled, (unsigned long long)f->clamped,
                (unsigned long long)f->flows_kept);
  for (size_t i = 0; i < sb->n_flows; i++) {
    lh_buf_printf(b, "%s{\"id\":", i ? "," : "");
    lh_buf_json(b, sb->flows[i].id);
    lh_buf_printf(b, ",\"queued\":%llu,\"bytes\":%llu}", (unsigned long long)sb->flows[i].queued,
                  (unsigned long long)sb->flows[i].bytes);
  }
  lh_buf_printf(b, "]}");
}

void lh_admin_flows(lh_buf *b, lh_flows *m) {
  if (!m->on) {
    lh_buf_printf(b, "{\"enabled\":false,\"bands\":[]}\n");
    return;
  }
  if (m->n_bands) qsort(m->bands, m->n_bands, sizeof *m->bands, by_priority); /* NULL when none */
  lh_buf_printf(b, "{\"enabled\":true,\"bands\":[");
  for (size_t i = 0; i < m->n_bands; i++) {
    lh_flow_band *sb = &m->bands[i];
    if (sb->n_flows) qsort(sb->flows, sb->n_flows, sizeof *sb->flows, by_id);
    if (i) lh_buf_printf(b, ",");
    band_json(b, sb);
  }
  lh_buf_printf(b, "],\"saturated\":%s}\n", m->saturated ? "true" : "false");
}
