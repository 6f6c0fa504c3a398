/* Keyed prefix indexes: one index per key for all the runtimes of a process.
 *
 * lupin.prefix.index(capacity, key) opens the index of that key in the
 * runtime's lupin_shared: made on first use, counted by the views open on it
 * (one per plugin instance and runtime), freed at the last close.  So an
 * index outlives a reload (the new generation opens its key before the old
 * one closes) and every worker's instance of a plugin feeds the same index.
 *
 * Threads: an index is S shards by block hash, each a lupin_prefix_index
 * (prefix_index.c) under its own mutex with capacity/S per endpoint.  A
 * record takes the lock of each shard its hashes fall in once.  A match
 * collects, shard by shard under its lock, the holders of the shard's hashes
 * up to the first one nobody holds, then walks the prompt from the first
 * block over what it collected: the same answer as one index's walk, with no
 * two locks ever held at once.  With S = 1 (a runtime's private lupin_shared)
 * record and match are prefix_index.c's, under one uncontended lock. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SHARDS 64

typedef struct shard {
  _Alignas(64) pthread_mutex_t lock; /* a cache line each: no false sharing */
  lupin_prefix_index *x;
} shard;

/* An endpoint the index cannot vouch for until a time (lupin.h,
 * lupin_shared_prefix_unsure). */
typedef struct unsure {
  uint32_t id;
  double until;
} unsure;

struct lupin_prefix_shared {
  lupin_prefix_shared *next; /* the store's list */
  char *key;
  size_t refs; /* views open on it, under the store's lock */
  unsigned n_shards, shift;
  shard *shards;
  pthread_mutex_t unsure_lock;
  unsure *unsure; /* under unsure_lock; n_unsure read without it first */
  size_t n_unsure, cap_unsure;
};

/* One runtime's handle, with the scratch of its sharded calls (a runtime is
 * single-threaded, so is its view). */
struct lupin_prefix_view {
  lupin_runtime *rt;
  lupin_prefix_shared *ix;
  size_t cap_pos;        /* room in the per-position arrays */
  uint32_t *order;       /* positions grouped by shard, in order within one */
  uint32_t *start, *len; /* a position's holders in `holders` */
  uint64_t *group;       /* one shard's hashes (record) */
  uint32_t *holders;
  size_t cap_holders;
  uint32_t *found, *fcount; /* a match's endpoints and counts, as found */
  uint32_t *map;            /* endpoint id -> found index + 1, open addressing */
  size_t map_mask;
};

/* --- shards ---------------------------------------------------------------- */

static unsigned shard_of(const lupin_prefix_shared *ix, uint64_t hash) {
  return ix->n_shards == 1 ? 0 : (unsigned)(hash >> ix->shift);
}

/* Shard i's share of a per-endpoint capacity: the shares add up to it. */
static uint32_t share(const lupin_prefix_shared *ix, unsigned i, uint32_t capacity) {
  return capacity / ix->n_shards + (i < capacity % ix->n_shards);
}

static lupin_prefix_shared *index_new(const char *key, uint32_t capacity, unsigned n_shards) {
  lupin_prefix_shared *ix = calloc(1, sizeof *ix);
  if (!ix) return NULL;
  unsigned bits = 0;
  while ((1u << bits) < n_shards && bits < 6)
    bits++;
  ix->n_shards = 1u << bits;
  ix->shift = 64 - bits;
  ix->key = strdup(key);
  ix->shards = aligned_alloc(_Alignof(shard), ix->n_shards * sizeof(shard));
  pthread_mutex_init(&ix->unsure_lock, NULL);
  if (!ix->key || !ix->shards) goto fail;
  for (unsigned i = 0; i < ix->n_shards; i++) {
    shard *s = &ix->shards[i];
    s->x = lupin_prefix_new(NULL, share(ix, i, capacity));
    pthread_mutex_init(&s->lock, NULL);
    if (!s->x) {
      ix->n_shards = i + 1;
      goto fail;
    }
  }
  return ix;
fail:
  for (unsigned i = 0; ix->shards && i < ix->n_shards; i++) {
    lupin_prefix_free(ix->shards[i].x);
    pthread_mutex_destroy(&ix->shards[i].lock);
  }
  free(ix->shards);
  free(ix->key);
  pthread_mutex_destroy(&ix->unsure_lock);
  free(ix);
  return NULL;
}

