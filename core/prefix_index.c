/* The prefix index: which endpoint has probably cached which prompt blocks.
 *
 * Per endpoint, an LRU of block hashes with a capacity (its KV-cache size in
 * blocks, when known); across endpoints, a reverse map hash -> the endpoints
 * holding it, kept exact on every insert, eviction and purge, so a lookup
 * costs O(matched blocks x holders) and never scans an endpoint's entries.
 *
 * Storage: one node per (endpoint, hash) in a growable array, linked twice:
 * into its endpoint's LRU list and into the chain of nodes sharing its hash.
 * Three open-addressing tables (linear probing, backward-shift deletion, no
 * tombstones) find things: (endpoint, hash) -> node, hash -> first node of its
 * chain, endpoint id -> endpoint slot.  Memory is bounded by the sum of the
 * capacities (nodes) and a constant factor (tables grow at 70% load). */
#define _DEFAULT_SOURCE /* madvise and MADV_HUGEPAGE; _POSIX_C_SOURCE alone hides them */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NIL    0u /* node and slot index 0 is never used: 0 means "none" */
#define GOLDEN 0x9E3779B97F4A7C15ull

typedef struct slot {
  uint64_t key;
  uint32_t ep;  /* endpoint slot for the pair table, 0 for the others */
  uint32_t val; /* node index or endpoint slot + 1; NIL: empty */
} slot;

typedef struct table {
  slot *s;
  size_t mask, count;
} table;

typedef struct node {
  uint64_t hash;
  uint32_t ep;           /* endpoint slot */
  uint32_t prev, next;   /* the endpoint's LRU, most recent first */
  uint32_t rprev, rnext; /* the chain of nodes with this hash */
} node;

typedef struct endpoint {
  uint32_t id;
  uint32_t capacity, count;
  uint32_t head, tail; /* LRU ends */
  uint32_t stamp, out; /* the lookup that last counted it, and where */
} endpoint;

struct lupin_prefix_index {
  lupin_runtime *rt;
  lupin_prefix_index *prev_index, *next_index; /* the runtime's list */
  uint32_t default_capacity;
  node *nodes;
  uint32_t n_nodes, cap_nodes, free_nodes;
  endpoint *eps;
  uint32_t n_eps, cap_eps, free_eps;
  table pairs, hashes, ids;
  uint32_t epoch;
};

/* --- memory -------------------------------------------------------------- */

/* The tables and the node array grow to tens of MB and are accessed at random:
 * with 4 KB pages nearly every access also misses the TLB (a long page walk in
 * a VM), and filling them faults in one page per 4 KB.  From HUGE bytes on they
 * come straight from mmap, aligned to and advised for transparent huge pages;
 * smaller ones from malloc.  Which one is told by the size alone. */
#define HUGE ((size_t)2 << 20)

/* Zeroed bytes. */
static void *mem_alloc(size_t bytes) {
  if (bytes < HUGE) return calloc(1, bytes);
  /* Over-map by HUGE and trim both ends, so the block starts on a huge page. */
  char *p = mmap(NULL, bytes + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  size_t head = (HUGE - (uintptr_t)p % HUGE) % HUGE;
  if (head) munmap(p, head);
  munmap(p + head + bytes, HUGE - head);
#ifdef MADV_HUGEPAGE
  madvise(p + head, bytes, MADV_HUGEPAGE); /* a hint: without it, small pages */
#endif
  return p + head;
}

static void mem_free(void *p, size_t bytes) {
  if (!p) return;
  if (bytes < HUGE)
    free(p);
  else
    munmap(p, bytes);
}

/* Like realloc, the new bytes past the old ones not zeroed. */
static void *mem_resize(void *p, size_t old_bytes, size_t bytes) {
  if (bytes < HUGE) return realloc(p, bytes);
  void *q = mem_alloc(bytes);
  if (!q) return NULL;
  if (p) memcpy(q, p, old_bytes);
  mem_free(p, old_bytes);
  return q;
}

/* --- tables -------------------------------------------------------------- */

static size_t home(const table *t, uint64_t key, uint32_t ep) {
  uint64_t k = key ^ (ep * GOLDEN);
  return (size_t)(k ^ (k >> 29)) & t->mask;
}

static slot *tab_find(const table *t, uint64_t key, uint32_t ep) {
  if (!t->s) return NULL;
  for (size_t i = home(t, key, ep);; i = (i + 1) & t->mask) {
    slot *s = &t->s[i];
    if (s->val == NIL) return NULL;
    if (s->key == key && s->ep == ep) return s;
  }
}

static void tab_place(table *t, slot v) {
  size_t i = home(t, v.key, v.ep);
  while (t->s[i].val != NIL)
    i = (i + 1) & t->mask;
  t->s[i] = v;
}

static int tab_grow(table *t) {
  size_t old_cap = t->s ? t->mask + 1 : 0;
  size_t cap = old_cap ? old_cap * 2 : 64;
  slot *old = t->s, *s = mem_alloc(cap * sizeof *s);
  if (!s) return -1;
  t->s = s;
  t->mask = cap - 1;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i].val != NIL) tab_place(t, old[i]);
  mem_free(old, old_cap * sizeof *old);
  return 0;
}

