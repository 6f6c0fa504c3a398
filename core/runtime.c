/* The runtime: one Lua state, its allocator, the hooks into the Lua side. */
#include "internal.h"

#include <lauxlib.h>
#include <luajit.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

#ifndef LUPIN_DEFAULT_HOME
#define LUPIN_DEFAULT_HOME "/usr/local/share/lupin"
#endif

static const char *const hook_names[LUPIN_HOOK_COUNT] = {
#define LUPIN_HOOK_NAME(id, name) name,
    LUPIN_HOOKS(LUPIN_HOOK_NAME)
#undef LUPIN_HOOK_NAME
};

const char *lupin_luajit_version(void) { return LUAJIT_VERSION; }

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void lupin__errf(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || !errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static void log_line(lupin_runtime *rt, int level, const char *msg) {
  if (level > rt->log_level) return;
  if (rt->log) {
    rt->log(rt->log_ud, level, msg);
    return;
  }
  fprintf(stderr, "lupin [%s] %s\n", level_names[level & 3], msg);
}

void lupin__log(lupin_runtime *rt, int level, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  log_line(rt, level, buf);
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

int lupin__push_hook(lupin_runtime *rt, enum lupin_hook hook) {
  lua_rawgeti(rt->L, LUA_REGISTRYINDEX, rt->hooks[hook]);
  return lua_gettop(rt->L);
}

int lupin__call(lupin_runtime *rt, int nargs, int nresults, char *err, size_t errlen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L) - nargs;
  /* made once at start: lua_pushcfunction would allocate a closure per call */
  lua_rawgeti(L, LUA_REGISTRYINDEX, rt->traceback);
  lua_insert(L, base);
  int rc = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (rc == 0) return 0;
  lupin__errf(err, errlen, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "unknown error");
  lua_pop(L, 1);
  return -1;
}

double lupin_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void push_options(lua_State *L, const lupin_options *o, const char *home) {
  lua_createtable(L, 0, 6);
  lua_pushstring(L, home);
  lua_setfield(L, -2, "home");
  lua_createtable(L, (int)o->n_plugin_dirs, 0);
  for (size_t i = 0; i < o->n_plugin_dirs; i++) {
    lua_pushstring(L, o->plugin_dirs[i]);
    lua_rawseti(L, -2, (int)i + 1);
  }
  lua_setfield(L, -2, "plugin_dirs");
  lua_pushnumber(L, (lua_Number)o->memory_limit);
  lua_setfield(L, -2, "memory_limit");
  lua_pushnumber(L, (lua_Number)(o->seed ? o->seed : (uint64_t)time(NULL)));
  lua_setfield(L, -2, "seed");
  lua_pushinteger(L, o->log_level);
  lua_setfield(L, -2, "log_level");
  lua_pushlightuserdata(L, (void *)lupin__abi());
  lua_setfield(L, -2, "abi");
  lupin__abi_push_enums(L, hook_names, LUPIN_HOOK_COUNT);
  lua_setfield(L, -2, "enums");
}

/* The module lupin.invoke, the engine's one way into a plugin:
 * invoke(handler, f, obj, ctx, x, y) is f(obj, ctx, x, y) under lua_pcall
 * with handler, as xpcall(f, handler, ...) would be, returning true and
 * three results or false and the error.  From C, not xpcall, so that no
 * trace of the engine runs on into plugin code: LuaJIT ends a trace at a C
 * function and goes on with a new one after it (trace stitching), where a
 * trace through xpcall met the plugin's loops, aborted, and after a few
 * aborts got the engine's functions blacklisted (docs/performance.md,
 * "Compiled paths"). */
static int invoke(lua_State *L) {
  lua_settop(L, 6);
  int status = lua_pcall(L, 4, 3, 1);
  lua_pushboolean(L, status == 0);
  lua_replace(L, 1);
  return status == 0 ? 4 : 2;
}

static int invoke_open(lua_State *L) {
  lua_pushcfunction(L, invoke);
  return 1;
}

/* Loads lua/lupin/runtime/init.lua and keeps references to its hooks. */
static int boot(lupin_runtime *rt, const lupin_options *o, const char *home, char *err,
                size_t errlen) {
  lua_State *L = rt->L;
  lua_getglobal(L, "package");
  lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua;", home, home);
  lua_getfield(L, -2, "path");
  lua_concat(L, 2);
  lua_setfield(L, -2, "path");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, lupin__json_open);
  lua_setfield(L, -2, "lupin.json.native");
  lua_pushcfunction(L, invoke_open);
  lua_setfield(L, -2, "lupin.invoke");
  lua_pushlightuserdata(L, &rt->budget);
  lua_pushcclosure(L, lupin__guard_open, 1);
  lua_setfield(L, -2, "lupin.guard.native");
  lua_pop(L, 2);

  lua_getglobal(L, "require");
  lua_pushstring(L, "lupin.runtime");
  if (lupin__call(rt, 1, 1, err, errlen)) return -1;
  lua_getfield(L, -1, "init");
  lua_pushlightuserdata(L, &rt->capi);
  push_options(L, o, home);
  if (lupin__call(rt, 2, 1, err, errlen)) return -1;
  for (int i = 0; i < LUPIN_HOOK_COUNT; i++) {
    lua_getfield(L, -1, hook_names[i]);
    if (!lua_isfunction(L, -1)) {
      lupin__errf(err, errlen, "lupin.runtime has no hook %s", hook_names[i]);
      return -1;
    }
    rt->hooks[i] = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_settop(L, 0);
  return 0;
}

/* LuaJIT frees its arena at close only when its own allocator is in place. */
static void close_state(lupin_runtime *rt) {
  lua_gc(rt->L, LUA_GCCOLLECT, 0); /* finalizers run while we still account */
  lua_setallocf(rt->L, rt->alloc.base, rt->alloc.base_ud);
  lupin_alloc_release_spares(&rt->alloc);
  lua_close(rt->L);
}

static void capi_log(lupin_runtime *rt, int level, const char *msg) { log_line(rt, level, msg); }

/* LUPIN_JIT_PROFILE=<jit.p mode> (e.g. "v", "Fl") runs LuaJIT's sampling
 * profiler over the runtime's whole life, the report written to
 * LUPIN_JIT_PROFILE_OUT (default /tmp/lupin.jitp) when it is freed;
 * LUPIN_JIT_LOG=<file> logs the traces compiled and aborted (jit.v): where
 * a host's Lua time goes, compiled or interpreted (docs/performance.md). */
static void jit_profile(lupin_runtime *rt, int start) {
  const char *log = getenv("LUPIN_JIT_LOG"); /* jit.v: traces and aborts */
  char code[1024], err[256];
  if (start && log && *log) {
    snprintf(code, sizeof code, "require('jit.v').start([==[%s]==]) return ''", log);
    free(lupin__eval(rt, code, err, sizeof err));
  }
  const char *mode = getenv("LUPIN_JIT_PROFILE");
  if (!mode || !*mode) return;
  const char *out = getenv("LUPIN_JIT_PROFILE_OUT");
  snprintf(code, sizeof code,
           start ? "require('jit.p').start([==[%s]==], [==[%s]==]) return ''"
                 : "require('jit.p').stop() return ''",
           mode, out && *out ? out : "/tmp/lupin.jitp");
  free(lupin__eval(rt, code, err, sizeof err));
}

/* A Lua state whose every block goes through the accounting allocator,
 * over the host's allocator or else LuaJIT's own.  With LuaJIT's, the state
 * is made first and its blocks so far counted: LuaJIT hands out its
 * allocator only from a state that uses it. */
static lua_State *new_state(lupin_alloc *a, const lupin_options *o) {
  if (o->allocator) {
    a->base = o->allocator;
    a->base_ud = o->allocator_ud;
    return lua_newstate(lupin_alloc_fn, a);
  }
  lua_State *L = luaL_newstate();
  if (!L) return NULL;
  a->base = lua_getallocf(L, &a->base_ud);
  a->used = a->peak = (size_t)lua_gc(L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(L, LUA_GCCOUNTB, 0);
  lua_setallocf(L, lupin_alloc_fn, a);
  return L;
}

lupin_runtime *lupin_runtime_new(const lupin_options *opts, char *err, size_t errlen) {
  static const lupin_options defaults = {.log_level = LUPIN_LOG_INFO};
  const lupin_options *o = opts ? opts : &defaults;
  lupin_runtime *rt = calloc(1, sizeof *rt);
  if (!rt) {
    lupin__errf(err, errlen, "out of memory");
    return NULL;
  }
  rt->alloc.limit = o->memory_limit;
  rt->log = o->log;
  rt->log_ud = o->log_ud;
  rt->log_level = o->log_level;
  rt->capi = (lupin_capi){rt,
                          &rt->alloc,
                          lupin_now,
                          capi_log,
                          lupin__endpoint_free,
                          lupin__result_add_pick,
                          lupin__request_count,
                          lupin__result_add_header,
                          lupin__client_add_header,
                          lupin__header_find,
                          lupin_block_hashes,
                          lupin_prefix_new,
                          lupin_prefix_free,
                          lupin_prefix_set_capacity,
                          lupin_prefix_record,
                          lupin_prefix_match,
                          lupin_prefix_purge,
                          lupin_prefix_count,
                          lupin_prefix_holds,
                          lupin_prefix_endpoints,
                          lupin_prefix_memory,
                          &rt->budget,
                          lupin_budget_poll,
                          &lupin__capi_shared,
                          lupin__request_timing,
                          lupin__request_prefill};
  /* Without a host's lupin_shared, a private one (one code path): endpoint
   * ids, counters, keyed prefix indexes and dicts behave alike, the indexes
   * with one shard (no cost for threads not there). */
  rt->shared = o->shared;
  if (!rt->shared) {
    rt->shared = rt->own_shared = lupin_shared_new(1, err, errlen);
    if (!rt->shared) {
      free(rt);
      return NULL;
    }
  }
  rt->L = new_state(&rt->alloc, o);
  if (!rt->L) {
    lupin__errf(err, errlen, "cannot create a Lua state");
    lupin_shared_free(rt->own_shared);
    free(rt);
    return NULL;
  }
  luaL_openlibs(rt->L);
  lua_pushcfunction(rt->L, traceback);
  rt->traceback = luaL_ref(rt->L, LUA_REGISTRYINDEX);
  const char *home = o->home ? o->home : getenv("LUPIN_HOME");
  if (!home || !*home) home = LUPIN_DEFAULT_HOME;
  if (lupin__budget_start(&rt->budget, err, errlen) || boot(rt, o, home, err, errlen)) {
    lupin__budget_stop(&rt->budget);
    close_state(rt);
    lupin_shared_free(rt->own_shared);
    free(rt);
    return NULL;
  }
  jit_profile(rt, 1);
  if (o->host_paces_collector) lupin__collector_start(rt);
  return rt;
}

/* xxh64 over the strings of the list at idx, in order. */
static uint64_t digest_of(lua_State *L, int idx) {
  XXH64_state_t *st = XXH64_createState();
  if (!st) return 0;
  XXH64_reset(st, 0);
  size_t n = lua_istable(L, idx) ? lua_objlen(L, idx) : 0;
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, (int)i);
    size_t len;
    const char *s = lua_tolstring(L, -1, &len);
    if (s) XXH64_update(st, s, len);
    lua_pop(L, 1);
  }
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

/* Builds a generation (the load hook: read, check, instantiate, dry cycle)
 * without installing it. */
static int build(lupin_runtime *rt, const char *text, const char *source, lupin_staged *out,
                 char *err, size_t errlen) {
  lua_State *L = rt->L;
  double t0 = lupin_now();
  lupin__push_hook(rt, LUPIN_HOOK_LOAD);
  lua_pushstring(L, text); /* NULL pushes nil: the hook reads path */
  lua_pushstring(L, source);
  lua_pushnumber(L, (lua_Number)(rt->generation_seq + 1));
  if (lupin__call(rt, 3, 3, err, errlen)) return -1;
  if (lua_isnil(L, -3)) {
    lupin__errf(err, errlen, "%s", lua_tostring(L, -2));
    lua_pop(L, 3);
    return -1;
  }
  out->flags = (int)lua_tointeger(L, -1);
  out->digest = digest_of(L, lua_gettop(L) - 1);
  lua_pop(L, 2);
  out->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  out->seconds = lupin_now() - t0;
  return 0;
}

/* Makes a built generation current, on both sides. */
static int install(lupin_runtime *rt, const lupin_staged *g, const char *source) {
  int ref = g->ref;
  if (lupin__generation_install(rt, ref, g->flags, source, g->digest, g->seconds)) return -1;
  lupin__push_hook(rt, LUPIN_HOOK_INSTALL);
  lua_rawgeti(rt->L, LUA_REGISTRYINDEX, ref);
  return lupin__call(rt, 1, 0, NULL, 0);
}

static int load(lupin_runtime *rt, const char *text, const char *source, char *err, size_t errlen) {
  lupin_staged g;
  if (build(rt, text, source, &g, err, errlen)) return -1;
  if (install(rt, &g, source)) {
    lupin__errf(err, errlen, "out of memory");
    return -1;
  }
  return 0;
}

int lupin_runtime_load(lupin_runtime *rt, const char *path, char *err, size_t errlen) {
  if (load(rt, NULL, path, err, errlen)) return -1;
  if (rt->config_path != path) {
    free(rt->config_path);
    rt->config_path = strdup(path);
  }
  return 0;
}

int lupin_runtime_load_string(lupin_runtime *rt, const char *json, const char *source, char *err,
                              size_t errlen) {
  return load(rt, json, source ? source : "(string)", err, errlen);
}

int lupin_runtime_reload(lupin_runtime *rt, char *err, size_t errlen) {
  if (!rt->config_path) {
    lupin__errf(err, errlen, "reload: no config file was loaded");
    return -1;
  }
  return lupin_runtime_load(rt, rt->config_path, err, errlen);
}

int lupin_runtime_stage(lupin_runtime *rt, char *err, size_t errlen) {
  lupin_runtime_abort(rt);
  if (!rt->config_path) {
    lupin__errf(err, errlen, "reload: no config file was loaded");
    return -1;
  }
  if (build(rt, NULL, rt->config_path, &rt->staged, err, errlen)) return -1;
  rt->has_staged = 1;
  return 0;
}

int lupin_runtime_commit(lupin_runtime *rt, char *err, size_t errlen) {
  if (!rt->has_staged) {
    lupin__errf(err, errlen, "commit: no generation is staged");
    return -1;
  }
  rt->has_staged = 0;
  if (install(rt, &rt->staged, rt->config_path)) {
    lupin__errf(err, errlen, "out of memory");
    return -1;
  }
  return 0;
}

/* The staged generation was never current: releasing it runs its plugins'
 * shutdown hooks, as for a generation that served. */
void lupin_runtime_abort(lupin_runtime *rt) {
  if (!rt->has_staged) return;
  rt->has_staged = 0;
  lupin__generation_drop(rt, rt->staged.ref);
}

void lupin_runtime_free(lupin_runtime *rt) {
  if (!rt) return;
  jit_profile(rt, 0);
  rt->dispatch = NULL; /* no callback while the requests are cancelled */
  lupin__requests_cancel_all(rt);
  lupin__requests_free_spares(rt);
  lupin_runtime_abort(rt);
  lupin__generation_free_all(rt);
  close_state(rt); /* runs the endpoints' finalizers: their slots are let go */
  lupin__budget_stop(&rt->budget);
  lupin_shared_free(rt->own_shared);
  free(rt->endpoints);
  free(rt->endpoint_names);
  free(rt->config_path);
  free(rt);
}

static uint64_t field_u64(lua_State *L, int idx, const char *name) {
  lua_getfield(L, idx, name);
  uint64_t v = (uint64_t)lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

void lupin_runtime_stats(lupin_runtime *rt, lupin_stats *out) {
  memset(out, 0, sizeof *out);
  out->requests_begun = rt->requests_begun;
  out->requests_ended = rt->requests_ended;
  out->live_requests = rt->requests_begun - rt->requests_ended;
  out->lua_memory = rt->alloc.used;
  out->lua_memory_peak = rt->alloc.peak;
  out->memory_limit_hits = rt->alloc.refused;
  out->endpoints = rt->n_endpoints;
  out->collector_cycles = rt->collector.cycles;
  out->collector_ns = (uint64_t)(rt->collector.seconds * 1e9);
  for (lupin_generation *g = rt->generations; g; g = g->next) {
    out->generations_alive++;
    if (g->current) out->generation = g->number;
  }
  lupin__push_hook(rt, LUPIN_HOOK_STATS);
  if (lupin__call(rt, 0, 1, NULL, 0) == 0) {
    out->live_request_tables = field_u64(rt->L, -1, "live_request_tables");
    lua_pop(rt->L, 1);
  }
}

void lupin_runtime_plugin_stats(lupin_runtime *rt, lupin_plugin_stat_fn fn, void *ud) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_PLUGIN_STATS);
  if (lupin__call(rt, 0, 1, NULL, 0)) return;
  size_t n = lua_objlen(L, -1);
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, (int)i);
    int t = lua_gettop(L);
    lua_getfield(L, t, "plugin");
    lua_getfield(L, t, "type");
    lua_getfield(L, t, "point");
    lua_getfield(L, t, "epp_point");
    lupin_plugin_stat s = {.plugin = lua_tostring(L, t + 1),
                           .type = lua_tostring(L, t + 2),
                           .point = lua_tostring(L, t + 3),
                           .epp_point = lua_tostring(L, t + 4),
                           .calls = field_u64(L, t, "calls"),
                           .errors = field_u64(L, t, "errors"),
                           .nanoseconds = field_u64(L, t, "ns"),
                           .cuts = field_u64(L, t, "cuts"),
                           .disabled = field_u64(L, t, "disabled") != 0};
    lua_getfield(L, t, "buckets");
    for (int k = 0; k <= LUPIN_PLUGIN_BUCKETS && lua_istable(L, -1); k++) {
      lua_rawgeti(L, -1, k + 1);
      s.buckets[k] = (uint64_t)lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
    fn(ud, &s);
    lua_settop(L, t - 1);
  }
  lua_pop(L, 1);
}

int lupin_runtime_check_leaks(lupin_runtime *rt, char *report, size_t len) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_CHECK_LEAKS);
  if (lupin__call(rt, 0, 2, report, len)) return -1;
  int n = (int)lua_tonumber(L, -2);
  lupin__errf(report, len, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
  lua_pop(L, 2);
  if (rt->collector.on) lupin__collector_start(rt); /* its full collections set LuaJIT's pace */
  return n;
}

char *lupin__eval(lupin_runtime *rt, const char *code, char *err, size_t errlen) {
  lupin__push_hook(rt, LUPIN_HOOK_EVAL);
  lua_pushstring(rt->L, code);
  if (lupin__call(rt, 1, 1, err, errlen)) return NULL;
  char *out = strdup(lua_tostring(rt->L, -1) ? lua_tostring(rt->L, -1) : "");
  lua_pop(rt->L, 1);
  return out;
}

void lupin_runtime_collect(lupin_runtime *rt) {
  lua_gc(rt->L, LUA_GCCOLLECT, 0);
  if (rt->collector.on) lupin__collector_start(rt); /* paced afresh from the heap left */
}
