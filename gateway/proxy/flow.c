/* Flow control as the gateway shows it (docs/flow-control.md): the queue's
 * bands and flows at /admin/flows, and the EPP's flow-control families on
 * /metrics.  The queue itself is the runtime's (lupin_runtime_flows); what
 * the runtime does not keep — how long each request waited — is observed
 * here when a request leaves the queue (proxy.c). */
#include "proxy/proxy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Priorities come from the config (objectives, bands) and from the
 * x-gateway-inference-objective header as an integer: bounded, so a client
 * cycling through numbers cannot grow the gateway's memory or /metrics. */
#define MAX_WAITS 64

typedef struct gw_flow_wait {
  int priority;
  char outcome[24];
  lh_histogram wait;
  uint64_t count;
} gw_flow_wait;

static gw_flow_wait *wait_of(lupin_gateway *gw, int priority, const char *outcome) {
  for (size_t i = 0; i < gw->n_flow_waits; i++) {
    gw_flow_wait *w = &gw->flow_waits[i];
    if (w->priority == priority && !strcmp(w->outcome, outcome)) return w;
  }
  if (gw->n_flow_waits == MAX_WAITS) return NULL;
  if (!gw->flow_waits && !(gw->flow_waits = calloc(MAX_WAITS, sizeof *gw->flow_waits))) return NULL;
  gw_flow_wait *w = &gw->flow_waits[gw->n_flow_waits++];
  w->priority = priority;
  snprintf(w->outcome, sizeof w->outcome, "%s", outcome);
  return w;
}

void gw_flow_observe(lupin_gateway *gw, int priority, const char *outcome, double waited) {
  gw_flow_wait *w = wait_of(gw, priority, outcome);
  if (w) lh_histogram_observe(&w->wait, LH_M_FC_QUEUE_DURATION, waited);
}

void gw_flow_free(lupin_gateway *gw) {
  free(gw->flow_waits);
  gw->flow_waits = NULL;
  gw->n_flow_waits = 0;
}

/* --- /metrics ------------------------------------------------------------ */

typedef struct metrics_pass {
  lh_expo *e;
  lh_family_id id;
} metrics_pass;

static void band_sample(void *ud, const lupin_flow_info *f) {
  metrics_pass *p = ud;
  if (f->flow) return; /* per band: fairness ids are the clients' */
  char prio[16];
  snprintf(prio, sizeof prio, "%d", f->priority);
  if (p->id == LH_M_FC_QUEUE_SIZE) {
    lh_expo_sample(p->e, (const char *[]){prio}, (double)f->queued);
  } else if (p->id == LH_M_FC_QUEUE_BYTES) {
    lh_expo_sample(p->e, (const char *[]){prio}, (double)f->bytes);
  } else if (p->id == LH_M_FC_CLAMPED) {
    lh_expo_sample(p->e, (const char *[]){prio}, (double)f->clamped);
  } else {
    const struct {
      const char *name;
      uint64_t v;
    } by[] = {{"dispatched", f->dispatched},
              {"queue_ttl", f->ttl},
              {"queue_full", f->full},
              {"shed", f->shed},
              {"cancelled", f->cancelled}};
    for (size_t i = 0; i < sizeof by / sizeof *by; i++)
      lh_expo_sample(p->e, (const char *[]){prio, by[i].name}, (double)by[i].v);
  }
}

static void nothing(void *ud, const lupin_flow_info *f) {
  (void)ud;
  (void)f;
}

void gw_flow_metrics(lupin_gateway *gw, lh_expo *e) {
  int saturated = 0;
  metrics_pass p = {e, LH_M_FC_QUEUE_SIZE};
  /* off: no flow-control family at all, as the EPP without its feature gate */
  if (lupin_runtime_flows(gw->rt, nothing, NULL, &saturated)) return;
  const lh_family_id ids[] = {LH_M_FC_QUEUE_SIZE, LH_M_FC_QUEUE_BYTES, LH_M_FC_REQUESTS,
                              LH_M_FC_CLAMPED};
  for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
    lh_expo_family(e, ids[i]);
    p.id = ids[i];
    lupin_runtime_flows(gw->rt, band_sample, &p, NULL);
  }
  lh_expo_family(e, LH_M_FC_QUEUE_DURATION);
  for (size_t i = 0; i < gw->n_flow_waits; i++) {
    gw_flow_wait *w = &gw->flow_waits[i];
    char prio[16];
    snprintf(prio, sizeof prio, "%d", w->priority);
    lh_expo_histogram(e, (const char *[]){prio, w->outcome}, &w->wait);
  }
  lh_expo_family(e, LH_M_FC_SATURATION);
  lh_expo_sample(e, NULL, saturated ? 1 : 0);
}

