/* The token cache (lupin.h): token ids of prompt prefixes, for the keys of
 * KV-cache blocks by token ids (blockhash.c), shared by the runtimes of a
 * lupin_shared.
 *
 * A tokenizer is an HTTP call to an engine, far too slow for a request's
 * path, so a plugin asks for a prefix's ids once (a job to the host's hook),
 * scores that request without them, and finds them cached for the next
 * requests sharing the prefix.  One entry per key, either cached (ids, in
 * the LRU) or pending (a job asked for, in a FIFO that is also the order in
 * which they expire: every job gets the time to live the cache has when the
 * job's age is checked, so a changed one keeps the order).  One mutex: a
 * request makes at most one lookup, and hashing a cached prefix under it
 * costs microseconds. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define DEFAULT_LIMIT   ((size_t)64 << 20)
#define DEFAULT_PENDING 5.0
/* Jobs pending at once: past it the oldest is forgotten (asked for again
 * later), so a host that never answers cannot grow the table without end. */
#define MAX_PENDING 65536
#define GOLDEN      0x9E3779B97F4A7C15ull

typedef struct entry entry;
struct entry {
  uint64_t key;
  entry *chain;       /* in its bucket */
  entry *prev, *next; /* the LRU (most recent first) or the pending FIFO */
  double asked;       /* pending: when it was asked for */
  int pending;
  size_t n;
  uint32_t ids[];
};

typedef struct list {
  entry *head, *tail;
  size_t count;
} list;

struct lupin_token_cache {
  pthread_mutex_t lock;
  entry **buckets;
  size_t n_buckets, n_entries;
  list lru, pending;
  size_t bytes, limit;
  double pending_seconds;
  lupin_tokenize_fn hook;
  void *hook_ud;
  uint64_t hits, misses, evictions, asked, failed, expired;
};

/* --- lists and the table ---------------------------------------------------- */

static void list_unlink(list *l, entry *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    l->head = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    l->tail = e->prev;
  l->count--;
}

static void list_push_front(list *l, entry *e) {
  e->prev = NULL;
  e->next = l->head;
  if (l->head)
    l->head->prev = e;
  else
    l->tail = e;
  l->head = e;
  l->count++;
}

static void list_push_back(list *l, entry *e) {
  e->next = NULL;
  e->prev = l->tail;
  if (l->tail)
    l->tail->next = e;
  else
    l->head = e;
  l->tail = e;
  l->count++;
}

static size_t bucket_of(const lupin_token_cache *c, uint64_t key) {
  uint64_t k = key * GOLDEN;
  return (size_t)(k ^ (k >> 32)) & (c->n_buckets - 1);
}

static entry **find_ref(lupin_token_cache *c, uint64_t key) {
  if (!c->buckets) return NULL;
  entry **p = &c->buckets[bucket_of(c, key)];
  while (*p && (*p)->key != key)
    p = &(*p)->chain;
  return *p ? p : NULL;
}

static entry *find(lupin_token_cache *c, uint64_t key) {
  entry **p = find_ref(c, key);
  return p ? *p : NULL;
}

/* Doubles the buckets past one entry per bucket; without memory for it the
 * chains just grow longer. */
static void grow(lupin_token_cache *c) {
  if (c->n_entries < c->n_buckets) return;
  size_t n = c->n_buckets ? c->n_buckets * 2 : 64;
  entry **b = calloc(n, sizeof *b);
  if (!b) return;
  size_t old = c->n_buckets;
  entry **ob = c->buckets;
  c->buckets = b;
  c->n_buckets = n;
  for (size_t i = 0; i < old; i++) {
    for (entry *e = ob[i], *next; e; e = next) {
      next = e->chain;
      size_t h = bucket_of(c, e->key);
      e->chain = b[h];
      b[h] = e;
    }
  }
  free(ob);
}

static size_t entry_bytes(size_t n) { return sizeof(entry) + n * sizeof(uint32_t); }

