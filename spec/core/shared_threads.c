/* Four threads, each with its own runtime on one lupin_shared, as the
 * workers of `lupin serve` are: they add, move and remove endpoints and count
 * requests in and out at the same time, and at each barrier the shared
 * counters must hold exactly what every thread has in flight, the ids must
 * agree, and at the end everything must come back to 0 and be freed.  Run by
 * spec/core/shared_threads_spec.lua; meant to run under ASan (make
 * test-asan) and ThreadSanitizer: every access to shared memory here is
 * either under a barrier or atomic.
 *
 *   LUPIN_HOME=. ./build/shared-threads [rounds] */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS   4
#define ENDPOINTS 8
#define HELD      6 /* requests each thread holds at a barrier */
#define TOKENS    5 /* token-load-scorer's estimate of BODY: 8/4 + 3 */

static const char CONFIG[] =
    "{\"plugins\": [{\"type\": \"token-load-scorer\"}, {\"type\": \"random-picker\"}],"
    " \"schedulingProfiles\": [{\"name\": \"default\", \"plugins\": ["
    "{\"pluginRef\": \"token-load-scorer\"}, {\"pluginRef\": \"random-picker\"}]}]}";
static const char BODY[] = "{\"model\":\"m\",\"prompt\":\"abcdefgh\",\"max_tokens\":3}";

static lupin_shared *shared;
static pthread_barrier_t barrier;
static int rounds = 200;
static const char *home;
static int failures; /* atomic */
static uint32_t ids[THREADS][ENDPOINTS];

#define FAIL(...)                                                                                  \
  do {                                                                                             \
    fprintf(stderr, "shared-threads: " __VA_ARGS__);                                               \
    fputc('\n', stderr);                                                                           \
    __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);                                            \
  } while (0)

/* Endpoint i of round r: ep7 moves between two ports every third round. */
static int port_of(int i, int r) { return i == ENDPOINTS - 1 ? 8000 + (r / 3) % 2 : 8000; }

static void upsert(lupin_runtime *rt, int i, int r) {
  char name[16], address[32], err[256];
  snprintf(name, sizeof name, "ep%d", i);
  snprintf(address, sizeof address, "10.0.0.%d", i + 1);
  lupin_endpoint_desc d = {.name = name, .address = address, .port = port_of(i, r)};
  if (lupin_endpoint_upsert(rt, &d, err, sizeof err)) FAIL("upsert %s: %s", name, err);
}

/* Sums the shared counters over this runtime's pool: at a barrier, what
 * every thread has in flight. */
static void totals(lupin_runtime *rt, int64_t *requests, int64_t *tokens) {
  *requests = *tokens = 0;
  for (size_t i = 0; i < rt->n_endpoints; i++) {
    lupin_counters *c = rt->endpoints[i]->counters;
    *requests += __atomic_load_n(&c->in_flight, __ATOMIC_RELAXED);
    *tokens += __atomic_load_n(&c->in_flight_tokens, __ATOMIC_RELAXED);
  }
}

static lupin_request *schedule_one(lupin_runtime *rt) {
  char err[512];
  lupin_request_desc desc = {.path = "/v1/completions", .body = BODY, .body_len = sizeof BODY - 1};
  lupin_request *req = lupin_request_begin(rt, &desc, err, sizeof err);
  if (!req) {
    FAIL("begin: %s", err);
    return NULL;
  }
  lupin_result res;
  if (lupin_request_schedule(req, &res) != 200) FAIL("schedule: %d %s", res.status, res.message);
  return req;
}

