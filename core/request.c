/* Requests: the C object that holds the only reference to a request's Lua
 * state table, from lupin_request_begin to lupin_request_end. */
#include "internal.h"

#include <ctype.h>
#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

typedef struct {
  lupin_header *v;
  size_t n, cap;
} header_list;

/* What a request counts on an endpoint's shared counters until it ends
 * (prefill: until its first body byte). */
typedef struct {
  lupin_counters *c;
  int64_t requests, tokens, prefill;
} hold;

struct lupin_request {
  lupin_runtime *rt;
  lupin_generation *gen;
  int ref;           /* the request table */
  const char *id;    /* in text, or "" when it could not be copied */
  const char *model; /* in text after the id, or NULL */
  char *text;        /* "id\0model\0": kept with its capacity by a spare */
  size_t text_cap;
  int failed;         /* scheduling failed: its outcome wins at the end */
  int response_hooks; /* call the response hooks (see lupin_request_schedule) */
  int head_status;    /* the response head kept for finish alone (keep_head) */
  char *head;         /* kept with its capacity by a spare */
  size_t head_len, head_cap;
  lupin_outcome failed_outcome;
  char *message;
  char *plugin;
  lupin_pick *picks;
  size_t n_picks, cap_picks;
  lupin_pick *fallbacks; /* lupin_request_fallbacks: owned copies */
  size_t n_fallbacks;
  int fallbacks_done;
  unsigned flags;       /* LUPIN_REQUEST_* */
  char *explain;        /* lupin_request_explain's last answer */
  header_list upstream; /* set by plugins for the upstream request */
  header_list client;   /* set by plugins for the client's response */
  int stream;
  char *param; /* the parameter a failed body check names */
  void *data;  /* the host's (lupin_request_set_data) */
  int flow;    /* flow control knows of it: tell it of the end */
  /* in-flight counts to release at the end: holds_inline until more than
   * it fits (a request is counted on one endpoint per profile at most) */
  hold *holds;
  size_t n_holds, cap_holds;
  int released; /* the end released them: nothing more is counted */
  int prefill;  /* prefill tokens are counted in a hold: the first byte releases them */
  int answered; /* a body byte came back: no prefill is counted any more */
  lupin_response_timing timing;
  hold holds_inline[2];
  lupin_request *prev, *next; /* next: the spare list's too */
};

/* Ended requests kept for the next (at most SPARE_REQUESTS, above what a
 * loop usually has in flight): the next request reuses their texts, picks
 * and response-head buffer, so a lifecycle allocates nothing in C in the
 * steady state.  A buffer past SPARE_BYTES (a long request id, a big head)
 * is not kept.  Under ASan a spare is poisoned, buffers and all: a stale
 * pointer into an ended request is still reported, as when it was freed. */
enum { SPARE_REQUESTS = 256, SPARE_BYTES = 4096 };

#if defined(__SANITIZE_ADDRESS__)
static void spare_poison(lupin_request *req, int poison) {
  void (*mark)(const volatile void *, size_t) =
      poison ? __asan_poison_memory_region : __asan_unpoison_memory_region;
  if (!poison) mark(req, sizeof *req); /* its fields first, to read the buffers' */
  if (req->text) mark(req->text, req->text_cap);
  if (req->head) mark(req->head, req->head_cap);
  if (req->picks) mark(req->picks, req->cap_picks * sizeof *req->picks);
  if (poison) mark(req, sizeof *req);
}
#else
static void spare_poison(lupin_request *req, int poison) {
  (void)req;
  (void)poison;
}
#endif

static lupin_request *request_new(lupin_runtime *rt) {
  lupin_request *req = rt->spare_requests;
  if (!req) return calloc(1, sizeof *req);
  spare_poison(req, 0);
  rt->spare_requests = req->next;
  rt->n_spare_requests--;
  *req = (lupin_request){.text = req->text,
                         .text_cap = req->text_cap,
                         .head = req->head,
                         .head_cap = req->head_cap,
                         .picks = req->picks,
                         .cap_picks = req->cap_picks};
  return req;
}

static void request_free(lupin_request *req) {
  free(req->text);
  free(req->head);
  free(req->picks);
  free(req);
}

