/* Threads on one lupin_shared (run by spec/core/prefix_threads_spec.lua; built
 * by make as $(B)/prefix-threads): THREADS threads, each with its own
 * runtime, hammer one keyed prefix index with records, matches, purges and
 * removals by name, one shared dict with increments, and the token cache
 * with puts, lookups and jobs; a subscriber thread that runs no runtime
 * applies, removes and purges by name meanwhile, as a host's KV-event thread
 * does.  Checked: no increment is lost (exact totals), a prompt nobody
 * touches keeps matching whole while the others churn, every match is
 * well-formed, capacities hold, a purge empties, the token cache's counts
 * add up and its bound holds.  Meant for AddressSanitizer and
 * ThreadSanitizer (no sleeps, no timing).
 *
 *   prefix-threads [iterations per thread]   exits 0 and prints "ok" lines */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS    4
#define ENDPOINTS  6 /* ep1: the stable prompt's; ep6: purged over and over */
#define CAPACITY   512
#define BLOCK      16
#define MAX_BLOCKS 64

static lupin_shared *shared;
static int stop_subscriber;            /* __atomic */
static long hook_calls, token_lookups; /* __atomic */
#define TOKEN_LIMIT 16384              /* bytes: a few hundred entries, evicting all along */
#define TOKEN_IDS   64
static pthread_barrier_t barrier;
static int failures;
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      pthread_mutex_lock(&fail_lock);                                                              \
      if (failures++ < 10) {                                                                       \
        fprintf(stderr, "prefix-threads: %s:%d: ", __FILE__, __LINE__);                            \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
      }                                                                                            \
      pthread_mutex_unlock(&fail_lock);                                                            \
    }                                                                                              \
  } while (0)

typedef struct worker {
  int n;
  long iterations;
  uint64_t rng;
  pthread_t thread;
} worker;

static uint64_t next(worker *w) { /* xorshift64 */
  w->rng ^= w->rng << 13;
  w->rng ^= w->rng >> 7;
  w->rng ^= w->rng << 17;
  return w->rng;
}

static size_t hashes_of(const char *prompt, uint64_t *out) {
  size_t len = strlen(prompt);
  lupin_hash_input in = {prompt, len, "m", 1, "", 0, BLOCK, MAX_BLOCKS};
  long n = lupin_block_hashes(&in, out, MAX_BLOCKS);
  return n < 0 ? 0 : (size_t)n;
}

/* One of 8 stems, so prompts share prefixes, then a random tail. */
static size_t random_prompt(worker *w, uint64_t *h) {
  char p[BLOCK * MAX_BLOCKS + 1];
  int len = snprintf(p, sizeof p, "stem %d: a system prompt shared by many", (int)(next(w) % 8));
  int blocks = 4 + (int)(next(w) % 40);
  while (len < blocks * BLOCK)
    p[len++] = (char)('a' + next(w) % 4);
  p[len] = 0;
  return hashes_of(p, h);
}

static lupin_runtime *runtime(void) {
  char err[256];
  lupin_options o = {.shared = shared, .log_level = LUPIN_LOG_ERROR};
  lupin_runtime *rt = lupin_runtime_new(&o, err, sizeof err);
  if (!rt) {
    fprintf(stderr, "prefix-threads: %s\n", err);
    exit(1);
  }
  for (int i = 1; i <= ENDPOINTS; i++) { /* the same order: the same ids */
    char name[16];
    snprintf(name, sizeof name, "ep%d", i);
    lupin_endpoint_desc d = {.name = name, .address = "10.0.0.1", .port = 8000 + i};
    if (lupin_endpoint_upsert(rt, &d, err, sizeof err)) exit(1);
  }
  return rt;
}

static uint32_t id_of(lupin_runtime *rt, int i) { return rt->endpoints[i - 1]->id; }

static void check_match(const uint32_t *ids, const uint32_t *counts, long k, size_t n,
                        lupin_runtime *rt) {
  CHECK(k >= 0 && k <= ENDPOINTS, "match found %ld endpoints", k);
  for (long i = 0; i < k; i++) {
    CHECK(counts[i] >= 1 && counts[i] <= n, "count %u of %zu blocks", counts[i], n);
    int known = 0;
    for (int e = 1; e <= ENDPOINTS; e++)
      known |= ids[i] == id_of(rt, e);
    CHECK(known, "unknown endpoint id %u", ids[i]);
    for (long j = 0; j < i; j++)
      CHECK(ids[i] != ids[j], "endpoint %u twice", ids[i]);
  }
}

/* The host's tokenize hook: answers at once now and then (it holds no lock
 * of the cache, or this would deadlock), fails others, forgets the rest. */
