/* The endpoint pool.  C owns the list and the metrics; the Lua side wraps each
 * endpoint in one FFI object that plugins read without copying.  A removed
 * endpoint lives on until the last request holding its object lets go. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* The pool by name.  A gateway sets every endpoint's metrics by name each
 * scrape round: a scan of the names made a round over n endpoints cost n²
 * compares.  Open addressing, at most half full: an added endpoint is placed,
 * a removal (which moves the last endpoint into the hole) rebuilds; without
 * memory for it, lookups scan. */
static size_t name_home(const lupin_runtime *rt, const char *name) {
  return (size_t)XXH64(name, strlen(name), 0) & rt->endpoint_names_mask;
}

static void name_place(lupin_runtime *rt, size_t i) {
  size_t k = name_home(rt, rt->endpoints[i]->name);
  while (rt->endpoint_names[k])
    k = (k + 1) & rt->endpoint_names_mask;
  rt->endpoint_names[k] = (uint32_t)i + 1;
}

static void names_rebuild(lupin_runtime *rt) {
  size_t cap = 16;
  while (cap < rt->n_endpoints * 2)
    cap *= 2;
  free(rt->endpoint_names);
  rt->endpoint_names = calloc(cap, sizeof *rt->endpoint_names);
  if (!rt->endpoint_names) return;
  rt->endpoint_names_mask = cap - 1;
  for (size_t i = 0; i < rt->n_endpoints; i++)
    name_place(rt, i);
}

/* The endpoint just appended at the end of the pool. */
static void names_add(lupin_runtime *rt) {
  if (!rt->endpoint_names || rt->n_endpoints * 2 > rt->endpoint_names_mask + 1)
    names_rebuild(rt);
  else
    name_place(rt, rt->n_endpoints - 1);
}

static lupin_endpoint *find(lupin_runtime *rt, const char *name, size_t *index) {
  if (!rt->endpoint_names) {
    for (size_t i = 0; i < rt->n_endpoints; i++) {
      if (strcmp(rt->endpoints[i]->name, name) == 0) {
        if (index) *index = i;
        return rt->endpoints[i];
      }
    }
    return NULL;
  }
  for (size_t k = name_home(rt, name); rt->endpoint_names[k];
       k = (k + 1) & rt->endpoint_names_mask) {
    size_t i = rt->endpoint_names[k] - 1;
    if (strcmp(rt->endpoints[i]->name, name) == 0) {
      if (index) *index = i;
      return rt->endpoints[i];
    }
  }
  return NULL;
}

void lupin__endpoint_free(lupin_endpoint *ep) {
  if (ep->slot) lupin__shared_endpoint_unref(ep->shared, ep->slot);
  free((char *)ep->name);
  free((char *)ep->address);
  free(ep->running_lora);
  free(ep->waiting_lora);
  free(ep);
}

static void push_labels(lua_State *L, const lupin_endpoint_desc *d) {
  lua_createtable(L, 0, (int)d->n_labels);
  for (size_t i = 0; i < d->n_labels; i++) {
    lua_pushstring(L, d->labels[i].value ? d->labels[i].value : "");
    lua_setfield(L, -2, d->labels[i].name);
  }
}

static int call_labels(lupin_runtime *rt, const lupin_endpoint *ep, const lupin_endpoint_desc *d,
                       char *err, size_t errlen) {
  lupin__push_hook(rt, LUPIN_HOOK_ENDPOINT_LABELS);
  lua_pushnumber(rt->L, ep->id);
  push_labels(rt->L, d);
  return lupin__call(rt, 2, 0, err, errlen);
}

static int detach(lupin_runtime *rt, size_t i) {
  lupin_endpoint *ep = rt->endpoints[i];
  rt->endpoints[i] = rt->endpoints[--rt->n_endpoints];
  names_rebuild(rt);
  lupin__prefix_purge_all(rt, ep->id); /* what it cached is no longer reachable */
  lupin__push_hook(rt, LUPIN_HOOK_ENDPOINT_REMOVE);
  lua_pushnumber(rt->L, ep->id);
  return lupin__call(rt, 1, 0, NULL, 0);
}

