/* Addresses: host:port and names to socket addresses, every address of a
 * name in getaddrinfo's order, `--resolve NAME=ADDR[,ADDR...]` pins first
 * (gateway/endpoints/resolve.c looks endpoints' names up again), and a
 * socket address's name for messages. */
#include "loop/loop.h"

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

int gw_addr_literal(const char *host, int port, struct sockaddr_storage *out) {
  memset(out, 0, sizeof *out);
  return uv_ip4_addr(host, port, (struct sockaddr_in *)out) &&
                 uv_ip6_addr(host, port, (struct sockaddr_in6 *)out)
             ? -1
             : 0;
}

int gw_addr_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
  if (a->ss_family != b->ss_family) return 0;
  if (a->ss_family == AF_INET)
    return !memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                   &((const struct sockaddr_in *)b)->sin_addr, sizeof(struct in_addr));
  return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                 &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
}

/* Appends the addresses of an addrinfo list, each once. */
int gw_addr_list(const struct addrinfo *ai, int port, struct sockaddr_storage *out, int n,
                 int max) {
  for (; ai && n < max; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof *out) continue;
    struct sockaddr_storage ss = {0};
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    if (set_port(&ss, port)) continue;
    int dup = 0;
    for (int i = 0; i < n && !dup; i++)
      dup = gw_addr_same(&out[i], &ss);
    if (!dup) out[n++] = ss;
  }
  return n;
}

/* The addresses pinned by --resolve for host, or -1 when none is. */
int gw_addr_pinned(const gw_options *o, const char *host, int port, struct sockaddr_storage *out,
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
        if (!gw_addr_literal(a, port, &out[n])) n++;
      }
      p += len + (p[len] == ',');
    }
    return n;
  }
  return -1;
}

int gw_resolve_all(const gw_options *o, const char *host, int port, struct sockaddr_storage *out,
                   int max) {
  int n = gw_addr_pinned(o, host, port, out, max);
  if (n >= 0) return n;
  if (!gw_addr_literal(host, port, out)) return 1;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
  if (getaddrinfo(host, NULL, &hints, &res)) return 0;
  n = gw_addr_list(res, port, out, 0, max);
  freeaddrinfo(res);
  return n;
}

int gw_resolve(const char *host, int port, struct sockaddr_storage *out) {
  return gw_resolve_all(NULL, host, port, out, 1) ? 0 : -1;
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