static void index_free(lupin_prefix_shared *ix) {
  for (unsigned i = 0; i < ix->n_shards; i++) {
    lupin_prefix_free(ix->shards[i].x);
    pthread_mutex_destroy(&ix->shards[i].lock);
  }
  free(ix->shards);
  free(ix->key);
  pthread_mutex_destroy(&ix->unsure_lock);
  free(ix->unsure);
  free(ix);
}

static void index_purge(lupin_prefix_shared *ix, uint32_t id) {
  for (unsigned i = 0; i < ix->n_shards; i++) {
    pthread_mutex_lock(&ix->shards[i].lock);
    lupin_prefix_purge(ix->shards[i].x, id);
    pthread_mutex_unlock(&ix->shards[i].lock);
  }
}

/* --- the store ---------------------------------------------------------------- */

lupin_prefix_view *lupin_prefix_open(lupin_runtime *rt, const char *key, uint32_t capacity) {
  if (!rt || !rt->shared || !key) return NULL;
  lupin_shared_store *st = lupin__shared_store(rt->shared);
  lupin_prefix_view *v = calloc(1, sizeof *v);
  if (!v) return NULL;
  pthread_mutex_lock(&st->lock);
  lupin_prefix_shared *ix = st->prefix;
  while (ix && strcmp(ix->key, key) != 0)
    ix = ix->next;
  if (!ix && (ix = index_new(key, capacity, st->prefix_shards))) {
    ix->next = st->prefix;
    st->prefix = ix;
  }
  if (ix) ix->refs++;
  pthread_mutex_unlock(&st->lock);
  if (!ix) {
    free(v);
    return NULL;
  }
  v->rt = rt;
  v->ix = ix;
  return v;
}

void lupin_prefix_close(lupin_prefix_view *v) {
  if (!v) return;
  lupin_shared_store *st = lupin__shared_store(v->rt->shared);
  pthread_mutex_lock(&st->lock);
  if (--v->ix->refs == 0) {
    lupin_prefix_shared **p = &st->prefix;
    while (*p != v->ix)
      p = &(*p)->next;
    *p = v->ix->next;
    index_free(v->ix);
  }
  pthread_mutex_unlock(&st->lock);
  free(v->order);
  free(v->start);
  free(v->len);
  free(v->group);
  free(v->holders);
  free(v->found);
  free(v->fcount);
  free(v->map);
  free(v);
}

void lupin__prefix_shared_purge_all(lupin_shared_store *st, uint32_t id) {
  pthread_mutex_lock(&st->lock);
  for (lupin_prefix_shared *ix = st->prefix; ix; ix = ix->next)
    index_purge(ix, id);
  pthread_mutex_unlock(&st->lock);
}

/* Only indexes whose views were never closed are left: a host that freed
 * its runtimes first leaves none. */
void lupin__prefix_shared_free_all(lupin_shared_store *st) {
  while (st->prefix) {
    lupin_prefix_shared *ix = st->prefix;
    st->prefix = ix->next;
    index_free(ix);
  }
}

/* --- scratch ---------------------------------------------------------------- */

static int grow(void *pp, size_t n, size_t size) {
  void *q = realloc(*(void **)pp, n * size);
  if (!q) return -1;
  *(void **)pp = q;
  return 0;
}

static int room_for_positions(lupin_prefix_view *v, size_t n) {
  if (n <= v->cap_pos) return 0;
  size_t cap = n < 64 ? 64 : n;
  if (grow(&v->order, cap, sizeof *v->order) || grow(&v->start, cap, sizeof *v->start) ||
      grow(&v->len, cap, sizeof *v->len) || grow(&v->group, cap, sizeof *v->group))
    return -1;
  v->cap_pos = cap;
  return 0;
}

/* Sorts positions 0..n-1 by shard into v->order (stable: in order within a
 * shard); off[s]..off[s+1] are shard s's. */
