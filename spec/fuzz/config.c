/* Fuzz target "config": a config file's text.
 *
 * The runtime loads it as `lupin serve` and `lupin check` do (read, check
 * against the schemas, build the plugins, dry cycle; then the gateway's
 * settings and endpoints are read from it).  A refused text must leave an
 * error message and the generation before serving; an accepted one must
 * schedule a request over two endpoints.  The source is named as a file in
 * spec/fuzz/, so "pluginDirs": ["../fixtures/plugins"] reaches the specs'
 * test plugins (broken ones included).  Every 64 inputs, no request state
 * may outlive its request (lupin_runtime_check_leaks) and at most the
 * current generation is alive. */
#include "fuzz.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static lupin_runtime *rt;
static char source[4096];

static void count_endpoint(void *ud, const lupin_endpoint_desc *d) {
  (void)d;
  (*(size_t *)ud)++;
}

void __lsan_disable(void) __attribute__((weak));
void __lsan_enable(void) __attribute__((weak));

static void teardown(void) { lupin_runtime_free(rt); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_setup();
  const char *level = getenv("LUPIN_FUZZ_LOG");
  lupin_options o = {.log_level = level ? atoi(level) : LUPIN_LOG_DEBUG, .seed = 1};
  char err[1024];
  /* lua-cjson's buffers live as long as the state, held from the Lua heap
   * LeakSanitizer does not scan: not an input's leak */
  if (__lsan_disable) __lsan_disable();
  rt = lupin_runtime_new(&o, err, sizeof err);
  if (__lsan_enable) __lsan_enable();
  if (!rt) fz_fail("lupin_runtime_new: %s", err);
  if (gw_settings_declare(rt, err, sizeof err)) fz_fail("gw_settings_declare: %s", err);
  atexit(teardown);
  fz_lua_coverage(rt);
  snprintf(source, sizeof source, "%s/spec/fuzz/fuzz-config.json", getenv("LUPIN_HOME"));
  lupin_header zone = {"zone", "a"};
  lupin_endpoint_desc eps[2] = {{"e0", "127.0.0.1", 8001, &zone, 1},
                                {"e1", "127.0.0.1", 8002, NULL, 0}};
  for (int i = 0; i < 2; i++)
    if (lupin_endpoint_upsert(rt, &eps[i], err, sizeof err)) fz_fail("upsert: %s", err);
  lupin_metrics m = {.waiting_queue_size = 1, .running_requests = 2, .kv_cache_usage = 0.5};
  lupin_endpoint_set_metrics(rt, "e0", &m);
  return 0;
}

static void one_request(void) {
  static const char body[] = "{\"model\":\"m\",\"prompt\":\"hello world, hello world\"}";
  lupin_header h = {"x-test", "1"};
  lupin_request_desc d = {.path = "/v1/completions",
                          .body = body,
                          .body_len = sizeof body - 1,
                          .headers = &h,
                          .n_headers = 1};
  char err[512];
  lupin_request *req = lupin_request_begin(rt, &d, err, sizeof err);
  if (!req) fz_fail("a request could not begin on a config that loaded: %s", err);
  lupin_result res;
  int status = lupin_request_schedule(req, &res);
  if (status == 200 && !res.n_picks) fz_fail("scheduled with no pick");
  if (status != 200 && (!res.message || !*res.message))
    fz_fail("scheduling answered %d without a message", status);
  if (status == 200) {
    lupin_header rh = {"content-type", "application/json"};
    lupin_request_response_header(req, 200, &rh, 1);
    lupin_request_response_chunk(req, "{}", 2);
    lupin_request_response_complete(req);
  }
  lupin_request_end(req, status == 200 ? LUPIN_OK : LUPIN_REJECTED);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static unsigned long runs;
  char *text = malloc(size + 1);
  memcpy(text, data, size);
  text[size] = 0;
  char err[2048] = "";
  uint64_t before = 0;
  lupin_stats s;
  lupin_runtime_stats(rt, &s);
  before = s.generation;
  if (lupin_runtime_load_string(rt, text, source, err, sizeof err)) {
    if (!*err) fz_fail("a config was refused without a message");
    lupin_runtime_stats(rt, &s);
    if (s.generation != before) fz_fail("a refused config changed the generation");
  } else {
    gw_settings set;
    size_t n = 0;
    if (gw_settings_read(rt, &set, err, sizeof err))
      fz_fail("a config loaded but its gateway settings cannot be read: %s", err);
    if (lupin_runtime_read_endpoints(rt, NULL, count_endpoint, &n, err, sizeof err))
      fz_fail("a config loaded but its endpoints cannot be read: %s", err);
    one_request();
  }
  free(text);
  lupin_runtime_stats(rt, &s);
  if (s.live_requests) fz_fail("%llu requests alive", (unsigned long long)s.live_requests);
  if (++runs % 64 == 0) {
    char report[2048];
    if (lupin_runtime_check_leaks(rt, report, sizeof report))
      fz_fail("request state outlived its request: %s", report);
    lupin_runtime_stats(rt, &s);
    const char *verbose = getenv("LUPIN_FUZZ_VERBOSE");
    if (verbose && *verbose == '1')
      fprintf(stderr, "config: %lu inputs, Lua memory %llu bytes after a full collection\n", runs,
              (unsigned long long)s.lua_memory);
    if (s.generations_alive > 1)
      fz_fail("%llu generations alive with no request in flight",
              (unsigned long long)s.generations_alive);
  }
  return 0;
}
