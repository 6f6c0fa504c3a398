/* Shared dicts: small key/value tables every runtime of a process sees alike
 * (lupin.shared, lua/lupin/shared.lua), in the spirit of OpenResty's
 * ngx.shared.DICT.
 *
 * A dict is made on first use under its name and lives as long as its
 * lupin_shared.  One mutex per dict guards it: each call is a lookup or an
 * insert, short enough that a lock-free design would buy nothing.  Its
 * entries are bounded (max_entries, fixed when made) and so are keys and
 * string values (LUPIN_DICT_MAX_KEY, _MAX_VALUE): a set past the bound is
 * refused, the dict never grows without limit. */
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
  char *name;
  pthread_mutex_t lock;
  size_t max, count;
  entry **buckets;
  size_t mask; /* buckets - 1, a power of two minus one */
};

/* --- the store ---------------------------------------------------------------- */

static lupin_dict *dict_new(const char *name, size_t max) {
  lupin_dict *d = calloc(1, sizeof *d);
  if (!d) return NULL;
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
  while (d && strcmp(d->name, name) != 0) d = d->next;
  if (!d && (d = dict_new(name, max_entries))) {
    d->next = st->dicts;
    st->dicts = d;
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
}

/* --- entries ---------------------------------------------------------------- */

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

/* A new entry at *p (the end of its bucket); NULL: full or out of memory. */
static entry *add(lupin_dict *d, entry **p, const char *key, size_t klen, uint64_t hash) {
  entry *e = malloc(sizeof *e + klen);
  if (!e) return NULL;
  *e = (entry){.hash = hash, .klen = klen};
  memcpy(e->key, key, klen);
  *p = e;
  d->count++;
  maybe_grow(d);
  return e;
}

/* Sets e's value; -1 (out of memory) leaves it as it was. */
static int assign(entry *e, int type, double num, const char *str, size_t slen) {
  char *copy = NULL;
  if (type == LUPIN_DICT_STRING) {
    copy = malloc(slen ? slen : 1);
    if (!copy) return -1;
    memcpy(copy, str, slen);
  }
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
    if (e) {
      *p = e->next;
      d->count--;
      free(e->str);
      free(e);
    }
  } else if (e) {
    rc = assign(e, type, num, str, slen);
  } else if (d->count >= d->max) {
    rc = LUPIN_DICT_FULL;
  } else if (!(e = add(d, p, key, klen, hash)) || assign(e, type, num, str, slen)) {
    if (e) { /* a new entry without its value: take it back out */
      *find(d, key, klen, hash) = NULL;
      d->count--;
      free(e);
    }
    rc = -1;
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
  } else if (!e && !(e = add(d, p, key, klen, hash))) {
    rc = -1;
  } else {
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
