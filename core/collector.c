/* The Lua collector paced by the host.  LuaJIT collects incrementally: once
 * the heap has doubled since the last cycle, each KB allocated pays for a
 * step of marking or sweeping, inside whatever call allocated it.  A
 * request's lifecycle allocates ~3 KB, so while a cycle runs most requests
 * carry a few steps, and the lifecycle's p99 is the collector's.  With
 * lupin_options.host_paces_collector the automatic collector is stopped and
 * the host calls lupin_runtime_collect_step between requests (lupin serve:
 * once per event-loop iteration), which makes the steps the KB allocated
 * since its last call owe, by LuaJIT's rule: a cycle starts once the heap
 * has doubled (its default pause, 200%), then one step per KB, each of the
 * size LuaJIT's step multiplier gives it.
 *
 * Steps are counted on the bytes allocated, not on the heap's net growth as
 * LuaJIT does: while a cycle sweeps, frees offset allocations, and counted
 * net, batched steps let cycles drag on over a heap grown large, whose cold
 * objects made each step up to twice as slow, from run to run
 * (docs/performance.md, "The collector between requests"). */
#include "internal.h"

#include <lauxlib.h>

#define STEP_BYTES 1024 /* LuaJIT's GCSTEPSIZE */
#define PAUSE      2    /* LuaJIT's default pause, 200% */

void lupin__collector_start(lupin_runtime *rt) {
  lupin_collector *c = &rt->collector;
  c->on = 1;
  c->in_cycle = 0;
  c->next = rt->alloc.used * PAUSE;
  lua_gc(rt->L, LUA_GCSTOP, 0);
}

void lupin_runtime_collect_step(lupin_runtime *rt) {
  lupin_collector *c = &rt->collector;
  if (!c->on) return;
  uint64_t allocated = rt->alloc.allocated;
  if (!c->in_cycle) {
    if (rt->alloc.used < c->next) {
      /* a full collection since (the memory limit's, a leak check's) set
       * LuaJIT's own threshold again */
      lua_gc(rt->L, LUA_GCSTOP, 0);
      return;
    }
    /* owed: a step for each KB past the threshold, the first starting it */
    uint64_t owed = rt->alloc.used - c->next + STEP_BYTES;
    c->in_cycle = 1;
    c->paced = allocated > owed ? allocated - owed : 0;
  }
  uint64_t steps = (allocated - c->paced) / STEP_BYTES;
  c->paced += steps * STEP_BYTES;
  if (steps) {
    double t0 = lupin_now();
    for (uint64_t i = 0; i < steps; i++) {
      if (lua_gc(rt->L, LUA_GCSTEP, 0)) { /* with 0: one step; 1: it ended the cycle */
        c->in_cycle = 0;
        c->next = rt->alloc.used * PAUSE;
        c->paced = allocated;
        c->cycles++;
        break;
      }
    }
    c->seconds += lupin_now() - t0;
  }
  lua_gc(rt->L, LUA_GCSTOP, 0); /* a step (or a full collection) set LuaJIT's threshold */
}