static void drop_big(char **buf, size_t *cap) {
  if (*cap <= SPARE_BYTES) return;
  free(*buf);
  *buf = NULL;
  *cap = 0;
}

static void request_recycle(lupin_runtime *rt, lupin_request *req) {
  if (rt->n_spare_requests >= SPARE_REQUESTS) {
    request_free(req);
    return;
  }
  drop_big(&req->text, &req->text_cap);
  drop_big(&req->head, &req->head_cap);
  req->next = rt->spare_requests;
  rt->spare_requests = req;
  rt->n_spare_requests++;
  spare_poison(req, 1);
}

void lupin__requests_free_spares(lupin_runtime *rt) {
  while (rt->spare_requests) {
    lupin_request *req = rt->spare_requests;
    spare_poison(req, 0);
    rt->spare_requests = req->next;
    request_free(req);
  }
  rt->n_spare_requests = 0;
}

/* Room for need bytes (at least one) in a kept buffer; its old contents
 * are not kept.  -1: out of memory, the buffer gone. */
static int room(char **buf, size_t *cap, size_t need) {
  if (need <= *cap && *buf) return 0;
  free(*buf);
  *cap = 0;
  if (!(*buf = malloc(need ? need : 1))) return -1;
  *cap = need ? need : 1;
  return 0;
}

/* Copies the id and the model (NULL: none) into the request's text.  Out
 * of memory, the request goes on with the id "" and no model: its Lua
 * state exists by now and ends like any other's. */
static void set_texts(lupin_request *req, const char *id, size_t id_len, const char *model,
                      size_t model_len) {
  if (room(&req->text, &req->text_cap, id_len + 1 + (model ? model_len + 1 : 0))) {
    req->id = "";
    req->model = NULL;
    return;
  }
  memcpy(req->text, id, id_len + 1);
  req->id = req->text;
  req->model = NULL;
  if (model) {
    memcpy(req->text + id_len + 1, model, model_len + 1);
    req->model = req->text + id_len + 1;
  }
}

static const char *const outcome_names[] = {
    "ok",      "rejected",        "no_endpoint", "plugin_error", "upstream_error", "cancelled",
    "timeout", "invalid_request", "queue_ttl",   "queue_full",   "shed",           "evicted",
};

const char *lupin_outcome_name(lupin_outcome o) {
  return (unsigned)o < sizeof outcome_names / sizeof *outcome_names ? outcome_names[o] : "unknown";
}

/* Header names reach plugins in lower case; doing it here keeps string.lower,
 * which LuaJIT does not compile, off the request path.  ASCII: what tolower
 * does in the C locale, without a call per byte. */
static char ascii_lower(char c) {
  unsigned char ch = (unsigned char)c;
  return (char)((unsigned)(ch - 'A') < 26u ? ch | 0x20 : ch);
}

/* Headers for Lua as one string, "name\0value\0" per header, names in
 * lower case (C strings hold no NUL, so the fields split unambiguously):
 * one string to make where a table, its hash part and a string per name and
 * value were made for every request and every response head.  The engine
 * looks up the few request headers it needs with lupin__header_find, and
 * the tables plugins read (ctx.request.headers, ctx.response.headers) are
 * made from it on first use. */
static size_t header_block_len(const lupin_header *h, size_t n) {
  size_t len = 0;
  for (size_t i = 0; i < n; i++)
    len += strlen(h[i].name) + (h[i].value ? strlen(h[i].value) : 0) + 2;
  return len;
}

static void header_block_write(char *w, const lupin_header *h, size_t n) {
  for (size_t i = 0; i < n; i++) {
    for (const char *c = h[i].name; *c; c++)
      *w++ = ascii_lower(*c);
    *w++ = '\0';
    const char *v = h[i].value ? h[i].value : "";
    size_t vl = strlen(v) + 1; /* its NUL too */
    memcpy(w, v, vl);
    w += vl;
  }
}

