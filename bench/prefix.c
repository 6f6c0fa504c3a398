/* Benchmark (not a test) of the prefix primitives: block hashing throughput
 * and prefix index insert and lookup cost per block, for prompts of 1 KB,
 * 16 KB and 256 KB.  `make bench-prefix`. */
#include "../core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 64          /* the EPP's default block size */
#define ENDPOINTS 16
#define CAPACITY 31250    /* the EPP's default lruCapacityPerServer */
#define MIN_SECONDS 0.25

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next(void) { /* xorshift64: deterministic prompts */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void fill(char *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (char)(' ' + next() % 95);
}

static lupin_hash_input input(const char *prompt, size_t len) {
  return (lupin_hash_input){prompt, len, "meta-llama/Llama-3.1-8B-Instruct", 32, "", 0, BLOCK,
                            len / BLOCK};
}

/* Hashing: GB/s over whole prompts (every full block hashed). */
static double bench_hash(const char *prompt, size_t len, uint64_t *out) {
  lupin_hash_input in = input(prompt, len);
  size_t iters = 0;
  double t0 = lupin_now(), t;
  do {
    for (int i = 0; i < 64; i++) lupin_block_hashes(&in, out, len / BLOCK);
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
  for (uint32_t e = 0; e < 4; e++) lupin_prefix_record(x, e, h, n);
  uint32_t ids[ENDPOINTS], counts[ENDPOINTS];
  size_t iters = 0;
  t0 = lupin_now();
  do {
    for (int i = 0; i < 16; i++) lupin_prefix_match(x, h, n, ids, counts, ENDPOINTS);
    iters += 16;
  } while ((spent = lupin_now() - t0) < MIN_SECONDS);
  c.lookup_ns = spent * 1e9 / (double)(iters * n);
  printf("  index memory %.1f MB for %zu endpoints x %d blocks\n",
         (double)lupin_prefix_memory(x) / 1e6, (size_t)ENDPOINTS, CAPACITY);
  lupin_prefix_free(x);
  return c;
}

int main(void) {
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
  return 0;
}
