/* Scale and leaks through the embedding API: millions of lifecycles with
 * failures injected at every stage (bench/plugins/chaos.lua: admit rejects,
 * filters emptying the list, plugin errors; here: upstream errors, cancels,
 * timeouts), then a crowd of requests in flight at once.  It checks what must
 * hold -- finish ran once per begun request, no request table outlives its
 * request, Lua memory returns to where it was -- and prints the figures.
 *
 *   LUPIN_HOME=. ./build/bench-soak [lifecycles] [in-flight] */
#include <lupin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ENDPOINTS 16

typedef struct {
  uint64_t finish_calls;
} counters;

/* The injected errors are logged (rate-limited); count the lines, show none. */
static void count_log(void *ud, int level, const char *msg) {
  (void)level;
  (void)msg;
  (*(uint64_t *)ud)++;
}

static void count_finish(void *ud, const lupin_plugin_stat *st) {
  if (strcmp(st->plugin, "chaos") == 0 && strcmp(st->point, "finish") == 0)
    ((counters *)ud)->finish_calls = st->calls;
}

static long rss_kib(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static uint64_t lua_after_gc(lupin_runtime *rt, int *leaked) {
  char report[1024];
  *leaked = lupin_runtime_check_leaks(rt, report, sizeof report);
  if (*leaked) fprintf(stderr, "soak: leaks:\n%s\n", report);
  lupin_stats s;
  lupin_runtime_stats(rt, &s);
  return s.lua_memory;
}

/* Some prompts share prefixes, as real traffic does. */
static size_t make_body(char *buf, size_t cap, unsigned seq) {
  return (size_t)snprintf(buf, cap,
                          "{\"model\":\"llama\",\"max_tokens\":16,\"prompt\":\"System prompt of "
                          "group %u: answer in the voice of a lighthouse keeper who has read "
                          "every book about the sea. Question %u: what is the tide doing?\"}",
                          seq % 97, seq);
}

static lupin_request *begin(lupin_runtime *rt, unsigned seq) {
  char body[512], err[256];
  lupin_request_desc d = {.path = "/v1/completions", .body = body};
  d.body_len = make_body(body, sizeof body, seq);
  lupin_request *req = lupin_request_begin(rt, &d, err, sizeof err);
  if (!req) {
    fprintf(stderr, "soak: begin: %s\n", err);
    exit(1);
  }
  return req;
}

/* One request to its end, on a path drawn at random. */
static void lifecycle(lupin_runtime *rt, unsigned seq) {
  static const lupin_outcome ends[] = {
      LUPIN_OK,        LUPIN_OK,     LUPIN_OK, LUPIN_OK, LUPIN_OK, LUPIN_OK, LUPIN_UPSTREAM_ERROR,
      LUPIN_CANCELLED, LUPIN_TIMEOUT};
  lupin_request *req = begin(rt, seq);
  lupin_result res;
  lupin_outcome end = ends[rand() % 9];
  if (lupin_request_schedule(req, &res) == 200 && end != LUPIN_CANCELLED) {
    lupin_request_response_header(req, end == LUPIN_UPSTREAM_ERROR ? 500 : 200, NULL, 0);
    if (end == LUPIN_OK) {
      lupin_request_response_chunk(req, "data: {}\n\n", 10);
      lupin_request_response_complete(req);
    }
  }
  lupin_request_end(req, end);
}

static void move_metrics(lupin_runtime *rt, unsigned seq) {
  char name[16];
  int i = (int)(seq % ENDPOINTS);
  snprintf(name, sizeof name, "ep%d", i);
  lupin_endpoint_set_metrics(rt, name,
                             &(lupin_metrics){.waiting_queue_size = rand() % 20,
                                              .kv_cache_usage = (rand() % 100) / 100.0});
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000000;
  long crowd = argc > 2 ? atol(argv[2]) : 100000;
  char err[2048];
  srand(7);
  uint64_t log_lines = 0;
  lupin_options opts = {
      .log_level = LUPIN_LOG_ERROR, .seed = 7, .log = count_log, .log_ud = &log_lines};
  lupin_runtime *rt = lupin_runtime_new(&opts, err, sizeof err);
  if (!rt || lupin_runtime_load(rt, "bench/soak.json", err, sizeof err)) {
    fprintf(stderr, "soak: %s\n", err);
    return 1;
  }
  for (int i = 0; i < ENDPOINTS; i++) {
    char name[16], addr[32];
    snprintf(name, sizeof name, "ep%d", i);
    snprintf(addr, sizeof addr, "10.1.0.%d", i + 1);
    lupin_endpoint_upsert(rt, &(lupin_endpoint_desc){name, addr, 8000, NULL, 0}, err, sizeof err);
  }

  int leaked;
  for (unsigned s = 0; s < 100000; s++)
    lifecycle(rt, s); /* warm up */
  uint64_t before = lua_after_gc(rt, &leaked);
  long rss_before = rss_kib();
  time_t t0 = time(NULL);
  for (long s = 0; s < n; s++) {
    if (s % 64 == 0) move_metrics(rt, (unsigned)s);
    lifecycle(rt, (unsigned)s);
  }
  double secs = difftime(time(NULL), t0);
  uint64_t after = lua_after_gc(rt, &leaked);
  int leaked_lifecycles = leaked;

  lupin_request **reqs = malloc(sizeof *reqs * (size_t)crowd);
  for (long i = 0; i < crowd; i++) {
    lupin_result res;
    reqs[i] = begin(rt, (unsigned)i);
    lupin_request_schedule(reqs[i], &res);
  }
  lupin_stats s;
  lupin_runtime_stats(rt, &s);
  uint64_t crowd_memory = s.lua_memory, crowd_tables = s.live_request_tables;
  long crowd_rss = rss_kib();
  for (long i = 0; i < crowd; i++)
    lupin_request_end(reqs[i], i % 2 ? LUPIN_OK : LUPIN_CANCELLED);
  free(reqs);
  uint64_t crowd_gone = lua_after_gc(rt, &leaked);
  int leaked_crowd = leaked;
  /* The registries sized for the crowd shrink as traffic goes on. */
  for (unsigned i = 0; i < 200000; i++)
    lifecycle(rt, i);
  uint64_t end_memory = lua_after_gc(rt, &leaked);
  lupin_runtime_stats(rt, &s);
  counters c = {0};
  lupin_runtime_plugin_stats(rt, count_finish, &c);

  printf("soak: %ld lifecycles in %.0f s with failures at every stage, then %ld in flight\n", n,
         secs, crowd);
  printf("  lua memory after GC    before %llu B, after the lifecycles %llu B (%+lld)\n",
         (unsigned long long)before, (unsigned long long)after, (long long)(after - before));
  printf("                         right after the crowd ended %llu B (%+lld), after 200,000 "
         "more lifecycles %llu B (%+lld)\n",
         (unsigned long long)crowd_gone, (long long)(crowd_gone - before),
         (unsigned long long)end_memory, (long long)(end_memory - before));
  printf("  with %ld in flight     lua memory %llu B, live request tables %llu, RSS %ld KiB\n",
         crowd, (unsigned long long)crowd_memory, (unsigned long long)crowd_tables, crowd_rss);
  printf("  RSS                    before %ld KiB, after %ld KiB\n", rss_before, rss_kib());
  printf("  log lines (rate-limited errors injected) %llu\n", (unsigned long long)log_lines);
  printf("  requests begun %llu, ended %llu, finish calls %llu; live request tables %llu\n",
         (unsigned long long)s.requests_begun, (unsigned long long)s.requests_ended,
         (unsigned long long)c.finish_calls, (unsigned long long)s.live_request_tables);
  int ok = s.requests_begun == s.requests_ended && c.finish_calls == s.requests_begun &&
           s.live_request_tables == 0 && leaked == 0 && leaked_lifecycles == 0 && leaked_crowd == 0;
  printf("  %s\n", ok ? "every request finished once, no state left behind"
                      : "FAILED: finish calls, live tables or leaks do not add up");
  lupin_runtime_free(rt);
  return ok ? 0 : 1;
}
