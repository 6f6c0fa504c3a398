/* lupin_native: the embedding API as a Lua C module, so busted specs drive a
 * real runtime (its own Lua state) through the same calls a host makes. */
#include "internal.h"

#include <inttypes.h>
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RT_MT     "lupin_native.runtime"
#define REQ_MT    "lupin_native.request"
#define SHARED_MT "lupin_native.shared"

/* Each runtime made with it holds a reference to it; still, at lua_close
 * every finalizer runs, in no order a reference sets: freed by whichever
 * comes last, its finalizer or the last runtime's. */
typedef struct {
  lupin_shared *shared;
  int runtimes, collected;
  /* records heard by its hook (shared:watch_records()): lines of
   * "key\tendpoint\thash,hash,...\n", hashes in hex */
  char *heard;
  size_t heard_len;
} shared_box;

static void shared_release(shared_box *sb) {
  if (sb->collected && sb->runtimes == 0 && sb->shared) {
    lupin_shared_free(sb->shared);
    sb->shared = NULL;
    free(sb->heard);
    sb->heard = NULL;
  }
}

typedef struct {
  lupin_runtime *rt;
  int logs_ref;       /* a table collecting log lines, in the caller's state */
  shared_box *shared; /* the one it was made with, NULL: its own */
  int shared_ref;
  lua_State *L;
  int dispatch_ref; /* rt:set_dispatch's function, LUA_NOREF: none */
  int evict_ref;    /* rt:set_evict's function, LUA_NOREF: none */
} runtime_box;

typedef struct {
  lupin_request *req;
  runtime_box *box;
} request_box;

static const char *const outcomes[] = {
    "ok",      "rejected",        "no_endpoint", "plugin_error", "upstream_error", "cancelled",
    "timeout", "invalid_request", "queue_ttl",   "queue_full",   "shed",           "evicted",
    NULL};

static runtime_box *check_rt(lua_State *L) {
  runtime_box *b = luaL_checkudata(L, 1, RT_MT);
  if (!b->rt) luaL_error(L, "runtime already freed");
  return b;
}

static request_box *check_req(lua_State *L) {
  request_box *b = luaL_checkudata(L, 1, REQ_MT);
  if (!b->req) luaL_error(L, "request already ended");
  if (!b->box->rt) luaL_error(L, "its runtime was freed");
  return b;
}

static int fail(lua_State *L, const char *err) {
  lua_pushnil(L);
  lua_pushstring(L, err);
  return 2;
}

/* Log lines go into a table of the calling state: {level, message} pairs. */
static void collect_log(void *ud, int level, const char *msg) {
  runtime_box *b = ud;
  lua_State *L = b->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->logs_ref);
  size_t n = lua_objlen(L, -1);
  lua_createtable(L, 2, 0);
  lua_pushinteger(L, level);
  lua_rawseti(L, -2, 1);
  lua_pushstring(L, msg);
  lua_rawseti(L, -2, 2);
  lua_rawseti(L, -2, (int)n + 1);
  lua_pop(L, 1);
}

static const char *opt_string(lua_State *L, int t, const char *k) {
  lua_getfield(L, t, k);
  const char *s = lua_tostring(L, -1);
  lua_pop(L, 1); /* the string stays anchored in the options table */
  return s;
}

static lua_Number opt_number(lua_State *L, int t, const char *k, lua_Number def) {
  lua_getfield(L, t, k);
  lua_Number v = lua_isnumber(L, -1) ? lua_tonumber(L, -1) : def;
  lua_pop(L, 1);
  return v;
}

/* native.shared([threads]): state for several runtimes (lupin_shared; 4
 * threads unless told: prefix indexes in 8 stripes), freed by the GC once no
 * runtime made with it is left (each keeps a reference). */
static int l_shared(lua_State *L) {
  unsigned threads = (unsigned)luaL_optinteger(L, 1, 4);
  shared_box *b = lua_newuserdata(L, sizeof *b);
  memset(b, 0, sizeof *b);
  luaL_getmetatable(L, SHARED_MT);
  lua_setmetatable(L, -2);
  char err[256];
  if (!(b->shared = lupin_shared_new(threads, err, sizeof err))) return fail(L, err);
  return 1;
}

static int l_shared_gc(lua_State *L) {
  shared_box *b = luaL_checkudata(L, 1, SHARED_MT);
  b->collected = 1;
  shared_release(b);
  return 0;
}

/* Slots in its endpoint registry (endpoints some runtime holds an object of). */
static int l_shared_endpoints(lua_State *L) {
  shared_box *b = luaL_checkudata(L, 1, SHARED_MT);
  lua_pushinteger(L, (lua_Integer)lupin__shared_endpoints(b->shared));
  return 1;
}

