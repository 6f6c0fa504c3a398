/* Built-ins that plugins reach, bounded by the call budget and the C stack
 * (docs/plugins.md, "Budgets").  The module lupin.guard.native, preloaded
 * in every runtime's state: the pattern functions of pattern.c, string.rep
 * and table.concat built in slices with a look at the budget between them,
 * and the C stack's room for the wrappers lua/lupin/runtime/guard.lua installs.
 *
 * The budget's flag is set by the watchdog (budget.c); a built-in that finds
 * it set calls budget.lua's trip, which grants a request-path call its grace
 * or throws the cut from here as a poll in plugin code would.
 *
 * Recursion through C (a gsub replacement function calling gsub, a sort
 * comparator sorting, a resume in a coroutine resuming) takes C stack at
 * every level, and the thread's stack ends in a guard page: LuaJIT counts
 * Lua stack slots, not C frames, so the process would die of SIGSEGV.  Each
 * such call first checks the room left on the running thread's stack. */
#define _GNU_SOURCE /* pthread_getattr_np */
#include "internal.h"

#include <pthread.h>
#include <string.h>

#include <lauxlib.h>

#define SLICE ((size_t)1 << 20) /* bytes built between two looks at the budget */

/* The stack of the thread running now: found again when the runtime has
 * moved to another thread (a host may create it on one and run it on
 * another). */
static void find_stack(lupin_guard *g) {
  pthread_attr_t a;
  void *lo = NULL;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &a) == 0) {
    pthread_attr_getstack(&a, &lo, &size);
    pthread_attr_destroy(&a);
  }
  g->stack_lo = lo;
  g->stack_hi = (char *)lo + size;
  /* a quarter of a small stack, else 256 KB: the error path (message
   * handler, traceback, unwinder) and a sanitizer's larger frames need it */
  g->reserve = size / 4 < ((size_t)256 << 10) ? size / 4 : (size_t)256 << 10;
}

size_t lupin_stack_room(lupin_guard *g) {
  char *sp = __builtin_frame_address(0); /* the real stack, not a sanitizer's fake one */
  if (sp <= g->stack_lo || sp > g->stack_hi) find_stack(g);
  if (sp <= g->stack_lo || sp > g->stack_hi) return (size_t)-1; /* cannot tell */
  size_t room = (size_t)(sp - g->stack_lo);
  return room > g->reserve ? room - g->reserve : 0;
}

void lupin__guard_stack_check(lua_State *L, lupin_guard *g) {
  if (lupin_stack_room(g) == 0)
    luaL_error(L, "C stack overflow: callbacks from built-ins (gsub, sort, coroutines, "
                  "__tostring) nested too deeply");
}

void lupin__guard_poll(lua_State *L, lupin_guard *g, double eta) {
  lupin_budget *b = g->budget;
  if (!b || g->trip == LUA_NOREF) return;
  if (eta > 0) { /* would the work left end past the deadline? */
    double d;
    __atomic_load(&b->deadline, &d, __ATOMIC_RELAXED); /* the Lua side writes it */
    if (d <= 0 || lupin_now() + eta < d) return;
  } else if (!__atomic_load_n(&b->cut, __ATOMIC_RELAXED)) { /* the watchdog sets it */
    return;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, g->trip);
  if (eta > 0) lua_pushnumber(L, lupin_now() + eta);
  lua_call(L, eta > 0 ? 1 : 0, 0);
}

/* Where rep and concat build their result: a userdata counted against the
 * memory limit (a small one on the C stack), filled in slices with a look
 * at the budget between them.  The last step, copying the bytes into a Lua
 * string, cannot be cut: it is about as long as filling them was, so a call
 * that could not finish it within its budget is cut before it starts. */
typedef struct out {
  lua_State *L;
  lupin_guard *g;
  char *dst;
  size_t len, at, since;
  double t0;
  char small[4096];
} out;

static void out_open(out *o, lua_State *L, lupin_guard *g, size_t len) {
  o->L = L, o->g = g, o->len = len, o->at = 0, o->since = 0;
  o->t0 = lupin_now();
  o->dst = len <= sizeof o->small ? o->small : lua_newuserdata(L, len);
}

static void out_put(out *o, const char *s, size_t n) {
  while (n > 0) {
    size_t k = n < SLICE - o->since ? n : SLICE - o->since;
    memcpy(o->dst + o->at, s, k);
    o->at += k, o->since += k, s += k, n -= k;
    if (o->since == SLICE) {
      o->since = 0;
      lupin__guard_poll(o->L, o->g, 0);
    }
  }
}

