/* The cost of one full request lifecycle through the embedding API (begin,
 * schedule, response header, three chunks, complete, end) and the Lua heap
 * held per in-flight request.  A benchmark, not a test: it prints figures.
 * Beside the lifecycle's p99 it prints the machine's own: the p99 of a plain C
 * loop as long as the lifecycle's median, timed the same way (on a shared VM
 * the host's interruptions alone can make it several times the median).
 * The lifecycles are timed twice: with LuaJIT pacing the collector (its
 * steps inside the lifecycles that allocate) and with the host pacing it
 * (lupin_options.host_paces_collector, as lupin serve does: the steps
 * between lifecycles, timed apart).  Last, each plugin's time per call
 * (lupin_runtime_plugin_stats): where a lifecycle's time goes.
 *
 *   LUPIN_HOME=. ./build/bench-lifecycle [config] [endpoints] [lifecycles] [prompt bytes] */
#include <lupin.h>

#include "internal.h" /* lupin__eval: the collector stopped to count garbage */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Work the compiler cannot drop: volatile stores in a loop. */
static void spin(long iterations) {
  volatile long sink = 0;
  for (long k = 0; k < iterations; k++)
    sink += k;
}

/* Median and p99 of n runs of a plain loop calibrated to last target_ns. */
static void machine_floor(double target_ns, int n, double *median, double *p99) {
  long it = 1000;
  for (int round = 0; round < 6; round++) { /* calibrate on the fastest of 20 runs */
    double best = 1e18;
    for (int k = 0; k < 20; k++) {
      double s = now_ns();
      spin(it);
      double d = now_ns() - s;
      if (d < best) best = d;
    }
    it = best > 0 ? (long)(it * target_ns / best) + 1 : it * 2;
  }
  double *t = malloc(sizeof *t * n);
  for (int i = 0; i < n; i++) {
    double s = now_ns();
    spin(it);
    t[i] = now_ns() - s;
  }
  qsort(t, n, sizeof *t, cmp);
  *median = t[n / 2];
  *p99 = t[n * 99 / 100];
  free(t);
}

static char *body;
static size_t body_len;

/* A completion whose prompt is `bytes` characters of varied English-like text. */
static void make_body(size_t bytes) {
  static const char words[] = "the quick brown fox jumps over a lazy dog while seven wizards "
                              "box nimbly and judges vex the sphinx of black quartz ";
  body = malloc(bytes + 128);
  body_len = (size_t)sprintf(body, "{\"model\":\"llama\",\"max_tokens\":64,\"stream\":true,"
                                   "\"prompt\":\"");
  for (size_t i = 0; i < bytes; i++)
    body[body_len++] = words[i % (sizeof words - 1)];
  body_len += (size_t)sprintf(body + body_len, "\"}");
}

static lupin_request *begin(lupin_runtime *rt) {
  char err[256];
  lupin_request_desc d = {.path = "/v1/completions", .body = body, .body_len = body_len};
  lupin_request *req = lupin_request_begin(rt, &d, err, sizeof err);
  if (!req) {
    fprintf(stderr, "begin: %s\n", err);
    exit(1);
  }
  return req;
}

static void lifecycle(lupin_runtime *rt) {
  static const lupin_header ct = {"content-type", "text/event-stream"};
  lupin_request *req = begin(rt);
  lupin_result res;
  if (lupin_request_schedule(req, &res) != 200) {
    fprintf(stderr, "schedule: %d %s\n", res.status, res.message);
    exit(1);
  }
  lupin_request_response_header(req, 200, &ct, 1);
  for (int i = 0; i < 3; i++)
    lupin_request_response_chunk(req, "data: {\"x\":1}\n\n", 16);
  lupin_request_response_complete(req);
  lupin_request_end(req, LUPIN_OK);
}

static uint64_t lua_memory_after_gc(lupin_runtime *rt) {
  char report[64];
  lupin_runtime_check_leaks(rt, report, sizeof report); /* runs a full GC */
  lupin_stats s;
  lupin_runtime_stats(rt, &s);
  return s.lua_memory;
}

/* A runtime with config's plugins and n_endpoints endpoints. */
static lupin_runtime *open_runtime(const char *config, int n_endpoints, int host_paced) {
  char err[2048];
  lupin_options o = {.log_level = LUPIN_LOG_WARN, .seed = 1, .host_paces_collector = host_paced};
  lupin_runtime *rt = lupin_runtime_new(&o, err, sizeof err);
  if (!rt || lupin_runtime_load(rt, config, err, sizeof err)) {
    fprintf(stderr, "bench: %s\n", err);
    exit(1);
  }
  for (int i = 0; i < n_endpoints; i++) {
    char name[16], addr[32];
    snprintf(name, sizeof name, "ep%d", i);
    snprintf(addr, sizeof addr, "10.0.%d.%d", i / 250, i % 250 + 1);
    lupin_endpoint_upsert(rt, &(lupin_endpoint_desc){name, addr, 8000, NULL, 0}, err, sizeof err);
    lupin_endpoint_set_metrics(
        rt, name, &(lupin_metrics){.waiting_queue_size = i % 7, .kv_cache_usage = 0.1 * (i % 10)});
  }
  return rt;
}

