/* Flow control as the gateway shows it (docs/flow-control.md): the queue's
 * bands and flows at /admin/flows, and the EPP's flow-control families on
 * /metrics.  The queue itself is the runtime's (lupin_runtime_flows); what
 * the runtime does not keep — how long each request waited — is observed
 * here when a request leaves the queue (proxy.c). */
#include "gateway.h"

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
  gw_histogram wait;
  uint64_t count;
} gw_flow_wait;

static gw_flow_wait *wait_of(lupin_gateway *gw, int priority, const char *outcome) {
  for (size_t i = 0; i < gw->n_flow_waits; i++) {
    gw_flow_wait *w = &gw->flow_waits[i];
    if (w->priority == priority && !strcmp(w->outcome, outcome)) return w;
  }
  if (gw->n_flow_waits == MAX_WAITS) return NULL;
  if (!gw->flow_waits && !(gw->flow_waits = calloc(MAX_WAITS, sizeof *gw->flow_waits)))
    return NULL;
  gw_flow_wait *w = &gw->flow_waits[gw->n_flow_waits++];
  w->priority = priority;
  snprintf(w->outcome, sizeof w->outcome, "%s", outcome);
  return w;
}

void gw_flow_observe(lupin_gateway *gw, int priority, const char *outcome, double waited) {
  gw_flow_wait *w = wait_of(gw, priority, outcome);
  if (w) gw_histogram_observe(&w->wait, GW_M_FC_QUEUE_DURATION, waited);
}

void gw_flow_free(lupin_gateway *gw) {
  free(gw->flow_waits);
  gw->flow_waits = NULL;
  gw->n_flow_waits = 0;
}

/* --- /metrics ------------------------------------------------------------ */

typedef struct metrics_pass {
  gw_expo *e;
  gw_family_id id;
} metrics_pass;

static void band_sample(void *ud, const lupin_flow_info *f) {
  metrics_pass *p = ud;
  if (f->flow) return; /* per band: fairness ids are the clients' */
  char prio[16];
  snprintf(prio, sizeof prio, "%d", f->priority);
  if (p->id == GW_M_FC_QUEUE_SIZE) {
    gw_expo_sample(p->e, (const char *[]){prio}, (double)f->queued);
  } else if (p->id == GW_M_FC_QUEUE_BYTES) {
    gw_expo_sample(p->e, (const char *[]){prio}, (double)f->bytes);
  } else {
    const struct {
      const char *name;
      uint64_t v;
    } by[] = {{"dispatched", f->dispatched}, {"queue_ttl", f->ttl},       {"queue_full", f->full},
              {"shed", f->shed},             {"cancelled", f->cancelled}};
    for (size_t i = 0; i < sizeof by / sizeof *by; i++)
      gw_expo_sample(p->e, (const char *[]){prio, by[i].name}, (double)by[i].v);
  }
}

static void nothing(void *ud, const lupin_flow_info *f) {
  (void)ud;
  (void)f;
}

void gw_flow_metrics(lupin_gateway *gw, gw_expo *e) {
  int saturated = 0;
  metrics_pass p = {e, GW_M_FC_QUEUE_SIZE};
  /* off: no flow-control family at all, as the EPP without its feature gate */
  if (lupin_runtime_flows(gw->rt, nothing, NULL, &saturated)) return;
  const gw_family_id ids[] = {GW_M_FC_QUEUE_SIZE, GW_M_FC_QUEUE_BYTES, GW_M_FC_REQUESTS};
  for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
    gw_expo_family(e, ids[i]);
    p.id = ids[i];
    lupin_runtime_flows(gw->rt, band_sample, &p, NULL);
  }
  gw_expo_family(e, GW_M_FC_QUEUE_DURATION);
  for (size_t i = 0; i < gw->n_flow_waits; i++) {
    gw_flow_wait *w = &gw->flow_waits[i];
    char prio[16];
    snprintf(prio, sizeof prio, "%d", w->priority);
    gw_expo_histogram(e, (const char *[]){prio, w->outcome}, &w->wait);
  }
  gw_expo_family(e, GW_M_FC_SATURATION);
  gw_expo_sample(e, NULL, saturated ? 1 : 0);
}

/* --- /admin/flows -------------------------------------------------------- */

typedef struct admin_pass {
  gw_buf *b;
  int bands, flows; /* written so far: the commas */
} admin_pass;

static void band_json(void *ud, const lupin_flow_info *f) {
  admin_pass *p = ud;
  gw_buf *b = p->b;
  if (f->flow) {
    gw_buf_printf(b, "%s{\"id\":", p->flows++ ? "," : "");
    gw_buf_json(b, f->flow);
    gw_buf_printf(b, ",\"queued\":%llu,\"bytes\":%llu}", (unsigned long long)f->queued,
                  (unsigned long long)f->bytes);
    return;
  }
  if (p->bands++) gw_buf_printf(b, "]},");
  p->flows = 0;
  gw_buf_printf(b, "{\"priority\":%d,\"queued\":%llu,\"bytes\":%llu,\"max_requests\":%llu,"
                   "\"max_bytes\":%llu,\"fairness\":",
                f->priority, (unsigned long long)f->queued, (unsigned long long)f->bytes,
                (unsigned long long)f->max_requests, (unsigned long long)f->max_bytes);
  gw_buf_json(b, f->fairness ? f->fairness : "");
  gw_buf_printf(b, ",\"ordering\":");
  gw_buf_json(b, f->ordering ? f->ordering : "");
  gw_buf_printf(b,
                ",\"dispatched\":%llu,\"evicted\":{\"queue_ttl\":%llu,\"queue_full\":%llu,"
                "\"shed\":%llu,\"cancelled\":%llu},\"flows\":[",
                (unsigned long long)f->dispatched, (unsigned long long)f->ttl,
                (unsigned long long)f->full, (unsigned long long)f->shed,
                (unsigned long long)f->cancelled);
}

void gw_flow_admin(lupin_gateway *gw, gw_conn *c) {
  gw_buf b = {0};
  admin_pass p = {&b, 0, 0};
  int saturated = 0;
  gw_buf_printf(&b, "{\"enabled\":");
  size_t at = b.len;
  gw_buf_printf(&b, "true,\"bands\":[");
  if (lupin_runtime_flows(gw->rt, band_json, &p, &saturated)) {
    b.len = at;
    gw_buf_printf(&b, "false,\"bands\":[]}\n");
  } else {
    gw_buf_printf(&b, "%s],\"saturated\":%s}\n", p.bands ? "]}" : "",
                  saturated ? "true" : "false");
  }
  lupin_header h = {"content-type", "application/json"};
  gw_conn_respond(c, 200, &h, 1, b.data, b.len);
  gw_buf_free(&b);
}
