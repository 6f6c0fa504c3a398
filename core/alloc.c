/* The Lua allocator: accounts every byte the Lua state holds and refuses
 * allocations over the memory limit while a plugin runs.  It wraps LuaJIT's
 * own allocator, which is markedly faster than malloc for Lua's many small
 * objects.
 *
 * Big blocks (a long prompt's body and the strings decoded from it) are the
 * exception: LuaJIT's allocator maps each block of 128 KB or more afresh and
 * unmaps it when freed, so every request with a long prompt page-faulted its
 * whole body in again.  Big sizes are rounded up to a power of two and freed
 * big blocks are kept, up to SPARE_BYTES, to serve the next big allocation
 * of the same size.  A collection frees a whole cycle's long prompts at once
 * (two blocks each: the body and its decoded prompt), so the count of kept
 * blocks must not be what runs out first: with 16 kept, 256 KB prompts had
 * half their blocks mapped and faulted in afresh.  Kept blocks stay blocks
 * of the allocator underneath, which reads a block's size from its own
 * header: the rounding only lets a freed block be matched to a request, and
 * the pages past what was used are never touched. */
#include "internal.h"

#define BIG         ((size_t)128 << 10) /* LuaJIT maps blocks from this size on */
#define SPARE_BYTES ((size_t)16 << 20)  /* most kept at once */

static size_t rounded(size_t n) {
  if (n < BIG) return n;
  size_t r = BIG;
  while (r < n)
    r <<= 1;
  return r;
}

static void *take_spare(lupin_alloc *a, size_t size) {
  for (size_t i = 0; i < a->n_spare; i++) {
    if (a->spare[i].size != size) continue;
    void *p = a->spare[i].p;
    a->spare_bytes -= size;
    a->spare[i] = a->spare[--a->n_spare];
    return p;
  }
  return NULL;
}

static int keep_spare(lupin_alloc *a, void *p, size_t size) {
  if (a->n_spare == LUPIN_ALLOC_SPARES || a->spare_bytes + size > SPARE_BYTES) return 0;
  a->spare[a->n_spare].p = p;
  a->spare[a->n_spare].size = size;
  a->n_spare++;
  a->spare_bytes += size;
  return 1;
}

void lupin_alloc_release_spares(lupin_alloc *a) {
  while (a->n_spare) {
    a->n_spare--;
    a->base(a->base_ud, a->spare[a->n_spare].p, a->spare[a->n_spare].size, 0);
  }
  a->spare_bytes = 0;
}

/* The allocator underneath, big sizes rounded and big blocks recycled. */
static void *underneath(lupin_alloc *a, void *ptr, size_t osize, size_t nsize) {
  size_t o = ptr ? rounded(osize) : 0, n = rounded(nsize);
  if (!ptr && n >= BIG) {
    void *p = take_spare(a, n);
    if (p) return p;
  } else if (ptr && nsize == 0 && o >= BIG && keep_spare(a, ptr, o)) {
    return NULL;
  } else if (ptr && o == n) {
    return ptr; /* the block already has room */
  }
  return a->base(a->base_ud, ptr, o, n);
}

void *lupin_alloc_fn(void *ud, void *ptr, size_t osize, size_t nsize) {
  lupin_alloc *a = ud;
  size_t old = ptr ? osize : 0;
  size_t used = a->used - old + nsize;

  /* Shrinking never fails; growing past the limit does, inside a plugin. */
  if (a->enforce && nsize > old && a->limit && used > a->limit) {
    a->refused++;
    return NULL;
  }
  /* small blocks, nearly every call: straight to the allocator underneath */
  void *p = (old | nsize) < BIG ? a->base(a->base_ud, ptr, osize, nsize)
                                : underneath(a, ptr, osize, nsize);
  if (!p && nsize) return NULL;
  if (nsize > old) a->allocated += nsize - old;
  a->used = used;
  if (used > a->peak) a->peak = used;
  return p;
}