static int tab_put(table *t, uint64_t key, uint32_t ep, uint32_t val) {
  if (!t->s || (t->count + 1) * 10 > (t->mask + 1) * 7) {
    if (tab_grow(t)) return -1;
  }
  tab_place(t, (slot){key, ep, val});
  t->count++;
  return 0;
}

/* Backward-shift deletion: later entries of the probe run move into the hole
 * unless their home lies cyclically after it. */
static void tab_del(table *t, slot *s) {
  size_t hole = (size_t)(s - t->s);
  for (size_t i = (hole + 1) & t->mask; t->s[i].val != NIL; i = (i + 1) & t->mask) {
    size_t h = home(t, t->s[i].key, t->s[i].ep);
    if (((i - h) & t->mask) >= ((i - hole) & t->mask)) {
      t->s[hole] = t->s[i];
      hole = i;
    }
  }
  t->s[hole].val = NIL;
  t->count--;
}

static size_t tab_bytes(const table *t) { return t->s ? (t->mask + 1) * sizeof(slot) : 0; }

/* --- nodes: the LRU lists and the hash chains ----------------------------- */

static uint32_t node_alloc(lupin_prefix_index *x) {
  if (x->free_nodes != NIL) {
    uint32_t n = x->free_nodes;
    x->free_nodes = x->nodes[n].next;
    return n;
  }
  if (x->n_nodes + 1 >= x->cap_nodes) {
    if (x->cap_nodes >= UINT32_MAX / 2) return NIL; /* indexes are 32-bit */
    uint32_t cap = x->cap_nodes ? x->cap_nodes * 2 : 256;
    node *a = mem_resize(x->nodes, (size_t)x->cap_nodes * sizeof *a, (size_t)cap * sizeof *a);
    if (!a) return NIL;
    x->nodes = a;
    x->cap_nodes = cap;
  }
  return ++x->n_nodes;
}

static void lru_unlink(lupin_prefix_index *x, endpoint *e, uint32_t n) {
  node *d = &x->nodes[n];
  if (d->prev)
    x->nodes[d->prev].next = d->next;
  else
    e->head = d->next;
  if (d->next)
    x->nodes[d->next].prev = d->prev;
  else
    e->tail = d->prev;
}

static void lru_push_front(lupin_prefix_index *x, endpoint *e, uint32_t n) {
  node *d = &x->nodes[n];
  d->prev = NIL;
  d->next = e->head;
  if (e->head)
    x->nodes[e->head].prev = n;
  else
    e->tail = n;
  e->head = n;
}

static int chain_link(lupin_prefix_index *x, uint32_t n) {
  node *d = &x->nodes[n];
  slot *s = tab_find(&x->hashes, d->hash, 0);
  d->rprev = NIL;
  d->rnext = s ? s->val : NIL;
  if (!s) return tab_put(&x->hashes, d->hash, 0, n);
  x->nodes[s->val].rprev = n;
  s->val = n;
  return 0;
}

static void chain_unlink(lupin_prefix_index *x, uint32_t n) {
  node *d = &x->nodes[n];
  if (d->rnext) x->nodes[d->rnext].rprev = d->rprev;
  if (d->rprev) {
    x->nodes[d->rprev].rnext = d->rnext;
    return;
  }
  slot *s = tab_find(&x->hashes, d->hash, 0);
  if (d->rnext)
    s->val = d->rnext;
  else
    tab_del(&x->hashes, s);
}