/* Takes e out of the table and its list, and frees it. */
static void drop(lupin_token_cache *c, entry *e) {
  entry **p = find_ref(c, e->key);
  *p = e->chain;
  c->n_entries--;
  if (e->pending) {
    list_unlink(&c->pending, e);
  } else {
    list_unlink(&c->lru, e);
    c->bytes -= entry_bytes(e->n);
  }
  free(e);
}

/* A table of at least 64 buckets exists before the first insert. */
static int insert(lupin_token_cache *c, entry *e) {
  grow(c);
  if (!c->buckets) return -1;
  size_t h = bucket_of(c, e->key);
  e->chain = c->buckets[h];
  c->buckets[h] = e;
  c->n_entries++;
  if (e->pending) {
    list_push_back(&c->pending, e);
  } else {
    list_push_front(&c->lru, e);
    c->bytes += entry_bytes(e->n);
  }
  return 0;
}

static void evict_to(lupin_token_cache *c, size_t limit) {
  while (c->bytes > limit && c->lru.tail) {
    drop(c, c->lru.tail);
    c->evictions++;
  }
}

static void expire(lupin_token_cache *c, double now) {
  while (c->pending.head &&
         (c->pending.head->asked + c->pending_seconds <= now || c->pending.count > MAX_PENDING)) {
    drop(c, c->pending.head);
    c->expired++;
  }
}

/* --- the cache ---------------------------------------------------------------- */

lupin_token_cache *lupin__tokens_new(void) {
  lupin_token_cache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->lock, NULL);
  c->limit = DEFAULT_LIMIT;
  c->pending_seconds = DEFAULT_PENDING;
  return c;
}

void lupin__tokens_free(lupin_token_cache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n_buckets; i++) {
    for (entry *e = c->buckets[i], *next; e; e = next) {
      next = e->chain;
      free(e);
    }
  }
  free(c->buckets);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

static lupin_token_cache *cache_of(lupin_shared *s) {
  return s ? lupin__shared_store(s)->tokens : NULL;
}

int lupin_shared_tokens_put(lupin_shared *s, uint64_t key, const uint32_t *ids, size_t n) {
  lupin_token_cache *c = cache_of(s);
  if (!c || (n && !ids) || n > (SIZE_MAX - sizeof(entry)) / sizeof(uint32_t)) return -1;
  entry *e = malloc(entry_bytes(n)); /* outside the lock: it may be large */
  if (!e) return -1;
  *e = (entry){.key = key, .n = n};
  if (n) memcpy(e->ids, ids, n * sizeof *ids);
  pthread_mutex_lock(&c->lock);
  int rc = entry_bytes(n) > c->limit ? -1 : 0;
  if (rc == 0) {
    entry *old = find(c, key);
    if (old) drop(c, old);
    evict_to(c, c->limit - entry_bytes(n));
    rc = insert(c, e);
  }
  pthread_mutex_unlock(&c->lock);
  if (rc) free(e);
  return rc;
}

