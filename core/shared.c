/* State shared by the runtimes of one process (lupin.h, docs/workers.md).
 *
 * Endpoint identities: the registry maps (name, address, port) to a slot
 * holding the endpoint's id and its in-flight counters.  Every runtime's
 * object for that endpoint points at the one slot, so ids agree across
 * runtimes and the counters add up the whole process.  Slots are allocated
 * one by one and never move: a runtime reads and updates the counters
 * through a plain pointer, without the lock. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct lupin_endpoint_slot {
  lupin_counters counters; /* updated with __atomic builtins, lock-free */
  /* the rest under the registry's lock */
  uint32_t id;
  uint32_t refs; /* endpoint objects of every runtime pointing here */
  uint64_t hash;
  char *name, *address;
  int port;
  lupin_endpoint_slot *next; /* in its bucket */
};

/* Most shards of a keyed prefix index: 2 per thread, a power of two.  One
 * thread gets 1: its path stays one lock and one index (grouping a prompt's
 * hashes by shard costs a few µs a request). */
#define MAX_PREFIX_SHARDS 8

static unsigned shards_for(unsigned threads) {
  unsigned n = 1;
  while (threads > 1 && n < 2 * threads && n < MAX_PREFIX_SHARDS)
    n *= 2;
  return n;
}

struct lupin_shared {
  pthread_mutex_t lock;

  /* --- endpoint identities and in-flight counters (this file) --- */
  lupin_endpoint_slot **buckets; /* chains by hash; NULL until the first */
  size_t n_buckets, n_slots;
  uint32_t last_id; /* ids are never reused: a prefix index keys by them */

  /* --- prefix indexes and plugins' shared dicts --- */
  lupin_shared_store store; /* prefix indexes and dicts (prefix_shared.c, shared_dict.c) */
};

