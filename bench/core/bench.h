/* bench/core: the cost of the runtime against the same algorithm in plain C.
 * Shared declarations of the benchmark's parts, one concept per file:
 *   workload.c   the deterministic request stream and endpoint metrics
 *   native.c     the default algorithm written directly in C (the reference)
 *   lupin_side.c the same requests through the embedding API
 *   main.c       the configurations, the agreement check, the table */
#ifndef BENCH_CORE_H
#define BENCH_CORE_H

#include <stddef.h>
#include <stdint.h>

#define SEED  20261202u
#define MODEL "meta-llama/Llama-3.1-8B-Instruct"
/* examples/configs/epp-default.json (the EPP's weights) */
#define BLOCK_SIZE   64
#define MAX_BLOCKS   256
#define LRU_CAPACITY 31250
#define W_PREFIX     3.0
#define W_QUEUE      2.0
#define W_KV         2.0

double now_ns(void);

/* --- workload.c ---------------------------------------------------------- */

/* One request after another: a completion body whose prompt shares a long
 * prefix with the other requests of its group (most requests) or nothing
 * (the rest), and the endpoint metrics as they stand when it arrives.  The
 * sequence depends only on the seed, so both sides see the same one. */
typedef struct workload {
  int n_endpoints;
  size_t prompt_bytes;
  uint64_t seed, rng;
  /* prompt text is cut from this corpus of English-like words */
  char *corpus;
  size_t corpus_len;
  int n_groups;
  size_t *group_off, *group_len; /* each group's shared prefix in the corpus */
  /* the current request */
  char *body;
  size_t body_len, body_cap;
  int group; /* -1: no shared prefix */
  /* the metrics as scraped, and which endpoints changed for this request */
  double *queue, *kv;
  int *changed, n_changed;
} workload;

void workload_init(workload *w, int n_endpoints, size_t prompt_bytes, uint64_t seed);
/* Back to the first request, metrics as at the start. */
void workload_reset(workload *w);
/* The next request: w->body and the metrics move. */
void workload_next(workload *w);
void workload_free(workload *w);

/* --- decode.cpp ---------------------------------------------------------- */

/* simdjson's On-Demand parser, reused across bodies (one per native). */
typedef struct native_json native_json;

/* The fields the algorithm reads; "" when absent or not strings.  They point
 * into the parser's buffers: valid until its next decode. */
typedef struct native_fields {
  const char *model, *salt, *prompt;
  size_t model_len, salt_len, prompt_len;
} native_fields;

#ifdef __cplusplus
extern "C" {
#endif
native_json *native_json_new(void);
/* 0, or -1 when the text is not a JSON object (or out of memory). */
int native_json_decode(native_json *j, const char *text, size_t len, native_fields *out);
void native_json_free(native_json *j);
#ifdef __cplusplus
}
#endif

/* --- native.c ------------------------------------------------------------ */

typedef struct native native;

/* ns summed over lifecycles: the simdjson decode; block hashes, index match and record */
typedef struct native_times {
  double decode, index;
} native_times;

native *native_new(int n_endpoints, const double *queue, const double *kv);
/* One full lifecycle of the default algorithm on a body; returns the picked
 * endpoint's index.  *ties: how many endpoints share the top score.  When
 * several do, the pick is the one in `follow` if it is among them (the
 * runtime breaks ties at random; following it keeps both prefix indexes the
 * same), else the first.  With tm, the parts are timed and added there
 * (clock reads inline: a separate pass from the one whose total is timed). */
int native_lifecycle(native *nv, const char *body, size_t len, int follow, int *ties,
                     native_times *tm);
void native_free(native *nv);

/* --- lupin_side.c -------------------------------------------------------- */

typedef struct lupin_side lupin_side;

/* Where lupin's time went, in ns summed over the timed lifecycles. */
typedef struct breakdown {
  double decode;  /* cjson.decode of the body (measured apart, see there) */
  double index;   /* block hashes, index match and record: the C work, as
                     the native side's instrumented pass times it */
  double prefix;  /* the rest of the prefix plugin's prepare and pre_request:
                     its Lua, and what decoding costs in a request beyond the
                     loop's figure (fresh strings, GC steps) */
  double scoring; /* the three scorers and the picker */
  double runtime; /* the rest: request state, ctx, engine, C<->Lua, finish, GC */
  int aborts;     /* LuaJIT trace aborts over the timed lifecycles */
} breakdown;

lupin_side *lupin_side_new(workload *w, const char *config);
/* One full lifecycle of the current request; returns the pick's index. */
int lupin_side_lifecycle(lupin_side *ls);
void lupin_side_push_metrics(lupin_side *ls);
/* Marks the start of the timed part (plugin time counted from here). */
void lupin_side_mark(lupin_side *ls);
/* Splits total_ns (n timed lifecycles) into the breakdown; index_ns is the
 * native side's hashing and index time over the same lifecycles. */
void lupin_side_breakdown(lupin_side *ls, int n, double total_ns, double index_ns, breakdown *out);
/* Lua heap held per in-flight (begun and scheduled) request, after a full GC. */
double lupin_side_heap_per_request(lupin_side *ls, int in_flight);
void lupin_side_free(lupin_side *ls);

#endif