typedef struct timing {
  double median, p99, mean, steps; /* steps: the host's collector steps, mean per lifecycle */
} timing;

/* n lifecycles timed one by one, after a warm-up; with a host-paced
 * collector, its steps come between them, timed apart. */
static timing time_lifecycles(lupin_runtime *rt, int n, int host_paced) {
  for (int i = 0; i < n / 10; i++) { /* warm up the JIT */
    lifecycle(rt);
    if (host_paced) lupin_runtime_collect_step(rt);
  }
  double *t = malloc(sizeof *t * n), total = 0, steps = 0;
  for (int i = 0; i < n; i++) {
    double s = now_ns();
    lifecycle(rt);
    t[i] = now_ns() - s;
    total += t[i];
    if (host_paced) {
      s = now_ns();
      lupin_runtime_collect_step(rt);
      steps += now_ns() - s;
    }
  }
  qsort(t, n, sizeof *t, cmp);
  timing r = {t[n / 2], t[n * 99 / 100], total / n, steps / n};
  free(t);
  return r;
}

/* One line per (plugin instance, extension point): where a lifecycle's time
 * goes, per call. */
static void print_plugin_stat(void *ud, const lupin_plugin_stat *st) {
  (void)ud;
  printf("  %-30s %-16s %9.3f us/call  (%llu calls)\n", st->plugin, st->point,
         st->nanoseconds / 1e3 / (double)st->calls, (unsigned long long)st->calls);
}

int main(int argc, char **argv) {
  const char *config = argc > 1 ? argv[1] : "examples/configs/minimal.json";
  int n_endpoints = argc > 2 ? atoi(argv[2]) : 16;
  int n = argc > 3 ? atoi(argv[3]) : 200000;
  size_t prompt = argc > 4 ? (size_t)atol(argv[4]) : 100;
  char err[2048];
  make_body(prompt);

  lupin_runtime *rt = open_runtime(config, n_endpoints, 0);
  timing a = time_lifecycles(rt, n, 0);
  lupin_runtime *paced = open_runtime(config, n_endpoints, 1);
  timing h = time_lifecycles(paced, n, 1);

  /* garbage: what lifecycles allocate, counted with the collector stopped */
  enum { GARBAGE_RUNS = 10000 };
  free(lupin__eval(rt, "collectgarbage('collect') collectgarbage('stop')", err, sizeof err));
  lupin_stats g0, g1;
  lupin_runtime_stats(rt, &g0);
  for (int i = 0; i < GARBAGE_RUNS; i++)
    lifecycle(rt);
  lupin_runtime_stats(rt, &g1);
  free(lupin__eval(rt, "collectgarbage('restart')", err, sizeof err));

  enum { IN_FLIGHT = 10000 };
  static lupin_request *reqs[IN_FLIGHT];
  uint64_t before = lua_memory_after_gc(rt);
  for (int i = 0; i < IN_FLIGHT; i++) {
    lupin_result res;
    reqs[i] = begin(rt);
    lupin_request_schedule(reqs[i], &res);
  }
  uint64_t during = lua_memory_after_gc(rt);
  for (int i = 0; i < IN_FLIGHT; i++)
    lupin_request_end(reqs[i], LUPIN_OK);
  uint64_t after = lua_memory_after_gc(rt);

  printf("config %s, %d endpoints, %d lifecycles, %zu-byte prompt\n", config, n_endpoints, n,
         prompt);
  printf("lifecycle  median %.2f us  p99 %.2f us  mean %.2f us  (%.0f lifecycles/s on one core)\n",
         a.median / 1e3, a.p99 / 1e3, a.mean / 1e3, 1e9 / a.mean);
  printf("host-paced median %.2f us  p99 %.2f us  mean %.2f us  + collector steps between "
         "lifecycles %.2f us  (%.0f lifecycles/s on one core)\n",
         h.median / 1e3, h.p99 / 1e3, h.mean / 1e3, h.steps / 1e3, 1e9 / (h.mean + h.steps));
  double floor_median, floor_p99;
  machine_floor(a.median, n < 100000 ? n : 100000, &floor_median, &floor_p99);
  printf("machine    median %.2f us  p99 %.2f us  (a plain C loop as long as the median, "
         "timed alike)\n",
         floor_median / 1e3, floor_p99 / 1e3);
  printf("lua garbage per lifecycle: %.0f bytes (GC stopped over %d lifecycles)\n",
         (double)(g1.lua_memory - g0.lua_memory) / GARBAGE_RUNS, GARBAGE_RUNS);
  printf("lua heap per in-flight request (scheduled, %d in flight): %.0f bytes\n", IN_FLIGHT,
         (double)(during - before) / IN_FLIGHT);
  printf("lua heap after they ended: %+lld bytes from before\n", (long long)(after - before));
  printf("plugin calls (the host-paced lifecycles, warm-up included):\n");
  lupin_runtime_plugin_stats(paced, print_plugin_stat, NULL);
  lupin_runtime_free(paced);
  free(body);
  lupin_runtime_free(rt);
  return 0;
}