static int group_by_shard(lupin_prefix_view *v, const uint64_t *hashes, size_t n,
                          size_t off[MAX_SHARDS + 1]) {
  if (room_for_positions(v, n)) return -1;
  const lupin_prefix_shared *ix = v->ix;
  size_t next[MAX_SHARDS];
  memset(off, 0, (ix->n_shards + 1) * sizeof *off);
  for (size_t i = 0; i < n; i++)
    off[shard_of(ix, hashes[i]) + 1]++;
  for (unsigned s = 0; s < ix->n_shards; s++) {
    off[s + 1] += off[s];
    next[s] = off[s];
  }
  for (size_t i = 0; i < n; i++)
    v->order[next[shard_of(ix, hashes[i])]++] = (uint32_t)i;
  return 0;
}

/* Whether the runtime's pool holds endpoint id (as prefix_index.c's in_pool:
 * a request may end on an endpoint removed since, whose entries nothing
 * would purge). */
static const lupin_endpoint *pool_endpoint(const lupin_runtime *rt, uint32_t id) {
  for (size_t i = 0; i < rt->n_endpoints; i++)
    if (rt->endpoints[i]->id == id) return rt->endpoints[i];
  return NULL;
}

static int in_pool(const lupin_runtime *rt, uint32_t id) { return pool_endpoint(rt, id) != NULL; }

/* --- the view's calls ------------------------------------------------------- */

int lupin_prefix_view_set_capacity(lupin_prefix_view *v, uint32_t id, uint32_t capacity) {
  if (!v) return -1;
  if (!in_pool(v->rt, id)) return 0;
  int rc = 0;
  for (unsigned i = 0; i < v->ix->n_shards; i++) {
    shard *s = &v->ix->shards[i];
    pthread_mutex_lock(&s->lock);
    rc |= lupin_prefix_set_capacity(s->x, id, share(v->ix, i, capacity));
    pthread_mutex_unlock(&s->lock);
  }
  return rc ? -1 : 0;
}

static int record_in(lupin_prefix_view *v, unsigned i, uint32_t id, const uint64_t *hashes,
                     size_t n, uint32_t capacity) {
  shard *s = &v->ix->shards[i];
  pthread_mutex_lock(&s->lock);
  int rc = capacity ? lupin_prefix_set_capacity(s->x, id, share(v->ix, i, capacity)) : 0;
  if (rc == 0) rc = lupin_prefix_record(s->x, id, hashes, n);
  pthread_mutex_unlock(&s->lock);
  return rc;
}

static int remove_in(lupin_prefix_view *v, unsigned i, uint32_t id, const uint64_t *hashes,
                     size_t n, uint32_t capacity) {
  (void)capacity;
  shard *s = &v->ix->shards[i];
  pthread_mutex_lock(&s->lock);
  lupin_prefix_remove(s->x, id, hashes, n);
  pthread_mutex_unlock(&s->lock);
  return 0;
}

typedef int (*shard_op)(lupin_prefix_view *v, unsigned i, uint32_t id, const uint64_t *hashes,
                        size_t n, uint32_t capacity);

/* op over each shard's share of hashes, one lock at a time. */
static int each_shard(lupin_prefix_view *v, shard_op op, uint32_t id, const uint64_t *hashes,
                      size_t n, uint32_t capacity) {
  if (v->ix->n_shards == 1) return op(v, 0, id, hashes, n, capacity);
  size_t off[MAX_SHARDS + 1];
  if (group_by_shard(v, hashes, n, off)) return -1;
  for (unsigned s = 0; s < v->ix->n_shards; s++) {
    size_t k = 0;
    for (size_t j = off[s]; j < off[s + 1]; j++)
      v->group[k++] = hashes[v->order[j]];
    if (k && op(v, s, id, v->group, k, capacity)) return -1;
  }
  return 0;
}

static int record_sharded(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n,
                          uint32_t capacity) {
  return each_shard(v, record_in, id, hashes, n, capacity);
}

int lupin_prefix_view_record(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n,
                             uint32_t capacity) {
  if (!v || (n && !hashes)) return -1;
  const lupin_endpoint *ep = n ? pool_endpoint(v->rt, id) : NULL;
  if (!ep) return 0;
  if (record_sharded(v, id, hashes, n, capacity)) return -1;
  lupin__prefix_sync_recorded(lupin__shared_store(v->rt->shared), v->ix->key, ep, hashes, n);
  return 0;
}

static lupin_prefix_shared *index_named(lupin_shared_store *st, const char *key) {
  lupin_prefix_shared *ix = st->prefix;
  while (ix && strcmp(ix->key, key) != 0)
    ix = ix->next;
  return ix;
}

