/* The gateway's JSON work, done by the runtime's Lua state (lua-cjson) through
 * the "gateway" hook of lua/lupin/runtime.lua: the C side carries no JSON
 * library of its own (DESIGN.md §3). */
#include "gateway.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

static uint64_t num_field(lua_State *L, int t, const char *name) {
  lua_getfield(L, t, name);
  uint64_t v = (uint64_t)lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

int gw_lua_settings(lupin_runtime *rt, gw_settings *out, char *err, size_t errlen) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_GATEWAY);
  lua_pushstring(L, "settings");
  if (lupin__call(rt, 1, 1, err, errlen)) return -1;
  int t = lua_gettop(L);
  *out = (gw_settings){
      .max_body_bytes = num_field(L, t, "maxBodyBytes"),
      .max_header_bytes = num_field(L, t, "maxHeaderBytes"),
      .header_timeout_ms = num_field(L, t, "headerTimeoutMs"),
      .connect_timeout_ms = num_field(L, t, "connectTimeoutMs"),
      .first_byte_timeout_ms = num_field(L, t, "firstByteTimeoutMs"),
      .idle_timeout_ms = num_field(L, t, "idleTimeoutMs"),
      .refresh_interval_ms = num_field(L, t, "refreshIntervalMs"),
      .scrape_timeout_ms = num_field(L, t, "scrapeTimeoutMs"),
      .metrics_staleness_ms = num_field(L, t, "metricsStalenessMs"),
      .pool_size = num_field(L, t, "poolSize"),
      .drain_timeout_ms = num_field(L, t, "drainTimeoutMs"),
      .resolve_interval_ms = num_field(L, t, "resolveIntervalMs"),
      .max_lua_memory_bytes = num_field(L, t, "maxLuaMemoryBytes"),
      .max_requests_in_flight = num_field(L, t, "maxRequestsInFlight"),
      .max_buffered_body_bytes = num_field(L, t, "maxBufferedBodyBytes"),
      .pool_idle_ms = num_field(L, t, "poolIdleMs"),
      .retry_non_idempotent = num_field(L, t, "retryNonIdempotent"),
      .retry_budget_percent = num_field(L, t, "retryBudgetPercent"),
      .retry_budget_min = num_field(L, t, "retryBudgetMin"),
      .consecutive_errors = num_field(L, t, "consecutiveErrors"),
      .base_ejection_time_ms = num_field(L, t, "baseEjectionTimeMs"),
      .max_ejection_time_ms = num_field(L, t, "maxEjectionTimeMs"),
      .max_ejection_percent = num_field(L, t, "maxEjectionPercent"),
      .stale_ejection_ms = num_field(L, t, "staleEjectionMs"),
      .explain_without_token = num_field(L, t, "explainWithoutToken"),
  };
  lua_settop(L, t - 1);
  return 0;
}

int gw_lua_memory_limit(lupin_runtime *rt, uint64_t bytes, char *err, size_t errlen) {
  lupin__push_hook(rt, LUPIN_HOOK_GATEWAY);
  lua_pushstring(rt->L, "memory_limit");
  lua_pushnumber(rt->L, (lua_Number)bytes);
  return lupin__call(rt, 2, 0, err, errlen);
}

static double real_field(lua_State *L, int t, const char *name) {
  lua_getfield(L, t, name);
  double v = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

/* An entry's "metrics" (lua/lupin/config.lua checked them) into m; its
 * strings stay on the stack until the caller's settop. */
static void read_metrics(lua_State *L, int e, lupin_metrics *m) {
  *m = (lupin_metrics){0};
  lua_getfield(L, e, "metrics");
  int t = lua_gettop(L);
  if (!lua_istable(L, t)) return;
  m->waiting_queue_size = real_field(L, t, "waiting_queue_size");
  m->running_requests = real_field(L, t, "running_requests");
  m->kv_cache_usage = real_field(L, t, "kv_cache_usage");
  m->max_lora = real_field(L, t, "max_lora");
  m->cache_block_size = real_field(L, t, "cache_block_size");
  m->num_blocks = real_field(L, t, "num_blocks");
  lua_getfield(L, t, "running_lora_adapters");
  m->running_lora_adapters = lua_tostring(L, -1);
  lua_getfield(L, t, "waiting_lora_adapters");
  m->waiting_lora_adapters = lua_tostring(L, -1);
}

static void each_endpoint(lua_State *L, int list, gw_endpoint_fn fn, gw_endpoint_metrics_fn mfn,
                          void *ud) {
  size_t n = lua_objlen(L, list);
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, list, (int)i);
    int e = lua_gettop(L);
    lua_getfield(L, e, "name");
    lua_getfield(L, e, "address");
    lupin_endpoint_desc d = {lua_tostring(L, e + 1), lua_tostring(L, e + 2),
                             (int)num_field(L, e, "port"), NULL, 0};
    lua_getfield(L, e, "labels");
    int lt = lua_gettop(L);
    lupin_header labels[64];
    size_t k = 0;
    for (lua_pushnil(L); lua_next(L, lt) && k < 64; lua_pop(L, 1))
      labels[k++] = (lupin_header){lua_tostring(L, -2), lua_tostring(L, -1)};
    if (k == 64) lua_pop(L, 2); /* lua_next left a key and value */
    d.labels = labels;
    d.n_labels = k;
    if (mfn) {
      lupin_metrics m;
      read_metrics(L, e, &m);
      mfn(ud, &d, &m);
    } else {
      fn(ud, &d);
    }
    lua_settop(L, e - 1);
  }
}

