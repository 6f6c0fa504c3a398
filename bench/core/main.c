/* bench/core: lupin's full request lifecycle through the embedding API
 * against the native reference (native.c), over endpoint counts and prompt
 * sizes, on the same deterministic request stream.  A benchmark, not a test.
 *
 *   LUPIN_HOME=. ./build/bench-core [config] [scale] [endpoints:prompt-bytes]
 *
 * config defaults to examples/configs/epp-default.json (native.c implements that
 * algorithm, so another config only makes sense for the lupin figures);
 * scale multiplies the iteration counts (default 1: about 1.5 minutes on a
 * 2-core machine); the last argument runs that one configuration only (for
 * profiling: perf record -g ./build/bench-core epp-default.json 1 16:4096).
 * Prints each configuration as it finishes, then one table; exits 1 if a
 * pick differs between the two sides. */
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct config {
  int endpoints;
  size_t prompt;
  int warmup, timed, in_flight;
} config;

static const config configs[] = {
    {16, 1024, 4000, 40000, 5000}, {16, 4096, 4000, 40000, 5000},  {16, 16384, 1000, 10000, 1000},
    {16, 262144, 100, 1000, 100},  {64, 1024, 4000, 40000, 5000},  {64, 16384, 1000, 10000, 1000},
    {64, 262144, 100, 1000, 100},  {256, 1024, 4000, 30000, 5000}, {256, 16384, 1000, 8000, 1000},
    {256, 262144, 100, 1000, 100},
};
#define N_CONFIGS (sizeof configs / sizeof *configs)

typedef struct row {
  config c;
  double l_median, l_p99, l_mean, n_median, n_p99, n_mean;
  double heap;
  breakdown b;
  double n_decode; /* mean ns of simdjson's decode per lifecycle */
  double n_index;  /* mean ns of native's hashing and index work */
  double n_rest;   /* mean ns of native less its decode (instrumented pass) */
  double n_imean;  /* mean ns of the instrumented pass */
  int agree, disagree, ties;
} row;

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void stats(double *t, int n, double *median, double *p99, double *mean) {
  double sum = 0;
  for (int i = 0; i < n; i++)
    sum += t[i];
  qsort(t, (size_t)n, sizeof *t, cmp);
  *median = t[n / 2];
  *p99 = t[(size_t)n * 99 / 100];
  *mean = sum / n;
}

/* The three passes run interleaved in blocks of lifecycles -- lupin, then
 * native on the same requests, then native with its parts timed -- each on
 * its own copy of the stream, so load that comes and goes on a shared
 * machine falls on both sides alike. */
#define BLOCKS 50

static void run(const config *c, const char *path, row *r) {
  workload wl, wn, wi; /* lupin's, native's, the instrumented pass's */
  workload_init(&wl, c->endpoints, c->prompt, SEED);
  workload_init(&wn, c->endpoints, c->prompt, SEED);
  workload_init(&wi, c->endpoints, c->prompt, SEED);
  int total = c->warmup + c->timed;
  int *picks = malloc(total * sizeof *picks);
  double *tl = malloc(c->timed * sizeof *tl), *tn = malloc(c->timed * sizeof *tn);
  memset(r, 0, sizeof *r);
  r->c = *c;
  lupin_side *ls = lupin_side_new(&wl, path);
  native *nv = native_new(c->endpoints, wn.queue, wn.kv);
  native *ni = native_new(c->endpoints, wi.queue, wi.kv);
  native_times tm = {0};
  double lsum = 0, isum = 0;
  int block = total / BLOCKS > 0 ? total / BLOCKS : 1;
  /* jit.p's samples landing in native code, or in the untimed metric
   * pushes (lupin_endpoint_set_metrics finds an endpoint by a linear scan of
   * names), would be charged to the next Lua function lupin runs: when
   * profiling, lupin runs alone and its endpoints keep their first metrics */
  const char *prof = getenv("LUPIN_BENCH_PROFILE");
  int lupin_only = prof && *prof;

  for (int from = 0; from < total; from += block) {
    int to = from + block < total ? from + block : total;
    /* lupin: warm-up (JIT, index), then timed one by one */
    for (int i = from; i < to; i++) {
      workload_next(&wl);
      if (!lupin_only) lupin_side_push_metrics(ls);
      if (i == c->warmup) lupin_side_mark(ls);
      double s = now_ns();
      picks[i] = lupin_side_lifecycle(ls);
      double d = now_ns() - s;
      if (i >= c->warmup) lsum += tl[i - c->warmup] = d;
    }
    if (lupin_only) continue;
    /* native on the same requests, its picks checked against lupin's */
    for (int i = from; i < to; i++) {
      workload_next(&wn);
      int ties;
      double s = now_ns();
      int pick = native_lifecycle(nv, wn.body, wn.body_len, picks[i], &ties, NULL);
      double d = now_ns() - s;
      if (i >= c->warmup) tn[i - c->warmup] = d;
      if (ties > 1)
        r->ties++;
      else if (pick == picks[i])
        r->agree++;
      else
        r->disagree++;
    }
    /* native again with its parts timed: decode, and the C hashing and index
     * work lupin's prefix plugin also does (same calls, same index states) */
    for (int i = from; i < to; i++) {
      workload_next(&wi);
      int ties;
      if (i == c->warmup) tm = (native_times){0}, isum = 0;
      double s = now_ns();
      native_lifecycle(ni, wi.body, wi.body_len, picks[i], &ties, &tm);
      isum += now_ns() - s;
    }
  }
  stats(tl, c->timed, &r->l_median, &r->l_p99, &r->l_mean);
  stats(tn, c->timed, &r->n_median, &r->n_p99, &r->n_mean);
  r->n_rest = (isum - tm.decode) / c->timed;
  r->n_imean = isum / c->timed;
  r->n_decode = tm.decode / c->timed;
  r->n_index = tm.index / c->timed;
  native_free(nv);
  native_free(ni);
  lupin_side_breakdown(ls, c->timed, lsum, tm.index, &r->b);

  r->heap = lupin_side_heap_per_request(ls, c->in_flight);
  lupin_side_free(ls);
  workload_free(&wl);
  workload_free(&wn);
  workload_free(&wi);
  free(picks);
  free(tl);
  free(tn);
}

