/* What a host builds on beyond requests and endpoints: config sections of
 * its own, the endpoints a config or file lists, the plugin directories to
 * watch, a dry run, the memory limit.  Each is one op of the "host" hook of
 * lua/lupin/runtime/init.lua. */
#include "internal.h"

#include <lauxlib.h>
#include <string.h>

static void push_op(lupin_runtime *rt, const char *op) {
  lupin__push_hook(rt, LUPIN_HOOK_HOST);
  lua_pushstring(rt->L, op);
}

/* After a call that returns nil, message on failure: 0, or -1 with err set;
 * the results stay on the stack either way. */
static int failed(lua_State *L, int base, char *err, size_t errlen) {
  if (!lua_isnil(L, base + 1)) return 0;
  lupin__errf(err, errlen, "%s", lua_tostring(L, base + 2) ? lua_tostring(L, base + 2) : "?");
  return -1;
}

int lupin_runtime_declare_section(lupin_runtime *rt, const char *section,
                                  const lupin_setting *settings, size_t n, char *err,
                                  size_t errlen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "declare_section");
  lua_pushstring(L, section);
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 4);
    lua_pushstring(L, settings[i].name);
    lua_setfield(L, -2, "name");
    lua_pushnumber(L, settings[i].def);
    lua_setfield(L, -2, "default");
    lua_pushnumber(L, settings[i].min);
    lua_setfield(L, -2, "min");
    lua_pushstring(L, settings[i].text); /* NULL pushes nil: an integer */
    lua_setfield(L, -2, "text");
    lua_pushstring(L, settings[i].pattern);
    lua_setfield(L, -2, "pattern");
    lua_pushstring(L, settings[i].what);
    lua_setfield(L, -2, "what");
    if (settings[i].max >= settings[i].min) {
      lua_pushnumber(L, settings[i].max);
      lua_setfield(L, -2, "max");
    }
    lua_rawseti(L, -2, (int)i + 1);
  }
  if (lupin__call(rt, 3, 2, err, errlen)) return -1;
  int rc = failed(L, base, err, errlen);
  lua_settop(L, base);
  return rc;
}

int lupin_runtime_section(lupin_runtime *rt, const char *section, double *values, size_t n) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "section");
  lua_pushstring(L, section);
  if (lupin__call(rt, 2, 1, NULL, 0)) return -1;
  int rc = -1;
  if (lua_istable(L, base + 1)) {
    for (size_t i = 0; i < n; i++) {
      lua_rawgeti(L, base + 1, (int)i + 1);
      values[i] = lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
    rc = 0;
  }
  lua_settop(L, base);
  return rc;
}

int lupin_runtime_section_text(lupin_runtime *rt, const char *section, const char *name, char *out,
                               size_t len) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "section_text");
  lua_pushstring(L, section);
  lua_pushstring(L, name);
  int rc = -1;
  size_t n;
  if (!lupin__call(rt, 3, 1, NULL, 0) && lua_type(L, base + 1) == LUA_TSTRING) {
    const char *v = lua_tolstring(L, base + 1, &n);
    if (n < len) {
      memcpy(out, v, n + 1);
      rc = 0;
    }
  }
  lua_settop(L, base);
  return rc;
}

static void each_endpoint(lua_State *L, int list, lupin_endpoint_desc_fn fn, void *ud) {
  size_t n = lua_objlen(L, list);
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, list, (int)i);
    int e = lua_gettop(L);
    lua_getfield(L, e, "name");
    lua_getfield(L, e, "address");
    lua_getfield(L, e, "port");
    lupin_endpoint_desc d = {lua_tostring(L, e + 1), lua_tostring(L, e + 2),
                             (int)lua_tointeger(L, e + 3), NULL, 0};
    lua_getfield(L, e, "labels");
    int lt = lua_gettop(L);
    lupin_header labels[64];
    size_t k = 0;
    if (lua_istable(L, lt)) {
      for (lua_pushnil(L); lua_next(L, lt); lua_pop(L, 1)) {
        if (k == 64) {
          lua_pop(L, 2); /* lua_next left a key and value */
          break;
        }
        labels[k++] = (lupin_header){lua_tostring(L, -2), lua_tostring(L, -1)};
      }
    }
    d.labels = labels;
    d.n_labels = k;
    fn(ud, &d);
    lua_settop(L, e - 1);
  }
}