/* -1: out of memory, nothing pushed. */
static int push_header_block(lua_State *L, const lupin_header *h, size_t n) {
  char stack[2048], *block = stack;
  size_t len = header_block_len(h, n);
  if (!len) {
    lua_pushliteral(L, "");
    return 0;
  }
  if (len > sizeof stack && !(block = malloc(len))) return -1;
  header_block_write(block, h, n);
  lua_pushlstring(L, block, len);
  if (block != stack) free(block);
  return 0;
}

/* The value of the last header named name (lower case) in a header block,
 * as the table made from it keeps the last; NULL when there is none.  The
 * block is a Lua string: a NUL follows its last byte, so strlen stops. */
const char *lupin__header_find(const char *block, size_t len, const char *name, size_t name_len,
                               size_t *value_len) {
  const char *found = NULL, *end = block + len;
  for (const char *p = block; p < end;) {
    size_t nl = strlen(p);
    const char *value = p + nl + 1;
    if (value >= end) break; /* not a block push_header_block made */
    size_t vl = strlen(value);
    if (nl == name_len && memcmp(p, name, nl) == 0) {
      found = value;
      *value_len = vl;
    }
    p = value + vl + 1;
  }
  return found;
}

/* The description as the begin hook's arguments: id, path (nil: the
 * body's), body, model, the header block, subset (nil when absent), check_body,
 * flags, the body's length, with no table to build.  Whether the body is
 * UTF-8 is found by the JSON decoder as it parses (core/json.cpp), not by a
 * scan of its own.  A body to check is decoded before the hook returns and
 * never read again, so it goes as a pointer into the host's memory, not as
 * a Lua string: a request holds its decoded values, not a copy of its text
 * besides them (a body read only when a plugin asks stays a string). */
enum { DESC_ARGS = 9 };

static int push_desc(lua_State *L, const lupin_request_desc *d) {
  if (d->id && *d->id)
    lua_pushstring(L, d->id);
  else
    lua_pushnil(L);
  if (d->path)
    lua_pushstring(L, d->path);
  else
    lua_pushnil(L);
  if (d->body && d->check_body)
    lua_pushlightuserdata(L, (void *)d->body);
  else if (d->body)
    lua_pushlstring(L, d->body, d->body_len);
  else
    lua_pushnil(L);
  if (d->model)
    lua_pushstring(L, d->model);
  else
    lua_pushnil(L);
  if (push_header_block(L, d->headers, d->n_headers)) return -1;
  if (d->subset) {
    lua_createtable(L, (int)d->n_subset, 0);
    for (size_t i = 0; i < d->n_subset; i++) {
      lua_pushstring(L, d->subset[i]);
      lua_rawseti(L, -2, (int)i + 1);
    }
  } else {
    lua_pushnil(L);
  }
  lua_pushboolean(L, d->check_body);
  lua_pushinteger(L, (lua_Integer)d->flags);
  lua_pushinteger(L, d->body ? (lua_Integer)d->body_len : 0);
  return 0;
}