static void out_push(out *o) {
  if (o->dst == o->small) {
    lua_pushlstring(o->L, o->dst, o->len);
    return;
  }
  lupin__guard_poll(o->L, o->g, lupin_now() - o->t0);
  lua_pushlstring(o->L, o->dst, o->len);
  lua_remove(o->L, -2);
}

static int l_rep(lua_State *L) {
  size_t ls, lsep;
  const char *s = luaL_checklstring(L, 1, &ls);
  lua_Integer n = luaL_checkinteger(L, 2);
  const char *sep = luaL_optlstring(L, 3, "", &lsep);
  if (n <= 0 || (ls == 0 && lsep == 0)) {
    lua_pushliteral(L, "");
    return 1;
  }
  size_t unit = ls + lsep;
  if (unit > (SIZE_MAX >> 1) / (size_t)n) return luaL_error(L, "resulting string too large");
  size_t len = unit * (size_t)n - lsep; /* no separator after the last */
  if (len >= 0x7fffff00) return luaL_error(L, "resulting string too large");
  out o;
  out_open(&o, L, lupin__guard_of(L), len);
  out_put(&o, s, ls);
  if (n > 1) out_put(&o, sep, lsep);
  /* the result is periodic: copy what is written, doubling, from the same
   * phase of an earlier unit (never overlapping) */
  while (o.at < len) {
    size_t back = o.at - o.at % unit, k = len - o.at;
    if (k > back) k = back;
    out_put(&o, o.dst + o.at % unit, k);
  }
  out_push(&o);
  return 1;
}

/* Pushes t[k] as a string, or fails as the original does. */
static const char *element(lua_State *L, lua_Integer k, size_t *len) {
  lua_rawgeti(L, 1, (int)k);
  if (!lua_isstring(L, -1))
    luaL_error(L, "invalid value (%s) at index %d in table for 'concat'", luaL_typename(L, -1),
               (int)k);
  return lua_tolstring(L, -1, len);
}

static int l_concat(lua_State *L) {
  size_t lsep, len = 0;
  luaL_checktype(L, 1, LUA_TTABLE);
  const char *sep = luaL_optlstring(L, 2, "", &lsep);
  lua_Integer i = luaL_optinteger(L, 3, 1);
  lua_Integer j = lua_isnoneornil(L, 4) ? (lua_Integer)lua_objlen(L, 1) : luaL_checkinteger(L, 4);
  lupin_guard *g = lupin__guard_of(L);
  for (lua_Integer k = i; k <= j; k++) {
    size_t l;
    element(L, k, &l);
    lua_pop(L, 1);
    len += l + (k < j ? lsep : 0);
    if (len >= 0x7fffff00) return luaL_error(L, "resulting string too large");
    if ((k & 0xffff) == 0) lupin__guard_poll(L, g, 0);
  }
  out o;
  out_open(&o, L, g, len);
  for (lua_Integer k = i; k <= j; k++) {
    size_t l;
    const char *s = element(L, k, &l);
    out_put(&o, s, l);
    lua_pop(L, 1);
    if (k < j) out_put(&o, sep, lsep);
  }
  out_push(&o);
  return 1;
}

/* bind(trip): budget.lua's trip, called when the flag is set. */
static int l_bind(lua_State *L) {
  lupin_guard *g = lupin__guard_of(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  luaL_unref(L, LUA_REGISTRYINDEX, g->trip);
  lua_pushvalue(L, 1);
  g->trip = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

static int l_room(lua_State *L) {
  lua_pushnumber(L, (lua_Number)lupin_stack_room(lupin__guard_of(L)));
  return 1;
}

lupin_guard *lupin__guard_of(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

int lupin__guard_open(lua_State *L) {
  lupin_budget *budget = lua_touserdata(L, lua_upvalueindex(1));
  lupin_guard *g = lua_newuserdata(L, sizeof *g);
  memset(g, 0, sizeof *g);
  g->budget = budget;
  g->trip = LUA_NOREF;
  find_stack(g);
  int gi = lua_gettop(L);
  lua_newtable(L);
  static const luaL_Reg fns[] = {
      {"rep", l_rep}, {"concat", l_concat}, {"bind", l_bind}, {"room", l_room}, {NULL, NULL}};
  for (const luaL_Reg *f = fns; f->name; f++) {
    lua_pushvalue(L, gi);
    lua_pushcclosure(L, f->func, 1);
    lua_setfield(L, -2, f->name);
  }
  lupin__pattern_register(L, gi);
  lua_pushvalue(L, gi); /* held by the module: the closures' upvalue too */
  lua_setfield(L, -2, "guard");
  lua_pushlightuserdata(L, (void *)lupin_stack_room);
  lua_setfield(L, -2, "room_fn");
  return 1;
}
