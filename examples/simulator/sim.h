/* lupin-sim: simulated vLLM endpoints for the gateway's specs, demo and benchmarks.
 *
 * One process, one libuv loop, one `sim` object owning N endpoints (one per port).
 * Each endpoint is a little model server: an HTTP listener (server.c), OpenAI
 * request/response shapes (openai.c), a continuous-batching engine with a
 * waiting queue and per-request timers (engine.c), a prefix cache of hashed
 * blocks (kvcache.c) and vLLM-named Prometheus metrics (metrics.c). */
#ifndef LUPIN_SIM_H
#define LUPIN_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* ---- configuration (main.c) ---------------------------------------------- */

#define MAX_LORAS 256 /* adapters per simulator: bounds the per-scan "seen" sets */

typedef struct sim_config {
  const char *host;
  int port; /* endpoint i listens on port + i */
  int endpoints;
  const char *model;
  char **loras; /* adapter names served besides the base model */
  int nloras;
  int max_loras; /* distinct adapters allowed in the running batch */
  int max_num_seqs;
  int block_size;
  int num_gpu_blocks;
  int max_model_len;
  int default_max_tokens;
  double prefill_overhead_ms;
  double prefill_ms_per_token;
  bool prefill_serial; /* prefills of one endpoint queue behind each other */
  double itl_ms;
  uint64_t seed;
  double error_rate;
  double drop_rate;
  bool *slow; /* slow[i]: endpoint i runs slow_factor times slower */
  double slow_factor;
  size_t max_body_bytes;
  bool log_requests;
  const char *engine; /* whose /metrics names to serve: vllm, sglang, tgi, triton, trtllm-serve */
} sim_config;

int config_parse(sim_config *cfg, int argc, char **argv); /* 0 ok, 1 help shown, -1 error */
void config_free(sim_config *cfg);

/* ---- a growable string ----------------------------------------------------- */

typedef struct strbuf {
  char *data;
  size_t len, cap;
} strbuf;