/* Drops one (endpoint, hash) entry from every structure. */
static void node_remove(lupin_prefix_index *x, endpoint *e, uint32_t n) {
  uint32_t slot_of_e = (uint32_t)(e - x->eps);
  lru_unlink(x, e, n);
  chain_unlink(x, n);
  tab_del(&x->pairs, tab_find(&x->pairs, x->nodes[n].hash, slot_of_e));
  e->count--;
  x->nodes[n].next = x->free_nodes;
  x->free_nodes = n;
}

/* --- endpoints ------------------------------------------------------------ */

static endpoint *ep_get(const lupin_prefix_index *x, uint32_t id) {
  slot *s = tab_find(&x->ids, id * GOLDEN, 0);
  return s ? &x->eps[s->val] : NULL;
}

static uint32_t ep_slot_alloc(lupin_prefix_index *x) {
  if (x->free_eps != NIL) {
    uint32_t e = x->free_eps;
    x->free_eps = x->eps[e].head; /* a dead endpoint's head links the free list */
    return e;
  }
  if (x->n_eps + 1 >= x->cap_eps) {
    uint32_t cap = x->cap_eps ? x->cap_eps * 2 : 16;
    endpoint *a = realloc(x->eps, (size_t)cap * sizeof *a);
    if (!a) return NIL;
    x->eps = a;
    x->cap_eps = cap;
  }
  return ++x->n_eps;
}

static endpoint *ep_open(lupin_prefix_index *x, uint32_t id) {
  endpoint *e = ep_get(x, id);
  if (e) return e;
  uint32_t i = ep_slot_alloc(x);
  if (i == NIL) return NULL;
  if (tab_put(&x->ids, id * GOLDEN, 0, i)) {
    x->eps[i].head = x->free_eps;
    x->free_eps = i;
    return NULL;
  }
  e = &x->eps[i];
  *e = (endpoint){.id = id, .capacity = x->default_capacity};
  return e;
}

/* Whether the runtime's pool still holds endpoint id: a request may have been
 * scheduled onto an endpoint removed since, whose entries nothing would purge. */
static int in_pool(const lupin_prefix_index *x, uint32_t id) {
  if (!x->rt) return 1;
  for (size_t i = 0; i < x->rt->n_endpoints; i++)
    if (x->rt->endpoints[i]->id == id) return 1;
  return 0;
}

/* --- the API -------------------------------------------------------------- */

lupin_prefix_index *lupin_prefix_new(lupin_runtime *rt, uint32_t default_capacity) {
  lupin_prefix_index *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->rt = rt;
  x->default_capacity = default_capacity;
  if (rt) {
    x->next_index = rt->prefix_indexes;
    if (rt->prefix_indexes) rt->prefix_indexes->prev_index = x;
    rt->prefix_indexes = x;
  }
  return x;
}

void lupin_prefix_free(lupin_prefix_index *x) {
  if (!x) return;
  if (x->rt) {
    if (x->prev_index)
      x->prev_index->next_index = x->next_index;
    else
      x->rt->prefix_indexes = x->next_index;
    if (x->next_index) x->next_index->prev_index = x->prev_index;
  }
  mem_free(x->nodes, (size_t)x->cap_nodes * sizeof *x->nodes);
  free(x->eps);
  mem_free(x->pairs.s, tab_bytes(&x->pairs));
  mem_free(x->hashes.s, tab_bytes(&x->hashes));
  mem_free(x->ids.s, tab_bytes(&x->ids));
  free(x);
}

static void evict_to(lupin_prefix_index *x, endpoint *e, uint32_t capacity) {
  while (e->count > capacity)
    node_remove(x, e, e->tail);
}

int lupin_prefix_set_capacity(lupin_prefix_index *x, uint32_t id, uint32_t capacity) {
  if (!x) return -1;
  if (!in_pool(x, id)) return 0; /* nothing would ever purge its record */
  endpoint *e = ep_open(x, id);
  if (!e) return -1;
  e->capacity = capacity;
  evict_to(x, e, capacity);
  return 0;
}

/* --- prefetching ------------------------------------------------------------
 *
 * A record into full LRUs is a chain of cache misses into tables of tens of
 * MB: each block's pair and hash slots, and for each eviction the victim's
 * node, its chain neighbours and its slots.  The blocks of one record do not
 * depend on each other, and the victims are the LRU's tail walked backwards,
 * so both are known ahead: the loads are started a few blocks early and
 * overlap instead of following one another (docs/performance.md). */
#define PREFETCH_AHEAD 4 /* blocks between a block's slots and its insert */