static const char *size_name(size_t b) {
  static char buf[4][32];
  static int k;
  char *s = buf[k++ & 3];
  snprintf(s, 32, "%zu KB", b / 1024);
  return s;
}

static void pct(char *out, double part, double whole) {
  snprintf(out, 8, "%.0f%%", whole > 0 ? 100 * part / whole : 0);
}

static void print_row(const row *r) {
  const breakdown *b = &r->b;
  double whole = b->decode + b->index + b->prefix + b->scoring + b->runtime;
  char d[8], h[8], p[8], s[8], rt[8];
  pct(d, b->decode, whole);
  pct(h, b->index, whole);
  pct(p, b->prefix, whole);
  pct(s, b->scoring, whole);
  pct(rt, b->runtime, whole);
  char aborts[16] = "-"; /* not counted under LUPIN_BENCH_JITV */
  if (b->aborts >= 0) snprintf(aborts, sizeof aborts, "%d", b->aborts);
  /* lupin's mean without its decode over native's without simdjson's */
  double l_rest = r->l_mean - b->decode / r->c.timed, n_rest = r->n_rest;
  printf("| %3d | %6s | %8.2f | %8.2f | %7.0f | %8.2f | %8.2f | %7.0f | %5.2f | %5.2f | %5.2f "
         "| %9.0f | %4s | %4s | %4s | %4s | %4s | %3.0f%% | %d/%d (%d ties) | %s |\n",
         r->c.endpoints, size_name(r->c.prompt), r->l_median / 1e3, r->l_p99 / 1e3, 1e9 / r->l_mean,
         r->n_median / 1e3, r->n_p99 / 1e3, 1e9 / r->n_mean, r->l_median / r->n_median,
         r->l_mean / r->n_mean, l_rest / n_rest, r->heap, d, h, p, s, rt,
         100 * r->n_decode / r->n_imean, r->agree, r->agree + r->disagree, r->ties, aborts);
}

static void header(void) {
  printf("| eps | prompt | lupin median µs | p99 µs | lupin/s | native median µs | p99 µs "
         "| native/s | ratio median | ratio mean | ratio mean w/o decode | Lua heap B/req "
         "| decode | hash+index | prefix rest | scoring | runtime | native decode | same pick "
         "| trace aborts |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "examples/configs/epp-default.json";
  double scale = argc > 2 ? atof(argv[2]) : 1;
  if (scale <= 0) scale = 1;
  int only_eps = 0;
  size_t only_prompt = 0;
  if (argc > 3 && sscanf(argv[3], "%d:%zu", &only_eps, &only_prompt) != 2) {
    fprintf(stderr, "bench-core: want endpoints:prompt-bytes, got %s\n", argv[3]);
    return 2;
  }
  row rows[N_CONFIGS + 1];
  size_t n_rows = 0;
  int disagreements = 0;
  printf("bench-core: %s, seed %u, full lifecycle (begin, schedule, response header, 3 chunks, "
         "complete, end)\n",
         path, SEED);
  header();
  for (size_t i = 0; i < N_CONFIGS; i++) {
    config c = configs[i];
    if (only_eps) {
      if (only_prompt != c.prompt) continue;
      c.endpoints = only_eps;
      i = N_CONFIGS; /* the counts of the first with that prompt size */
    }
    c.warmup = (int)ceil(c.warmup * scale);
    c.timed = (int)ceil(c.timed * scale);
    row *r = &rows[n_rows++];
    run(&c, path, r);
    print_row(r);
    fflush(stdout);
    disagreements += r->disagree;
  }
  if (n_rows == 0) {
    fprintf(stderr, "bench-core: no configuration with a %zu-byte prompt\n", only_prompt);
    return 2;
  }
  printf("\nbench-core summary (times per lifecycle; per second = 1/mean on one core; ratio = "
         "lupin/native;\nshares of lupin's timed lifecycles: decode = the body decode, simdjson in "
         "C (warm loop), "
         "hash+index = block\nhashes, index match and record (the C work, timed on the native "
         "side), prefix rest = the rest of the\nprefix plugin's prepare and pre_request, "
         "scoring = 3 scorers + picker, runtime = the rest (see\nbench/core/lupin_side.c);\nnative "
         "decode = simdjson's "
         "share of native's mean (instrumented pass);\nratio w/o decode = lupin's mean less its "
         "decode over "
         "native's mean less simdjson's\n(both from the instrumented native pass);\nsame pick = "
         "agreeing/compared, ties apart;\ntrace aborts = LuaJIT's over lupin's timed lifecycles, "
         "LUPIN_BENCH_JITV=file logs them)\n\n");
  header();
  for (size_t i = 0; i < n_rows; i++)
    print_row(&rows[i]);
  if (disagreements) printf("\n%d picks differ between lupin and native\n", disagreements);
  return disagreements ? 1 : 0;
}
