/* Endpoint addresses: a host name stands for every address getaddrinfo
 * gives (a stock /etc/hosts maps localhost to ::1 and 127.0.0.1, and a
 * service name may map to several pods).  Connects try them in order,
 * starting with the one that worked last; names are looked up again, off
 * the loop, once they are older than resolveIntervalMs or when every
 * address failed.  `--resolve NAME=ADDR[,ADDR...]` pins a name's addresses
 * (as curl's option does), for tests and for operators without DNS. */
#include "gateway.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_port(struct sockaddr_storage *ss, int port) {
  if (ss->ss_family == AF_INET)
    ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
  else if (ss->ss_family == AF_INET6)
    ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
  else
    return -1;
  return 0;
}

static int literal(const char *host, int port, struct sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  return uv_ip4_addr(host, port, (struct sockaddr_in *)out) &&
                 uv_ip6_addr(host, port, (struct sockaddr_in6 *)out)
             ? -1
             : 0;
}

static int same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  if (a->ss_family != b->ss_family) return 0;
  if (a->ss_family == AF_INET)
    return !memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                   &((const struct sockaddr_in *)b)->sin_addr, sizeof(struct in_addr));
  return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                 &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
}

/* Appends the addresses of an addrinfo list, each once. */
static int add_list(const struct addrinfo *ai, int port, struct sockaddr_storage *out, int n,
                    int max) {
  for (; ai && n < max; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof *out) continue;
    struct sockaddr_storage ss = {0};
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (set_port(&ss, port)) continue;
    int dup = 0;
    for (int i = 0; i < n && !dup; i++)
      dup = same_addr(&out[i], &ss);
    if (!dup) out[n++] = ss;
  }
  return n;
}

/* The addresses pinned by --resolve for host, or -1 when none is. */
static int pinned(const gw_options *o, const char *host, int port, struct sockaddr_storage *out,
                  int max) {
  size_t hl = strlen(host);
  for (int i = 0; o && i < o->n_resolve; i++) {
    const char *r = o->resolve[i];
    if (strncmp(r, host, hl) || r[hl] != '=') continue;
    int n = 0;
    char addr[64];
    for (const char *p = r + hl + 1; *p && n < max;) {
      size_t len = strcspn(p, ",");
      if (len && len < sizeof addr) {
        memcpy(addr, p, len);
        addr[len] = 0;
        char *a = addr;
        if (a[0] == '[' && a[len - 1] == ']') a[len - 1] = 0, a++;
        if (!literal(a, port, &out[n])) n++;
      }
      p += len + (p[len] == ',');
    }
    return n;
  }
  return -1;
}

int gw_resolve_all(const gw_options *o, const char *host, int port, struct sockaddr_storage *out,
                   int max) {
  int n = pinned(o, host, port, out, max);
  if (n >= 0) return n;
  if (!literal(host, port, out)) return 1;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, NULL, &hints, &res)) return 0;
  n = add_list(res, port, out, 0, max);
  freeaddrinfo(res);
  return n;
}

int gw_resolve(const char *host, int port, struct sockaddr_storage *out) {
  return gw_resolve_all(NULL, host, port, out, 1) ? 0 : -1;
}

/* --- an endpoint's addresses ------------------------------------------------ */

static int is_name(const gw_endpoint *ep) {
  struct sockaddr_storage ss;
  return literal(ep->address, ep->port, &ss) != 0;
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
    int n = add_list(res, ep->port, addrs, 0, GW_MAX_ADDRS);
    int changed = n != ep->n_addrs;
    for (int i = 0; i < n && !changed; i++)
      changed = !same_addr(&addrs[i], &ep->addrs[i]);
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
  return pinned(&ep->gw->opts, ep->address, ep->port, ss, 1) >= 0;
}

const struct sockaddr *gw_endpoint_addr(gw_endpoint *ep, int attempt) {
  if (attempt >= ep->n_addrs) return NULL;
  return (const struct sockaddr *)&ep->addrs[(ep->addr_first + attempt) % ep->n_addrs];
}

void gw_endpoint_addr_worked(gw_endpoint *ep, int attempt) {
  if (ep->n_addrs) ep->addr_first = (ep->addr_first + attempt) % ep->n_addrs;
}

int gw_addr_name(const struct sockaddr_storage *ss, char *out, size_t len) {
  char ip[64];
  if (ss->ss_family == AF_INET6) {
    uv_ip6_name((const struct sockaddr_in6 *)ss, ip, sizeof ip);
    return snprintf(out, len, "[%s]:%d", ip, ntohs(((const struct sockaddr_in6 *)ss)->sin6_port));
  }
  uv_ip4_name((const struct sockaddr_in *)ss, ip, sizeof ip);
  return snprintf(out, len, "%s:%d", ip, ntohs(((const struct sockaddr_in *)ss)->sin_port));
}
