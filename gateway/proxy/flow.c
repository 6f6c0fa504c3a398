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
  double level = 0;
  metrics_pass p = {e, LH_M_FC_QUEUE_SIZE};
  /* off: no flow-control family at all, as the EPP without its feature gate */
  if (lupin_runtime_flows(gw->rt, nothing, NULL, NULL)) return;
  lupin_runtime_flow_saturation(gw->rt, &level);
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
  lh_expo_sample(e, NULL, level);
}

/* --- every worker's queue --------------------------------------------------- */

void gw_flow_pump(lupin_gateway *gw, void *arg) {
  (void)arg;
  lupin_runtime_tick(gw->rt);
}

/* /admin/flows shows the process's queue: each worker's bands and flows,
 * read on the worker's own thread (gw_workers_each), summed and written by
 * host/flows_json.c. */
static void flows_of(lupin_gateway *gw, void *arg) { lh_flows_add(arg, gw->rt); }

void gw_flow_admin(lupin_gateway *gw, gw_conn *c) {
  lh_flows m = {0};
  gw_workers_each(gw, flows_of, &m);
  lh_buf b = {0};
  lh_admin_flows(&b, &m);
  lh_flows_free(&m);
  lupin_header h = {"content-type", "application/json"};
  gw_conn_respond(c, 200, &h, 1, b.data, b.len);
  lh_buf_free(&b);
}
