/* Shared dicts: small key/value tables every runtime of a process sees alike
 * (lupin.shared, lua/lupin/shared.lua), in the spirit of OpenResty's
 * ngx.shared.DICT.
 *
 * A dict is made on first use under its name and lives as long as its
 * lupin_shared.  One mutex per dict guards it: each call is a lookup or an
 * insert, short enough that a lock-free design would buy nothing.  Its
 * entries are bounded (max_entries, fixed when made) and so are keys and
 * string values (LUPIN_DICT_MAX_KEY, _MAX_VALUE): a set past the bound is
 * refused, the dict never grows without limit.  So are the process's dicts
 * together: at most LUPIN_DICT_MAX_DICTS of them, their entries at most
 * LUPIN_DICT_MAX_BYTES, counted in the store whatever dict's lock is held. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct entry {
  struct entry *next; /* the bucket's chain */
  uint64_t hash;
  int32_t type;
  double num;
  char *str; /* a string value, malloc'd */
  size_t slen, klen;
  char key[]; /* not terminated */
} entry;

struct lupin_dict {
  lupin_dict *next; /* the store's list */
  size_t *bytes;    /* the store's count of the plugins' dicts' entries; NULL: the runtime's */
  char *name;
  pthread_mutex_t lock;
  size_t max, count;
  entry **buckets;
  size_t mask; /* buckets - 1, a power of two minus one */
};

/* --- the store ---------------------------------------------------------------- */

static lupin_dict *dict_new(const char *name, size_t max, size_t *bytes) {
  lupin_dict *d = calloc(1, sizeof *d);
  if (!d) return NULL;
  d->bytes = bytes;
  d->name = strdup(name);
  d->max = max;
  d->mask = 15;
  d->buckets = calloc(d->mask + 1, sizeof *d->buckets);
  if (!d->name || !d->buckets) {
    free(d->name);
    free(d->buckets);
    free(d);
    return NULL;
  }
  pthread_mutex_init(&d->lock, NULL);
  return d;
}

static void dict_free(lupin_dict *d) {
  for (size_t b = 0; b <= d->mask; b++) {
    for (entry *e = d->buckets[b], *next; e; e = next) {
      next = e->next;
      free(e->str);
      free(e);
    }
  }
  free(d->buckets);
  pthread_mutex_destroy(&d->lock);
  free(d->name);
  free(d);
}

lupin_dict *lupin_dict_open(lupin_runtime *rt, const char *name, size_t max_entries) {
  if (!rt || !rt->shared || !name) return NULL;
  lupin_shared_store *st = lupin__shared_store(rt->shared);
  pthread_mutex_lock(&st->lock);
  lupin_dict *d = st->dicts;
  while (d && strcmp(d->name, name) != 0)
    d = d->next;
  /* the runtime's own dicts ("lupin.", which lupin.shared keeps from
   * plugins) are bounded by their users alone: a plugin filling the budget
   * must not stop flow control's counts */
  int own = strncmp(name, "lupin.", 6) == 0;
  if (!d && (own || st->n_dicts < LUPIN_DICT_MAX_DICTS) &&
      (d = dict_new(name, max_entries, own ? NULL : &st->dict_bytes))) {
    d->next = st->dicts;
    st->dicts = d;
    st->n_dicts += !own;
  }
  pthread_mutex_unlock(&st->lock);
  return d;
}

void lupin__dict_free_all(lupin_shared_store *st) {
  while (st->dicts) {
    lupin_dict *d = st->dicts;
    st->dicts = d->next;
    dict_free(d);
  }
  st->n_dicts = 0;
  st->dict_bytes = 0;
}

/* --- entries ---------------------------------------------------------------- */

/* What an entry of klen key bytes and slen value bytes holds. */
static size_t entry_bytes(size_t klen, size_t slen) { return sizeof(entry) + klen + slen; }

/* Takes n bytes of the process's budget; -1: it has not that much left. */
static int charge(lupin_dict *d, size_t n) {
  if (!d->bytes || __atomic_add_fetch(d->bytes, n, __ATOMIC_RELAXED) <= LUPIN_DICT_MAX_BYTES)
    return 0;
  __atomic_sub_fetch(d->bytes, n, __ATOMIC_RELAXED);
  return -1;
}

static void uncharge(lupin_dict *d, size_t n) {
  if (d->bytes) __atomic_sub_fetch(d->bytes, n, __ATOMIC_RELAXED);
}

/* The link pointing at key's entry (or at the NULL ending its bucket). */
static entry **find(lupin_dict *d, const char *key, size_t klen, uint64_t hash) {
  entry **p = &d->buckets[hash & d->mask];
  for (; *p; p = &(*p)->next)
    if ((*p)->hash == hash && (*p)->klen == klen && memcmp((*p)->key, key, klen) == 0) break;
  return p;
}

