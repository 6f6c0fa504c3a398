/* One endpoint's resident blocks as its engine announces them, applied to a
 * keyed prefix index of the lupin_shared (docs/kv-events.md).
 *
 * Engine block hashes cannot be recomputed by a router (vLLM seeds them at
 * random and hashes pickled tuples), so an index keyed by them could never
 * be looked up for a request.  Like llm-d, lupin keys a block by its own
 * chained hash of the block's token ids, which a request's token ids give
 * too (lupin_token_block_hashes).  BlockStored carries the token ids;
 * BlockRemoved carries only engine hashes: this map from engine hash to
 * lupin key, one per endpoint, is what lets a removal find its key.
 *
 * The map is open addressing with linear probing and backward-shift
 * deletion (no tombstones: removals are as frequent as stores). */
#include "lupin_host.h"

#include <stdlib.h>
#include <string.h>

#define MIN_SLOTS 1024

typedef struct slot {
  uint64_t engine, key;
  uint8_t used;
} slot;

struct lh_kv_index {
  slot *slots;
  size_t mask, count, max_blocks;
  uint64_t *keys; /* scratch: one batch's keys */
  size_t keys_cap;
};

static size_t home(const lh_kv_index *x, uint64_t engine) {
  /* engine hashes are already hashes; the multiply spreads the low bits of
   * encodings that are not (a small int, a left-padded bin) */
  return (size_t)((engine * 0x9E3779B97F4A7C15ull) >> 17) & x->mask;
}

lh_kv_index *lh_kv_index_new(size_t max_blocks) {
  lh_kv_index *x = calloc(1, sizeof *x);
  if (!x) return NULL;
  x->slots = calloc(MIN_SLOTS, sizeof *x->slots);
  if (!x->slots) {
    free(x);
    return NULL;
  }
  x->mask = MIN_SLOTS - 1;
  x->max_blocks = max_blocks ? max_blocks : SIZE_MAX;
  return x;
}

void lh_kv_index_free(lh_kv_index *x) {
  if (!x) return;
  free(x->slots);
  free(x->keys);
  free(x);
}

size_t lh_kv_index_blocks(const lh_kv_index *x) { return x ? x->count : 0; }

static slot *find(const lh_kv_index *x, uint64_t engine) {
  for (size_t i = home(x, engine);; i = (i + 1) & x->mask) {
    slot *s = &x->slots[i];
    if (!s->used) return NULL;
    if (s->engine == engine) return s;
  }
}

static void place(lh_kv_index *x, uint64_t engine, uint64_t key) {
  size_t i = home(x, engine);
  while (x->slots[i].used && x->slots[i].engine != engine)
    i = (i + 1) & x->mask;
  if (!x->slots[i].used) x->count++;
  x->slots[i] = (slot){engine, key, 1};
}

static int grow(lh_kv_index *x) {
  size_t n = (x->mask + 1) * 2;
  slot *old = x->slots, *fresh = calloc(n, sizeof *fresh);
  if (!fresh) return -1;
  size_t old_n = x->mask + 1;
  x->slots = fresh;
  x->mask = n - 1;
  x->count = 0;
  for (size_t i = 0; i < old_n; i++)
    if (old[i].used) place(x, old[i].engine, old[i].key);
  free(old);
  return 0;
}

/* 0, or -1: the map is full (max_blocks) or out of memory. */
static int put(lh_kv_index *x, uint64_t engine, uint64_t key) {
  if (x->count >= x->max_blocks && !find(x, engine)) return -1;
  if ((x->count + 1) * 10 > (x->mask + 1) * 7 && grow(x)) return -1;
  place(x, engine, key);
  return 0;
}

/* Backward-shift deletion: every entry after the hole that could live in
 * it moves up, so lookups never need a tombstone. */
static void del(lh_kv_index *x, slot *s) {
  size_t hole = (size_t)(s - x->slots);
  x->slots[hole].used = 0;
  x->count--;
  for (size_t i = (hole + 1) & x->mask; x->slots[i].used; i = (i + 1) & x->mask) {
    size_t h = home(x, x->slots[i].engine);
    /* the entry at i may fill the hole when its home is not in (hole, i] */
    if (((i - h) & x->mask) >= ((i - hole) & x->mask)) {
      x->slots[hole] = x->slots[i];
      x->slots[i].used = 0;
      hole = i;
    }
  }
}

