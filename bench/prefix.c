/* Benchmark (not a test) of the prefix primitives: block hashing throughput
 * and prefix index insert and lookup cost per block, for prompts of 1 KB,
 * 16 KB and 256 KB; then a keyed index (core/prefix_shared.c) under 1 and 2
 * threads, each with its own runtime: records and matches per second.
 * `make bench-prefix`. */
#include "../core/internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK       64 /* the EPP's default block size */
#define ENDPOINTS   16
#define CAPACITY    31250 /* the EPP's default lruCapacityPerServer */
#define MIN_SECONDS 0.25

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next(void) { /* xorshift64: deterministic prompts */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void fill(char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = (char)(' ' + next() % 95);
}

static lupin_hash_input input(const char *prompt, size_t len) {
  return (lupin_hash_input){prompt, len,        "meta-llama/Llama-3.1-8B-Instruct", 32, "", 0,
                            BLOCK,  len / BLOCK};
}

/* Hashing: GB/s over whole prompts (every full block hashed). */
static double bench_hash(const char *prompt, size_t len, uint64_t *out) {
  lupin_hash_input in = input(prompt, len);
  size_t iters = 0;
  double t0 = lupin_now(), t;
  do {
    for (int i = 0; i < 64; i++)
      lupin_block_hashes(&in, out, len / BLOCK);
    iters += 64;
  } while ((t = lupin_now() - t0) < MIN_SECONDS);
  return (double)iters * (double)len / t / 1e9;
}

typedef struct {
  double insert_ns, insert_full_ns, lookup_ns;
} index_cost;

/* Index: ns per block to record fresh prompts, to record them into full LRUs
 * (each block evicts one), and to look up a prompt held by 4 endpoints. */
static index_cost bench_index(char *prompt, size_t len, uint64_t *h) {
  index_cost c = {0};
  size_t n = len / BLOCK, blocks = 0, rounds = 0;
  lupin_prefix_index *x = lupin_prefix_new(NULL, CAPACITY);
  lupin_hash_input in = input(prompt, len);
  double spent = 0, t0;
  while (blocks < (size_t)ENDPOINTS * CAPACITY) { /* fill every LRU */
    prompt[0] = (char)('A' + rounds++ % 26);
    prompt[1] = (char)('A' + rounds / 26 % 26);
    prompt[2] = (char)('A' + rounds / 676 % 26);
    lupin_block_hashes(&in, h, n);
    t0 = lupin_now();
    lupin_prefix_record(x, (uint32_t)(rounds % ENDPOINTS), h, n);
    spent += lupin_now() - t0;
    blocks += n;
  }
  c.insert_ns = spent * 1e9 / (double)blocks;
  spent = 0, blocks = 0;
  while (spent < MIN_SECONDS) { /* full: every new block evicts */
    fill(prompt, 8);
    lupin_block_hashes(&in, h, n);
    t0 = lupin_now();
    lupin_prefix_record(x, (uint32_t)(next() % ENDPOINTS), h, n);
    spent += lupin_now() - t0;
    blocks += n;
  }
  c.insert_full_ns = spent * 1e9 / (double)blocks;
  for (uint32_t e = 0; e < 4; e++)
    lupin_prefix_record(x, e, h, n);
  uint32_t ids[ENDPOINTS], counts[ENDPOINTS];
  size_t iters = 0;
  t0 = lupin_now();
  do {
    for (int i = 0; i < 16; i++)
      lupin_prefix_match(x, h, n, ids, counts, ENDPOINTS);
    iters += 16;
  } while ((spent = lupin_now() - t0) < MIN_SECONDS);
  c.lookup_ns = spent * 1e9 / (double)(iters * n);
  printf("  index memory %.1f MB for %zu endpoints x %d blocks\n",
         (double)lupin_prefix_memory(x) / 1e6, (size_t)ENDPOINTS, CAPACITY);
  lupin_prefix_free(x);
  return c;
}

/* --- a keyed index under threads ------------------------------------------ */

#define T_PROMPTS  4096  /* distinct prompts, over 16 shared stems */
#define T_BLOCKS   128   /* blocks per prompt: 8 KB */
#define T_CAPACITY 31250 /* per endpoint: the EPP default */

static uint64_t (*t_hashes)[T_BLOCKS];
static atomic_int t_stop;

typedef struct {
  lupin_shared *shared;
  int n;
  uint64_t pairs; /* record + match */
  pthread_t thread;
} t_worker;

static void t_prompts(void) {
  t_hashes = malloc(sizeof *t_hashes * T_PROMPTS);
  char *p = malloc(T_BLOCKS * BLOCK);
  if (!t_hashes || !p) exit(1);
  for (int i = 0; i < T_PROMPTS; i++) {
    snprintf(p, 32, "stem %02d ", i % 16); /* the stem: the first 32 blocks */
    for (size_t c = 8; c < 32 * BLOCK; c++)
      p[c] = (char)('a' + c % 26);
    fill(p + 32 * BLOCK, (T_BLOCKS - 32) * BLOCK);
    lupin_block_hashes(&(lupin_hash_input){p, T_BLOCKS * BLOCK, "m", 1, "", 0, BLOCK, T_BLOCKS},
                       t_hashes[i], T_BLOCKS);
  }
  free(p);
}

static void *t_run(void *arg) {
  t_worker *w = arg;
  char err[256];
  lupin_options o = {.shared = w->shared, .log_level = LUPIN_LOG_ERROR};
  lupin_runtime *rt = lupin_runtime_new(&o, err, sizeof err);
  if (!rt) {
    fprintf(stderr, "bench-prefix: %s (set LUPIN_HOME)\n", err);
    exit(1);
  }
  for (int i = 0; i < ENDPOINTS; i++) {
    char name[16];
    snprintf(name, sizeof name, "ep%d", i);
    lupin_endpoint_desc d = {.name = name, .address = "10.0.0.1", .port = 8000 + i};
    lupin_endpoint_upsert(rt, &d, err, sizeof err);
  }
  lupin_prefix_view *v = lupin_prefix_open(rt, "bench", T_CAPACITY);
  uint32_t ids[ENDPOINTS], counts[ENDPOINTS];
  uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(w->n + 1);
  while (!atomic_load_explicit(&t_stop, memory_order_relaxed)) {
    for (int i = 0; i < 64; i++) {
      r ^= r << 13, r ^= r >> 7, r ^= r << 17;
      const uint64_t *h = t_hashes[r % T_PROMPTS];
      lupin_prefix_view_match(v, h, T_BLOCKS, ids, counts, ENDPOINTS);
      lupin_prefix_view_record(v, rt->endpoints[(r >> 32) % ENDPOINTS]->id, h, T_BLOCKS, 0);
    }
    __atomic_store_n(&w->pairs, w->pairs + 64, __ATOMIC_RELAXED);
  }
  lupin_prefix_close(v);
  lupin_runtime_free(rt);
  return NULL;
}

/* Records + matches per second (one each per request) from n threads on one
 * index of `shards` shards (1: a runtime's private store, one lock). */
static double bench_threads(int n, unsigned shards) {
  char err[256];
  lupin_shared *s = lupin_shared_new(1, err, sizeof err);
  if (!s) exit(1);
  lupin__shared_store(s)->prefix_shards = shards;
  t_worker w[2];
  atomic_store(&t_stop, 0);
  for (int i = 0; i < n; i++) {
    w[i] = (t_worker){.shared = s, .n = i};
    pthread_create(&w[i].thread, NULL, t_run, &w[i]);
  }
  struct timespec nap = {0, 200 * 1000 * 1000}; /* warm up: fill the LRUs */
  nanosleep(&nap, NULL);
  uint64_t before = 0, after = 0;
  for (int i = 0; i < n; i++)
    before += __atomic_load_n(&w[i].pairs, __ATOMIC_RELAXED);
  double t0 = lupin_now();
  nap.tv_sec = 1, nap.tv_nsec = 0;
  nanosleep(&nap, NULL);
  for (int i = 0; i < n; i++)
    after += __atomic_load_n(&w[i].pairs, __ATOMIC_RELAXED);
  double t = lupin_now() - t0;
  atomic_store(&t_stop, 1);
  for (int i = 0; i < n; i++)
    pthread_join(w[i].thread, NULL);
  lupin_shared_free(s);
  return (double)(after - before) / t;
}

static void threads_table(void) {
  printf("\nkeyed index, %d endpoints, capacity %d, %d-block prompts: records + matches/s\n",
         ENDPOINTS, T_CAPACITY, T_BLOCKS);
  printf("%8s %8s %14s %14s\n", "threads", "shards", "pairs/s", "per thread");
  static const struct {
    int threads;
    unsigned shards;
  } rows[] = {{1, 1}, {1, 8}, {2, 1}, {2, 8}, {2, 32}};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    double r = bench_threads(rows[i].threads, rows[i].shards);
    printf("%8d %8u %14.0f %14.0f\n", rows[i].threads, rows[i].shards, r, r / rows[i].threads);
  }
}

