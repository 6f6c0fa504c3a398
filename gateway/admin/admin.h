/* admin.h -- the admin listener of lupin serve (admin.c), /metrics merged
 * over the workers (metrics_merge.c), the process's own metrics (process.c). */
#ifndef LUPIN_GW_ADMIN_H
#define LUPIN_GW_ADMIN_H

#include "proxy/proxy.h"

void gw_admin_handle(void *gw, gw_conn *c, gw_http_request *req);
/* --- the process (process.c) ---------------------------------------------- */

/* process_* as Prometheus' process collector names them, from /proc/self. */
void gw_process_metrics(lh_expo *e);

/* Merges the /metrics texts of the workers (admin.c): counters, histograms
 * and the gauges the workers hold each their own share of are summed, the
 * rest are the leader's. */
void gw_metrics_merge(lh_buf *out, const lh_buf *texts, size_t n);

#endif
