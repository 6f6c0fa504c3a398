/* The Lua allocator: accounts every byte the Lua state holds and refuses
 * allocations over the memory limit while a plugin runs. */
#include "internal.h"

#include <stdlib.h>

void *lupin_alloc_fn(void *ud, void *ptr, size_t osize, size_t nsize) {
  lupin_alloc *a = ud;
  size_t old = ptr ? osize : 0;

  if (nsize == 0) {
    free(ptr);
    a->used -= old;
    return NULL;
  }
  /* Shrinking never fails; growing past the limit does, inside a plugin. */
  if (nsize > old && a->enforce && a->limit && a->used - old + nsize > a->limit) {
    a->refused++;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (!p) return NULL;
  a->used = a->used - old + nsize;
  if (a->used > a->peak) a->peak = a->used;
  return p;
}