/* Doubles the buckets at a load of 1 (a failure only keeps chains longer). */
static void maybe_grow(lupin_dict *d) {
  if (d->count <= d->mask) return;
  size_t cap = (d->mask + 1) * 2;
  entry **b = calloc(cap, sizeof *b);
  if (!b) return;
  for (size_t i = 0; i <= d->mask; i++) {
    for (entry *e = d->buckets[i], *next; e; e = next) {
      next = e->next;
      e->next = b[e->hash & (cap - 1)];
      b[e->hash & (cap - 1)] = e;
    }
  }
  free(d->buckets);
  d->buckets = b;
  d->mask = cap - 1;
}

/* A new entry at *p (the end of its bucket) in *out: 0, LUPIN_DICT_NO_MEMORY
 * (the budget) or -1 (malloc). */
static int add(lupin_dict *d, entry **p, const char *key, size_t klen, uint64_t hash, entry **out) {
  if (charge(d, entry_bytes(klen, 0))) return LUPIN_DICT_NO_MEMORY;
  entry *e = malloc(sizeof *e + klen);
  if (!e) {
    uncharge(d, entry_bytes(klen, 0));
    return -1;
  }
  *e = (entry){.hash = hash, .klen = klen};
  memcpy(e->key, key, klen);
  *p = e;
  d->count++;
  maybe_grow(d);
  *out = e;
  return 0;
}

/* Unlinks the entry at *p and frees it. */
static void drop(lupin_dict *d, entry **p) {
  entry *e = *p;
  *p = e->next;
  d->count--;
  uncharge(d, entry_bytes(e->klen, e->slen));
  free(e->str);
  free(e);
}

/* Sets e's value; LUPIN_DICT_NO_MEMORY or -1 leave it as it was. */
static int assign(lupin_dict *d, entry *e, int type, double num, const char *str, size_t slen) {
  char *copy = NULL;
  if (type == LUPIN_DICT_STRING) {
    if (charge(d, slen)) return LUPIN_DICT_NO_MEMORY;
    if (!(copy = malloc(slen ? slen : 1))) {
      uncharge(d, slen);
      return -1;
    }
    memcpy(copy, str, slen);
  }
  uncharge(d, e->slen);
  free(e->str);
  e->type = type;
  e->num = num;
  e->str = copy;
  e->slen = copy ? slen : 0;
  return 0;
}

int lupin_dict_get(lupin_dict *d, const char *key, size_t klen, lupin_dict_value *out, char *buf,
                   size_t cap) {
  uint64_t hash = XXH3_64bits(key, klen);
  pthread_mutex_lock(&d->lock);
  entry *e = *find(d, key, klen, hash);
  *out = (lupin_dict_value){.type = e ? e->type : LUPIN_DICT_NIL};
  if (e) {
    out->num = e->num;
    out->len = e->slen;
    if (e->slen) memcpy(buf, e->str, e->slen < cap ? e->slen : cap);
  }
  pthread_mutex_unlock(&d->lock);
  return 0;
}

int lupin_dict_set(lupin_dict *d, const char *key, size_t klen, int type, double num,
                   const char *str, size_t slen) {
  if (klen > LUPIN_DICT_MAX_KEY || (type == LUPIN_DICT_STRING && slen > LUPIN_DICT_MAX_VALUE))
    return LUPIN_DICT_TOO_LONG;
  uint64_t hash = XXH3_64bits(key, klen);
  int rc = 0;
  pthread_mutex_lock(&d->lock);
  entry **p = find(d, key, klen, hash), *e = *p;
  if (type == LUPIN_DICT_NIL) {
    if (e) drop(d, p);
  } else if (e) {
    rc = assign(d, e, type, num, str, slen);
  } else if (d->count >= d->max) {
    rc = LUPIN_DICT_FULL;
  } else if (!(rc = add(d, p, key, klen, hash, &e)) && (rc = assign(d, e, type, num, str, slen))) {
    drop(d, find(d, key, klen, hash)); /* a new entry without its value */
  }
  pthread_mutex_unlock(&d->lock);
  return rc;
}

int lupin_dict_incr(lupin_dict *d, const char *key, size_t klen, double delta, double init,
                    int has_init, double *out) {
  if (klen > LUPIN_DICT_MAX_KEY) return LUPIN_DICT_TOO_LONG;
  uint64_t hash = XXH3_64bits(key, klen);
  int rc = 0;
  pthread_mutex_lock(&d->lock);
  entry **p = find(d, key, klen, hash), *e = *p;
  if (e && e->type != LUPIN_DICT_NUMBER) {
    rc = LUPIN_DICT_NOT_NUMBER;
  } else if (!e && !has_init) {
    rc = LUPIN_DICT_NOT_FOUND;
  } else if (!e && d->count >= d->max) {
    rc = LUPIN_DICT_FULL;
  } else if (e || !(rc = add(d, p, key, klen, hash, &e))) {
    if (e->type != LUPIN_DICT_NUMBER) { /* just added */
      e->type = LUPIN_DICT_NUMBER;
      e->num = init;
    }
    e->num += delta;
    *out = e->num;
  }
  pthread_mutex_unlock(&d->lock);
  return rc;
}

size_t lupin_dict_count(lupin_dict *d) {
  pthread_mutex_lock(&d->lock);
  size_t n = d->count;
  pthread_mutex_unlock(&d->lock);
  return n;
}

size_t lupin_dict_max(lupin_dict *d) { return d->max; }
