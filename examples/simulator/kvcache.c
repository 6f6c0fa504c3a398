/* The prefix cache, modelled on vLLM's block manager.
 *
 * A fixed pool of `capacity` blocks. A block referenced by a running request is
 * "in use"; a block nobody references sits in the free queue, in LRU order, and
 * keeps its hash so a later request with the same prefix can take it back (a
 * hit). Allocating a new block takes the free queue's head, evicting whatever it
 * cached. Hashes come chained (engine.c), so a match of block i means the whole
 * prefix up to i matches: lookups stop at the first miss. */
#include <stdlib.h>

#include "sim.h"

typedef struct block {
  uint64_t hash;
  bool hashed;
  int refs;
  int prev, next; /* free queue links; -1 ends */
  int hnext;      /* hash bucket chain */
} block;

struct kvcache {
  block *b;
  int capacity;
  int in_use;
  int free_head, free_tail, free_count;
  int *buckets;
  uint64_t mask;
};

static int bucket_of(const kvcache *kv, uint64_t h) { return (int)(h & kv->mask); }

static void free_push_tail(kvcache *kv, int i) {
  kv->b[i].prev = kv->free_tail;
  kv->b[i].next = -1;
  if (kv->free_tail >= 0)
    kv->b[kv->free_tail].next = i;
  else
    kv->free_head = i;
  kv->free_tail = i;
  kv->free_count++;
}

static void free_unlink(kvcache *kv, int i) {
  block *x = &kv->b[i];
  if (x->prev >= 0)
    kv->b[x->prev].next = x->next;
  else
    kv->free_head = x->next;
  if (x->next >= 0)
    kv->b[x->next].prev = x->prev;
  else
    kv->free_tail = x->prev;
  x->prev = x->next = -1;
  kv->free_count--;
}

static int table_find(const kvcache *kv, uint64_t h) {
  for (int i = kv->buckets[bucket_of(kv, h)]; i >= 0; i = kv->b[i].hnext)
    if (kv->b[i].hash == h) return i;
  return -1;
}

static void table_insert(kvcache *kv, int i, uint64_t h) {
  int *head = &kv->buckets[bucket_of(kv, h)];
  kv->b[i].hash = h;
  kv->b[i].hashed = true;
  kv->b[i].hnext = *head;
  *head = i;
}

static void table_remove(kvcache *kv, int i) {
  if (!kv->b[i].hashed) return;
  int *link = &kv->buckets[bucket_of(kv, kv->b[i].hash)];
  while (*link != i)
    link = &kv->b[*link].hnext;
  *link = kv->b[i].hnext;
  kv->b[i].hashed = false;
}

kvcache *kv_new(int capacity) {
  kvcache *kv = calloc(1, sizeof *kv);
  int nb = 1;
  while (nb < capacity * 2)
    nb *= 2;
  kv->b = calloc((size_t)capacity, sizeof *kv->b);
  kv->buckets = malloc((size_t)nb * sizeof *kv->buckets);
  if (!kv->b || !kv->buckets) abort();
  kv->capacity = capacity;
  kv->mask = (uint64_t)nb - 1;
  kv->free_head = kv->free_tail = -1;
  for (int i = 0; i < nb; i++)
    kv->buckets[i] = -1;
  for (int i = 0; i < capacity; i++)
    free_push_tail(kv, i);
  return kv;
}

void kv_free(kvcache *kv) {
  if (!kv) return;
  free(kv->b);
  free(kv->buckets);
  free(kv);
}

int kv_capacity(const kvcache *kv) { return kv->capacity; }
int kv_in_use(const kvcache *kv) { return kv->in_use; }
int kv_free_count(const kvcache *kv) { return kv->free_count; }

int kv_match(const kvcache *kv, const uint64_t *hashes, int n) {
  int i = 0;
  while (i < n && table_find(kv, hashes[i]) >= 0)
    i++;
  return i;
}

static void take_ref(kvcache *kv, int i) {
  if (kv->b[i].refs++ == 0) {
    free_unlink(kv, i);
    kv->in_use++;
  }
}

/* The LRU free block, its old content forgotten. */
static int evict_one(kvcache *kv) {
  int i = kv->free_head;
  if (i < 0) return -1;
  table_remove(kv, i);
  take_ref(kv, i);
  return i;
}

int kv_acquire(kvcache *kv, const uint64_t *hashes, int n, int *out) {
  int got = 0;
  for (int k = 0; k < n; k++) {
    int i = table_find(kv, hashes[k]);
    if (i >= 0) {
      take_ref(kv, i);
    } else {
      i = evict_one(kv);
      if (i < 0) break; /* full: the rest of the prompt is not cached */
      table_insert(kv, i, hashes[k]);
    }
    out[got++] = i;
  }
  return got;
}

int kv_acquire_anon(kvcache *kv) { return evict_one(kv); }

void kv_release(kvcache *kv, const int *blocks, int n) {
  for (int k = n - 1; k >= 0; k--) {
    int i = blocks[k];
    if (--kv->b[i].refs > 0) continue;
    kv->in_use--;
    if (kv->b[i].hashed) {
      free_push_tail(kv, i);
    } else {
      /* Nothing to reuse in an unhashed block: first in line for eviction. */
      kv->b[i].prev = -1;
      kv->b[i].next = kv->free_head;
      if (kv->free_head >= 0)
        kv->b[kv->free_head].prev = i;
      else
        kv->free_tail = i;
      kv->free_head = i;
      kv->free_count++;
    }
  }
}