/* --- every worker's queue --------------------------------------------------- */

void gw_flow_pump(lupin_gateway *gw, void *arg) {
  (void)arg;
  lupin_runtime_tick(gw->rt);
}

/* /admin/flows shows the process's queue: each worker's bands and flows,
 * read on the worker's own thread (gw_workers_each), summed by priority and
 * fairness id.  Strings are copied: they live in the worker's Lua state. */
typedef struct sum_flow {
  char *id;
  uint64_t queued, bytes;
} sum_flow;

typedef struct sum_band {
  lupin_flow_info f; /* totals; f.fairness and f.ordering are owned copies */
  sum_flow *flows;
  size_t n_flows;
} sum_band;

typedef struct flows_sum {
  sum_band *bands;
  size_t n_bands;
  sum_band *band; /* the band the next flows belong to */
  int on, saturated;
} flows_sum;

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

static sum_band *sum_band_of(flows_sum *m, const lupin_flow_info *f) {
  for (size_t i = 0; i < m->n_bands; i++)
    if (m->bands[i].f.priority == f->priority) return &m->bands[i];
  sum_band *b = realloc(m->bands, (m->n_bands + 1) * sizeof *b);
  if (!b) return NULL;
  m->bands = b;
  b = &m->bands[m->n_bands++];
  *b = (sum_band){.f = *f};
  b->f.queued = b->f.bytes = b->f.dispatched = b->f.ttl = b->f.full = b->f.shed = 0;
  b->f.cancelled = b->f.clamped = b->f.flows_kept = 0;
  b->f.fairness = dup_or_null(f->fairness);
  b->f.ordering = dup_or_null(f->ordering);
  return b;
}

static void sum_flow_add(sum_band *b, const lupin_flow_info *f) {
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
  flows_sum *m = ud;
  if (f->flow) {
    if (m->band) sum_flow_add(m->band, f);
    return;
  }
  sum_band *b = m->band = sum_band_of(m, f);
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

static void sum_worker(lupin_gateway *gw, void *arg) {
  flows_sum *m = arg;
  int saturated = 0;
  m->band = NULL;
  if (lupin_runtime_flows(gw->rt, sum_one, m, &saturated)) return;
  m->on = 1;
  m->saturated |= saturated;
}

static int by_priority(const void *a, const void *b) {
  int x = ((const sum_band *)a)->f.priority, y = ((const sum_band *)b)->f.priority;
  return (x < y) - (x > y); /* highest first */
}

static int by_id(const void *a, const void *b) {
  return strcmp(((const sum_flow *)a)->id, ((const sum_flow *)b)->id);
}

static void flows_sum_free(flows_sum *m) {
  for (size_t i = 0; i < m->n_bands; i++) {
    sum_band *b = &m->bands[i];
    for (size_t k = 0; k < b->n_flows; k++)
      free(b->flows[k].id);
    free(b->flows);
    free((char *)b->f.fairness);
    free((char *)b->f.ordering);
  }
  free(m->bands);
}

/* --- /admin/flows -------------------------------------------------------- */

static void band_json(lh_buf *b, const sum_band *sb) {
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

void gw_flow_admin(lupin_gateway *gw, gw_conn *c) {
  flows_sum m = {0};
  gw_workers_each(gw, sum_worker, &m);
  lh_buf b = {0};
  if (!m.on) {
    lh_buf_printf(&b, "{\"enabled\":false,\"bands\":[]}\n");
  } else {
    qsort(m.bands, m.n_bands, sizeof *m.bands, by_priority);
    lh_buf_printf(&b, "{\"enabled\":true,\"bands\":[");
    for (size_t i = 0; i < m.n_bands; i++) {
      sum_band *sb = &m.bands[i];
      if (sb->n_flows) qsort(sb->flows, sb->n_flows, sizeof *sb->flows, by_id);
      if (i) lh_buf_printf(&b, ",");
      band_json(&b, sb);
    }
    lh_buf_printf(&b, "],\"saturated\":%s}\n", m.saturated ? "true" : "false");
  }
  flows_sum_free(&m);
  lupin_header h = {"content-type", "application/json"};
  gw_conn_respond(c, 200, &h, 1, b.data, b.len);
  lh_buf_free(&b);
}