long lupin_shared_tokens_hashes(lupin_shared *s, uint64_t key, uint64_t prev, size_t block_size,
                                uint64_t *out, size_t cap) {
  lupin_token_cache *c = cache_of(s);
  if (!c || block_size == 0 || (cap && !out)) return -1;
  pthread_mutex_lock(&c->lock);
  entry *e = find(c, key);
  long rc = -1;
  if (e && !e->pending) {
    c->hits++;
    list_unlink(&c->lru, e);
    list_push_front(&c->lru, e);
    rc = lupin_token_block_hashes(prev, e->ids, e->n, block_size, out, cap);
  } else {
    c->misses++;
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

long lupin_shared_tokens_count(lupin_shared *s, uint64_t key) {
  lupin_token_cache *c = cache_of(s);
  if (!c) return -1;
  pthread_mutex_lock(&c->lock);
  entry *e = find(c, key);
  long n = e && !e->pending ? (long)e->n : -1;
  pthread_mutex_unlock(&c->lock);
  return n;
}

void lupin_shared_tokens_limit(lupin_shared *s, size_t bytes) {
  lupin_token_cache *c = cache_of(s);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  c->limit = bytes;
  evict_to(c, bytes);
  pthread_mutex_unlock(&c->lock);
}

void lupin_shared_tokens_pending_seconds(lupin_shared *s, double seconds) {
  lupin_token_cache *c = cache_of(s);
  if (!c || !(seconds >= 0)) return;
  pthread_mutex_lock(&c->lock);
  c->pending_seconds = seconds;
  pthread_mutex_unlock(&c->lock);
}

void lupin_shared_tokens_stats(lupin_shared *s, lupin_token_cache_stats *out) {
  lupin_token_cache *c = cache_of(s);
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  expire(c, lupin_now());
  out->entries = c->lru.count;
  out->bytes = c->bytes;
  out->limit = c->limit;
  out->pending = c->pending.count;
  out->hits = c->hits;
  out->misses = c->misses;
  out->evictions = c->evictions;
  out->asked = c->asked;
  out->failed = c->failed;
  out->expired = c->expired;
  pthread_mutex_unlock(&c->lock);
}

/* --- jobs ----------------------------------------------------------------- */

void lupin_shared_on_tokenize(lupin_shared *s, lupin_tokenize_fn fn, void *ud) {
  lupin_token_cache *c = cache_of(s);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  c->hook = fn;
  c->hook_ud = ud;
  pthread_mutex_unlock(&c->lock);
}

/* Marks key pending unless cached or pending; 1: marked, 0: not needed, -1:
 * out of memory.  The hook to call in *fn. */
static int mark_pending(lupin_token_cache *c, uint64_t key, lupin_tokenize_fn *fn, void **ud) {
  double now = lupin_now();
  pthread_mutex_lock(&c->lock);
  expire(c, now);
  int rc = 0;
  *fn = c->hook;
  *ud = c->hook_ud;
  if (*fn && !find(c, key)) {
    entry *e = malloc(sizeof *e);
    rc = -1;
    if (e) {
      *e = (entry){.key = key, .pending = 1, .asked = now};
      rc = insert(c, e) ? -1 : 1;
      if (rc < 0) free(e);
    }
    if (rc == 1) {
      c->asked++;
      expire(c, now); /* past MAX_PENDING: the oldest */
    }
  }
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int lupin_shared_tokens_want(lupin_shared *s, const lupin_tokenize_job *job) {
  lupin_token_cache *c = cache_of(s);
  if (!c || !job || (job->text_len && !job->text)) return -1;
  lupin_tokenize_fn fn;
  void *ud;
  int rc = mark_pending(c, job->key, &fn, &ud);
  if (rc == 1) fn(ud, job);
  return rc;
}

void lupin_shared_tokens_failed(lupin_shared *s, uint64_t key) {
  lupin_token_cache *c = cache_of(s);
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  entry *e = find(c, key);
  if (e && e->pending) {
    drop(c, e);
    c->failed++;
  }
  pthread_mutex_unlock(&c->lock);
}

/* --- through a runtime (lupin.tokens, by FFI: lupin_capi_shared) ------------ */

int lupin__tokens_put(lupin_runtime *rt, uint64_t key, const uint32_t *ids, size_t n) {
  return lupin_shared_tokens_put(rt->shared, key, ids, n);
}

long lupin__tokens_hashes(lupin_runtime *rt, uint64_t key, uint64_t prev, size_t block_size,
                          uint64_t *out, size_t cap) {
  return lupin_shared_tokens_hashes(rt->shared, key, prev, block_size, out, cap);
}

long lupin__tokens_count(lupin_runtime *rt, uint64_t key) {
  return lupin_shared_tokens_count(rt->shared, key);
}

int lupin__tokens_want(lupin_runtime *rt, const lupin_tokenize_job *job) {
  return lupin_shared_tokens_want(rt->shared, job);
}