int lupin_runtime_read_endpoints(lupin_runtime *rt, const char *file, lupin_endpoint_desc_fn fn,
                                 void *ud, char *err, size_t errlen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "endpoints");
  lua_pushstring(L, file); /* NULL pushes nil: the config's */
  if (lupin__call(rt, 2, 2, err, errlen)) return -1;
  int rc = failed(L, base, err, errlen);
  if (!rc) each_endpoint(L, base + 1, fn, ud);
  lua_settop(L, base);
  return rc;
}

/* An entry's "metrics" into m (lua/lupin/config/init.lua checked them): 0, or -1
 * when it has none.  Its strings stay on the stack until the caller's settop. */
static int entry_metrics(lua_State *L, int e, lupin_metrics *m) {
  lua_getfield(L, e, "metrics");
  int t = lua_gettop(L);
  if (!lua_istable(L, t)) return -1;
  static const char *const keys[] = {"waiting_queue_size", "running_requests", "kv_cache_usage",
                                     "max_lora",           "cache_block_size", "num_blocks"};
  double *v[] = {&m->waiting_queue_size, &m->running_requests, &m->kv_cache_usage,
                 &m->max_lora,           &m->cache_block_size, &m->num_blocks};
  *m = (lupin_metrics){0};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
    lua_getfield(L, t, keys[i]);
    *v[i] = lua_tonumber(L, -1);
    lua_pop(L, 1);
  }
  lua_getfield(L, t, "running_lora_adapters");
  m->running_lora_adapters = lua_tostring(L, -1);
  lua_getfield(L, t, "waiting_lora_adapters");
  m->waiting_lora_adapters = lua_tostring(L, -1);
  return 0;
}

int lupin_runtime_read_endpoint_metrics(lupin_runtime *rt, const char *file,
                                        lupin_endpoint_metrics_fn fn, void *ud, char *err,
                                        size_t errlen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "endpoints");
  lua_pushstring(L, file);
  if (lupin__call(rt, 2, 2, err, errlen)) return -1;
  int rc = failed(L, base, err, errlen);
  size_t n = rc ? 0 : lua_objlen(L, base + 1);
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, base + 1, (int)i);
    int e = lua_gettop(L);
    lupin_metrics m;
    lua_getfield(L, e, "name");
    if (!entry_metrics(L, e, &m)) fn(ud, lua_tostring(L, e + 1), &m);
    lua_settop(L, e - 1);
  }
  lua_settop(L, base);
  return rc;
}

/* Calls fn with each string of the list the op returns. */
static void each_path(lupin_runtime *rt, const char *op, lupin_path_fn fn, void *ud) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, op);
  if (lupin__call(rt, 1, 1, NULL, 0)) return;
  size_t n = lua_istable(L, base + 1) ? lua_objlen(L, base + 1) : 0;
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, base + 1, (int)i);
    if (lua_tostring(L, -1)) fn(ud, lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lua_settop(L, base);
}

void lupin_runtime_plugin_dirs(lupin_runtime *rt, lupin_path_fn fn, void *ud) {
  each_path(rt, "plugin_dirs", fn, ud);
}

void lupin_runtime_routes(lupin_runtime *rt, lupin_path_fn fn, void *ud) {
  each_path(rt, "routes", fn, ud);
}

int lupin_runtime_dry_run(lupin_runtime *rt, char *err, size_t errlen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "dry_run");
  if (lupin__call(rt, 1, 1, err, errlen)) return -1;
  int rc = 0;
  if (!lua_isnil(L, base + 1)) {
    lupin__errf(err, errlen, "%s", lua_tostring(L, base + 1));
    rc = -1;
  }
  lua_settop(L, base);
  return rc;
}

void lupin_runtime_set_memory_limit(lupin_runtime *rt, size_t bytes) {
  push_op(rt, "memory_limit");
  lua_pushnumber(rt->L, (lua_Number)bytes);
  lupin__call(rt, 2, 0, NULL, 0);
}

/* One spec of a metric_source table (lua/lupin/datalayer.lua's compiled
 * form: { name, legacy, labels = { k, v, ... } }) at the top of the stack.
 * The strings are anchored by the generation. */