lupin_request *lupin_request_begin(lupin_runtime *rt, const lupin_request_desc *desc, char *err,
                                   size_t errlen) {
  lupin_generation *gen = lupin__generation_current(rt);
  if (!gen) {
    lupin__errf(err, errlen, "no config loaded: call lupin_runtime_load first");
    return NULL;
  }
  lupin_request *req = request_new(rt);
  if (!req) {
    lupin__errf(err, errlen, "out of memory");
    return NULL;
  }
  lua_State *L = rt->L;
  lupin__push_hook(rt, LUPIN_HOOK_BEGIN);
  lua_rawgeti(L, LUA_REGISTRYINDEX, gen->ref);
  /* as a number, which the request's state keeps and hands back to the
   * capi functions as uintptr_t: a pointer cdata would be one more Lua
   * object a request (x86-64 user addresses fit a double's 53 bits) */
  lua_pushnumber(L, (lua_Number)(uintptr_t)req);
  int top = lua_gettop(L) - 3;
  if (push_desc(L, desc)) {
    lua_settop(L, top);
    request_recycle(rt, req);
    lupin__errf(err, errlen, "out of memory");
    return NULL;
  }
  if (lupin__call(rt, 2 + DESC_ARGS, 4, err, errlen)) {
    request_recycle(rt, req);
    return NULL;
  }
  size_t id_len, model_len = 0;
  const char *id = lua_tolstring(L, -3, &id_len);
  if (!id) id = "", id_len = 0;
  const char *model = lua_isstring(L, -2) ? lua_tolstring(L, -2, &model_len) : NULL;
  set_texts(req, id, id_len, model, model_len);
  req->stream = lua_toboolean(L, -1);
  lua_pop(L, 3);
  req->ref = luaL_ref(L, LUA_REGISTRYINDEX);
  req->rt = rt;
  req->flags = desc->flags;
  req->gen = gen;
  req->prefill = req->answered = 0;
  /* timed only for a plugin that reads it: no clock read a request otherwise */
  req->timing =
      (lupin_response_timing){.begun_at = gen->flags & LUPIN_GEN_TIMES_RESPONSE ? lupin_now() : 0};
  req->response_hooks = gen->flags & LUPIN_GEN_OBSERVES_RESPONSE;
  req->holds = req->holds_inline;
  req->cap_holds = sizeof req->holds_inline / sizeof *req->holds_inline;
  gen->pinned++;
  /* keep the live list oldest first */
  req->prev = rt->requests_tail;
  if (rt->requests_tail)
    rt->requests_tail->next = req;
  else
    rt->requests = req;
  rt->requests_tail = req;
  rt->requests_begun++;
  return req;
}

const char *lupin_request_id(const lupin_request *req) { return req->id; }

uint64_t lupin_request_generation(const lupin_request *req) { return req->gen->number; }

const char *lupin_request_model(const lupin_request *req) { return req->model; }

int lupin_request_stream(const lupin_request *req) { return req->stream; }

static void *grow(void *a, size_t *cap, size_t n, size_t size) {
  if (n < *cap) return a;
  size_t c = *cap ? *cap * 2 : 4;
  void *b = realloc(a, c * size);
  if (b) *cap = c;
  return b;
}

int lupin__result_add_pick(uintptr_t addr, const lupin_endpoint *ep) {
  lupin_request *req = (lupin_request *)addr;
  lupin_pick *p = grow(req->picks, &req->cap_picks, req->n_picks, sizeof *p);
  if (!p) return -1;
  req->picks = p;
  p[req->n_picks++] = (lupin_pick){ep->name, ep->address, ep->port};
  return 0;
}

/* Sets what the request counts on ep's shared counters: requests and
 * tokens (each: negative leaves it as it is), so a repeated call counts
 * nothing twice.  The counters stay valid until the end: the Lua side keeps
 * the endpoint objects counted on alive in the request's state (ctx.lua's
 * r.held), and each holds its slot in the shared registry. */
static hold *hold_of(lupin_request *req, const lupin_endpoint *ep) {
  hold *h = NULL;
  for (size_t i = 0; i < req->n_holds && !h; i++)
    if (req->holds[i].c == ep->counters) h = &req->holds[i];
  if (!h) {
    if (req->n_holds == req->cap_holds) {
      size_t cap = req->cap_holds * 2;
      hold *a = req->holds == req->holds_inline ? malloc(cap * sizeof *a)
                                                : realloc(req->holds, cap * sizeof *a);
      if (!a) return NULL;
      if (req->holds == req->holds_inline) memcpy(a, req->holds, req->n_holds * sizeof *a);
      req->holds = a;
      req->cap_holds = cap;
    }
    h = &req->holds[req->n_holds++];
    *h = (hold){ep->counters, 0, 0, 0};
  }
  return h;
}

int lupin__request_count(uintptr_t addr, const lupin_endpoint *ep, int64_t requests,
                         int64_t tokens) {
  lupin_request *req = (lupin_request *)addr;
  if (!ep->counters || req->released) return -1;
  hold *h = hold_of(req, ep);
  if (!h) return -1;
  int64_t dr = requests >= 0 ? requests - h->requests : 0;
  int64_t dt = tokens >= 0 ? tokens - h->tokens : 0;
  h->requests += dr;
  h->tokens += dt;
  lupin__counters_add(ep->counters, dr, dt);
  return 0;
}

