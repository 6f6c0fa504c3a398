/* The Lua allocator: accounts every byte the Lua state holds and refuses
 * allocations over the memory limit while a plugin runs.  It wraps LuaJIT's
 * own allocator, which is markedly faster than malloc for Lua's many small
 * objects. */
#include "internal.h"

void *lupin_alloc_fn(void *ud, void *ptr, size_t osize, size_t nsize) {
  lupin_alloc *a = ud;
  size_t old = ptr ? osize : 0;

  /* Shrinking never fails; growing past the limit does, inside a plugin. */
  if (nsize > old && a->enforce && a->limit && a->used - old + nsize > a->limit) {
    a->refused++;
    return NULL;
  }
  void *p = a->base(a->base_ud, ptr, osize, nsize);
  if (!p && nsize) return NULL;
  a->used = a->used - old + nsize;
  if (a->used > a->peak) a->peak = a->used;
  return p;
}