static void read_spec(lua_State *L, int t, const char *key, lupin_metric_spec *s) {
  *s = (lupin_metric_spec){0};
  lua_getfield(L, t, key);
  int spec = lua_gettop(L);
  if (lua_istable(L, spec)) {
    lua_getfield(L, spec, "name");
    s->name = lua_tostring(L, -1);
    lua_getfield(L, spec, "legacy");
    s->legacy = lua_tostring(L, -1);
    lua_getfield(L, spec, "labels");
    size_t n = lua_istable(L, -1) ? lua_objlen(L, -1) / 2 : 0;
    for (size_t i = 0; i < n && i < LUPIN_METRIC_LABELS; i++) {
      lua_rawgeti(L, -1, (int)(2 * i + 1));
      lua_rawgeti(L, -2, (int)(2 * i + 2));
      s->labels[i] = (lupin_header){lua_tostring(L, -2), lua_tostring(L, -1)};
      lua_pop(L, 2);
    }
    s->n_labels = n < LUPIN_METRIC_LABELS ? n : LUPIN_METRIC_LABELS;
  }
  lua_settop(L, spec - 1);
}

int lupin_runtime_metric_source(lupin_runtime *rt, const char *endpoint, lupin_metric_source *out) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "metric_source");
  lua_pushstring(L, endpoint);
  if (lupin__call(rt, 2, 1, NULL, 0) || !lua_istable(L, base + 1)) {
    lua_settop(L, base);
    return -1;
  }
  int t = base + 1;
  lua_getfield(L, t, "engine");
  out->engine = lua_tostring(L, -1);
  lua_getfield(L, t, "path");
  out->path = lua_tostring(L, -1);
  lua_getfield(L, t, "block_size_label");
  out->block_size_label = lua_tostring(L, -1);
  lua_getfield(L, t, "num_blocks_label");
  out->num_blocks_label = lua_tostring(L, -1);
  lua_settop(L, t);
  read_spec(L, t, "queue", &out->queue);
  read_spec(L, t, "running", &out->running);
  read_spec(L, t, "kv_usage", &out->kv_usage);
  read_spec(L, t, "lora", &out->lora);
  read_spec(L, t, "cache_info", &out->cache_info);
  read_spec(L, t, "block_size", &out->block_size);
  read_spec(L, t, "num_blocks", &out->num_blocks);
  lua_settop(L, base);
  return 0;
}

/* A field of the table at t as a string, an integer or a number. */
static const char *field_text(lua_State *L, int t, const char *k) {
  lua_getfield(L, t, k);
  const char *v = lua_tostring(L, -1); /* anchored by the generation's table */
  lua_pop(L, 1);
  return v ? v : "";
}

static double field_number(lua_State *L, int t, const char *k) {
  lua_getfield(L, t, k);
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

int lupin_runtime_kv_events(lupin_runtime *rt, lupin_kv_events *out) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "kv_events");
  if (lupin__call(rt, 1, 1, NULL, 0)) {
    lua_settop(L, base);
    return -1;
  }
  int t = base + 1, rc = lua_istable(L, t) ? 1 : lua_isnil(L, t) ? -1 : 0;
  if (rc == 1) {
    *out = (lupin_kv_events){
        .index = field_text(L, t, "index"),
        .hash_seed = field_text(L, t, "hash_seed"),
        .topic = field_text(L, t, "topic"),
        .bind = field_text(L, t, "bind"),
        .port = (int)field_number(L, t, "port"),
        .replay_port = (int)field_number(L, t, "replay_port"),
        .block_size = (int)field_number(L, t, "block_size"),
        .max_blocks = (size_t)field_number(L, t, "max_blocks"),
        .max_pending = (size_t)field_number(L, t, "max_pending"),
        .unsure_seconds = field_number(L, t, "unsure_seconds"),
    };
  }
  lua_settop(L, base);
  return rc;
}

int lupin_runtime_config_pool(lupin_runtime *rt, const char *name, const char *ns, lupin_pool *out,
                              char *others, size_t otherslen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  push_op(rt, "pool");
  lua_pushstring(L, name);
  lua_pushstring(L, ns);
  if (lupin__call(rt, 3, 2, NULL, 0)) {
    lua_settop(L, base);
    return -1;
  }
  int t = base + 1, rc = lua_istable(L, t);
  if (others) lupin__errf(others, otherslen, "%s", rc ? "" : luaL_optstring(L, t + 1, ""));
  if (rc) {
    *out = (lupin_pool){.name = field_text(L, t, "name"),
                        .group = field_text(L, t, "group"),
                        .version = field_text(L, t, "version"),
                        .selector = field_text(L, t, "selector_text"),
                        .where = field_text(L, t, "where")};
    lua_getfield(L, t, "ports");
    for (int i = 1; i <= LUPIN_POOL_PORTS && i <= (int)lua_objlen(L, -1); i++) {
      lua_rawgeti(L, -1, i);
      out->ports[out->n_ports++] = (int)lua_tointeger(L, -1);
      lua_pop(L, 1);
    }
  }
  lua_settop(L, base);
  return rc;
}
