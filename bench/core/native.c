/* The native reference: examples/configs/epp-default.json's algorithm written
 * directly in C, with no Lua -- what lupin's runtime is measured against.
 *
 * Per request, the work the plugins and the engine do:
 *   decode the JSON body (simdjson On-Demand, decode.cpp) and take model,
 *   prompt, cache_salt;
 *   chained xxh64 block hashes of the prompt (core/blockhash.c: 64-character
 *   blocks, at most 256) and the prefix index lookup (core/prefix_index.c);
 *   prefix score matched/total blocks, queue score (max-q)/(max-min) with all
 *   equal -> 1, KV score 1-usage, each clamped to [0,1] and summed with weights
 *   3/2/2 in that order; the highest total wins;
 *   the hashes recorded against the pick (prefix-cache-scorer's pre_request);
 *   the request's state (its hashes) kept until it ends; the decoded fields
 *   live in the parser's buffer, used up by the hashing. */
#include "../../core/internal.h"
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct native {
  int n;
  const double *queue, *kv; /* the pool's metrics, read in place */
  lupin_prefix_index *index;
  native_json *json;
  uint32_t *ids, *counts; /* prefix_match output */
  double *matched, *total;
};

/* A request's state, from begin to end. */
typedef struct request {
  uint64_t *hashes;
  long n_hashes;
  int pick;
} request;

native *native_new(int n_endpoints, const double *queue, const double *kv) {
  native *nv = calloc(1, sizeof *nv);
  nv->n = n_endpoints;
  nv->queue = queue;
  nv->kv = kv;
  nv->index = lupin_prefix_new(NULL, LRU_CAPACITY);
  nv->json = native_json_new();
  nv->ids = malloc(n_endpoints * sizeof *nv->ids);
  nv->counts = malloc(n_endpoints * sizeof *nv->counts);
  nv->matched = malloc(n_endpoints * sizeof *nv->matched);
  nv->total = malloc(n_endpoints * sizeof *nv->total);
  return nv;
}

void native_free(native *nv) {
  lupin_prefix_free(nv->index);
  native_json_free(nv->json);
  free(nv->ids);
  free(nv->counts);
  free(nv->matched);
  free(nv->total);
  free(nv);
}

static double clamp01(double v) { return v != v || v < 0 ? 0 : v > 1 ? 1 : v; }

/* Decode, hash, look up: the request's prefix matches (prefix-cache-scorer's
 * prepare).  Endpoint i is id i + 1 in the index. */
static void prepare(native *nv, request *r, const char *text, size_t len, native_times *tm) {
  double t0 = tm ? now_ns() : 0;
  native_fields f = {"", "", "", 0, 0, 0};
  if (native_json_decode(nv->json, text, len, &f)) f = (native_fields){"", "", "", 0, 0, 0};
  double t1 = tm ? now_ns() : 0;
  lupin_hash_input in = {.block_size = BLOCK_SIZE, .max_blocks = MAX_BLOCKS};
  in.model = f.model, in.model_len = f.model_len;
  in.salt = f.salt, in.salt_len = f.salt_len;
  in.prompt = f.prompt, in.prompt_len = f.prompt_len;
  size_t n = in.prompt_len / BLOCK_SIZE;
  if (n > MAX_BLOCKS) n = MAX_BLOCKS;
  r->hashes = malloc((n ? n : 1) * sizeof *r->hashes);
  r->n_hashes = lupin_block_hashes(&in, r->hashes, n);
  memset(nv->matched, 0, nv->n * sizeof *nv->matched);
  long k = r->n_hashes ? lupin_prefix_match(nv->index, r->hashes, (size_t)r->n_hashes, nv->ids,
                                            nv->counts, (size_t)nv->n)
                       : 0;
  for (long i = 0; i < k; i++)
    nv->matched[nv->ids[i] - 1] = nv->counts[i];
  if (tm) {
    tm->decode += t1 - t0;
    tm->index += now_ns() - t1;
  }
}

/* The profile: three weighted scorers and max-score. */
static int schedule(native *nv, request *r, int follow, int *ties) {
  int n = nv->n;
  double qmin = INFINITY, qmax = -INFINITY;
  for (int i = 0; i < n; i++) {
    double q = nv->queue[i];
    q = q == q ? q : 0;
    qmin = fmin(qmin, q);
    qmax = fmax(qmax, q);
  }
  double top = -INFINITY;
  int pick = -1, n_top = 0, follow_top = 0;
  for (int i = 0; i < n; i++) {
    double prefix = r->n_hashes > 0 ? nv->matched[i] / (double)r->n_hashes : 0;
    double q = nv->queue[i] == nv->queue[i] ? nv->queue[i] : 0;
    double queue = qmax == qmin ? 1 : (qmax - q) / (qmax - qmin);
    double u = nv->kv[i] == nv->kv[i] ? nv->kv[i] : 0;
    double kv = fmax(0, fmin(1, 1 - u));
    double t = 0;
    t += W_PREFIX * clamp01(prefix);
    t += W_QUEUE * clamp01(queue);
    t += W_KV * clamp01(kv);
    nv->total[i] = t;
    if (t > top) {
      top = t, pick = i, n_top = 1, follow_top = i == follow;
    } else if (t == top) {
      n_top++;
      follow_top |= i == follow;
    }
  }
  *ties = n_top;
  if (n_top > 1 && follow_top) pick = follow;
  return pick;
}

int native_lifecycle(native *nv, const char *body, size_t len, int follow, int *ties,
                     native_times *tm) {
  request *r = calloc(1, sizeof *r); /* begin */
  prepare(nv, r, body, len, tm);
  r->pick = schedule(nv, r, follow, ties);
  double t0 = tm ? now_ns() : 0;
  if (r->n_hashes > 0) /* pre_request */
    lupin_prefix_record(nv->index, (uint32_t)r->pick + 1, r->hashes, (size_t)r->n_hashes);
  if (tm) tm->index += now_ns() - t0;
  /* response header, three chunks, complete: the default config has no
   * plugin there, so the native side has nothing to do */
  int pick = r->pick; /* end */
  free(r->hashes);
  free(r);
  return pick;
}
