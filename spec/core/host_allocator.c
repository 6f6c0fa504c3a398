/* A host's allocator under the Lua heap (lupin_options.allocator): every
 * block of the state comes from it and goes back to it, the runtime's count
 * of Lua memory is exactly what the host holds, the memory limit still
 * refuses a plugin's allocation before the host is asked for it, and a host
 * allocator that gives nothing makes lupin_runtime_new fail with a message.
 * Run by spec/core/host_allocator_spec.lua (and under ASan by make
 * test-asan).
 *
 *   LUPIN_HOME=. ./build/host-allocator spec/fixtures/plugins */
#define PROGRAM "host-allocator"
#include "program.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIMIT ((size_t)16 << 20)

static const char CONFIG[] =
    "{\"plugins\": [{\"type\": \"test-observer\", \"name\": \"hog\","
    "  \"parameters\": {\"allocate\": 67108864}},"
    " {\"type\": \"test-scorer\", \"name\": \"s\", \"parameters\": {\"record\": false}},"
    " {\"type\": \"test-picker\", \"name\": \"p\"}],"
    " \"schedulingProfiles\": [{\"name\": \"default\", \"plugins\": ["
    "  {\"pluginRef\": \"s\"}, {\"pluginRef\": \"p\"}]}]}";

typedef struct counting {
  size_t calls, live_blocks, live_bytes, peak_bytes;
  int refuse; /* give nothing */
} counting;

static void *counting_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  counting *c = ud;
  c->calls++;
  if (!nsize) {
    if (ptr) {
      c->live_blocks--;
      c->live_bytes -= osize;
    }
    free(ptr);
    return NULL;
  }
  void *p = c->refuse ? NULL : realloc(ptr, nsize);
  if (!p) return NULL;
  if (ptr)
    c->live_bytes -= osize;
  else
    c->live_blocks++;
  c->live_bytes += nsize;
  if (c->live_bytes > c->peak_bytes) c->peak_bytes = c->live_bytes;
  return p;
}

static int lifecycle(lupin_runtime *rt, const char *body) {
  char err[512];
  lupin_request_desc d = {.path = "/v1/completions", .body = body, .body_len = strlen(body)};
  lupin_request *req = lupin_request_begin(rt, &d, err, sizeof err);
  if (!req) return -1;
  lupin_result res;
  int status = lupin_request_schedule(req, &res);
  lupin_request_response_header(req, 200, NULL, 0);
  lupin_request_response_complete(req);
  lupin_request_end(req, LUPIN_OK);
  return status;
}

int main(int argc, char **argv) {
  const char *dirs[] = {argc > 1 ? argv[1] : "spec/fixtures/plugins"};
  char err[1024];
  counting c = {0};
  lupin_options o = {.plugin_dirs = dirs,
                     .n_plugin_dirs = 1,
                     .log_level = -1,
                     .seed = 1,
                     .allocator = counting_alloc,
                     .allocator_ud = &c};
  lupin_runtime *rt = lupin_runtime_new(&o, err, sizeof err);
  if (!rt || lupin_runtime_load_string(rt, CONFIG, "host-allocator.json", err, sizeof err)) {
    fprintf(stderr, "host-allocator: %s\n", err);
    return 1;
  }
  add_endpoints(rt, 4);

  /* the hog allocates only over the limit: without one, small lifecycles */
  lupin_runtime_set_memory_limit(rt, LIMIT);
  for (int i = 0; i < 1000; i++)
    CHECK(lifecycle(rt, "{\"model\":\"m\",\"prompt\":\"hello\"}") == 200, "lifecycle %d failed", i);
  lupin_stats s;
  size_t held = c.live_bytes; /* the stats call reads its count before running Lua */
  lupin_runtime_stats(rt, &s);
  CHECK(c.calls > 1000, "the host's allocator was called %zu times", c.calls);
  CHECK(s.lua_memory == held, "the runtime counts %llu bytes, the host holds %zu",
        (unsigned long long)s.lua_memory, held);
  /* (a slow build may see some of the hog's calls cut by the call budget
   * before they allocate: at least one refusal, not one per request) */
  CHECK(s.memory_limit_hits > 0, "the hog's 64 MB were never refused");
  CHECK(c.peak_bytes < LIMIT, "the host was asked for %zu bytes at once, over the %zu limit",
        c.peak_bytes, LIMIT);

  lupin_runtime_free(rt);
  CHECK(c.live_blocks == 0 && c.live_bytes == 0,
        "%zu blocks (%zu bytes) not given back to the host's allocator", c.live_blocks,
        c.live_bytes);

  counting none = {.refuse = 1};
  o.allocator_ud = &none;
  err[0] = 0;
  CHECK(!lupin_runtime_new(&o, err, sizeof err), "a runtime made of no memory");
  CHECK(!strcmp(err, "cannot create a Lua state"), "refused: \"%s\"", err);
  CHECK(none.live_blocks == 0, "%zu blocks left by the refused runtime", none.live_blocks);

  if (failures) return 1;
  printf("host-allocator: every block from the host's allocator and back, counted exactly, "
         "limit applied above it\n");
  return 0;
}