void sb_add(strbuf *sb, const char *s, size_t n);
void sb_adds(strbuf *sb, const char *s);
void sb_printf(strbuf *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(strbuf *sb);

/* ---- randomness: splitmix64, so a seed reproduces every decision ---------- */

uint64_t rng_next(uint64_t *state);
double rng_unit(uint64_t *state); /* uniform in [0,1) */
double wall_seconds(void);        /* unix time, for timestamps in responses and metrics */

/* ---- prefix cache (kvcache.c) --------------------------------------------- */

typedef struct kvcache kvcache;

kvcache *kv_new(int capacity);
void kv_free(kvcache *kv);
int kv_capacity(const kvcache *kv);
int kv_in_use(const kvcache *kv); /* blocks referenced by a live request */
int kv_free_count(const kvcache *kv);
/* Leading blocks of `hashes` already cached (prefix semantics: stops at the first miss). */
int kv_match(const kvcache *kv, const uint64_t *hashes, int n);
/* Takes a reference on each hashed block (reusing cached ones, evicting LRU free
 * blocks for the rest); writes block ids to `out`; returns how many it got. */
int kv_acquire(kvcache *kv, const uint64_t *hashes, int n, int *out);
/* One unhashed block (partial or decode block); -1 when none is free. */
int kv_acquire_anon(kvcache *kv);
/* Drops references, last block first, so a prompt's end is evicted before its start. */
void kv_release(kvcache *kv, const int *blocks, int n);

/* ---- metrics (metrics.c) --------------------------------------------------- */

#define HIST_MAX_BUCKETS 24

typedef struct histogram {
  const double *bounds;
  int nbounds;
  uint64_t counts[HIST_MAX_BUCKETS + 1];
  double sum;
  uint64_t count;
} histogram;

void hist_init(histogram *h, const double *bounds, int nbounds);
void hist_observe(histogram *h, double v);

/* vLLM's lora_requests_info is a labelled gauge: each label set it ever had
 * stays exported with the value it had last, and the current one has the
 * latest timestamp. The simulator keeps the last few old ones the same way. */
#define LORA_SERIES_KEPT 8
typedef struct lora_series {
  char *labels;
  double ts;
} lora_series;

typedef struct counters {
  uint64_t requests; /* completion requests received (lupin_sim_requests_total) */
  uint64_t success;  /* finished with a full response */
  uint64_t injected_errors;
  uint64_t injected_drops;
  uint64_t prompt_tokens;
  uint64_t generation_tokens;
  uint64_t prefix_queries; /* tokens */
  uint64_t prefix_hits;    /* tokens */
  histogram ttft;
  histogram itl;
  double lora_updated;  /* unix time of the last change of the LoRA sets */
  lora_series lora_now; /* the label set /metrics showed last */
  lora_series lora_old[LORA_SERIES_KEPT];
  int nlora_old;
} counters;

struct endpoint;
void metrics_init(counters *c);
void metrics_free(counters *c);
void metrics_render(struct endpoint *ep, strbuf *out);
bool metrics_engine_known(const char *engine);

/* ---- the engine (engine.c) -------------------------------------------------- */

enum job_kind { JOB_COMPLETION, JOB_CHAT };
enum job_state { JOB_WAITING, JOB_RUNNING, JOB_FINISHED };

struct conn;

/* One generation request, from parse to its last byte. */
typedef struct job {
  struct endpoint *ep;
  struct conn *conn; /* NULL once the client is gone */
  struct job *prev, *next;
  enum job_kind kind;
  enum job_state state;
  bool stream, include_usage;
  char *model; /* as requested: the base model or an adapter */
  int lora;    /* adapter index, -1 for the base model */
  char *id;
  int prompt_tokens;
  int max_tokens;
  int n; /* choices: sampled together, one engine sequence (their tokens differ by seed) */
  int generated;
  int cached_tokens;
  int drop_at; /* token count after which the connection is dropped; -1 never */
  uint64_t *hashes;
  int nhashes;
  int *blocks;
  int nblocks, cap_blocks;
  uint64_t text_seed;
  uint64_t t_arrival, t_last; /* uv_hrtime, ns */
  uint64_t created;           /* unix seconds, for the response */
  strbuf text;                /* accumulated output of a non-streaming job */
  uv_timer_t timer;
} job;

typedef struct job_list {
  job *head, *tail;
  int count;
} job_list;

void engine_submit(struct endpoint *ep, job *j);
void engine_cancel(job *j); /* the client left: free its slot and blocks */
void engine_close(struct endpoint *ep);
void job_free(job *j); /* closes its timer; memory goes in the close callback */

/* ---- OpenAI shapes (openai.c) ------------------------------------------------ */

typedef struct http_reply {
  int status;
  strbuf body;
} http_reply;

/* Parses and validates a completion or chat body. Returns a job, or NULL with
 * `err` holding the status and OpenAI error JSON. */
job *openai_parse(struct endpoint *ep, enum job_kind kind, const char *body, size_t len,
                  http_reply *err);
void openai_error(http_reply *r, int status, const char *type, const char *param, const char *code,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void openai_models(const struct endpoint *ep, strbuf *out);
/* Token text: a word per token, a pure function of the job's seed and index. */
const char *openai_token(const job *j, int index);
void openai_stream_tokens(job *j, int from, int to, bool finished); /* SSE chunks */
void openai_finish(job *j); /* the full response, or the stream's tail */

/* ---- the routes that generate no tokens (routes.c) ---------------------------- */

bool aux_route_known(const char *path, size_t len);
/* Answers POST path (embeddings, pooling, score, rerank, tokenize, ...): the
 * status and JSON in out, the model served appended to model on success. */
void aux_serve(struct endpoint *ep, const char *path, size_t plen, const char *content_type,
               const char *body, size_t len, http_reply *out, strbuf *model);

/* ---- HTTP (server.c) ------------------------------------------------------- */

int server_listen(struct endpoint *ep);
void server_close(struct endpoint *ep);
/* Response plumbing for openai.c: headers, an SSE chunk, the end, an abrupt drop. */
void conn_stream_begin(struct conn *c);
void conn_stream_chunk(struct conn *c, const char *data, size_t len);
void conn_stream_end(struct conn *c, const char *data, size_t len); /* a last chunk, then the end */
void conn_reply(struct conn *c, int status, const char *content_type, const char *body, size_t len);
void conn_drop(struct conn *c);

/* ---- the simulator ----------------------------------------------------------- */

typedef struct endpoint {
  struct sim *sim;
  int index;
  int port;
  char addr[64]; /* host:port, as the gateway names it */
  uv_tcp_t listener;
  bool listening;
  kvcache *kv;
  job_list waiting, running;
  counters m;
  uint64_t rng;             /* per-endpoint stream for failure injection */
  uint64_t seq;             /* request ids */
  uint64_t prefill_free_at; /* loop time (ms) the last queued prefill ends (--prefill-serial) */
  struct conn *conns;       /* open connections, closed on shutdown */
} endpoint;

typedef struct sim {
  sim_config cfg;
  uv_loop_t *loop;
  endpoint *eps;
  uv_signal_t sigint, sigterm;
  bool stopping;
} sim;

double endpoint_slowness(const endpoint *ep);

#endif
