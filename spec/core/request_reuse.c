/* Ended requests are kept and reused (core/request.c's spares): in the
 * steady state a lifecycle makes no C allocation, and a reused request
 * answers with its own id, model and picks, never the one before's.
 * Linked with --wrap for malloc, calloc, realloc and strdup, so every C
 * allocation of liblupin is counted here; the Lua heap has its own
 * allocator (lupin_options.allocator) and is not.  Run by
 * spec/core/request_reuse_spec.lua (and under ASan by make test-asan).
 *
 *   LUPIN_HOME=. ./build/request-reuse spec/fixtures/plugins */
#define PROGRAM "request-reuse"
#include "program.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char CONFIG[] = "{\"plugins\": [{\"type\": \"test-scorer\", \"name\": \"s\", "
                             "\"parameters\": {\"record\": false}},"
                             " {\"type\": \"test-picker\", \"name\": \"p\"}],"
                             " \"schedulingProfiles\": [{\"name\": \"default\", \"plugins\": ["
                             "  {\"pluginRef\": \"s\"}, {\"pluginRef\": \"p\"}]}]}";

static size_t c_allocations;

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);

void *__wrap_malloc(size_t n) {
  c_allocations++;
  return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size) {
  c_allocations++;
  return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n) {
  c_allocations++;
  return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s) {
  c_allocations++;
  return __real_strdup(s);
}

/* the Lua heap, not counted */
static void *lua_heap(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud;
  (void)osize;
  if (nsize) return __real_realloc(ptr, nsize);
  free(ptr);
  return NULL;
}

static lupin_request *begin(lupin_runtime *rt, const char *id, const char *body) {
  char err[512];
  lupin_request_desc d = {
      .id = id, .path = "/v1/completions", .body = body, .body_len = strlen(body), .check_body = 1};
  lupin_request *req = lupin_request_begin(rt, &d, err, sizeof err);
  CHECK(req, "begin %s: %s", id, err);
  return req;
}

/* One whole lifecycle; 0 when the request was scheduled on one of ep1..ep4
 * and read back its own id. */
static int lifecycle(lupin_runtime *rt, const char *id, const char *body) {
  lupin_request *req = begin(rt, id, body);
  if (!req) return -1;
  lupin_result res;
  int ok = lupin_request_schedule(req, &res) == 200 && res.n_picks >= 1 &&
           !strncmp(res.picks[0].name, "ep", 2) && !strcmp(lupin_request_id(req), id);
  lupin_header head[] = {{"content-type", "application/json"}, {"x-served-by", "ep"}};
  lupin_request_response_header(req, 200, head, 2);
  lupin_request_response_complete(req);
  lupin_request_end(req, LUPIN_OK);
  return ok ? 0 : -1;
}

static void no_allocation_in_the_steady_state(lupin_runtime *rt) {
  const char *body = "{\"model\":\"m\",\"prompt\":\"hello\"}";
  char id[32];
  for (int i = 0; i < 300; i++) { /* the spares fill, the picks grow */
    snprintf(id, sizeof id, "warm-%04d", i);
    CHECK(lifecycle(rt, id, body) == 0, "warm-up lifecycle %d failed", i);
  }
  size_t before = c_allocations;
  for (int i = 0; i < 1000; i++) {
    snprintf(id, sizeof id, "kept-%04d", i);
    CHECK(lifecycle(rt, id, body) == 0, "lifecycle %d failed", i);
  }
  CHECK(c_allocations == before, "1000 lifecycles made %zu C allocations, want 0",
        c_allocations - before);
}

/* A request that reuses one with a longer id and a model reads its own. */
static void a_reused_request_reads_its_own(lupin_runtime *rt) {
  char long_id[2001];
  memset(long_id, 'x', sizeof long_id - 1);
  long_id[sizeof long_id - 1] = '\0';
  lupin_request *req =
      begin(rt, long_id, "{\"model\":\"a-rather-long-model-name\",\"prompt\":\"a\"}");
  if (!req) return;
  CHECK(!strcmp(lupin_request_id(req), long_id), "a 2000-byte id read back as another");
  CHECK(!strcmp(lupin_request_model(req), "a-rather-long-model-name"), "model \"%s\"",
        lupin_request_model(req));
  lupin_request_end(req, LUPIN_CANCELLED);

  req = begin(rt, "b", "{\"model\":\"m2\",\"prompt\":\"b\"}");
  if (!req) return;
  CHECK(!strcmp(lupin_request_id(req), "b"), "id \"%s\", want \"b\"", lupin_request_id(req));
  CHECK(!strcmp(lupin_request_model(req), "m2"), "model \"%s\", want \"m2\"",
        lupin_request_model(req));
  lupin_request_end(req, LUPIN_CANCELLED);

  /* no model at all (the body is not checked, nor its model read) */
  char err[512];
  lupin_request_desc d = {.id = "c", .path = "/v1/completions", .body = "{}", .body_len = 2};
  req = lupin_request_begin(rt, &d, err, sizeof err);
  CHECK(req, "begin c: %s", err);
  if (!req) return;
  CHECK(!lupin_request_model(req), "a request without a model reads \"%s\"",
        lupin_request_model(req));
  lupin_request_end(req, LUPIN_CANCELLED);
}

/* More requests in flight than spares kept: each reads its own, and the
 * ones past the spares are freed (ASan's leak check sees the rest freed
 * with the runtime). */
static void more_in_flight_than_spares(lupin_runtime *rt) {
  enum { N = 600 };
  static lupin_request *live[N];
  char id[32];
  for (int i = 0; i < N; i++) {
    snprintf(id, sizeof id, "flight-%d", i);
    live[i] = begin(rt, id, "{\"model\":\"m\",\"prompt\":\"x\"}");
  }
  for (int i = 0; i < N; i++) {
    snprintf(id, sizeof id, "flight-%d", i);
    if (live[i]) {
      CHECK(!strcmp(lupin_request_id(live[i]), id), "request %d reads id \"%s\"", i,
            lupin_request_id(live[i]));
      lupin_request_end(live[i], LUPIN_CANCELLED);
    }
  }
}

int main(int argc, char **argv) {
  const char *dirs[] = {argc > 1 ? argv[1] : "spec/fixtures/plugins"};
  char err[1024];
  lupin_options o = {
      .plugin_dirs = dirs, .n_plugin_dirs = 1, .log_level = -1, .seed = 1, .allocator = lua_heap};
  lupin_runtime *rt = lupin_runtime_new(&o, err, sizeof err);
  if (!rt || lupin_runtime_load_string(rt, CONFIG, "request-reuse.json", err, sizeof err)) {
    fprintf(stderr, "request-reuse: %s\n", err);
    return 1;
  }
  add_endpoints(rt, 4);
  no_allocation_in_the_steady_state(rt);
  a_reused_request_reads_its_own(rt);
  more_in_flight_than_spares(rt);
  no_allocation_in_the_steady_state(rt);
  lupin_runtime_free(rt);

  if (failures) return 1;
  printf("request-reuse: no C allocation a lifecycle once warm, each request reads its own\n");
  return 0;
}