/* A host's change (prefix_sync.c, and the engines' events): through a view
 * of no runtime, so on any thread and with its own scratch; the store's
 * lock keeps the index alive meanwhile.  hashes NULL: purge id. */
static int apply_named(lupin_shared_store *st, const char *key, shard_op op, uint32_t id,
                       const uint64_t *hashes, size_t n) {
  pthread_mutex_lock(&st->lock);
  lupin_prefix_shared *ix = index_named(st, key);
  int rc = 0;
  if (ix && !hashes) {
    index_purge(ix, id);
    rc = 1;
  } else if (ix) {
    lupin_prefix_view v = {.ix = ix};
    rc = each_shard(&v, op, id, hashes, n, 0) ? -1 : 1;
    free(v.order);
    free(v.start);
    free(v.len);
    free(v.group);
  }
  pthread_mutex_unlock(&st->lock);
  return rc;
}

int lupin__prefix_shared_record(lupin_shared_store *st, const char *key, uint32_t id,
                                const uint64_t *hashes, size_t n) {
  return apply_named(st, key, record_in, id, hashes, n);
}

/* Removals and purges come from the engines' events (lupin.h): the blocks an
 * engine evicted, the cache it cleared.  Like lupin_shared_prefix_apply, by
 * the endpoint's name and with no hook (no replica hears of them: each
 * replica hears the engines itself). */
int lupin_shared_prefix_remove(lupin_shared *s, const char *key, const char *endpoint,
                               const uint64_t *hashes, size_t n) {
  if (!s || !key || !endpoint || (n && !hashes)) return -1;
  uint32_t id = lupin__shared_endpoint_named(s, endpoint);
  if (!id) return 0;
  static const uint64_t none[1];
  return apply_named(lupin__shared_store(s), key, remove_in, id, n ? hashes : none, n);
}

/* Marks id unsure until `until` (0: sure again), dropping marks past. */
static int mark_unsure(lupin_prefix_shared *ix, uint32_t id, double until, double now) {
  pthread_mutex_lock(&ix->unsure_lock);
  size_t kept = 0;
  for (size_t i = 0; i < ix->n_unsure; i++)
    if (ix->unsure[i].id != id && ix->unsure[i].until > now) ix->unsure[kept++] = ix->unsure[i];
  int rc = 0;
  if (until > now && kept == ix->cap_unsure) {
    size_t cap = kept ? kept * 2 : 8;
    unsure *u = realloc(ix->unsure, cap * sizeof *u);
    if (u) {
      ix->unsure = u;
      ix->cap_unsure = cap;
    } else {
      rc = -1;
    }
  }
  if (until > now && !rc) ix->unsure[kept++] = (unsure){id, until};
  __atomic_store_n(&ix->n_unsure, kept, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&ix->unsure_lock);
  return rc;
}

int lupin_shared_prefix_unsure(lupin_shared *s, const char *key, const char *endpoint,
                               double seconds) {
  if (!s || !key || !endpoint || !(seconds >= 0)) return -1;
  uint32_t id = lupin__shared_endpoint_named(s, endpoint);
  if (!id) return 0;
  lupin_shared_store *st = lupin__shared_store(s);
  pthread_mutex_lock(&st->lock);
  lupin_prefix_shared *ix = index_named(st, key);
  double now = lupin_now();
  int rc = ix ? (mark_unsure(ix, id, seconds > 0 ? now + seconds : 0, now) ? -1 : 1) : 0;
  pthread_mutex_unlock(&st->lock);
  return rc;
}

int lupin_prefix_view_unsure(lupin_prefix_view *v, uint32_t id) {
  lupin_prefix_shared *ix = v ? v->ix : NULL;
  /* mostly none: no lock on a request's path */
  if (!ix || !__atomic_load_n(&ix->n_unsure, __ATOMIC_ACQUIRE)) return 0;
  int found = 0;
  double now = lupin_now();
  pthread_mutex_lock(&ix->unsure_lock);
  for (size_t i = 0; i < ix->n_unsure && !found; i++)
    found = ix->unsure[i].id == id && ix->unsure[i].until > now;
  pthread_mutex_unlock(&ix->unsure_lock);
  return found;
}

