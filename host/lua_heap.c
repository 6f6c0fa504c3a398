/* The Lua heaps of lupin's hosts on mimalloc (lupin_options.allocator).
 * A request makes and drops some thirty-five small Lua objects, and the
 * allocator's malloc and free for them were the largest single cost inside
 * LuaJIT per request; mimalloc's thread-local free lists take about half
 * the instructions LuaJIT's own allocator did (docs/performance.md, "The
 * Lua heap's allocator").  A runtime is made and used on one thread (a
 * worker of lupin serve, an nginx worker process), as mimalloc's fast path
 * wants. */
#include "lupin_host.h"

#include <mimalloc.h>

void *lh_lua_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud;
  (void)osize;
  if (!nsize) {
    mi_free(ptr);
    return NULL;
  }
  /* a new block by mi_malloc's inlined fast path: mi_realloc would take
   * several times the instructions to find it has nothing to copy */
  if (!ptr) return mi_malloc(nsize);
  return mi_realloc(ptr, nsize); /* NULL back: ptr kept */
}

/* Gives back to the system what the heaps freed.  mimalloc (which serves
 * the process's C allocations too) keeps a freed page for reuse and returns
 * it only after a delay, checked when the thread allocates again: after 17
 * bodies of 15 MB had been answered, an idle worker still held 187 MB (the
 * bodies' buffers, their prompts decoded in the Lua heap).  Called on the
 * worker's own thread (mimalloc's heaps are per thread) when it is idle,
 * after a full collection: at most once a second. */
void lh_heap_release(void) { mi_collect(true); }