static void add_prefill(lupin_counters *c, int64_t n) {
  if (n) __atomic_add_fetch(&c->prefill_tokens, n, __ATOMIC_RELAXED);
}

/* Sets the prefill tokens the request counts on ep until its first body
 * byte comes back (or it ends): once it has, nothing more is counted. */
int lupin__request_prefill(uintptr_t addr, const lupin_endpoint *ep, int64_t tokens) {
  lupin_request *req = (lupin_request *)addr;
  if (!ep->counters || req->released || req->answered || tokens < 0) return -1;
  hold *h = hold_of(req, ep);
  if (!h) return -1;
  add_prefill(h->c, tokens - h->prefill);
  h->prefill = tokens;
  req->prefill = 1;
  return 0;
}

/* At the first body byte: the prefill is done wherever it was counted. */
static void release_prefill(lupin_request *req) {
  if (!req->prefill) return;
  req->prefill = 0;
  for (size_t i = 0; i < req->n_holds; i++) {
    add_prefill(req->holds[i].c, -req->holds[i].prefill);
    req->holds[i].prefill = 0;
  }
}

/* Exactly once, at the end, whatever the outcome. */
static void release_holds(lupin_request *req) {
  release_prefill(req);
  for (size_t i = 0; i < req->n_holds; i++)
    lupin__counters_add(req->holds[i].c, -req->holds[i].requests, -req->holds[i].tokens);
  req->n_holds = 0;
  req->released = 1;
  if (req->holds != req->holds_inline) free(req->holds);
  req->holds = req->holds_inline;
}

/* The last guard on headers plugins set (ctx:set_header checks the same and
 * names the plugin; a plugin writing the header table directly gets here):
 * a token name, no control character but tab in the value, none of the
 * framing headers each side writes for itself, nor the request id or the
 * destination the host writes (a forged one would point the upstream
 * elsewhere).  A header refused here never reaches the wire. */
static int header_ok(const char *name, const char *value) {
  static const char *const reserved[] = {
      "connection", "keep-alive",        "proxy-connection",
      "te",         "transfer-encoding", "upgrade",
      "trailer",    "content-length",    "host",
      "expect",     "x-request-id",      "x-gateway-destination-endpoint"};
  if (!*name) return 0;
  for (const char *p = name; *p; p++)
    if (!isalnum((unsigned char)*p) && !strchr("!#$%&'*+-.^_`|~", *p)) return 0;
  for (const unsigned char *p = (const unsigned char *)value; *p; p++)
    if ((*p < 32 && *p != '\t') || *p == 127) return 0;
  for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++)
    if (!strcasecmp(name, reserved[i])) return 0;
  return 1;
}

static int add_header(header_list *l, const char *name, const char *value) {
  if (!header_ok(name, value)) return -1;
  lupin_header *h = grow(l->v, &l->cap, l->n, sizeof *h);
  if (!h) return -1;
  l->v = h;
  h[l->n] = (lupin_header){strdup(name), strdup(value)};
  if (!h[l->n].name || !h[l->n].value) {
    free((char *)h[l->n].name);
    free((char *)h[l->n].value);
    return -1;
  }
  l->n++;
  return 0;
}

static void clear_headers(header_list *l) {
  for (size_t i = 0; i < l->n; i++) {
    free((char *)l->v[i].name);
    free((char *)l->v[i].value);
  }
  l->n = 0;
}

int lupin__result_add_header(uintptr_t addr, const char *name, const char *value) {
  return add_header(&((lupin_request *)addr)->upstream, name, value);
}

int lupin__client_add_header(uintptr_t addr, const char *name, const char *value) {
  return add_header(&((lupin_request *)addr)->client, name, value);
}

size_t lupin_request_client_headers(const lupin_request *req, const lupin_header **out) {
  *out = req->client.v;
  return req->client.n;
}

static void clear_result(lupin_request *req) {
  clear_headers(&req->upstream);
  req->n_picks = 0;
  free(req->message);
  free(req->plugin);
  free(req->param);
  req->message = req->plugin = req->param = NULL;
}

static char *dup_or_null(lua_State *L, int idx) {
  return lua_isstring(L, idx) ? strdup(lua_tostring(L, idx)) : NULL;
}

