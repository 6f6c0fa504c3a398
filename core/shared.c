/* State shared by the runtimes of one process (lupin.h, docs/workers.md). */
#include "internal.h"

#include <stdlib.h>

/* Shards of a keyed prefix index in a lupin_shared a host made (a runtime's
 * private one has 1: the single-runtime path stays one lock and one index). */
#define PREFIX_SHARDS 8

struct lupin_shared {
  pthread_mutex_t lock;
  lupin_shared_store store; /* prefix indexes and dicts (prefix_shared.c, shared_dict.c) */
};

lupin_shared *lupin_shared_new(char *err, size_t errlen) {
  lupin_shared *s = calloc(1, sizeof *s);
  if (!s) {
    lupin__errf(err, errlen, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&s->lock, NULL);
  pthread_mutex_init(&s->store.lock, NULL);
  s->store.prefix_shards = PREFIX_SHARDS;
  return s;
}

void lupin_shared_free(lupin_shared *s) {
  if (!s) return;
  lupin__prefix_shared_free_all(&s->store);
  lupin__dict_free_all(&s->store);
  pthread_mutex_destroy(&s->store.lock);
  pthread_mutex_destroy(&s->lock);
  free(s);
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
};