/* GCC 12 deems a function whose only work is __builtin_prefetch free of
 * side effects and drops calls to it: on x86 the instruction is written out. */
#if defined(__x86_64__) || defined(__i386__)
#define PREFETCH(p) __asm__ volatile("prefetcht0 %0" : : "m"(*(const char *)(p)))
#else
#define PREFETCH(p) __builtin_prefetch(p)
#endif

static void prefetch_slot(const table *t, uint64_t key, uint32_t ep) {
  if (t->s) PREFETCH(&t->s[home(t, key, ep)]);
}

static void prefetch_block(const lupin_prefix_index *x, uint32_t es, uint64_t hash) {
  prefetch_slot(&x->pairs, hash, es);
  prefetch_slot(&x->hashes, hash, 0);
}

/* Half way: the block's pair slot arrived, so a block already held can
 * have its node fetched (a hit moves it; its LRU neighbours are mostly the
 * prompt's next and previous blocks, fetched by their own inserts). */
static void prefetch_held(const lupin_prefix_index *x, uint32_t es, uint64_t hash) {
  const slot *s = tab_find(&x->pairs, hash, es);
  if (s) PREFETCH(&x->nodes[s->val]);
}

/* Before evicting the tail: the next victim's node arrived (prefetched by
 * the eviction before), so its slots and chain neighbours can be fetched,
 * and the node after it. */
static void prefetch_victims(const lupin_prefix_index *x, const endpoint *e) {
  uint32_t next = x->nodes[e->tail].prev;
  if (next == NIL) return;
  const node *d = &x->nodes[next];
  prefetch_slot(&x->pairs, d->hash, d->ep);
  prefetch_slot(&x->hashes, d->hash, 0);
  if (d->rprev) PREFETCH(&x->nodes[d->rprev]);
  if (d->rnext) PREFETCH(&x->nodes[d->rnext]);
  if (d->prev) PREFETCH(&x->nodes[d->prev]);
}

/* One hash into one endpoint's LRU: a hit moves it to the front; a miss
 * evicts the least recent entry when full and inserts at the front. */
static int insert(lupin_prefix_index *x, endpoint *e, uint64_t hash) {
  uint32_t es = (uint32_t)(e - x->eps);
  slot *s = tab_find(&x->pairs, hash, es);
  if (s) {
    lru_unlink(x, e, s->val);
    lru_push_front(x, e, s->val);
    return 0;
  }
  if (e->capacity == 0) return 0;
  if (e->count >= e->capacity && e->tail) prefetch_victims(x, e);
  evict_to(x, e, e->capacity - 1);
  uint32_t n = node_alloc(x);
  if (n == NIL) return -1;
  x->nodes[n] = (node){.hash = hash, .ep = es};
  if (tab_put(&x->pairs, hash, es, n)) goto fail;
  if (chain_link(x, n)) {
    tab_del(&x->pairs, tab_find(&x->pairs, hash, es));
    goto fail;
  }
  lru_push_front(x, e, n);
  e->count++;
  return 0;
fail:
  x->nodes[n].next = x->free_nodes;
  x->free_nodes = n;
  return -1;
}

int lupin_prefix_record(lupin_prefix_index *x, uint32_t id, const uint64_t *hashes, size_t n) {
  if (!x || (n && !hashes)) return -1;
  if (n == 0 || !in_pool(x, id)) return 0;
  endpoint *e = ep_open(x, id);
  if (!e) return -1;
  /* Last block first, so the first block ends most recent: like vLLM, which
   * frees a request's blocks tail first, the end of a prompt is evicted
   * before its start, and a trimmed entry keeps a matchable prefix. */
  uint32_t es = (uint32_t)(e - x->eps);
  for (size_t i = n; i-- > 0;) {
    if (i >= PREFETCH_AHEAD) prefetch_block(x, es, hashes[i - PREFETCH_AHEAD]);
    if (i >= PREFETCH_AHEAD / 2) prefetch_held(x, es, hashes[i - PREFETCH_AHEAD / 2]);
    if (insert(x, e, hashes[i])) return -1;
  }
  return 0;
}

/* runs: an endpoint counts the blocks it holds from the first without a
 * gap (what an engine can reuse), not every block it holds before the
 * first block nobody holds (the EPP's approximate count). */