static void tokenize(void *ud, const lupin_tokenize_job *job) {
  (void)ud;
  long c = __atomic_add_fetch(&hook_calls, 1, __ATOMIC_RELAXED);
  CHECK(job->text && job->text_len == strlen(job->text), "job text");
  uint32_t ids[TOKEN_IDS];
  for (int i = 0; i < TOKEN_IDS; i++)
    ids[i] = (uint32_t)(job->key * 31 + (uint64_t)i);
  if (c % 3 == 0) CHECK(lupin_shared_tokens_put(shared, job->key, ids, TOKEN_IDS) == 0, "put");
  if (c % 3 == 1) lupin_shared_tokens_failed(shared, job->key);
}

static void tokens(worker *w) {
  uint64_t key = (next(w) >> 32) % 512, out[8]; /* high bits: the low ones follow the last draw */
  uint32_t ids[TOKEN_IDS];
  for (int i = 0; i < TOKEN_IDS; i++)
    ids[i] = (uint32_t)(key * 31 + (uint64_t)i);
  switch (next(w) % 4) {
  case 0:
    CHECK(lupin_shared_tokens_put(shared, key, ids, TOKEN_IDS) == 0, "put");
    break;
  case 1: {
    lupin_tokenize_job job = {.key = key, .model = "m", .text = "some text", .text_len = 9};
    CHECK(lupin_shared_tokens_want(shared, &job) >= 0, "want");
    break;
  }
  default: {
    __atomic_add_fetch(&token_lookups, 1, __ATOMIC_RELAXED);
    long k = lupin_shared_tokens_hashes(shared, key, 7, 16, out, 8);
    CHECK(k == -1 || k == TOKEN_IDS / 16, "tokens_hashes gave %ld", k);
    uint64_t want[8];
    if (k > 0) { /* the same ids under a key, whoever put them */
      lupin_token_block_hashes(7, ids, TOKEN_IDS, 16, want, 8);
      CHECK(memcmp(want, out, (size_t)k * 8) == 0, "key %llu: other hashes",
            (unsigned long long)key);
    }
  }
  }
}

/* A host's event thread: no runtime, endpoints by name. */
static void *subscriber(void *arg) {
  worker *w = arg;
  uint64_t h[MAX_BLOCKS];
  while (!__atomic_load_n(&stop_subscriber, __ATOMIC_RELAXED)) {
    size_t n = random_prompt(w, h);
    char name[16];
    /* ep3..ep5: not ep6, whose emptiness thread 0 checks while this runs */
    snprintf(name, sizeof name, "ep%d", 3 + (int)(next(w) % (ENDPOINTS - 3)));
    CHECK(lupin_shared_prefix_apply(shared, "spec/threads", name, h, n) >= 0, "apply");
    CHECK(lupin_shared_prefix_remove(shared, "spec/threads", name, h, n / 2) >= 0, "remove");
    if (next(w) % 32 == 0)
      CHECK(lupin_shared_prefix_purge(shared, "spec/threads", name) >= 0, "purge");
    tokens(w);
  }
  return NULL;
}