static int attach(lupin_runtime *rt, lupin_endpoint *ep, const lupin_endpoint_desc *d, char *err,
                  size_t errlen) {
  if (rt->n_endpoints == rt->cap_endpoints) {
    size_t cap = rt->cap_endpoints ? rt->cap_endpoints * 2 : 16;
    lupin_endpoint **a = realloc(rt->endpoints, cap * sizeof *a);
    if (!a) {
      lupin__endpoint_free(ep);
      lupin__errf(err, errlen, "out of memory");
      return -1;
    }
    rt->endpoints = a;
    rt->cap_endpoints = cap;
  }
  lupin__push_hook(rt, LUPIN_HOOK_ENDPOINT_ADD);
  lua_pushlightuserdata(rt->L, ep);
  push_labels(rt->L, d);
  /* From here the Lua object owns ep: its finalizer frees it. */
  if (lupin__call(rt, 2, 0, err, errlen)) return -1;
  rt->endpoints[rt->n_endpoints++] = ep;
  names_add(rt);
  return 0;
}

int lupin_endpoint_upsert(lupin_runtime *rt, const lupin_endpoint_desc *d, char *err,
                          size_t errlen) {
  if (!d->address || !*d->address || d->port <= 0 || d->port > 65535) {
    lupin__errf(err, errlen, "endpoint %s: needs an address and a port in 1..65535",
                d->name ? d->name : "(unnamed)");
    return -1;
  }
  char hostport[300];
  snprintf(hostport, sizeof hostport, "%s:%d", d->address, d->port);
  const char *name = d->name && *d->name ? d->name : hostport;

  size_t i;
  lupin_endpoint *old = find(rt, name, &i);
  if (old && old->port == d->port && strcmp(old->address, d->address) == 0)
    return call_labels(rt, old, d, err, errlen);

  /* New, or moved: a fresh object, so requests holding the old one keep a
   * consistent view of where they were sent.  Its identity is the shared
   * registry's: the same (name, address, port) has the same id and
   * counters in every runtime; a move makes another. */
  lupin_endpoint *ep = calloc(1, sizeof *ep);
  if (ep) ep->shared = rt->shared;
  if (!ep || !(ep->name = strdup(name)) || !(ep->address = strdup(d->address)) ||
      !(ep->slot = lupin__shared_endpoint_ref(rt->shared, name, d->address, d->port))) {
    if (ep) lupin__endpoint_free(ep);
    lupin__errf(err, errlen, "out of memory");
    return -1;
  }
  ep->id = lupin__shared_endpoint_id(ep->slot);
  ep->counters = lupin__shared_endpoint_counters(ep->slot);
  ep->port = d->port;
  if (old) {
    ep->load = old->load;
    detach(rt, i);
  }
  return attach(rt, ep, d, err, errlen);
}

int lupin_endpoint_remove(lupin_runtime *rt, const char *name) {
  size_t i;
  if (!find(rt, name, &i)) return -1;
  return detach(rt, i);
}

static int same(const char *a, const char *b) { return strcmp(a ? a : "", b ? b : "") == 0; }

static int set_adapters(lupin_runtime *rt, lupin_endpoint *ep, const lupin_metrics *m) {
  if (same(ep->running_lora, m->running_lora_adapters) &&
      same(ep->waiting_lora, m->waiting_lora_adapters))
    return 0;
  free(ep->running_lora);
  free(ep->waiting_lora);
  ep->running_lora = strdup(m->running_lora_adapters ? m->running_lora_adapters : "");
  ep->waiting_lora = strdup(m->waiting_lora_adapters ? m->waiting_lora_adapters : "");
  lupin__push_hook(rt, LUPIN_HOOK_ENDPOINT_ADAPTERS);
  lua_pushnumber(rt->L, ep->id);
  lua_pushstring(rt->L, ep->running_lora);
  lua_pushstring(rt->L, ep->waiting_lora);
  return lupin__call(rt, 3, 0, NULL, 0);
}

int lupin_endpoint_set_metrics(lupin_runtime *rt, const char *name, const lupin_metrics *m) {
  lupin_endpoint *ep = find(rt, name, NULL);
  if (!ep) return -1;
  ep->load = (lupin_load){m->waiting_queue_size,
                          m->running_requests,
                          m->kv_cache_usage,
                          m->max_lora,
                          m->cache_block_size,
                          m->num_blocks,
                          m->scraped_at > 0 ? m->scraped_at : lupin_now()};
  int rc = set_adapters(rt, ep, m);
  lupin__flow_pump(rt, 0); /* fresh metrics may open the gate */
  return rc;
}

int lupin_endpoint_set_healthy(lupin_runtime *rt, const char *name, int healthy) {
  lupin_endpoint *ep = find(rt, name, NULL);
  if (!ep) return -1;
  lupin__push_hook(rt, LUPIN_HOOK_ENDPOINT_HEALTH);
  lua_pushnumber(rt->L, ep->id);
  lua_pushboolean(rt->L, healthy);
  return lupin__call(rt, 2, 0, NULL, 0);
}