/* The hook of shared:watch_records(): appends the record as a line. */
static void heard_record(void *ud, const char *key, const char *endpoint, const uint64_t *hashes,
                         size_t n) {
  shared_box *b = ud;
  size_t need = b->heard_len + strlen(key) + strlen(endpoint) + n * 17 + 4;
  char *p = realloc(b->heard, need);
  if (!p) return;
  b->heard = p;
  b->heard_len += (size_t)sprintf(p + b->heard_len, "%s\t%s\t", key, endpoint);
  for (size_t i = 0; i < n; i++)
    b->heard_len += (size_t)sprintf(p + b->heard_len, "%s%" PRIx64, i ? "," : "", hashes[i]);
  p[b->heard_len++] = '\n';
}

/* shared:watch_records(on): hooks lupin_shared_on_prefix_record */
static int l_shared_watch(lua_State *L) {
  shared_box *b = luaL_checkudata(L, 1, SHARED_MT);
  lupin_shared_on_prefix_record(b->shared, lua_toboolean(L, 2) ? heard_record : NULL, b);
  return 0;
}

/* shared:heard(): the records heard since the last call, as text lines */
static int l_shared_heard(lua_State *L) {
  shared_box *b = luaL_checkudata(L, 1, SHARED_MT);
  lua_pushlstring(L, b->heard ? b->heard : "", b->heard_len);
  b->heard_len = 0;
  return 1;
}

