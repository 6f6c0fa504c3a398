/* The prefix cache, modelled on vLLM's block manager.
 *
 * A fixed pool of `capacity` blocks. A block referenced by a running request is
 * "in use"; a block nobody references sits in the free queue, in LRU order, and
 * keeps its hash so a later request with the same prefix can take it back (a
 * hit). Allocating a new block takes the free queue's head, evicting whatever it
 * cached. Hashes come chained (kv_hash_blocks), so a match of block i means the
 * whole prefix up to i matches: lookups stop at the first miss.
 *
 * A listener (kvevents.c) hears each change as vLLM's block pool reports it:
 * the blocks newly cached by one request in runs of consecutive blocks (one
 * BlockStored each, its parent the block before the run), each evicted cached
 * block (one BlockRemoved each), a reset (AllBlocksCleared). */
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

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
  int block_size;
  kv_listener listener;
  bool listening;
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

/* vLLM's chain: hash(parent, token ids, extra keys), the first block's parent a
 * seeded constant (vLLM's NONE_HASH, random per engine unless PYTHONHASHSEED is
 * set), the adapter's name an extra key of every block, cache_salt of the first. */
void kv_hash_blocks(uint64_t seed, const char *lora, const char *salt, const uint32_t *ids,
                    int nblocks, int block_size, uint64_t *out) {
  size_t tokens = (size_t)block_size * sizeof *ids;
  size_t lora_len = lora ? strlen(lora) + 1 : 0, salt_len = salt ? strlen(salt) + 1 : 0;
  unsigned char *buf = malloc(8 + tokens + lora_len + salt_len);
  if (!buf) abort();
  uint64_t parent = XXH64("NONE_HASH", 9, seed);
  for (int i = 0; i < nblocks; i++) {
    memcpy(buf, &parent, 8);
    memcpy(buf + 8, ids + (size_t)i * (size_t)block_size, tokens);
    size_t n = 8 + tokens;
    if (lora) memcpy(buf + n, lora, lora_len);
    n += lora_len;
    if (salt && i == 0) {
      memcpy(buf + n, salt, salt_len);
      n += salt_len;
    }
    parent = XXH64(buf, n, seed);
    out[i] = parent;
  }
  free(buf);
}

void kv_listen(kvcache *kv, const kv_listener *l) {
  kv->listening = l != NULL;
  if (l) kv->listener = *l;
}

kvcache *kv_new(int capacity, int block_size) {
  kvcache *kv = calloc(1, sizeof *kv);
  int nb = 1;
  while (nb < capacity * 2)
    nb *= 2;
  kv->b = calloc((size_t)capacity, sizeof *kv->b);
  kv->buckets = malloc((size_t)nb * sizeof *kv->buckets);
  if (!kv->b || !kv->buckets) abort();
  kv->capacity = capacity;
  kv->block_size = block_size;
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
  if (kv->b[i].hashed && kv->listening) kv->listener.removed(kv->listener.ctx, kv->b[i].hash);
  table_remove(kv, i);
  take_ref(kv, i);
  return i;
}

/* The run [from, to) of blocks just cached, as one BlockStored. */
static void tell_stored(kvcache *kv, const uint64_t *hashes, const uint32_t *tokens, int from,
                        int to, int lora) {
  if (!kv->listening || from >= to) return;
  kv->listener.stored(kv->listener.ctx, hashes + from, to - from, from ? &hashes[from - 1] : NULL,
                      tokens + (size_t)from * (size_t)kv->block_size, lora);
}

int kv_acquire(kvcache *kv, const uint64_t *hashes, const uint32_t *tokens, int n, int lora,
               int *out) {
  int got = 0, run = 0; /* run: the first block of the current run of new ones */
  for (int k = 0; k < n; k++) {
    int i = table_find(kv, hashes[k]);
    if (i >= 0) {
      tell_stored(kv, hashes, tokens, run, k, lora);
      run = k + 1;
      take_ref(kv, i);
    } else {
      i = evict_one(kv);
      if (i < 0) break; /* full: the rest of the prompt is not cached */
      table_insert(kv, i, hashes[k]);
    }
    out[got++] = i;
  }
  tell_stored(kv, hashes, tokens, run, got, lora);
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

void kv_reset(kvcache *kv, bool announce) {
  for (int i = 0; i < kv->capacity; i++)
    if (kv->b[i].hashed) table_remove(kv, i);
  if (announce && kv->listening) kv->listener.cleared(kv->listener.ctx);
}
