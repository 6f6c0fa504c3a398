/* Flow control's side in C: handing the queue's final results to the host.
 *
 * The queue, the bands, the policies and the gate live in Lua
 * (lua/lupin/runtime/flow.lua); C asks it for the next request whose scheduling is
 * final — evicted, or let through the gate — one at a time, runs (or reads)
 * that scheduling and calls the host's dispatch callback.  One at a time
 * because the callback may end any request, the next one included. */
#include "internal.h"

#include <stdint.h>
#include <stdio.h>

void lupin_runtime_set_dispatch(lupin_runtime *rt, lupin_dispatch_fn fn, void *ud) {
  rt->dispatch = fn;
  rt->dispatch_ud = ud;
  lupin__push_hook(rt, LUPIN_HOOK_FLOW);
  lua_pushstring(rt->L, "hosted");
  lua_pushboolean(rt->L, fn != NULL);
  lupin__call(rt, 2, 0, NULL, 0);
}

void lupin_runtime_set_evict(lupin_runtime *rt, lupin_evict_fn fn, void *ud) {
  rt->evict = fn;
  rt->evict_ud = ud;
  lupin__push_hook(rt, LUPIN_HOOK_FLOW);
  lua_pushstring(rt->L, "evicts");
  lua_pushboolean(rt->L, fn != NULL);
  lupin__call(rt, 2, 0, NULL, 0);
}

/* The next request to hand over, or NULL; *evict (copied into evict, of
 * size n) is set when it is one to end rather than to dispatch. */
static lupin_request *next(lupin_runtime *rt, int sweep, char *evict, size_t n) {
  lua_State *L = rt->L;
  char err[512];
  lupin__push_hook(rt, LUPIN_HOOK_FLOW);
  lua_pushstring(L, "next");
  lua_pushboolean(L, sweep);
  if (lupin__call(rt, 2, 2, err, sizeof err)) {
    lupin__log(rt, LUPIN_LOG_ERROR, "flow control: %s", err);
    return NULL;
  }
  lupin_request *req = lua_isnumber(L, -2) ? (lupin_request *)(uintptr_t)lua_tonumber(L, -2) : NULL;
  *evict = 0;
  if (lua_isstring(L, -1)) snprintf(evict, n, "%s", lua_tostring(L, -1));
  lua_pop(L, 2);
  return req;
}

void lupin__flow_pump(lupin_runtime *rt, int sweep) {
  if (!rt->dispatch || (!rt->flow_requests && !(sweep && rt->flow_kept))) return;
  if (rt->pumping) { /* called back from inside the callback: once more after */
    rt->pump_again = 1;
    return;
  }
  rt->pumping = 1;
  do {
    rt->pump_again = 0;
    char evict[512];
    for (lupin_request *req; (req = next(rt, sweep, evict, sizeof evict)); sweep = 0) {
      if (*evict) { /* sent already: the host ends it */
        if (rt->evict) rt->evict(rt->evict_ud, req, evict);
        continue;
      }
      lupin_result res;
      lupin__request_schedule_into(req, &res);
      rt->dispatch(rt->dispatch_ud, req, &res);
      if (!rt->dispatch) break; /* the host let go */
    }
  } while (rt->pump_again && rt->dispatch);
  rt->pumping = 0;
}

void lupin_runtime_tick(lupin_runtime *rt) { lupin__flow_pump(rt, 1); }

void lupin__flow_keep(lupin_runtime *rt, int on) { rt->flow_kept = on; }

/* The queue is the runtime's, its count the process's: every runtime of a
 * lupin_shared adds its queued requests to the store's atomic count, so a
 * host can tell, without a lock or a call into Lua, whether another
 * runtime (another worker) holds requests that a freed place could send. */
double lupin__flow_add(lupin_runtime *rt, int64_t delta) {
  int64_t *n = &lupin__shared_store(rt->shared)->flow_queued;
  rt->flow_queued += delta;
  /* release/acquire: a runtime that sees a request leave the count sees the
   * endpoint's in-flight count its scheduling made first (flow.lua, take) */
  if (!delta) return (double)__atomic_load_n(n, __ATOMIC_ACQUIRE);
  return (double)__atomic_add_fetch(n, delta, __ATOMIC_ACQ_REL);
}

uint64_t lupin_runtime_flow_elsewhere(lupin_runtime *rt) {
  int64_t all = __atomic_load_n(&lupin__shared_store(rt->shared)->flow_queued, __ATOMIC_RELAXED);
  return all > rt->flow_queued ? (uint64_t)(all - rt->flow_queued) : 0;
}

size_t lupin_runtime_flow_drain(lupin_runtime *rt, const char *message) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_FLOW);
  lua_pushstring(L, "drain");
  lua_pushstring(L, message ? message : "the gateway is shutting down");
  if (lupin__call(rt, 2, 1, NULL, 0)) return 0;
  size_t n = (size_t)lua_tonumber(L, -1);
  lua_pop(L, 1);
  lupin__flow_pump(rt, 0);
  return n;
}

static uint64_t field(lua_State *L, const char *name) {
  lua_getfield(L, -1, name);
  uint64_t v = lua_isnumber(L, -1) ? (uint64_t)lua_tonumber(L, -1) : 0;
  lua_pop(L, 1);
  return v;
}

static int ifield(lua_State *L, const char *name) {
  lua_getfield(L, -1, name);
  int v = (int)lua_tonumber(L, -1);
  lua_pop(L, 1);
  return v;
}

static const char *sfield(lua_State *L, const char *name) {
  lua_getfield(L, -1, name);
  const char *s = lua_tostring(L, -1); /* the table holds it */
  lua_pop(L, 1);
  return s;
}

int lupin_runtime_flow_saturation(lupin_runtime *rt, double *level) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_FLOW);
  lua_pushstring(L, "saturation");
  if (lupin__call(rt, 1, 1, NULL, 0)) return -1;
  int on = lua_isnumber(L, -1);
  if (on && level) *level = lua_tonumber(L, -1);
  lua_pop(L, 1);
  return on ? 0 : -1;
}

int lupin_runtime_flows(lupin_runtime *rt, lupin_flow_fn fn, void *ud, int *saturated) {
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_FLOW);
  lua_pushstring(L, "list");
  if (lupin__call(rt, 1, 2, NULL, 0)) return -1;
  if (!lua_istable(L, -2)) {
    lua_pop(L, 2);
    return -1;
  }
  if (saturated) *saturated = lua_toboolean(L, -1);
  lua_pop(L, 1);
  size_t n = lua_objlen(L, -1);
  for (size_t i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, (int)i);
    lupin_flow_info f = {
        .priority = ifield(L, "priority"),
        .flow = sfield(L, "flow"),
        .queued = field(L, "queued"),
        .bytes = field(L, "bytes"),
        .dispatched = field(L, "dispatched"),
        .ttl = field(L, "ttl"),
        .full = field(L, "full"),
        .shed = field(L, "shed"),
        .cancelled = field(L, "cancelled"),
        .max_requests = field(L, "max_requests"),
        .max_bytes = field(L, "max_bytes"),
        .fairness = sfield(L, "fairness"),
        .ordering = sfield(L, "ordering"),
        .clamped = field(L, "clamped"),
        .flows_kept = field(L, "flows_kept"),
    };
    fn(ud, &f);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return 0;
}
