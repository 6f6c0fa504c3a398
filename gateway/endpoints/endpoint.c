/* An endpoint as the gateway's rooms share it: counted references (an
 * endpoint removed from the registry lives until its last exchange ends),
 * lookup by name, and whether its metrics are fresh (/readyz, the pool
 * gauges).  The registry itself is kept by gateway.c. */
#include "endpoints/endpoints.h"

#include <stdlib.h>
#include <string.h>

void gw_endpoint_ref(gw_endpoint *ep) { ep->refs++; }

void gw_endpoint_unref(gw_endpoint *ep) {
  if (--ep->refs) return;
  free(ep->name);
  free(ep->address);
  free(ep->running_lora);
  free(ep->waiting_lora);
  lh_buf_free(&ep->scrape_body);
  lh_headers_free(&ep->labels);
  free(ep);
}

gw_endpoint *gw_endpoint_find(lupin_gateway *gw, const char *name) {
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    if (!strcmp(ep->name, name)) return ep;
  return NULL;
}

int gw_endpoint_fresh(const gw_endpoint *ep, double now) {
  double limit = (double)ep->gw->set.metrics_staleness_ms / 1000;
  return ep->scraped_at > 0 && now - ep->scraped_at <= limit && ep->health.state == LH_HEALTHY;
}

size_t gw_fresh_endpoints(lupin_gateway *gw) {
  double now = lupin_now();
  size_t n = 0;
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    n += gw_endpoint_fresh(ep, now);
  return n;
}

const char *gw_not_ready(lupin_gateway *gw, char *buf, size_t len) {
  const char *k8s = gw_k8s_not_ready(gw); /* a pool not read is not an empty pool */
  if (k8s) {
    snprintf(buf, len, "not ready: kubernetes: %s", k8s);
    return buf;
  }
  if (gw_fresh_endpoints(gw)) return NULL;
  return "not ready: no healthy endpoint with fresh metrics (see /admin/endpoints)";
}

/* --- the endpoints file -------------------------------------------------- */
