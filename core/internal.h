/* Internal structures shared by the core's C files.  Not installed. */
#ifndef LUPIN_INTERNAL_H
#define LUPIN_INTERNAL_H

#include "lupin.h"

#include <lua.h>
#include <stdarg.h>

/* The Lua allocator's books.  Its layout is mirrored in lua/lupin/capi.lua. */
typedef struct lupin_alloc {
  size_t used;
  size_t peak;
  size_t limit;
  int enforce; /* the limit applies only while a plugin runs */
  uint64_t refused;
  /* private: the allocator underneath (LuaJIT's own) */
  lua_Alloc base;
  void *base_ud;
} lupin_alloc;

void *lupin_alloc_fn(void *ud, void *ptr, size_t osize, size_t nsize);

/* An endpoint.  The part up to `name` is mirrored in lua/lupin/capi.lua and
 * read by plugins through FFI; its memory is released by the Lua GC finalizer
 * of its endpoint object, so requests holding it keep it valid. */
typedef struct lupin_endpoint {
  uint32_t id;
  int32_t port;
  double waiting_queue_size;
  double running_requests;
  double kv_cache_usage;
  double max_lora;
  double cache_block_size;
  double num_blocks;
  double scraped_at;
  const char *name;
  const char *address;
  /* private */
  char *running_lora;
  char *waiting_lora;
} lupin_endpoint;

typedef struct lupin_generation lupin_generation;

struct lupin_generation {
  uint64_t number;
  int ref;       /* the generation's Lua table */
  size_t pinned; /* requests begun on it and not ended */
  int current;
  lupin_generation *next;
};

/* The function table handed to Lua (lua/lupin/capi.lua mirrors it). */
typedef struct lupin_capi {
  lupin_runtime *rt;
  lupin_alloc *alloc;
  void (*log)(lupin_runtime *rt, int level, const char *msg);
  void (*endpoint_free)(lupin_endpoint *ep);
  int (*result_add_pick)(lupin_request *req, const lupin_endpoint *ep);
  int (*result_add_header)(lupin_request *req, const char *name, const char *value);
  int (*client_add_header)(lupin_request *req, const char *name, const char *value);
} lupin_capi;

/* The Lua functions of lua/lupin/runtime.lua the core calls. */
enum lupin_hook {
  LUPIN_HOOK_LOAD,
  LUPIN_HOOK_RELEASE,
  LUPIN_HOOK_BEGIN,
  LUPIN_HOOK_SCHEDULE,
  LUPIN_HOOK_RESPONSE_HEADER,
  LUPIN_HOOK_RESPONSE_CHUNK,
  LUPIN_HOOK_RESPONSE_COMPLETE,
  LUPIN_HOOK_FINISH,
  LUPIN_HOOK_ENDPOINT_ADD,
  LUPIN_HOOK_ENDPOINT_REMOVE,
  LUPIN_HOOK_ENDPOINT_LABELS,
  LUPIN_HOOK_ENDPOINT_ADAPTERS,
  LUPIN_HOOK_STATS,
  LUPIN_HOOK_PLUGIN_STATS,
  LUPIN_HOOK_CHECK_LEAKS,
  LUPIN_HOOK_EVAL,
  LUPIN_HOOK_GATEWAY, /* the gateway host's JSON work (core/gwlua.c) */
  LUPIN_HOOK_COUNT
};

struct lupin_runtime {
  lua_State *L;
  lupin_alloc alloc;
  lupin_capi capi;
  int hooks[LUPIN_HOOK_COUNT];
  lupin_log_fn log;
  void *log_ud;
  int log_level;
  char *config_path;
  /* generations: current first, then older ones still pinned */
  lupin_generation *generations;
  uint64_t generation_seq;
  /* endpoints */
  lupin_endpoint **endpoints;
  size_t n_endpoints, cap_endpoints;
  uint32_t endpoint_seq;
  /* requests */
  lupin_request *requests, *requests_tail; /* live, oldest first */
  uint64_t requests_begun, requests_ended;
};

/* runtime.c */
int lupin__push_hook(lupin_runtime *rt, enum lupin_hook hook);
int lupin__call(lupin_runtime *rt, int nargs, int nresults, char *err, size_t errlen);
void lupin__log(lupin_runtime *rt, int level, const char *fmt, ...);
void lupin__errf(char *err, size_t errlen, const char *fmt, ...);
/* Runs a Lua chunk in the runtime's state; returns its result as a string
 * (JSON-encoded when not a string).  For specs and debugging only. */
char *lupin__eval(lupin_runtime *rt, const char *code, char *err, size_t errlen);

/* generation.c */
lupin_generation *lupin__generation_current(lupin_runtime *rt);
int lupin__generation_install(lupin_runtime *rt, int ref);
void lupin__generation_unpin(lupin_runtime *rt, lupin_generation *g);
void lupin__generation_free_all(lupin_runtime *rt);

/* endpoint.c */
void lupin__endpoint_free(lupin_endpoint *ep);
void lupin__endpoints_clear(lupin_runtime *rt);

/* request.c */
int lupin__result_add_pick(lupin_request *req, const lupin_endpoint *ep);
int lupin__result_add_header(lupin_request *req, const char *name, const char *value);
int lupin__client_add_header(lupin_request *req, const char *name, const char *value);
void lupin__requests_cancel_all(lupin_runtime *rt);
/* The number of the generation a request is pinned to (the gateway's
 * /admin/requests shows it). */
uint64_t lupin__request_generation(const lupin_request *req);

#endif