void lupin_request_set_data(lupin_request *req, void *data) { req->data = data; }

void *lupin_request_data(const lupin_request *req) { return req->data; }

int lupin__request_schedule_into(lupin_request *req, lupin_result *out) {
  lupin_runtime *rt = req->rt;
  lua_State *L = rt->L;
  char err[1024];
  int status;

  clear_result(req);
  lupin__push_hook(rt, LUPIN_HOOK_SCHEDULE);
  lua_rawgeti(L, LUA_REGISTRYINDEX, req->ref);
  if (lupin__call(rt, 1, 7, err, sizeof err) == 0) {
    status = (int)lua_tonumber(L, -7);
    req->message = dup_or_null(L, -6);
    req->plugin = dup_or_null(L, -5);
    req->failed_outcome = (lupin_outcome)lua_tonumber(L, -4);
    /* response headers set by plugins are published by the response header hook */
    if (lua_toboolean(L, -3)) req->response_hooks = 1;
    req->param = dup_or_null(L, -2);
    /* flow control queued it or counts it in flight: it hears of the end */
    if (lua_toboolean(L, -1) && !req->flow) {
      req->flow = 1;
      rt->flow_requests++;
    }
    lua_pop(L, 7);
  } else {
    lupin__log(rt, LUPIN_LOG_ERROR, "request %s: scheduling: %s", req->id, err);
    status = 500;
    req->message = strdup("internal error while scheduling");
    req->failed_outcome = LUPIN_PLUGIN_ERROR;
  }
  req->failed = status != 200 && status != LUPIN_QUEUED;
  *out = (lupin_result){status,          req->message,
                        req->plugin,     req->picks,
                        req->n_picks,    req->upstream.v,
                        req->upstream.n, req->failed ? (int)req->failed_outcome : LUPIN_OK,
                        req->param};
  return status;
}

int lupin_request_schedule(lupin_request *req, lupin_result *out) {
  return lupin__request_schedule_into(req, out);
}

void lupin_request_flow(const lupin_request *req, lupin_flow_place *out) {
  *out = (lupin_flow_place){0};
  out->flow = "";
  if (!req->flow) return;
  lua_State *L = req->rt->L;
  lupin__push_hook(req->rt, LUPIN_HOOK_FLOW);
  lua_pushstring(L, "place");
  lua_rawgeti(L, LUA_REGISTRYINDEX, req->ref);
  if (lupin__call(req->rt, 2, 4, NULL, 0)) return;
  out->managed = 1;
  out->queued = lua_toboolean(L, -4);
  out->priority = (int)lua_tonumber(L, -3);
  /* the string is the request's own (r.fc.flow): alive until the end */
  out->flow = lua_isstring(L, -2) ? lua_tostring(L, -2) : "";
  out->waited = lua_tonumber(L, -1);
  lua_pop(L, 4);
}

static int call_request(lupin_request *req, int nargs) {
  char err[1024];
  if (lupin__call(req->rt, nargs + 1, 0, err, sizeof err) == 0) return 0;
  lupin__log(req->rt, LUPIN_LOG_ERROR, "request %s: %s", req->id, err);
  return -1;
}

static void push_call(lupin_request *req, enum lupin_hook hook) {
  lupin__push_hook(req->rt, hook);
  lua_rawgeti(req->rt->L, LUA_REGISTRYINDEX, req->ref);
}

/* The head of the response for a generation whose only plugins to see it
 * are finish hooks (the default's bounded-load-picker): kept here as a
 * header block and handed over with the end, one call into Lua a request
 * instead of two. */
static int keep_head(lupin_request *req, int status, const lupin_header *headers, size_t n) {
  size_t len = header_block_len(headers, n);
  if (room(&req->head, &req->head_cap, len)) {
    lupin__log(req->rt, LUPIN_LOG_ERROR, "request %s: out of memory keeping the response head",
               req->id);
    return -1;
  }
  header_block_write(req->head, headers, n);
  req->head_len = len;
  req->head_status = status;
  return 0;
}