static void *worker(void *arg) {
  int t = (int)(intptr_t)arg;
  char err[2048];
  lupin_options o = {
      .home = home, .log_level = LUPIN_LOG_WARN, .seed = (uint64_t)t + 1, .shared = shared};
  lupin_runtime *rt = lupin_runtime_new(&o, err, sizeof err);
  if (!rt || lupin_runtime_load_string(rt, CONFIG, "shared-threads.json", err, sizeof err)) {
    FAIL("thread %d: %s", t, err);
    exit(1); /* the others would wait at the barrier forever */
  }
  static const lupin_outcome outcomes[] = {LUPIN_OK, LUPIN_CANCELLED, LUPIN_UPSTREAM_ERROR,
                                           LUPIN_TIMEOUT};
  lupin_request *held[HELD];
  for (int r = 0; r < rounds; r++) {
    /* churn: one endpoint out and back in (a new object, the same slot while
     * another thread holds it), ep7 moved now and then */
    char gone[16];
    snprintf(gone, sizeof gone, "ep%d", (r + t) % ENDPOINTS);
    lupin_endpoint_remove(rt, gone);
    for (int i = 0; i < ENDPOINTS; i++)
      upsert(rt, i, r);
    for (int k = 0; k < HELD; k++)
      held[k] = schedule_one(rt);
    /* requests that start and end while the others count theirs */
    for (int k = 0; k < 4; k++) {
      lupin_request *q = schedule_one(rt);
      if (q) lupin_request_end(q, outcomes[k]);
    }
    pthread_barrier_wait(&barrier);
    int64_t requests, tokens;
    totals(rt, &requests, &tokens);
    if (requests != THREADS * HELD || tokens != THREADS * HELD * TOKENS)
      FAIL("round %d thread %d: %lld requests, %lld tokens in flight, want %d and %d", r, t,
           (long long)requests, (long long)tokens, THREADS * HELD, THREADS * HELD * TOKENS);
    pthread_barrier_wait(&barrier);
    for (int k = 0; k < HELD; k++) { /* in another order than begun */
      lupin_request *q = held[(k * 5 + t) % HELD];
      if (q) lupin_request_end(q, outcomes[(k + r) % 4]);
    }
    if (r % 16 == t) lupin_runtime_collect(rt); /* finalizers: slots unreferenced */
  }

  pthread_barrier_wait(&barrier); /* all ended everywhere */
  int64_t requests, tokens;
  totals(rt, &requests, &tokens);
  if (requests || tokens)
    FAIL("thread %d: %lld requests, %lld tokens left in flight", t, (long long)requests,
         (long long)tokens);
  for (size_t i = 0; i < rt->n_endpoints; i++) {
    int n;
    if (sscanf(rt->endpoints[i]->name, "ep%d", &n) == 1 && n >= 0 && n < ENDPOINTS)
      ids[t][n] = rt->endpoints[i]->id;
  }
  lupin_runtime_free(rt);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) rounds = atoi(argv[1]);
  home = getenv("LUPIN_HOME") ? getenv("LUPIN_HOME") : ".";
  char err[256];
  if (!(shared = lupin_shared_new(4, err, sizeof err))) {
    fprintf(stderr, "shared-threads: %s\n", err);
    return 1;
  }
  pthread_barrier_init(&barrier, NULL, THREADS);
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++)
    pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
  for (int t = 0; t < THREADS; t++)
    pthread_join(th[t], NULL);
  pthread_barrier_destroy(&barrier);

  for (int i = 0; i < ENDPOINTS; i++) {
    for (int t = 1; t < THREADS; t++)
      if (ids[t][i] != ids[0][i] || !ids[t][i])
        FAIL("ep%d: id %u in thread 0, %u in thread %d", i, ids[0][i], ids[t][i], t);
    for (int j = 0; j < i; j++)
      if (ids[0][i] == ids[0][j]) FAIL("ep%d and ep%d share id %u", j, i, ids[0][i]);
  }
  size_t left = lupin__shared_endpoints(shared);
  if (left) FAIL("%zu endpoint slots left after every runtime was freed", left);
  lupin_shared_free(shared);
  if (failures) return 1;
  printf("shared-threads: %d threads x %d rounds, %d requests, ids agree, counters back to 0\n",
         THREADS, rounds, THREADS * rounds * (HELD + 4));
  return 0;
}