static int room_for_keys(lh_kv_index *x, size_t n) {
  if (n <= x->keys_cap) return 0;
  uint64_t *k = realloc(x->keys, n * sizeof *k);
  if (!k) return -1;
  x->keys = k;
  x->keys_cap = n;
  return 0;
}

/* The blocks a stored event's hashes name, in the chain of its parent. */
static int stored(lh_kv_index *x, const lh_kv_target *t, const lh_kv_event *ev, lh_kv_counts *c) {
  size_t n = ev->n_hashes, bs = ev->block_size ? ev->block_size : t->block_size;
  if (n == 0) return 0;
  if (bs == 0 || ev->n_tokens != n * bs) {
    c->malformed++; /* the tokens must be exactly the blocks' */
    return 0;
  }
  uint64_t prev;
  if (ev->has_parent) {
    slot *p = find(x, ev->parent);
    if (!p) {
      c->orphans += n; /* its parent was never seen or is gone: no chain */
      return 0;
    }
    prev = p->key;
  } else {
    prev = lupin_token_seed(t->hash_seed, t->hash_seed ? strlen(t->hash_seed) : 0, ev->lora_name,
                            ev->lora_name_len, ev->salt, ev->salt_len);
  }
  if (room_for_keys(x, n)) return -1;
  if (lupin_token_block_hashes(prev, ev->tokens, ev->n_tokens, bs, x->keys, n) != (long)n)
    return -1;
  for (size_t i = 0; i < n; i++)
    if (put(x, ev->hashes[i], x->keys[i])) return -1;
  if (lupin_shared_prefix_apply(t->shared, t->key, t->endpoint, x->keys, n) < 0) return -1;
  c->stored += n;
  return 0;
}

static int removed(lh_kv_index *x, const lh_kv_target *t, const lh_kv_event *ev, lh_kv_counts *c) {
  if (room_for_keys(x, ev->n_hashes)) return -1;
  size_t n = 0;
  for (size_t i = 0; i < ev->n_hashes; i++) {
    slot *s = find(x, ev->hashes[i]);
    if (!s) {
      c->unknown++; /* stored before lupin listened, or in a batch lost */
      continue;
    }
    x->keys[n++] = s->key;
    del(x, s);
  }
  if (n && lupin_shared_prefix_remove(t->shared, t->key, t->endpoint, x->keys, n) < 0) return -1;
  c->removed += n;
  return 0;
}

/* Whether the event is about blocks the index holds: the GPU's of the
 * full-attention group (other tiers and groups are counted, not kept). */
static int indexed(const lh_kv_event *ev) {
  if (ev->other_group) return 0;
  return !ev->medium || (ev->medium_len == 3 && strncasecmp(ev->medium, "gpu", 3) == 0);
}

int lh_kv_index_apply(lh_kv_index *x, const lh_kv_target *t, const lh_kv_batch *b,
                      lh_kv_counts *c) {
  for (size_t i = 0; i < b->n; i++) {
    const lh_kv_event *ev = &b->events[i];
    int rc = 0;
    if (ev->type == LH_KV_CLEARED) {
      lh_kv_index_clear(x, t);
      c->cleared++;
    } else if (!indexed(ev)) {
      c->ignored++;
    } else if (ev->type == LH_KV_STORED) {
      rc = stored(x, t, ev, c);
    } else if (ev->type == LH_KV_REMOVED) {
      rc = removed(x, t, ev, c);
    }
    if (rc) return -1;
  }
  return 0;
}

void lh_kv_index_clear(lh_kv_index *x, const lh_kv_target *t) {
  memset(x->slots, 0, (x->mask + 1) * sizeof *x->slots);
  x->count = 0;
  if (t) lupin_shared_prefix_purge(t->shared, t->key, t->endpoint);
}