static int endpoints(lupin_runtime *rt, const char *file, gw_endpoint_fn fn,
                     gw_endpoint_metrics_fn mfn, void *ud, char *err, size_t errlen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  lupin__push_hook(rt, LUPIN_HOOK_GATEWAY);
  lua_pushstring(L, file ? "endpoints_file" : "endpoints");
  lua_pushstring(L, file);
  if (lupin__call(rt, 2, 2, err, errlen)) return -1;
  if (lua_isnil(L, -2)) {
    lupin__errf(err, errlen, "%s", lua_tostring(L, -1));
    lua_settop(L, base);
    return -1;
  }
  each_endpoint(L, base + 1, fn, mfn, ud);
  lua_settop(L, base);
  return 0;
}

int gw_lua_endpoints(lupin_runtime *rt, const char *file, gw_endpoint_fn fn, void *ud, char *err,
                     size_t errlen) {
  return endpoints(rt, file, fn, NULL, ud, err, errlen);
}

int gw_lua_endpoints_metrics(lupin_runtime *rt, const char *file, gw_endpoint_metrics_fn fn,
                             void *ud, char *err, size_t errlen) {
  return endpoints(rt, file, NULL, fn, ud, err, errlen);
}

char *gw_lua_explain(lupin_runtime *rt, const char *op, const char *text, size_t len, char *err,
                     size_t errlen) {
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  lupin__push_hook(rt, LUPIN_HOOK_GATEWAY);
  lua_pushstring(L, op);
  lua_pushlstring(L, text ? text : "", text ? len : 0);
  if (lupin__call(rt, 2, 2, err, errlen)) return NULL;
  char *out = NULL;
  if (lua_isstring(L, base + 1))
    out = strdup(lua_tostring(L, base + 1));
  else
    lupin__errf(err, errlen, "%s", lua_isstring(L, base + 2) ? lua_tostring(L, base + 2) : op);
  lua_settop(L, base);
  return out;
}

int gw_lua_validate(lupin_runtime *rt, const char *path, const char *body, size_t len, char **model,
                    int *stream, char *msg, size_t msglen, char *param, size_t paramlen) {
  /* RFC 8259 §8.1: JSON text is UTF-8.  lua-cjson passes any byte through
   * strings, so the check is here, before the text reaches Lua. */
  long long bad = gw_utf8_invalid_at(body, len);
  if (bad >= 0) {
    lupin__errf(msg, msglen,
                "the request body is not valid UTF-8 at byte %lld (0x%02x): JSON text must be "
                "UTF-8 (RFC 8259)",
                bad + 1, (unsigned char)body[bad]);
    lupin__errf(param, paramlen, "%s", "");
    return -1;
  }
  lua_State *L = rt->L;
  int base = lua_gettop(L);
  lupin__push_hook(rt, LUPIN_HOOK_GATEWAY);
  lua_pushstring(L, "validate");
  lua_pushstring(L, path);
  lua_pushlstring(L, body, len);
  if (lupin__call(rt, 3, 3, msg, msglen)) return -2; /* the check itself failed */
  int rc = 0;
  if (lua_isnil(L, base + 1)) {
    lupin__errf(msg, msglen, "%s", lua_tostring(L, base + 2));
    lupin__errf(param, paramlen, "%s", lua_isstring(L, base + 3) ? lua_tostring(L, base + 3) : "");
    rc = -1;
  } else {
    *model = strdup(lua_tostring(L, base + 1));
    *stream = lua_toboolean(L, base + 2);
  }
  lua_settop(L, base);
  return rc;
}

char *gw_lua_models(lupin_runtime *rt, const gw_buf *bodies, size_t n) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_GATEWAY);
  lua_pushstring(L, "models");
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_pushlstring(L, bodies[i].data ? bodies[i].data : "", bodies[i].len);
    lua_rawseti(L, -2, (int)i + 1);
  }
  if (lupin__call(rt, 2, 1, NULL, 0)) return NULL;
  char *out = strdup(lua_tostring(L, -1) ? lua_tostring(L, -1) : "");
  lua_pop(L, 1);
  return out;
}

int gw_lua_dry_run(lupin_runtime *rt, char *err, size_t errlen) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_GATEWAY);
  lua_pushstring(L, "dry_run");
  if (lupin__call(rt, 1, 1, err, errlen)) return -1;
  int rc = lua_isnil(L, -1) ? 0 : -1;
  if (rc) lupin__errf(err, errlen, "%s", lua_tostring(L, -1));
  lua_pop(L, 1);
  return rc;
}