/* The response hooks only keep ctx.response for plugins and call theirs:
 * with no plugin of the generation to see them (and no response headers to
 * publish) a response costs no call into Lua at all.  The head is seen by
 * every response hook, and by finish (ctx.response) with the end when no
 * response hook calls in before; a chunk or the end only by the plugins
 * having that hook. */
int lupin_request_response_header(lupin_request *req, int status, const lupin_header *headers,
                                  size_t n) {
  if (req->gen->flags & LUPIN_GEN_TIMES_RESPONSE) req->timing.head_at = lupin_now();
  if (!req->response_hooks)
    return req->gen->flags & LUPIN_GEN_HAS_FINISH ? keep_head(req, status, headers, n) : 0;
  lua_State *L = req->rt->L;
  push_call(req, LUPIN_HOOK_RESPONSE_HEADER);
  lua_pushinteger(L, status);
  if (push_header_block(L, headers, n)) {
    lua_pop(L, 3);
    lupin__log(req->rt, LUPIN_LOG_ERROR, "request %s: out of memory passing the response head",
               req->id);
    return -1;
  }
  return call_request(req, 2);
}

/* Counts the blank lines that end server-sent events ("\n\n", as vLLM
 * and lupin-sim write them), across chunks too. */
static void time_chunk(lupin_response_timing *t, const char *data, size_t len) {
  double now = lupin_now();
  if (!t->first_byte_at) t->first_byte_at = now;
  t->last_byte_at = now;
  t->bytes += len;
  t->chunks++;
  const char *p = data, *end = data + len;
  if (t->newline && *p == '\n') t->events++;
  while ((p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
    if (++p < end && *p == '\n') t->events++;
  }
  t->newline = data[len - 1] == '\n';
}

int lupin_request_response_chunk(lupin_request *req, const char *data, size_t len) {
  int flags = req->gen->flags;
  if (len) {
    req->answered = 1;
    release_prefill(req);
    if (flags & LUPIN_GEN_TIMES_RESPONSE) time_chunk(&req->timing, data, len);
  }
  if (!(flags & LUPIN_GEN_OBSERVES_CHUNKS)) return 0;
  push_call(req, LUPIN_HOOK_RESPONSE_CHUNK);
  lua_pushlstring(req->rt->L, data, len);
  return call_request(req, 1);
}

int lupin_request_wants_chunks(const lupin_request *req) {
  return (req->gen->flags & (LUPIN_GEN_OBSERVES_CHUNKS | LUPIN_GEN_TIMES_RESPONSE)) != 0;
}

void lupin_request_timing(const lupin_request *req, lupin_response_timing *out) {
  *out = req->timing;
}

void lupin__request_timing(uintptr_t req, lupin_response_timing *out) {
  lupin_request_timing((const lupin_request *)req, out);
}

int lupin_request_response_complete(lupin_request *req) {
  if (!(req->gen->flags & LUPIN_GEN_OBSERVES_COMPLETE)) return 0;
  push_call(req, LUPIN_HOOK_RESPONSE_COMPLETE);
  return call_request(req, 0);
}

/* The Lua side answers a flat list: name, address, port, name, ... */
size_t lupin_request_fallbacks(lupin_request *req, const lupin_pick **out) {
  *out = req->fallbacks;
  if (req->fallbacks_done) return req->n_fallbacks;
  req->fallbacks_done = 1;
  lua_State *L = req->rt->L;
  char err[512];
  push_call(req, LUPIN_HOOK_FALLBACKS);
  if (lupin__call(req->rt, 1, 1, err, sizeof err)) {
    lupin__log(req->rt, LUPIN_LOG_ERROR, "request %s: fallbacks: %s", req->id, err);
    return 0;
  }
  size_t n = lua_objlen(L, -1) / 3;
  req->fallbacks = n ? calloc(n, sizeof *req->fallbacks) : NULL;
  for (size_t i = 0; req->fallbacks && i < n; i++) {
    lua_rawgeti(L, -1, (int)(3 * i + 1));
    lua_rawgeti(L, -2, (int)(3 * i + 2));
    lua_rawgeti(L, -3, (int)(3 * i + 3));
    lupin_pick *p = &req->fallbacks[req->n_fallbacks];
    *p = (lupin_pick){strdup(lua_tostring(L, -3)), strdup(lua_tostring(L, -2)),
                      (int)lua_tonumber(L, -1)};
    lua_pop(L, 3);
    if (!p->name || !p->address) {
      free((char *)p->name);
      free((char *)p->address);
      break;
    }
    req->n_fallbacks++;
  }
  lua_pop(L, 1);
  *out = req->fallbacks;
  return req->n_fallbacks;
}

const char *lupin_request_explain(lupin_request *req, lupin_explain_format format, size_t *len) {
  if (len) *len = 0;
  if (!(req->flags & LUPIN_REQUEST_EXPLAIN)) return NULL;
  lua_State *L = req->rt->L;
  char err[512];
  push_call(req, LUPIN_HOOK_EXPLAIN);
  lua_pushinteger(L, format);
  if (lupin__call(req->rt, 2, 1, err, sizeof err)) {
    lupin__log(req->rt, LUPIN_LOG_ERROR, "request %s: explain: %s", req->id, err);
    return NULL;
  }
  size_t n = 0;
  const char *s = lua_tolstring(L, -1, &n);
  char *copy = s ? malloc(n + 1) : NULL;
  if (copy) {
    memcpy(copy, s, n + 1);
    free(req->explain);
    req->explain = copy;
    if (len) *len = n;
  }
  lua_pop(L, 1);
  return copy;
}

static void free_fallbacks(lupin_request *req) {
  for (size_t i = 0; i < req->n_fallbacks; i++) {
    free((char *)req->fallbacks[i].name);
    free((char *)req->fallbacks[i].address);
  }
  free(req->fallbacks);
}

void lupin_request_end(lupin_request *req, lupin_outcome outcome) {
  lupin_runtime *rt = req->rt;
  int flow = req->flow;
  release_holds(req); /* first: the flow pump below sees the load without it */
  if (flow) {         /* out of the queue at once, out of the in-flight counts */
    lupin__push_hook(rt, LUPIN_HOOK_FLOW);
    lua_pushstring(rt->L, "end");
    lua_rawgeti(rt->L, LUA_REGISTRYINDEX, req->ref);
    lupin__call(rt, 2, 0, NULL, 0);
    rt->flow_requests--;
  }
  const char *name = req->flags & LUPIN_REQUEST_DRY_RUN
                         ? "dry_run"
                         : lupin_outcome_name(req->failed ? req->failed_outcome : outcome);
  if (req->gen->flags & LUPIN_GEN_HAS_FINISH) {
    push_call(req, LUPIN_HOOK_FINISH);
    lua_pushstring(rt->L, name);
    int nargs = 1;
    if (req->head_status) { /* ctx.response for finish, kept by keep_head */
      lua_pushinteger(rt->L, req->head_status);
      lua_pushlstring(rt->L, req->head, req->head_len);
      nargs = 3;
    }
    call_request(req, nargs);
  } else {
    /* no finish hook to run: all the Lua side needs is the outcome (the
     * request's state is ended, see lua/lupin/runtime/leaks.lua); the field exists
     * from the start, so setting it allocates nothing outside a pcall */
    lua_rawgeti(rt->L, LUA_REGISTRYINDEX, req->ref);
    lua_pushstring(rt->L, name);
    lua_setfield(rt->L, -2, "outcome");
    lua_pop(rt->L, 1);
  }
  luaL_unref(rt->L, LUA_REGISTRYINDEX, req->ref);

  if (req->prev)
    req->prev->next = req->next;
  else
    rt->requests = req->next;
  if (req->next)
    req->next->prev = req->prev;
  else
    rt->requests_tail = req->prev;
  rt->requests_ended++;
  lupin__generation_unpin(rt, req->gen);

  clear_result(req);
  clear_headers(&req->client);
  free_fallbacks(req);
  free(req->explain);
  free(req->upstream.v);
  free(req->client.v);
  request_recycle(rt, req);
  if (flow) lupin__flow_pump(rt, 0); /* its place is free for a queued one */
}

void lupin__requests_cancel_all(lupin_runtime *rt) {
  while (rt->requests)
    lupin_request_end(rt->requests, LUPIN_CANCELLED);
}
