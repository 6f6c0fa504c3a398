/* Generations: one loaded config each.  Requests pin the generation current at
 * their begin; a generation that is no longer current is released (its
 * plugins' shutdown hooks run) when its last pinned request ends. */
#include "internal.h"

#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

lupin_generation *lupin__generation_current(lupin_runtime *rt) {
  lupin_generation *g = rt->generations;
  return g && g->current ? g : NULL;
}

static void release_ref(lupin_runtime *rt, int ref, uint64_t number) {
  char err[512];
  lupin__push_hook(rt, LUPIN_HOOK_RELEASE);
  lua_rawgeti(rt->L, LUA_REGISTRYINDEX, ref);
  if (lupin__call(rt, 1, 0, err, sizeof err))
    lupin__log(rt, LUPIN_LOG_ERROR, "releasing generation %llu: %s", (unsigned long long)number,
               err);
  luaL_unref(rt->L, LUA_REGISTRYINDEX, ref);
}

static void release(lupin_runtime *rt, lupin_generation *g) {
  lupin_generation **p = &rt->generations;
  while (*p != g)
    p = &(*p)->next;
  *p = g->next;
  release_ref(rt, g->ref, g->number);
  free(g->source);
  free(g);
}

void lupin__generation_drop(lupin_runtime *rt, int ref) {
  release_ref(rt, ref, rt->generation_seq + 1);
}

int lupin__generation_install(lupin_runtime *rt, int ref, int flags, const char *source,
                              uint64_t digest, double load_seconds) {
  lupin_generation *g = calloc(1, sizeof *g);
  if (g && !(g->source = strdup(source ? source : ""))) {
    free(g);
    g = NULL;
  }
  if (!g) {
    luaL_unref(rt->L, LUA_REGISTRYINDEX, ref);
    return -1;
  }
  lupin_generation *old = lupin__generation_current(rt);
  g->number = ++rt->generation_seq;
  g->ref = ref;
  g->flags = flags;
  g->current = 1;
  g->loaded_at = lupin_now();
  struct timeval tv;
  gettimeofday(&tv, NULL);
  g->loaded_unix = (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
  g->load_seconds = load_seconds;
  snprintf(g->digest, sizeof g->digest, "%016llx", (unsigned long long)digest);
  g->next = rt->generations;
  rt->generations = g;
  if (old) {
    old->current = 0;
    if (old->pinned == 0) release(rt, old);
  }
  return 0;
}

void lupin__generation_unpin(lupin_runtime *rt, lupin_generation *g) {
  if (--g->pinned == 0 && !g->current) release(rt, g);
}

void lupin__generation_free_all(lupin_runtime *rt) {
  while (rt->generations)
    release(rt, rt->generations);
}

void lupin_runtime_generations(lupin_runtime *rt, lupin_generation_fn fn, void *ud) {
  for (lupin_generation *g = rt->generations; g; g = g->next) {
    lupin_generation_info info = {g->number, g->loaded_at, g->loaded_unix, g->load_seconds,
                                  g->source, g->digest,    g->pinned,      g->current};
    fn(ud, &info);
  }
}
