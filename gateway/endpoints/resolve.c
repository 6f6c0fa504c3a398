/* Endpoint addresses: a host name stands for every address getaddrinfo
 * gives (a stock /etc/hosts maps localhost to ::1 and 127.0.0.1, and a
 * service name may map to several pods).  Connects try them in order,
 * starting with the one that worked last; names are looked up again, off
 * the loop, once they are older than resolveIntervalMs or when every
 * address failed.  `--resolve NAME=ADDR[,ADDR...]` pins a name's addresses
 * (as curl's option does), for tests and for operators without DNS. */
#include "endpoints/endpoints.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --- an endpoint's addresses ------------------------------------------------ */

static int is_name(const gw_endpoint *ep) {
  struct sockaddr_storage ss;
  return gw_addr_literal(ep->address, ep->port, &ss) != 0;
}

void gw_endpoint_resolve(gw_endpoint *ep) {
  ep->n_addrs = gw_resolve_all(&ep->gw->opts, ep->address, ep->port, ep->addrs, GW_MAX_ADDRS);
  ep->addr_first = 0;
  ep->resolved_at = lupin_now();
  if (!ep->n_addrs)
    gw_log(ep->gw, LUPIN_LOG_WARN, "endpoint %s: cannot resolve %s", ep->name, ep->address);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  gw_endpoint *ep = req->data;
  free(req);
  ep->resolving = 0;
  ep->resolved_at = lupin_now();
  if (!ep->removed && status == 0) {
    struct sockaddr_storage addrs[GW_MAX_ADDRS];
    int n = gw_addr_list(res, ep->port, addrs, 0, GW_MAX_ADDRS);
    int changed = n != ep->n_addrs;
    for (int i = 0; i < n && !changed; i++)
      changed = !gw_addr_same(&addrs[i], &ep->addrs[i]);
    if (n && changed) {
      memcpy(ep->addrs, addrs, sizeof addrs);
      ep->n_addrs = n;
      ep->addr_first = 0;
      gw_log(ep->gw, LUPIN_LOG_INFO, "endpoint %s: %s now has %d address%s", ep->name, ep->address,
             n, n == 1 ? "" : "es");
    }
  } else if (!ep->removed) { /* keep the addresses we had: DNS may be down */
    gw_log(ep->gw, LUPIN_LOG_WARN, "endpoint %s: looking up %s again failed: %s", ep->name,
           ep->address, uv_strerror(status));
  }
  if (res) uv_freeaddrinfo(res);
  gw_endpoint_unref(ep);
}

void gw_endpoint_refresh_addrs(gw_endpoint *ep, int failed) {
  if (ep->resolving || ep->removed || !is_name(ep) || gw_resolve_pinned(ep)) return;
  double age = lupin_now() - ep->resolved_at;
  double interval = (double)ep->gw->set.resolve_interval_ms / 1000;
  if (age < (failed ? 1.0 : interval)) return; /* at most once a second on failures */
  uv_getaddrinfo_t *req = malloc(sizeof *req);
  if (!req) return;
  req->data = ep;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  gw_endpoint_ref(ep);
  ep->resolving = 1;
  if (uv_getaddrinfo(ep->gw->loop, req, on_resolved, ep->address, NULL, &hints)) {
    free(req);
    ep->resolving = 0;
    gw_endpoint_unref(ep);
  }
}

int gw_resolve_pinned(const gw_endpoint *ep) {
  struct sockaddr_storage ss[1];
  return gw_addr_pinned(&ep->gw->opts, ep->address, ep->port, ss, 1) >= 0;
}

const struct sockaddr *gw_endpoint_addr(gw_endpoint *ep, int attempt) {
  if (attempt >= ep->n_addrs) return NULL;
  return (const struct sockaddr *)&ep->addrs[(ep->addr_first + attempt) % ep->n_addrs];
}

void gw_endpoint_addr_worked(gw_endpoint *ep, int attempt) {
  if (ep->n_addrs) ep->addr_first = (ep->addr_first + attempt) % ep->n_addrs;
}