/* bench-prefix [threads [N SHARDS]]: "threads" skips the primitives; N and
 * SHARDS run that one row of the threads table (for a profiler). */
int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "threads") == 0) {
    t_prompts();
    if (argc > 3) {
      int n = atoi(argv[2]) == 2 ? 2 : 1;
      printf("%.0f pairs/s\n", bench_threads(n, (unsigned)atoi(argv[3])));
    } else {
      threads_table();
    }
    free(t_hashes);
    return 0;
  }
  static const size_t sizes[] = {1024, 16 * 1024, 256 * 1024};
  printf("prefix primitives: block %d characters, %d endpoints, capacity %d blocks each\n", BLOCK,
         ENDPOINTS, CAPACITY);
  printf("%8s %12s %14s %18s %14s\n", "prompt", "hash GB/s", "insert ns/blk", "insert-evict ns/blk",
         "lookup ns/blk");
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t len = sizes[i];
    char *prompt = malloc(len);
    uint64_t *h = malloc(len / BLOCK * sizeof *h);
    if (!prompt || !h) return 1;
    fill(prompt, len);
    double gbs = bench_hash(prompt, len, h);
    index_cost c = bench_index(prompt, len, h);
    printf("%6zuKB %12.2f %14.1f %18.1f %14.1f\n", len / 1024, gbs, c.insert_ns, c.insert_full_ns,
           c.lookup_ns);
    free(prompt);
    free(h);
  }
  t_prompts();
  threads_table();
  free(t_hashes);
  return 0;
}