/* shared:prefix_apply(key, endpoint, {"hex", ...}): lupin_shared_prefix_apply */
static int l_shared_apply(lua_State *L) {
  shared_box *b = luaL_checkudata(L, 1, SHARED_MT);
  const char *key = lua_tostring(L, 2), *endpoint = lua_tostring(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  size_t n = lua_objlen(L, 4);
  uint64_t *h = malloc((n ? n : 1) * sizeof *h);
  if (!h) return luaL_error(L, "out of memory");
  for (size_t i = 0; i < n; i++) {
    lua_rawgeti(L, 4, (int)i + 1);
    h[i] = strtoull(lua_tostring(L, -1) ? lua_tostring(L, -1) : "0", NULL, 16);
    lua_pop(L, 1);
  }
  int rc = lupin_shared_prefix_apply(b->shared, key, endpoint, h, n);
  free(h);
  lua_pushinteger(L, rc);
  return 1;
}

/* native.new{home=, plugin_dirs={...}, memory_limit=, seed=, log_level=,
 * shared=native.shared(), host_paces_collector=true} */
static int l_new(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lupin_options o = {0};
  lua_getfield(L, 1, "shared");
  shared_box *sb = lua_isnil(L, -1) ? NULL : luaL_checkudata(L, -1, SHARED_MT);
  lua_pop(L, 1);
  o.shared = sb ? sb->shared : NULL;
  o.home = opt_string(L, 1, "home");
  o.memory_limit = (size_t)opt_number(L, 1, "memory_limit", 0);
  o.seed = (uint64_t)opt_number(L, 1, "seed", 1);
  o.log_level = (int)opt_number(L, 1, "log_level", LUPIN_LOG_DEBUG);
  lua_getfield(L, 1, "host_paces_collector");
  o.host_paces_collector = lua_toboolean(L, -1);
  lua_pop(L, 1);
  const char *dirs[16];
  lua_getfield(L, 1, "plugin_dirs");
  if (lua_istable(L, -1)) {
    for (size_t i = 0; i < lua_objlen(L, -1) && i < 16; i++) {
      lua_rawgeti(L, -1, (int)i + 1);
      dirs[o.n_plugin_dirs++] = lua_tostring(L, -1);
      lua_pop(L, 1);
    }
  }
  o.plugin_dirs = dirs;

  runtime_box *b = lua_newuserdata(L, sizeof *b);
  memset(b, 0, sizeof *b);
  luaL_getmetatable(L, RT_MT);
  lua_setmetatable(L, -2);
  lua_newtable(L);
  b->logs_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  b->L = L;
  b->dispatch_ref = LUA_NOREF;
  b->evict_ref = LUA_NOREF;
  o.log = collect_log;
  o.log_ud = b;
  char err[1024];
  b->rt = lupin_runtime_new(&o, err, sizeof err);
  if (!b->rt) return fail(L, err);
  if (sb) {
    b->shared = sb;
    sb->runtimes++;
    lua_getfield(L, 1, "shared");
    b->shared_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return 1;
}

static int l_free(lua_State *L) {
  runtime_box *b = luaL_checkudata(L, 1, RT_MT);
  if (b->rt) {
    lupin_runtime_free(b->rt);
    b->rt = NULL;
    if (b->shared) {
      b->shared->runtimes--;
      shared_release(b->shared);
      luaL_unref(L, LUA_REGISTRYINDEX, b->shared_ref);
    }
    luaL_unref(L, LUA_REGISTRYINDEX, b->logs_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, b->dispatch_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, b->evict_ref);
  }
  return 0;
}

static int l_load(lua_State *L) {
  runtime_box *b = check_rt(L);
  char err[2048];
  if (lupin_runtime_load(b->rt, luaL_checkstring(L, 2), err, sizeof err)) return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_load_string(lua_State *L) {
  runtime_box *b = check_rt(L);
  char err[2048];
  if (lupin_runtime_load_string(b->rt, luaL_checkstring(L, 2), luaL_optstring(L, 3, NULL), err,
                                sizeof err))
    return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* rt:declare_section(name, { {name=, default=, min=, max=}, ... }) */
static int l_declare_section(lua_State *L) {
  runtime_box *b = check_rt(L);
  const char *name = luaL_checkstring(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  lupin_setting s[64];
  size_t n = 0;
  for (; n < lua_objlen(L, 3) && n < 64; n++) {
    lua_rawgeti(L, 3, (int)n + 1);
    int t = lua_gettop(L);
    lua_getfield(L, t, "name");
    lua_getfield(L, t, "default");
    lua_getfield(L, t, "min");
    lua_getfield(L, t, "max");
    lua_getfield(L, t, "text");
    lua_getfield(L, t, "pattern");
    lua_getfield(L, t, "what");
    s[n] =
        (lupin_setting){lua_tostring(L, t + 1),
                        lua_tonumber(L, t + 2),
                        lua_tonumber(L, t + 3),
                        lua_isnil(L, t + 4) ? -1 - lua_tonumber(L, t + 3) : lua_tonumber(L, t + 4),
                        lua_tostring(L, t + 5),
                        lua_tostring(L, t + 6),
                        lua_tostring(L, t + 7)};
    lua_pop(L, 7); /* the setting table stays: it anchors the strings */
  }
  char err[1024];
  int rc = lupin_runtime_declare_section(b->rt, name, s, n, err, sizeof err);
  if (rc) return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* A lupin_metric_spec as "name{k=v,...}" (legacy after a "|"), or nil. */
static void push_spec(lua_State *L, const lupin_metric_spec *sp) {
  if (!sp->name) {
    lua_pushnil(L);
    return;
  }
  luaL_Buffer buf;
  luaL_buffinit(L, &buf);
  luaL_addstring(&buf, sp->name);
  for (size_t i = 0; i < sp->n_labels; i++) {
    luaL_addstring(&buf, i ? "," : "{");
    luaL_addstring(&buf, sp->labels[i].name);
    luaL_addchar(&buf, '=');
    luaL_addstring(&buf, sp->labels[i].value);
  }
  if (sp->n_labels) luaL_addchar(&buf, '}');
  if (sp->legacy) {
    luaL_addchar(&buf, '|');
    luaL_addstring(&buf, sp->legacy);
  }
  luaL_pushresult(&buf);
}

/* rt:metric_source(endpoint): lupin_runtime_metric_source as a table */
static int l_metric_source(lua_State *L) {
  runtime_box *b = check_rt(L);
  lupin_metric_source s;
  if (lupin_runtime_metric_source(b->rt, luaL_checkstring(L, 2), &s)) return fail(L, "no config");
  lua_createtable(L, 0, 12);
  lua_pushstring(L, s.engine);
  lua_setfield(L, -2, "engine");
  lua_pushstring(L, s.path);
  lua_setfield(L, -2, "path");
  lua_pushstring(L, s.block_size_label);
  lua_setfield(L, -2, "block_size_label");
  lua_pushstring(L, s.num_blocks_label);
  lua_setfield(L, -2, "num_blocks_label");
  const lupin_metric_spec *specs[] = {&s.queue,      &s.running,    &s.kv_usage,  &s.lora,
                                      &s.cache_info, &s.block_size, &s.num_blocks};
  const char *names[] = {"queue",      "running",    "kv_usage",  "lora",
                         "cache_info", "block_size", "num_blocks"};
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
    push_spec(L, specs[i]);
    lua_setfield(L, -2, names[i]);
  }
  return 1;
}

/* rt:section(name, n): the current generation's values, a list */
static int l_section(lua_State *L) {
  runtime_box *b = check_rt(L);
  double v[64];
  size_t n = (size_t)luaL_checkinteger(L, 3);
  if (n > 64) n = 64;
  if (lupin_runtime_section(b->rt, luaL_checkstring(L, 2), v, n)) return fail(L, "no such section");
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushnumber(L, v[i]);
    lua_rawseti(L, -2, (int)i + 1);
  }
  return 1;
}

/* rt:section_text(section, name): a string setting's value */
static int l_section_text(lua_State *L) {
  runtime_box *b = check_rt(L);
  char v[4096];
  if (lupin_runtime_section_text(b->rt, luaL_checkstring(L, 2), luaL_checkstring(L, 3), v,
                                 sizeof v))
    return fail(L, "no such string setting");
  lua_pushstring(L, v);
  return 1;
}

static void push_endpoint_desc(void *ud, const lupin_endpoint_desc *d) {
  lua_State *L = ud;
  lua_createtable(L, 0, 4);
  lua_pushstring(L, d->name);
  lua_setfield(L, -2, "name");
  lua_pushstring(L, d->address);
  lua_setfield(L, -2, "address");
  lua_pushinteger(L, d->port);
  lua_setfield(L, -2, "port");
  lua_createtable(L, 0, (int)d->n_labels);
  for (size_t i = 0; i < d->n_labels; i++) {
    lua_pushstring(L, d->labels[i].value);
    lua_setfield(L, -2, d->labels[i].name);
  }
  lua_setfield(L, -2, "labels");
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
}

/* rt:read_endpoints([file]): the config's or the file's endpoints */
static int l_read_endpoints(lua_State *L) {
  runtime_box *b = check_rt(L);
  const char *file = luaL_optstring(L, 2, NULL);
  char err[2048];
  lua_newtable(L);
  if (lupin_runtime_read_endpoints(b->rt, file, push_endpoint_desc, L, err, sizeof err))
    return fail(L, err);
  return 1;
}

static int l_dry_run(lua_State *L) {
  runtime_box *b = check_rt(L);
  char err[2048];
  if (lupin_runtime_dry_run(b->rt, err, sizeof err)) return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_reload(lua_State *L) {
  runtime_box *b = check_rt(L);
  char err[2048];
  if (lupin_runtime_reload(b->rt, err, sizeof err)) return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

/* The staged reload: rt:stage(), rt:commit() (true, or nil and the error),
 * rt:abort(). */
static int l_stage(lua_State *L) {
  runtime_box *b = check_rt(L);
  char err[2048];
  if (lupin_runtime_stage(b->rt, err, sizeof err)) return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_commit(lua_State *L) {
  runtime_box *b = check_rt(L);
  char err[2048];
  if (lupin_runtime_commit(b->rt, err, sizeof err)) return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_abort(lua_State *L) {
  lupin_runtime_abort(check_rt(L)->rt);
  return 0;
}

/* Reads t[k] = {name=value,...} into a header array; returns its length. */
static size_t read_pairs(lua_State *L, int t, const char *k, lupin_header *out, size_t max) {
  size_t n = 0;
  lua_getfield(L, t, k);
  if (lua_istable(L, -1)) {
    lua_pushnil(L);
    while (n < max && lua_next(L, -2)) {
      out[n].name = lua_tostring(L, -2);
      out[n].value = lua_tostring(L, -1);
      n++;
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  return n;
}

static int l_upsert(lua_State *L) {
  runtime_box *b = check_rt(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  lupin_header labels[64];
  lupin_endpoint_desc d = {opt_string(L, 2, "name"), opt_string(L, 2, "address"),
                           (int)opt_number(L, 2, "port", 0), labels, 0};
  d.n_labels = read_pairs(L, 2, "labels", labels, 64);
  char err[512];
  if (lupin_endpoint_upsert(b->rt, &d, err, sizeof err)) return fail(L, err);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_remove(lua_State *L) {
  runtime_box *b = check_rt(L);
  lua_pushboolean(L, lupin_endpoint_remove(b->rt, luaL_checkstring(L, 2)) == 0);
  return 1;
}

static int l_set_metrics(lua_State *L) {
  runtime_box *b = check_rt(L);
  luaL_checktype(L, 3, LUA_TTABLE);
  lupin_metrics m = {
      opt_number(L, 3, "waiting_queue_size", 0), opt_number(L, 3, "running_requests", 0),
      opt_number(L, 3, "kv_cache_usage", 0),     opt_string(L, 3, "running_lora_adapters"),
      opt_string(L, 3, "waiting_lora_adapters"), opt_number(L, 3, "max_lora", 0),
      opt_number(L, 3, "cache_block_size", 0),   opt_number(L, 3, "num_blocks", 0),
      opt_number(L, 3, "scraped_at", 0),
  };
  lua_pushboolean(L, lupin_endpoint_set_metrics(b->rt, luaL_checkstring(L, 2), &m) == 0);
  return 1;
}

static int l_set_healthy(lua_State *L) {
  runtime_box *b = check_rt(L);
  int ok = lupin_endpoint_set_healthy(b->rt, luaL_checkstring(L, 2), lua_toboolean(L, 3)) == 0;
  lua_pushboolean(L, ok);
  return 1;
}

static int l_collect(lua_State *L) {
  lupin_runtime_collect(check_rt(L)->rt);
  return 0;
}

static int l_collect_step(lua_State *L) {
  lupin_runtime_collect_step(check_rt(L)->rt);
  return 0;
}

#define SET_NUM(field) (lua_pushnumber(L, (lua_Number)s.field), lua_setfield(L, -2, #field))

static int l_stats(lua_State *L) {
  runtime_box *b = check_rt(L);
  lupin_stats s;
  lupin_runtime_stats(b->rt, &s);
  lua_newtable(L);
  SET_NUM(requests_begun);
  SET_NUM(requests_ended);
  SET_NUM(live_requests);
  SET_NUM(live_request_tables);
  SET_NUM(lua_memory);
  SET_NUM(lua_memory_peak);
  SET_NUM(memory_limit_hits);
  SET_NUM(generations_alive);
  SET_NUM(generation);
  SET_NUM(endpoints);
  SET_NUM(collector_cycles);
  SET_NUM(collector_ns);
  return 1;
}

static void push_plugin_stat(void *ud, const lupin_plugin_stat *st) {
  lua_State *L = ud;
  lua_createtable(L, 0, 8);
  lua_pushstring(L, st->plugin);
  lua_setfield(L, -2, "plugin");
  lua_pushstring(L, st->type);
  lua_setfield(L, -2, "type");
  lua_pushstring(L, st->point);
  lua_setfield(L, -2, "point");
  lua_pushstring(L, st->epp_point);
  lua_setfield(L, -2, "epp_point");
  lua_pushnumber(L, (lua_Number)st->calls);
  lua_setfield(L, -2, "calls");
  lua_pushnumber(L, (lua_Number)st->errors);
  lua_setfield(L, -2, "errors");
  lua_pushnumber(L, (lua_Number)st->nanoseconds);
  lua_setfield(L, -2, "nanoseconds");
  lua_pushnumber(L, (lua_Number)st->cuts);
  lua_setfield(L, -2, "cuts");
  lua_pushboolean(L, st->disabled);
  lua_setfield(L, -2, "disabled");
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
}

static void push_route(void *ud, const char *path) {
  lua_State *L = ud;
  lua_pushstring(L, path);
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
}

/* rt:routes() -> { "/classify", ... } (lupin_runtime_routes) */
static int l_routes(lua_State *L) {
  runtime_box *b = check_rt(L);
  lua_newtable(L);
  lupin_runtime_routes(b->rt, push_route, L);
  return 1;
}

static int l_plugin_stats(lua_State *L) {
  runtime_box *b = check_rt(L);
  lua_newtable(L);
  lupin_runtime_plugin_stats(b->rt, push_plugin_stat, L);
  return 1;
}

static void push_generation(void *ud, const lupin_generation_info *g) {
  lua_State *L = ud;
  lua_createtable(L, 0, 8);
  lua_pushnumber(L, (lua_Number)g->number);
  lua_setfield(L, -2, "number");
  lua_pushnumber(L, g->loaded_at);
  lua_setfield(L, -2, "loaded_at");
  lua_pushnumber(L, g->loaded_unix);
  lua_setfield(L, -2, "loaded_unix");
  lua_pushnumber(L, g->load_seconds);
  lua_setfield(L, -2, "load_seconds");
  lua_pushstring(L, g->source);
  lua_setfield(L, -2, "source");
  lua_pushstring(L, g->digest);
  lua_setfield(L, -2, "digest");
  lua_pushnumber(L, (lua_Number)g->pinned);
  lua_setfield(L, -2, "pinned");
  lua_pushboolean(L, g->current);
  lua_setfield(L, -2, "current");
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
}

static int l_generations(lua_State *L) {
  runtime_box *b = check_rt(L);
  lua_newtable(L);
  lupin_runtime_generations(b->rt, push_generation, L);
  return 1;
}

static int l_check_leaks(lua_State *L) {
  runtime_box *b = check_rt(L);
  char report[8192];
  int n = lupin_runtime_check_leaks(b->rt, report, sizeof report);
  lua_pushinteger(L, n);
  lua_pushstring(L, report);
  return 2;
}

static int l_eval(lua_State *L) {
  runtime_box *b = check_rt(L);
  char err[2048];
  char *out = lupin__eval(b->rt, luaL_checkstring(L, 2), err, sizeof err);
  if (!out) return luaL_error(L, "eval: %s", err);
  lua_pushstring(L, out);
  free(out);
  return 1;
}

/* Returns the collected log lines and starts a new collection. */
static int l_logs(lua_State *L) {
  runtime_box *b = check_rt(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->logs_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, b->logs_ref);
  lua_newtable(L);
  b->logs_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

/* rt:begin{id=, path=, body=, model=, headers={}, subset={}, explain=, dry_run=} */
static int l_begin(lua_State *L) {
  runtime_box *b = check_rt(L);
  luaL_checktype(L, 2, LUA_TTABLE);
  lupin_header headers[64];
  const char *subset[64];
  lupin_request_desc d = {0};
  d.id = opt_string(L, 2, "id");
  d.path = opt_string(L, 2, "path");
  d.model = opt_string(L, 2, "model");
  lua_getfield(L, 2, "check_body");
  d.check_body = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, 2, "body");
  d.body = lua_tolstring(L, -1, &d.body_len);
  lua_pop(L, 1);
  d.headers = headers;
  d.n_headers = read_pairs(L, 2, "headers", headers, 64);
  lua_getfield(L, 2, "explain");
  lua_getfield(L, 2, "dry_run");
  d.flags = (lua_toboolean(L, -2) ? LUPIN_REQUEST_EXPLAIN : 0u) |
            (lua_toboolean(L, -1) ? LUPIN_REQUEST_DRY_RUN : 0u);
  lua_pop(L, 2);
  lua_getfield(L, 2, "subset");
  if (lua_istable(L, -1)) {
    d.subset = subset;
    for (; d.n_subset < lua_objlen(L, -1) && d.n_subset < 64; d.n_subset++) {
      lua_rawgeti(L, -1, (int)d.n_subset + 1);
      subset[d.n_subset] = lua_tostring(L, -1);
      lua_pop(L, 1); /* anchored in the subset table */
    }
  }
  char err[1024];
  lupin_request *req = lupin_request_begin(b->rt, &d, err, sizeof err);
  lua_pop(L, 1);
  if (!req) return fail(L, err);
  request_box *rb = lua_newuserdata(L, sizeof *rb);
  rb->req = req;
  rb->box = b;
  luaL_getmetatable(L, REQ_MT);
  lua_setmetatable(L, -2);
  /* keep the runtime's userdata alive as long as the request's */
  lua_pushvalue(L, 1);
  lua_createtable(L, 1, 0);
  lua_insert(L, -2);
  lua_rawseti(L, -2, 1);
  lua_setfenv(L, -2);
  return 1;
}

static int l_req_id(lua_State *L) {
  lua_pushstring(L, lupin_request_id(check_req(L)->req));
  return 1;
}

static int l_req_model(lua_State *L) {
  const lupin_request *req = check_req(L)->req;
  lua_pushstring(L, lupin_request_model(req)); /* NULL pushes nil */
  lua_pushboolean(L, lupin_request_stream(req));
  return 2;
}

static void push_result(lua_State *L, const lupin_result *res) {
  lupin_result r = *res;
  lua_createtable(L, 0, 5);
  lua_pushinteger(L, r.status);
  lua_setfield(L, -2, "status");
  if (r.message) {
    lua_pushstring(L, r.message);
    lua_setfield(L, -2, "message");
  }
  if (r.plugin) {
    lua_pushstring(L, r.plugin);
    lua_setfield(L, -2, "plugin");
  }
  if (r.param) {
    lua_pushstring(L, r.param);
    lua_setfield(L, -2, "param");
  }
  lua_pushstring(L, lupin_outcome_name((lupin_outcome)r.outcome));
  lua_setfield(L, -2, "outcome");
  lua_createtable(L, (int)r.n_picks, 0);
  for (size_t i = 0; i < r.n_picks; i++) {
    lua_createtable(L, 0, 3);
    lua_pushstring(L, r.picks[i].name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, r.picks[i].address);
    lua_setfield(L, -2, "address");
    lua_pushinteger(L, r.picks[i].port);
    lua_setfield(L, -2, "port");
    lua_rawseti(L, -2, (int)i + 1);
  }
  lua_setfield(L, -2, "picks");
  lua_createtable(L, 0, (int)r.n_headers);
  for (size_t i = 0; i < r.n_headers; i++) {
    lua_pushstring(L, r.headers[i].value);
    lua_setfield(L, -2, r.headers[i].name);
  }
  lua_setfield(L, -2, "headers");
}

static int l_schedule(lua_State *L) {
  request_box *rb = check_req(L);
  lupin_result r;
  lupin_request_schedule(rb->req, &r);
  push_result(L, &r);
  return 1;
}

/* The dispatch callback: the spec's function gets the request's id and its
 * final result. */
static void on_dispatch(void *ud, lupin_request *req, const lupin_result *res) {
  runtime_box *b = ud;
  lua_State *L = b->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->dispatch_ref);
  lua_pushstring(L, lupin_request_id(req));
  push_result(L, res);
  if (lua_pcall(L, 2, 0, 0)) {
    fprintf(stderr, "dispatch callback: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

/* rt:set_dispatch(fn | nil) */
static int l_set_dispatch(lua_State *L) {
  runtime_box *b = check_rt(L);
  luaL_unref(L, LUA_REGISTRYINDEX, b->dispatch_ref);
  b->dispatch_ref = LUA_NOREF;
  if (lua_isfunction(L, 2)) {
    lua_pushvalue(L, 2);
    b->dispatch_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lupin_runtime_set_dispatch(b->rt, on_dispatch, b);
  } else {
    lupin_runtime_set_dispatch(b->rt, NULL, NULL);
  }
  return 0;
}

/* The eviction callback: the spec's function gets the request's id and
 * the message (it ends the request itself, as a host does). */
static void on_evict(void *ud, lupin_request *req, const char *message) {
  runtime_box *b = ud;
  lua_State *L = b->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, b->evict_ref);
  lua_pushstring(L, lupin_request_id(req));
  lua_pushstring(L, message);
  if (lua_pcall(L, 2, 0, 0)) {
    fprintf(stderr, "evict callback: %s\n", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
}

/* rt:set_evict(fn | nil) */
static int l_set_evict(lua_State *L) {
  runtime_box *b = check_rt(L);
  luaL_unref(L, LUA_REGISTRYINDEX, b->evict_ref);
  b->evict_ref = LUA_NOREF;
  if (lua_isfunction(L, 2)) {
    lua_pushvalue(L, 2);
    b->evict_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lupin_runtime_set_evict(b->rt, on_evict, b);
  } else {
    lupin_runtime_set_evict(b->rt, NULL, NULL);
  }
  return 0;
}

static int l_tick(lua_State *L) {
  lupin_runtime_tick(check_rt(L)->rt);
  return 0;
}

static int l_flow_elsewhere(lua_State *L) {
  lua_pushnumber(L, (lua_Number)lupin_runtime_flow_elsewhere(check_rt(L)->rt));
  return 1;
}

static int l_flow_drain(lua_State *L) {
  runtime_box *b = check_rt(L);
  lua_pushnumber(L, (lua_Number)lupin_runtime_flow_drain(b->rt, luaL_optstring(L, 2, NULL)));
  return 1;
}

static void add_flow(void *ud, const lupin_flow_info *f) {
  lua_State *L = ud;
  lua_createtable(L, 0, 12);
  lua_pushinteger(L, f->priority);
  lua_setfield(L, -2, "priority");
  if (f->flow) {
    lua_pushstring(L, f->flow);
    lua_setfield(L, -2, "flow");
  }
#define NUM(k)                                                                                     \
  lua_pushnumber(L, (lua_Number)f->k);                                                             \
  lua_setfield(L, -2, #k)
  NUM(queued);
  NUM(bytes);
  NUM(dispatched);
  NUM(ttl);
  NUM(full);
  NUM(shed);
  NUM(cancelled);
  NUM(max_requests);
  NUM(max_bytes);
  NUM(clamped);
  NUM(flows_kept);
#undef NUM
  if (f->fairness) {
    lua_pushstring(L, f->fairness);
    lua_setfield(L, -2, "fairness");
  }
  if (f->ordering) {
    lua_pushstring(L, f->ordering);
    lua_setfield(L, -2, "ordering");
  }
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
}

/* rt:flows() -> list, saturated; nil when flow control is off */
static int l_flows(lua_State *L) {
  runtime_box *b = check_rt(L);
  int saturated = 0;
  lua_newtable(L);
  if (lupin_runtime_flows(b->rt, add_flow, L, &saturated)) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushboolean(L, saturated);
  return 2;
}

/* rt:flow_saturation() -> the detector's level; nil when flow control is off */
static int l_flow_saturation(lua_State *L) {
  double level = 0;
  if (lupin_runtime_flow_saturation(check_rt(L)->rt, &level)) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushnumber(L, level);
  return 1;
}

/* req:flow() -> {managed, queued, priority, flow, waited} */
static int l_req_flow(lua_State *L) {
  lupin_flow_place p;
  lupin_request_flow(check_req(L)->req, &p);
  lua_createtable(L, 0, 5);
  lua_pushboolean(L, p.managed);
  lua_setfield(L, -2, "managed");
  lua_pushboolean(L, p.queued);
  lua_setfield(L, -2, "queued");
  lua_pushinteger(L, p.priority);
  lua_setfield(L, -2, "priority");
  lua_pushstring(L, p.flow);
  lua_setfield(L, -2, "flow");
  lua_pushnumber(L, p.waited);
  lua_setfield(L, -2, "waited");
  return 1;
}

static int l_response_header(lua_State *L) {
  request_box *rb = check_req(L);
  lupin_header headers[64];
  size_t n = 0;
  if (lua_istable(L, 3)) {
    lua_pushnil(L);
    while (n < 64 && lua_next(L, 3)) {
      headers[n].name = lua_tostring(L, -2);
      headers[n++].value = lua_tostring(L, -1);
      lua_pop(L, 1);
    }
  }
  lupin_request_response_header(rb->req, (int)luaL_checkinteger(L, 2), headers, n);
  const lupin_header *out;
  size_t m = lupin_request_client_headers(rb->req, &out);
  lua_createtable(L, 0, (int)m);
  for (size_t i = 0; i < m; i++) {
    lua_pushstring(L, out[i].value);
    lua_setfield(L, -2, out[i].name);
  }
  return 1;
}

static int l_response_chunk(lua_State *L) {
  request_box *rb = check_req(L);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  lua_pushboolean(L, lupin_request_response_chunk(rb->req, data, len) == 0);
  return 1;
}

/* req:timing() -> {begun_at=, head_at=, first_byte_at=, last_byte_at=,
 * bytes=, chunks=, events=} (lupin_request_timing) */
static int l_timing(lua_State *L) {
  lupin_response_timing t;
  lupin_request_timing(check_req(L)->req, &t);
  lua_createtable(L, 0, 7);
  lua_pushnumber(L, t.begun_at), lua_setfield(L, -2, "begun_at");
  lua_pushnumber(L, t.head_at), lua_setfield(L, -2, "head_at");
  lua_pushnumber(L, t.first_byte_at), lua_setfield(L, -2, "first_byte_at");
  lua_pushnumber(L, t.last_byte_at), lua_setfield(L, -2, "last_byte_at");
  lua_pushnumber(L, (lua_Number)t.bytes), lua_setfield(L, -2, "bytes");
  lua_pushnumber(L, (lua_Number)t.chunks), lua_setfield(L, -2, "chunks");
  lua_pushnumber(L, (lua_Number)t.events), lua_setfield(L, -2, "events");
  return 1;
}

static int l_wants_chunks(lua_State *L) {
  lua_pushboolean(L, lupin_request_wants_chunks(check_req(L)->req));
  return 1;
}

static int l_response_complete(lua_State *L) {
  lua_pushboolean(L, lupin_request_response_complete(check_req(L)->req) == 0);
  return 1;
}

static int l_fallbacks(lua_State *L) {
  const lupin_pick *p;
  size_t n = lupin_request_fallbacks(check_req(L)->req, &p);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushstring(L, p[i].name);
    lua_rawseti(L, -2, (int)i + 1);
  }
  return 1;
}

/* req:explain([format]): the explain record ("json", "text", "summary"),
 * or nil when not asked for. */
static int l_explain(lua_State *L) {
  static const char *const formats[] = {"json", "text", "summary", NULL};
  size_t n;
  int f = luaL_checkoption(L, 2, "json", formats);
  const char *s = lupin_request_explain(check_req(L)->req, (lupin_explain_format)f, &n);
  if (s)
    lua_pushlstring(L, s, n);
  else
    lua_pushnil(L);
  return 1;
}

static int l_end(lua_State *L) {
  request_box *rb = check_req(L);
  int o = luaL_checkoption(L, 2, "ok", outcomes);
  lupin_request_end(rb->req, (lupin_outcome)o);
  rb->req = NULL;
  return 0;
}

/* A request dropped by the spec without end is ended as cancelled, as a
 * host must; a spec that wants to see the leak checks stats first. */
static int l_req_gc(lua_State *L) {
  request_box *rb = luaL_checkudata(L, 1, REQ_MT);
  if (rb->req && rb->box->rt) lupin_request_end(rb->req, LUPIN_CANCELLED);
  rb->req = NULL;
  return 0;
}

static const luaL_Reg rt_methods[] = {
    {"load", l_load},
    {"load_string", l_load_string},
    {"routes", l_routes},
    {"declare_section", l_declare_section},
    {"section", l_section},
    {"section_text", l_section_text},
    {"metric_source", l_metric_source},
    {"read_endpoints", l_read_endpoints},
    {"dry_run", l_dry_run},
    {"reload", l_reload},
    {"stage", l_stage},
    {"commit", l_commit},
    {"abort", l_abort},
    {"upsert", l_upsert},
    {"remove", l_remove},
    {"set_metrics", l_set_metrics},
    {"set_healthy", l_set_healthy},
    {"collect", l_collect},
    {"collect_step", l_collect_step},
    {"stats", l_stats},
    {"plugin_stats", l_plugin_stats},
    {"generations", l_generations},
    {"check_leaks", l_check_leaks},
    {"eval", l_eval},
    {"logs", l_logs},
    {"begin", l_begin},
    {"set_dispatch", l_set_dispatch},
    {"set_evict", l_set_evict},
    {"tick", l_tick},
    {"flow_elsewhere", l_flow_elsewhere},
    {"flow_drain", l_flow_drain},
    {"flows", l_flows},
    {"flow_saturation", l_flow_saturation},
    {"free", l_free},
    {NULL, NULL},
};

static const luaL_Reg req_methods[] = {
    {"id", l_req_id},
    {"model", l_req_model},
    {"schedule", l_schedule},
    {"flow", l_req_flow},
    {"fallbacks", l_fallbacks},
    {"explain", l_explain},
    {"response_header", l_response_header},
    {"response_chunk", l_response_chunk},
    {"wants_chunks", l_wants_chunks},
    {"timing", l_timing},
    {"response_complete", l_response_complete},
    {"finish", l_end},
    {NULL, NULL},
};

static const luaL_Reg shared_methods[] = {
    {"endpoints", l_shared_endpoints},
    {"watch_records", l_shared_watch},
    {"heard", l_shared_heard},
    {"prefix_apply", l_shared_apply},
    {NULL, NULL},
};

static void new_class(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc) {
  luaL_newmetatable(L, name);
  lua_newtable(L);
  luaL_register(L, NULL, methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, lupin_now());
  return 1;
}

int luaopen_lupin_native(lua_State *L) {
  new_class(L, RT_MT, rt_methods, l_free);
  new_class(L, REQ_MT, req_methods, l_req_gc);
  new_class(L, SHARED_MT, shared_methods, l_shared_gc);
  lua_newtable(L);
  lua_pushcfunction(L, l_shared);
  lua_setfield(L, -2, "shared");
  lua_pushcfunction(L, l_new);
  lua_setfield(L, -2, "new");
  lua_pushcfunction(L, l_now);
  lua_setfield(L, -2, "now");
  lua_pushlightuserdata(L, NULL); /* the bounded built-ins, never cut (specs) */
  lua_pushcclosure(L, lupin__guard_open, 1);
  lua_setfield(L, -2, "guard");
  lua_pushstring(L, LUPIN_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