lupin_shared *lupin_shared_new(unsigned threads, char *err, size_t errlen) {
  lupin_shared *s = calloc(1, sizeof *s);
  if (!s) {
    lupin__errf(err, errlen, "out of memory");
    return NULL;
  }
  if (!(s->store.tokens = lupin__tokens_new())) {
    free(s);
    lupin__errf(err, errlen, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->store.lock, NULL);
  s->store.prefix_shards = shards_for(threads);
  return s;
}

static void slot_free(lupin_endpoint_slot *e) {
  free(e->name);
  free(e->address);
  free(e);
}

void lupin_shared_free(lupin_shared *s) {
  if (!s) return;
  /* every runtime is gone, so every slot was unreferenced: this frees
   * what a host that broke the contract left */
  for (size_t i = 0; i < s->n_buckets; i++) {
    for (lupin_endpoint_slot *e = s->buckets[i], *next; e; e = next) {
      next = e->next;
      slot_free(e);
    }
  }
  free(s->buckets);
  lupin__prefix_shared_free_all(&s->store);
  lupin__dict_free_all(&s->store);
  lupin__latency_free_all(&s->store);
  lupin__tokens_free(s->store.tokens);
  pthread_mutex_destroy(&s->store.lock);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

/* --- endpoint identities ---------------------------------------------------- */

static uint64_t key_hash(const char *name, const char *address, int port) {
  /* chained through the seeds; the NULs keep "a"+"bc" apart from "ab"+"c" */
  uint64_t h = XXH64(name, strlen(name) + 1, 0);
  h = XXH64(address, strlen(address) + 1, h);
  return XXH64(&port, sizeof port, h);
}

/* Doubles the buckets when the chains average more than one slot; without
 * memory for it the chains just grow longer.  Under the lock. */
static void grow(lupin_shared *s) {
  if (s->n_slots < s->n_buckets) return;
  size_t n = s->n_buckets ? s->n_buckets * 2 : 16;
  lupin_endpoint_slot **b = calloc(n, sizeof *b);
  if (!b) return;
  for (size_t i = 0; i < s->n_buckets; i++) {
    for (lupin_endpoint_slot *e = s->buckets[i], *next; e; e = next) {
      next = e->next;
      e->next = b[e->hash & (n - 1)];
      b[e->hash & (n - 1)] = e;
    }
  }
  free(s->buckets);
  s->buckets = b;
  s->n_buckets = n;
}

static lupin_endpoint_slot *slot_new(lupin_shared *s, uint64_t h, const char *name,
                                     const char *address, int port) {
  grow(s);
  if (!s->buckets) return NULL;
  lupin_endpoint_slot *e = calloc(1, sizeof *e);
  if (!e || !(e->name = strdup(name)) || !(e->address = strdup(address))) {
    if (e) slot_free(e);
    return NULL;
  }
  e->id = ++s->last_id;
  e->hash = h;
  e->port = port;
  lupin_endpoint_slot **b = &s->buckets[h & (s->n_buckets - 1)];
  e->next = *b;
  *b = e;
  s->n_slots++;
  return e;
}

lupin_endpoint_slot *lupin__shared_endpoint_ref(lupin_shared *s, const char *name,
                                                const char *address, int port) {
  uint64_t h = key_hash(name, address, port);
  pthread_mutex_lock(&s->lock);
  lupin_endpoint_slot *e = s->buckets ? s->buckets[h & (s->n_buckets - 1)] : NULL;
  while (e && !(e->hash == h && e->port == port && strcmp(e->name, name) == 0 &&
                strcmp(e->address, address) == 0))
    e = e->next;
  if (!e) e = slot_new(s, h, name, address, port);
  if (e) e->refs++;
  pthread_mutex_unlock(&s->lock);
  return e;
}

void lupin__shared_endpoint_unref(lupin_shared *s, lupin_endpoint_slot *e) {
  pthread_mutex_lock(&s->lock);
  if (--e->refs == 0) {
    lupin_endpoint_slot **p = &s->buckets[e->hash & (s->n_buckets - 1)];
    while (*p != e)
      p = &(*p)->next;
    *p = e->next;
    s->n_slots--;
    slot_free(e);
  }
  pthread_mutex_unlock(&s->lock);
}

uint32_t lupin__shared_endpoint_id(const lupin_endpoint_slot *e) { return e->id; }

/* A scan of every slot: only remote records ask, off the request path. */
uint32_t lupin__shared_endpoint_named(lupin_shared *s, const char *name) {
  uint32_t id = 0;
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->n_buckets; i++)
    for (lupin_endpoint_slot *e = s->buckets[i]; e; e = e->next)
      if (e->id > id && strcmp(e->name, name) == 0) id = e->id;
  pthread_mutex_unlock(&s->lock);
  return id;
}

lupin_counters *lupin__shared_endpoint_counters(lupin_endpoint_slot *e) { return &e->counters; }

size_t lupin__shared_endpoints(lupin_shared *s) {
  pthread_mutex_lock(&s->lock);
  size_t n = s->n_slots;
  pthread_mutex_unlock(&s->lock);
  return n;
}

void lupin__counters_add(lupin_counters *c, int64_t requests, int64_t tokens) {
  if (requests) __atomic_add_fetch(&c->in_flight, requests, __ATOMIC_RELAXED);
  if (tokens) __atomic_add_fetch(&c->in_flight_tokens, tokens, __ATOMIC_RELAXED);
}
/* --- keyed prefix indexes and shared dicts -------------------------------- */

lupin_shared_store *lupin__shared_store(lupin_shared *s) { return &s->store; }

const lupin_capi_shared lupin__capi_shared = {
    lupin_prefix_open,
    lupin_prefix_close,
    lupin_prefix_view_set_capacity,
    lupin_prefix_view_record,
    lupin_prefix_view_match,
    lupin_prefix_view_purge,
    lupin_prefix_view_count,
    lupin_prefix_view_holds,
    lupin_prefix_view_memory,
    lupin_dict_open,
    lupin_dict_get,
    lupin_dict_set,
    lupin_dict_incr,
    lupin_dict_count,
    lupin_dict_max,
    lupin__flow_add,
    lupin__flow_keep,
    lupin_token_seed,
    lupin_token_block_hashes,
    lupin__tokens_put,
    lupin__tokens_hashes,
    lupin__tokens_count,
    lupin__tokens_want,
    lupin_prefix_view_unsure,
    lupin_prefix_view_remove,
    lupin_prefix_view_match_runs,
    lupin__latency_open,
    lupin__latency_train,
    lupin__latency_predict,
    lupin__latency_observe,
    lupin__latency_stats,
};
