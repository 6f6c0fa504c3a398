/* Prefix records across processes (lupin.h, docs/replicas.md).
 *
 * A host running replicas of itself (lupin serve with a "replicas" section)
 * hears every record a keyed prefix index makes, with the endpoint's name,
 * and ships it to the other replicas; they apply it to the index of the same
 * key by that name.  Names, not ids: ids are per process.  Applying calls no
 * hook, so a record never comes back to where it came from. */
#include "internal.h"

void lupin_shared_on_prefix_record(lupin_shared *s, lupin_prefix_record_fn fn, void *ud) {
  if (!s) return;
  lupin_shared_store *st = lupin__shared_store(s);
  st->on_record = fn;
  st->on_record_ud = ud;
}

void lupin__prefix_sync_recorded(lupin_shared_store *st, const char *key, const lupin_endpoint *ep,
                                 const uint64_t *hashes, size_t n) {
  if (st->on_record && ep->name) st->on_record(st->on_record_ud, key, ep->name, hashes, n);
}

int lupin_shared_prefix_apply(lupin_shared *s, const char *key, const char *endpoint,
                              const uint64_t *hashes, size_t n) {
  if (!s || !key || !endpoint || (n && !hashes)) return -1;
  if (n == 0) return 1;
  uint32_t id = lupin__shared_endpoint_named(s, endpoint);
  if (!id) return 0;
  return lupin__prefix_shared_record(lupin__shared_store(s), key, id, hashes, n);
}
