/* Reload time through the embedding API: lupin_runtime_reload re-reads the
 * config and every plugin file, validates, instantiates (init, migrate), runs
 * the dry scheduling cycle over the endpoints and swaps.  Median and p90 over
 * repeats, with requests in flight pinning nothing (the old generation is
 * released at the swap).  A benchmark, not a test: it prints figures.
 *
 *   LUPIN_HOME=. ./build/bench-reload config [endpoints] [repeats] */
#include <lupin.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench-reload config [endpoints] [repeats]\n");
    return 2;
  }
  const char *config = argv[1];
  int n_eps = argc > 2 ? atoi(argv[2]) : 16, repeats = argc > 3 ? atoi(argv[3]) : 200;
  char err[2048];
  lupin_options o = {.log_level = LUPIN_LOG_WARN, .seed = 1};
  lupin_runtime *rt = lupin_runtime_new(&o, err, sizeof err);
  if (!rt || lupin_runtime_load(rt, config, err, sizeof err)) {
    fprintf(stderr, "bench-reload: %s\n", err);
    return 1;
  }
  for (int i = 0; i < n_eps; i++) {
    char name[32];
    snprintf(name, sizeof name, "ep%d", i);
    lupin_endpoint_desc d = {name, "10.0.0.1", 8000 + i, NULL, 0};
    lupin_endpoint_upsert(rt, &d, err, sizeof err);
    lupin_metrics m = {.waiting_queue_size = i % 4, .kv_cache_usage = 0.1 * (i % 10)};
    lupin_endpoint_set_metrics(rt, name, &m);
  }
  double *t = malloc(sizeof *t * (size_t)repeats);
  for (int i = 0; i < repeats; i++) {
    double t0 = lupin_now();
    if (lupin_runtime_reload(rt, err, sizeof err)) {
      fprintf(stderr, "bench-reload: %s\n", err);
      return 1;
    }
    t[i] = lupin_now() - t0;
  }
  qsort(t, (size_t)repeats, sizeof *t, cmp);
  lupin_stats st;
  lupin_runtime_stats(rt, &st);
  printf("reload %-28s %3d endpoints: median %.2f ms, p90 %.2f ms, min %.2f ms (%d reloads, "
         "Lua heap after %.1f MB)\n",
         config, n_eps, t[repeats / 2] * 1e3, t[repeats * 9 / 10] * 1e3, t[0] * 1e3, repeats,
         (double)st.lua_memory / 1e6);
  free(t);
  lupin_runtime_free(rt);
  return 0;
}