int lupin_prefix_view_remove(lupin_prefix_view *v, uint32_t id, const uint64_t *hashes, size_t n) {
  if (!v || (n && !hashes)) return -1;
  return n ? each_shard(v, remove_in, id, hashes, n, 0) : 0;
}

int lupin_shared_prefix_purge(lupin_shared *s, const char *key, const char *endpoint) {
  if (!s || !key || !endpoint) return -1;
  uint32_t id = lupin__shared_endpoint_named(s, endpoint);
  if (!id) return 0;
  return apply_named(lupin__shared_store(s), key, NULL, id, NULL, 0);
}

/* A match's endpoints are counted in found/fcount.  Most matches find a
 * few endpoints, and a scan of those beats hashing each holder; past
 * SCAN_FOUND the view's map (endpoint id -> found index + 1, open
 * addressing) takes over for the rest of that match. */
#define SCAN_FOUND 8

static void map_insert(lupin_prefix_view *v, size_t f) {
  size_t i = (v->found[f] * 0x9E3779B1u) & v->map_mask;
  while (v->map[i])
    i = (i + 1) & v->map_mask;
  v->map[i] = (uint32_t)f + 1;
}

/* Room in the map for one more than n found, holding the n. */
static int map_room(lupin_prefix_view *v, size_t n) {
  if (v->map && (n + 1) * 2 <= v->map_mask + 1) return 0;
  size_t cap = v->map ? (v->map_mask + 1) * 2 : 64;
  uint32_t *m = calloc(cap, sizeof *m);
  if (!m || grow(&v->found, cap / 2, sizeof *v->found) ||
      grow(&v->fcount, cap / 2, sizeof *v->fcount)) {
    free(m);
    return -1;
  }
  free(v->map);
  v->map = m;
  v->map_mask = cap - 1;
  for (size_t f = 0; f < n; f++)
    map_insert(v, f);
  return 0;
}

/* The found-index + 1 of endpoint id in the match being counted, adding it
 * when new; 0: out of memory.  *mapped: whether the map holds them yet. */
static uint32_t found_slot(lupin_prefix_view *v, uint32_t id, size_t *n_found, int *mapped) {
  size_t n = *n_found;
  if (!*mapped) {
    for (size_t f = 0; f < n; f++)
      if (v->found[f] == id) return (uint32_t)f + 1;
    if (n < SCAN_FOUND) { /* map_room(v, 0) at the match's start made room */
      v->found[n] = id;
      v->fcount[n] = 0;
      return (uint32_t)++ * n_found;
    }
    for (size_t f = 0; f < n; f++)
      map_insert(v, f);
    *mapped = 1;
  }
  if (map_room(v, n)) return 0;
  size_t i = (id * 0x9E3779B1u) & v->map_mask;
  for (; v->map[i]; i = (i + 1) & v->map_mask)
    if (v->found[v->map[i] - 1] == id) return v->map[i];
  v->found[n] = id;
  v->fcount[n] = 0;
  v->map[i] = (uint32_t)++ * n_found;
  return v->map[i];
}

/* Shard s's part of a match: the holders of its hashes before *stop, until
 * one nobody holds, which lowers *stop. */
static int collect(lupin_prefix_view *v, unsigned s, const uint64_t *hashes, const size_t *off,
                   size_t *stop, size_t *used) {
  shard *sh = &v->ix->shards[s];
  int rc = 0;
  pthread_mutex_lock(&sh->lock);
  for (size_t j = off[s]; j < off[s + 1]; j++) {
    uint32_t i = v->order[j];
    if (i >= *stop) break;
    size_t k;
    while ((k = lupin_prefix_holders(sh->x, hashes[i], v->holders + *used,
                                     v->cap_holders - *used)) > v->cap_holders - *used) {
      size_t cap = (*used + k) * 2;
      if (grow(&v->holders, cap, sizeof *v->holders)) {
        rc = -1;
        goto out;
      }
      v->cap_holders = cap;
    }
    if (k == 0) {
      *stop = i;
      break;
    }
    v->start[i] = (uint32_t)*used;
    v->len[i] = (uint32_t)k;
    *used += k;
  }
out:
  pthread_mutex_unlock(&sh->lock);
  return rc;
}

/* Whether positions i and j have the same holders, in the same order: a
 * prompt's blocks mostly do (one endpoint holds a run of them), so the
 * match counts a run of such blocks at once. */