static long match(lupin_prefix_index *x, const uint64_t *hashes, size_t n, uint32_t *ids,
                  uint32_t *counts, size_t cap, int runs) {
  if (!x || (n && !hashes) || (cap && (!ids || !counts))) return -1;
  if (++x->epoch == 0) { /* wrapped: forget every stamp once */
    for (uint32_t i = 1; i <= x->n_eps; i++)
      x->eps[i].stamp = 0;
    x->epoch = 1;
  }
  size_t found = 0;
  for (size_t i = 0; i < n; i++) {
    if (i + PREFETCH_AHEAD < n) prefetch_slot(&x->hashes, hashes[i + PREFETCH_AHEAD], 0);
    slot *s = tab_find(&x->hashes, hashes[i], 0);
    if (!s) break; /* nobody holds block i, so nobody holds a longer prefix */
    for (uint32_t d = s->val; d != NIL; d = x->nodes[d].rnext) {
      endpoint *e = &x->eps[x->nodes[d].ep];
      if (e->stamp != x->epoch) {
        e->stamp = x->epoch;
        e->out = (uint32_t)found;
        if (found < cap) {
          ids[found] = e->id;
          counts[found] = 0;
        }
        found++;
      }
      if (e->out < cap && (!runs || counts[e->out] == i)) counts[e->out]++;
    }
  }
  return (long)(found < cap ? found : cap);
}

long lupin_prefix_match(lupin_prefix_index *x, const uint64_t *hashes, size_t n, uint32_t *ids,
                        uint32_t *counts, size_t cap) {
  return match(x, hashes, n, ids, counts, cap, 0);
}

long lupin_prefix_match_runs(lupin_prefix_index *x, const uint64_t *hashes, size_t n, uint32_t *ids,
                             uint32_t *counts, size_t cap) {
  return match(x, hashes, n, ids, counts, cap, 1);
}

void lupin_prefix_purge(lupin_prefix_index *x, uint32_t id) {
  endpoint *e = x ? ep_get(x, id) : NULL;
  if (!e) return;
  evict_to(x, e, 0);
  uint32_t i = (uint32_t)(e - x->eps);
  tab_del(&x->ids, tab_find(&x->ids, id * GOLDEN, 0));
  e->stamp = 0;
  e->head = x->free_eps;
  x->free_eps = i;
}

size_t lupin_prefix_remove(lupin_prefix_index *x, uint32_t id, const uint64_t *hashes, size_t n) {
  endpoint *e = x && hashes ? ep_get(x, id) : NULL;
  if (!e) return 0;
  uint32_t es = (uint32_t)(e - x->eps);
  size_t removed = 0;
  for (size_t i = 0; i < n; i++) {
    slot *s = tab_find(&x->pairs, hashes[i], es);
    if (s) {
      node_remove(x, e, s->val);
      removed++;
    }
  }
  return removed;
}

size_t lupin_prefix_count(const lupin_prefix_index *x, uint32_t id) {
  const endpoint *e = x ? ep_get(x, id) : NULL;
  return e ? e->count : 0;
}

int lupin_prefix_holds(const lupin_prefix_index *x, uint32_t id, uint64_t hash) {
  const endpoint *e = x ? ep_get(x, id) : NULL;
  return e && tab_find(&x->pairs, hash, (uint32_t)(e - x->eps)) != NULL;
}

size_t lupin_prefix_endpoints(const lupin_prefix_index *x) { return x ? x->ids.count : 0; }

size_t lupin_prefix_memory(const lupin_prefix_index *x) {
  if (!x) return 0;
  return sizeof *x + (size_t)x->cap_nodes * sizeof(node) + (size_t)x->cap_eps * sizeof(endpoint) +
         tab_bytes(&x->pairs) + tab_bytes(&x->hashes) + tab_bytes(&x->ids);
}

size_t lupin_prefix_holders(const lupin_prefix_index *x, uint64_t hash, uint32_t *ids, size_t cap) {
  slot *s = x ? tab_find(&x->hashes, hash, 0) : NULL;
  size_t k = 0;
  for (uint32_t d = s ? s->val : NIL; d != NIL; d = x->nodes[d].rnext, k++)
    if (k < cap) ids[k] = x->eps[x->nodes[d].ep].id;
  return k;
}

void lupin__prefix_purge_all(lupin_runtime *rt, uint32_t id) {
  for (lupin_prefix_index *x = rt->prefix_indexes; x; x = x->next_index)
    lupin_prefix_purge(x, id);
  if (rt->shared) lupin__prefix_shared_purge_all(lupin__shared_store(rt->shared), id);
}