static void *run(void *arg) {
  worker *w = arg;
  lupin_runtime *rt = runtime();
  lupin_prefix_view *v = lupin_prefix_open(rt, "spec/threads", CAPACITY);
  lupin_dict *d = lupin_dict_open(rt, "counters", 100);
  CHECK(v && d, "open failed");
  uint64_t stable[MAX_BLOCKS], h[MAX_BLOCKS];
  size_t n_stable = hashes_of("the stable prompt: recorded once on ep1, matched by every thread "
                              "while the others churn ...................",
                              stable);
  uint32_t ids[ENDPOINTS], counts[ENDPOINTS];
  char key[32];
  snprintf(key, sizeof key, "thread %d", w->n);

  if (w->n == 0) CHECK(lupin_prefix_view_record(v, id_of(rt, 1), stable, n_stable, 0) == 0, "rec");
  pthread_barrier_wait(&barrier);

  for (long it = 0; it < w->iterations; it++) {
    size_t n = random_prompt(w, h);
    int ep = 2 + (int)(next(w) % (ENDPOINTS - 1)); /* ep2..ep6: never ep1 */
    uint32_t cap = next(w) % 16 == 0 ? CAPACITY / 2 + (uint32_t)(next(w) % (CAPACITY / 2 + 1)) : 0;
    CHECK(lupin_prefix_view_record(v, id_of(rt, ep), h, n, cap) == 0, "record failed");
    long k = lupin_prefix_view_match(v, h, n, ids, counts, ENDPOINTS);
    check_match(ids, counts, k, n, rt);
    k = lupin_prefix_view_match(v, stable, n_stable, ids, counts, ENDPOINTS);
    CHECK(k == 1 && ids[0] == id_of(rt, 1) && counts[0] == n_stable,
          "the stable prompt matched %ld endpoints, %u blocks", k, k > 0 ? counts[0] : 0);
    if (it % 64 == 0) lupin_prefix_view_purge(v, id_of(rt, ENDPOINTS));
    char name[16];
    snprintf(name, sizeof name, "ep%d", ep);
    if (it % 8 == 0)
      CHECK(lupin_shared_prefix_remove(shared, "spec/threads", name, h, n) == 1, "remove");
    if (it % 97 == 0) CHECK(lupin_shared_prefix_purge(shared, "spec/threads", name) == 1, "purge");
    tokens(w);
    double total, mine;
    CHECK(lupin_dict_incr(d, "total", 5, 1, 0, 1, &total) == 0, "incr total");
    CHECK(lupin_dict_incr(d, key, strlen(key), 0.5, 0, 1, &mine) == 0, "incr mine");
    CHECK(mine == 0.5 * (double)(it + 1), "thread %d: %g after %ld increments", w->n, mine, it + 1);
  }
  pthread_barrier_wait(&barrier);

  if (w->n == 0) { /* everyone is done: the totals and bounds */
    double total;
    lupin_dict_incr(d, "total", 5, 0, 0, 0, &total);
    CHECK(total == (double)THREADS * (double)w->iterations, "total %g, want %ld", total,
          THREADS * w->iterations);
    CHECK(lupin_dict_count(d) == THREADS + 1, "%zu keys", lupin_dict_count(d));
    for (int e = 1; e <= ENDPOINTS; e++) {
      size_t c = lupin_prefix_view_count(v, id_of(rt, e));
      CHECK(c <= CAPACITY, "ep%d holds %zu blocks, capacity %d", e, c, CAPACITY);
    }
    lupin_prefix_view_purge(v, id_of(rt, ENDPOINTS));
    CHECK(lupin_prefix_view_count(v, id_of(rt, ENDPOINTS)) == 0, "purged, still holds blocks");
    CHECK(lupin_prefix_view_count(v, id_of(rt, 1)) == n_stable, "the stable prompt shrank");
    printf("ok %d threads x %ld iterations: total %.0f, index %.1f MB\n", THREADS, w->iterations,
           total, (double)lupin_prefix_view_memory(v) / 1e6);
  }
  pthread_barrier_wait(&barrier); /* thread 0's checks before any view closes */
  lupin_prefix_close(v);
  lupin_runtime_free(rt);
  return NULL;
}

int main(int argc, char **argv) {
  long iterations = argc > 1 ? atol(argv[1]) : 5000;
  char err[256];
  shared = lupin_shared_new(THREADS, err, sizeof err);
  if (!shared) return 1;
  pthread_barrier_init(&barrier, NULL, THREADS);
  lupin_shared_tokens_limit(shared, TOKEN_LIMIT);
  lupin_shared_on_tokenize(shared, tokenize, NULL);
  worker sub = {.n = THREADS, .rng = 0x243F6A8885A308D3ull};
  if (pthread_create(&sub.thread, NULL, subscriber, &sub)) return 1;
  worker w[THREADS];
  for (int i = 0; i < THREADS; i++) {
    w[i] = (worker){.n = i, .iterations = iterations, .rng = 0x9E3779B97F4A7C15ull * (i + 1)};
    if (pthread_create(&w[i].thread, NULL, run, &w[i])) return 1;
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(w[i].thread, NULL);
  __atomic_store_n(&stop_subscriber, 1, __ATOMIC_RELAXED);
  pthread_join(sub.thread, NULL);
  pthread_barrier_destroy(&barrier);
  lupin_token_cache_stats st;
  lupin_shared_tokens_stats(shared, &st);
  CHECK(st.hits + st.misses == (uint64_t)token_lookups, "%llu hits + %llu misses, %ld lookups",
        (unsigned long long)st.hits, (unsigned long long)st.misses, token_lookups);
  CHECK(st.asked == (uint64_t)hook_calls, "asked %llu, hook called %ld",
        (unsigned long long)st.asked, hook_calls);
  CHECK(st.hits > 0 && st.misses > 0, "no hits or no misses");
  CHECK(st.bytes <= TOKEN_LIMIT && st.evictions > 0, "%llu bytes, %llu evictions",
        (unsigned long long)st.bytes, (unsigned long long)st.evictions);
  printf("ok tokens: %llu entries, %llu hits, %llu misses, %llu evictions, %llu asked\n",
         (unsigned long long)st.entries, (unsigned long long)st.hits, (unsigned long long)st.misses,
         (unsigned long long)st.evictions, (unsigned long long)st.asked);
  lupin_shared_free(shared);
  if (failures) {
    fprintf(stderr, "prefix-threads: %d failed checks\n", failures);
    return 1;
  }
  printf("ok no lost increments, matches consistent\n");
  return 0;
}