static int same_holders(const lupin_prefix_view *v, size_t i, size_t j) {
  return v->len[i] == v->len[j] && memcmp(v->holders + v->start[i], v->holders + v->start[j],
                                          v->len[i] * sizeof *v->holders) == 0;
}

static long view_match(lupin_prefix_view *v, const uint64_t *hashes, size_t n, uint32_t *ids,
                       uint32_t *counts, size_t cap, int runs) {
  if (!v || (n && !hashes) || (cap && (!ids || !counts))) return -1;
  lupin_prefix_shared *ix = v->ix;
  if (ix->n_shards == 1) {
    shard *s = &ix->shards[0];
    pthread_mutex_lock(&s->lock);
    size_t need = lupin_prefix_endpoints(s->x);
    long k = need > cap ? (long)need
             : runs     ? lupin_prefix_match_runs(s->x, hashes, n, ids, counts, cap)
                        : lupin_prefix_match(s->x, hashes, n, ids, counts, cap);
    pthread_mutex_unlock(&s->lock);
    return k;
  }
  size_t off[MAX_SHARDS + 1], stop = n, used = 0, n_found = 0;
  int mapped = 0;
  if (map_room(v, 0) || group_by_shard(v, hashes, n, off)) return -1;
  for (unsigned s = 0; s < ix->n_shards; s++)
    if (off[s] < off[s + 1] && collect(v, s, hashes, off, &stop, &used)) return -1;
  long rc = 0;
  for (size_t i = 0, j; i < stop && rc == 0; i = j) {
    for (j = i + 1; j < stop && same_holders(v, i, j); j++) {
    }
    for (uint32_t h = v->start[i]; h < v->start[i] + v->len[i]; h++) {
      uint32_t f = found_slot(v, v->holders[h], &n_found, &mapped);
      if (!f) {
        rc = -1;
        break;
      }
      if (!runs || v->fcount[f - 1] == i) v->fcount[f - 1] += (uint32_t)(j - i);
    }
  }
  for (size_t f = 0; f < n_found; f++) {
    if (f < cap) {
      ids[f] = v->found[f];
      counts[f] = v->fcount[f];
    }
  }
  if (mapped) memset(v->map, 0, (v->map_mask + 1) * sizeof *v->map);
  return rc ? rc : (long)n_found;
}

long lupin_prefix_view_match(lupin_prefix_view *v, const uint64_t *hashes, size_t n, uint32_t *ids,
                             uint32_t *counts, size_t cap) {
  return view_match(v, hashes, n, ids, counts, cap, 0);
}

long lupin_prefix_view_match_runs(lupin_prefix_view *v, const uint64_t *hashes, size_t n,
                                  uint32_t *ids, uint32_t *counts, size_t cap) {
  return view_match(v, hashes, n, ids, counts, cap, 1);
}

void lupin_prefix_view_purge(lupin_prefix_view *v, uint32_t id) {
  if (v) index_purge(v->ix, id);
}

size_t lupin_prefix_view_count(lupin_prefix_view *v, uint32_t id) {
  size_t total = 0;
  for (unsigned i = 0; v && i < v->ix->n_shards; i++) {
    pthread_mutex_lock(&v->ix->shards[i].lock);
    total += lupin_prefix_count(v->ix->shards[i].x, id);
    pthread_mutex_unlock(&v->ix->shards[i].lock);
  }
  return total;
}

int lupin_prefix_view_holds(lupin_prefix_view *v, uint32_t id, uint64_t hash) {
  if (!v) return 0;
  shard *s = &v->ix->shards[shard_of(v->ix, hash)];
  pthread_mutex_lock(&s->lock);
  int held = lupin_prefix_holds(s->x, id, hash);
  pthread_mutex_unlock(&s->lock);
  return held;
}

size_t lupin_prefix_view_memory(lupin_prefix_view *v) {
  if (!v) return 0;
  size_t total = sizeof *v->ix + v->ix->n_shards * sizeof(shard);
  for (unsigned i = 0; i < v->ix->n_shards; i++) {
    pthread_mutex_lock(&v->ix->shards[i].lock);
    total += lupin_prefix_memory(v->ix->shards[i].x);
    pthread_mutex_unlock(&v->ix->shards[i].lock);
  }
  return total;
}
